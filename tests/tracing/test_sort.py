"""pnp.sort / argsort / partition / argpartition and pj.lax.top_k against NumPy, on static and symbolic axes."""
import functools
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import prepjit as pj
import prepjit.numpy as pnp
from tests.helpers import assert_matches


def _special(x: np.ndarray) -> np.ndarray:
    """Ties, NaNs, infinities and both zeros in a float array."""
    x = x.copy()
    flat = x.reshape(-1)
    flat[::5] = np.nan
    flat[1::7] = -0.0
    flat[2::7] = 0.0
    flat[3::11] = np.inf
    flat[4::11] = -np.inf
    return x


def _top_k_reference(x: np.ndarray, k: int):
    """jax.lax.top_k: descending along the last axis, NaNs largest, equal values in index order."""
    xf = x.astype(np.float64)
    nan = np.isnan(xf)
    idx = np.lexsort((-np.where(nan, 0, xf), ~nan), axis=-1)[..., :k]
    return np.take_along_axis(x, idx, -1), idx.astype(np.int32)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8, np.bool_])
def test_sort_argsort_top_k_static(device, rng, dtype):
    x = (rng.standard_normal((5, 37)) * 4).astype(dtype)
    if x.dtype.kind == "f":
        x = _special(x)
    f = pj.prepare(lambda x: (pnp.argsort(x), pnp.argsort(x, axis=0, kind="stable"), pnp.sort(x, axis=0),
                              pnp.sort(x, axis=None), pnp.argsort(x, axis=None), pj.lax.top_k(x, 6),
                              pj.lax.top_k(x.T, 3)), device=device)
    a1, a0, s0, sn, an, (tv, ti), (tvT, tiT) = f(x)
    assert_matches(a1, np.argsort(x, kind="stable"))
    assert_matches(a0, np.argsort(x, axis=0, kind="stable"))
    assert_matches(s0, np.sort(x, axis=0))
    assert_matches(sn, np.sort(x, axis=None))
    assert_matches(an, np.argsort(x, axis=None, kind="stable"))
    for (v, i), ref in (((tv, ti), _top_k_reference(x, 6)), ((tvT, tiT), _top_k_reference(x.T, 3))):
        assert_matches(v, ref[0])
        assert_matches(i, ref[1])


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_float_keys_of_every_exponent(device, rng, dtype):
    """Floats sort through exact integer codes of their bits: powers of two and their neighbours over the
    whole exponent range, subnormals, the largest finite values and both zeros keep NumPy's order."""
    info = np.finfo(dtype)
    powers = np.ldexp(np.ones(1, dtype), np.arange(info.minexp - info.nmant, info.maxexp).astype(np.int32))
    x = np.concatenate([powers, np.nextafter(powers, dtype(0)), np.nextafter(powers, dtype(np.inf)),
                        [info.max, -info.max, info.tiny, -info.tiny, 0.0, -0.0, np.inf, -np.inf, np.nan]])
    x = np.concatenate([x, -x]).astype(dtype)
    x = x[rng.permutation(len(x))]
    a = pj.prepare(lambda x: pnp.argsort(x), device=device)(x)
    assert_matches(a, np.argsort(x, kind="stable"))


def test_sort_dispatch_and_methods(device, rng):
    """np.argsort(traced) reaches the traced argsort; x.sort() returns a sorted copy, as JAX's Array.sort."""
    x = rng.standard_normal((4, 9)).astype(np.float32)
    f = pj.prepare(lambda x: (np.argsort(x, axis=0), x.sort(), x.argsort(kind="mergesort")), device=device)
    a, s, b = f(x)
    assert_matches(a, np.argsort(x, axis=0, kind="stable"))
    assert_matches(s, np.sort(x))
    assert_matches(b, np.argsort(x, kind="stable"))


@functools.lru_cache(maxsize=None)
def _symbolic_sorts(device: str):
    return pj.prepare(lambda x: (pnp.argsort(x), pnp.sort(x), pnp.sort(x, axis=0)),
                      vars={"b": (1, 4), "n": (0, 200)}, shapes={"x": ("b", "n")}, device=device)


def test_sort_symbolic_axis(device, rng):
    """One plan for every length up to the var's maximum (0 and 1 included)."""
    f = _symbolic_sorts(device)
    for b, n in ((1, 0), (2, 1), (3, 2), (4, 100), (1, 200), (2, 129)):
        x = _special(rng.integers(-3, 4, (b, n)).astype(np.float32))
        a, s, s0 = f(x)
        assert_matches(a, np.argsort(x, kind="stable"))
        assert_matches(s, np.sort(x))
        assert_matches(s0, np.sort(x, axis=0))
    assert f.stats["traces"] == 1


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([-2.0, -0.0, 0.0, 1.0, 1.5, np.inf, -np.inf, np.nan]), max_size=200))
def test_argsort_is_numpys_stable_argsort(values):
    """Many ties, both zeros, infinities and NaNs: the exact stable permutation (one plan for all lengths)."""
    x = np.array(values, np.float32).reshape(1, -1)
    a, s, _ = _symbolic_sorts("cpu")(x)
    np.testing.assert_array_equal(np.asarray(a), np.argsort(x, kind="stable"))
    np.testing.assert_array_equal(np.asarray(s), np.sort(x))


def test_top_k_symbolic_axis_checks_k(device, rng):
    f = pj.prepare(lambda x: pj.lax.top_k(x, 5), vars={"n": (1, 300)}, shapes={"x": ("n",)}, device=device)
    for n in (5, 6, 300):
        x = _special(rng.integers(0, 9, n).astype(np.float32))
        v, i = f(x)
        rv, ri = _top_k_reference(x, 5)
        assert_matches(v, rv)
        assert_matches(i, ri)
    with pytest.raises(pj.IndexBoundError, match="top_k"):
        f(np.ones(4, np.float32))
    assert_matches(f(np.arange(7, dtype=np.float32))[1], np.array([6, 5, 4, 3, 2], np.int32))
    assert f.stats["traces"] == 1


def test_top_k_long_axis_sorts_blocks_first(device, rng):
    """Over a long axis top_k keeps the k largest of each block and sorts those (far less work than a full
    sort), with jax.lax.top_k's order: ties in index order across blocks, NaNs first."""
    from prepjit.tracing.numpy_sort import _top_plan
    assert _top_plan(6000, 7) and _top_plan(49152, 50)
    x = _special(rng.integers(0, 50, (2, 6000)).astype(np.float32))
    v, i = pj.prepare(lambda x: pj.lax.top_k(x, 7), device=device)(x)
    rv, ri = _top_k_reference(x, 7)
    assert_matches(v, rv)
    assert_matches(i, ri)
    f = pj.prepare(lambda x: pj.lax.top_k(x, 3), vars={"n": (3, 3000)}, shapes={"x": ("n",)}, device=device)
    for n in (3, 1000, 3000):
        x = rng.integers(0, 4, n).astype(np.int32)
        v, i = f(x)
        rv, ri = _top_k_reference(x, 3)
        assert_matches(v, rv)
        assert_matches(i, ri)
    assert f.stats["traces"] == 1


def test_sort_under_grad_and_vmap(device):
    """The gradient flows through the final gather (a permutation of the cotangent); vmap batches the network."""
    x = np.array([3.0, 1.0, 2.0, 5.0], np.float32)
    weights = np.arange(4, dtype=np.float32)
    g = pj.prepare(lambda x: pj.grad(lambda x: (pnp.sort(x) * weights).sum())(x), device=device)(x)
    assert_matches(g, np.array([2.0, 0.0, 1.0, 3.0], np.float32))
    g = pj.prepare(lambda x: pj.grad(lambda x: pj.lax.top_k(x, 2)[0].sum())(x), device=device)(x)
    assert_matches(g, np.array([1.0, 0.0, 0.0, 1.0], np.float32))
    rows = np.array([[3, 1, 2], [0, -1, 5]], np.float32)
    assert_matches(pj.prepare(lambda x: pj.vmap(pnp.sort)(x), device=device)(rows), np.sort(rows))


def test_gpu_renderers_take_the_networks():
    """Sorts, top_k, unique and searchsorted are built from existing primitives: every kernel of their plan
    renders as OpenCL C and CUDA (the OpenCL syntax-checked by clang against the default header)."""
    from prepjit.codegen.render_cuda import render_cuda
    from prepjit.codegen.render_opencl import render_opencl
    from prepjit.codegen.schedule import schedule
    traced = pj.trace(pj.prepare(lambda x: (pnp.argsort(x), pj.lax.top_k(x, 3), pnp.unique(x, size=4),
                                            pnp.searchsorted(x, x))), np.zeros(3000, np.float32))
    asts = schedule(list(traced.outputs), list(traced.inputs)).kernels.asts()
    sources = {render_opencl(a).source for a in asts}
    assert len(asts) > 10 and all(render_cuda(a).source for a in asts)
    if shutil.which("clang"):
        for cl in sources:
            done = subprocess.run(["clang", "-x", "cl", "-cl-std=CL1.2", "-fsyntax-only", "-Xclang",
                                   "-finclude-default-header", "-"], input=cl, capture_output=True, text=True)
            assert done.returncode == 0, done.stderr + cl


def test_partition_places_kth(device, rng):
    """Any valid partition is NumPy's contract: the kth element in place, none larger before it, none smaller
    after it (ours is the sorted order)."""
    x = rng.standard_normal((3, 20)).astype(np.float32)
    f = pj.prepare(lambda x: (pnp.partition(x, 4), pnp.argpartition(x, (2, -3), axis=0)), device=device)
    p, ap = f(x)
    p = np.asarray(p)
    np.testing.assert_array_equal(p[:, 4], np.partition(x, 4)[:, 4])
    assert (p[:, :4] <= p[:, 4:5]).all() and (p[:, 5:] >= p[:, 4:5]).all()
    taken = np.take_along_axis(x, np.asarray(ap), 0)
    np.testing.assert_array_equal(taken[[2, -3]], np.partition(x, (2, -3), axis=0)[[2, -3]])


def test_partition_kth_checked(device):
    with pytest.raises(ValueError, match="out of bounds"):
        pj.prepare(lambda x: pnp.partition(x, 5), device=device)(np.zeros(5, np.float32))
    f = pj.prepare(lambda x: pnp.partition(x, 2), vars={"n": (1, 10)}, shapes={"x": ("n",)}, device=device)
    assert_matches(f(np.array([3, 1, 2], np.float32)), np.array([1, 2, 3], np.float32))
    with pytest.raises(pj.IndexBoundError, match="kth"):
        f(np.array([3, 1], np.float32))


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 4)])
@pytest.mark.parametrize("kth", [0, -1, 5])
def test_partition_of_an_array_with_no_element_is_empty(shape, kth, device):
    """NumPy checks no kth when the array holds no element: the result is empty (static and symbolic shapes)."""
    x = np.zeros(shape, np.float32)
    static = pj.prepare(lambda x: (pnp.partition(x, kth), pnp.argpartition(x, kth)), device=device)
    for out, ref in zip(static(x), (np.partition(x, kth), np.argpartition(x, kth))):
        assert_matches(out, ref)
    names = ("m", "n")[-len(shape):]
    symbolic = pj.prepare(lambda x: (pnp.partition(x, kth), pnp.argpartition(x, kth)), device=device,
                          vars={"m": (0, 6), "n": (0, 6)}, shapes={"x": names})
    for out, ref in zip(symbolic(x), (np.partition(x, kth), np.argpartition(x, kth))):
        assert_matches(out, ref)
    full = np.arange(int(np.prod([4 if d == 0 else d for d in shape])), dtype=np.float32)[::-1].reshape(
        [4 if d == 0 else d for d in shape]).copy()  # the same function, the axis 4 long: kth 5 is out of bounds
    if kth == 5:
        with pytest.raises(pj.IndexBoundError, match="kth"):
            symbolic(full)
    else:
        assert_matches(symbolic(full)[0], np.partition(full, kth))


def test_sort_argument_errors():
    x = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match="sort kind"):
        pj.prepare(lambda x: pnp.sort(x, kind="bogus"))(x)
    with pytest.raises(pj.TraceError, match="k must be"):
        pj.prepare(lambda x: pj.lax.top_k(x, -1))(x)
    with pytest.raises(ValueError, match="larger than the axis"):
        pj.prepare(lambda x: pj.lax.top_k(x, 4))(x)
    with pytest.raises(np.exceptions.AxisError):
        pj.prepare(lambda x: pnp.sort(x, axis=1))(x)


def test_sort_is_one_stage_kernel_replayed(rng):
    """The network's stages share one compiled kernel (the plan replays it once per stage)."""
    x = rng.standard_normal(1000).astype(np.float32)
    f = pj.prepare(lambda x: pnp.argsort(x))
    assert_matches(f(x), np.argsort(x, kind="stable"))
    plan = f.plan(x)
    stages = 10 * 11 // 2  # 1000 pads to 2**10
    assert len(plan.kernels) >= stages
    assert len({id(k.kernel) for k in plan.kernels}) < 8
