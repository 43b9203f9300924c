"""A contraction's precision (API.md "Low precision": precision= / pj.default_matmul_precision) is carried in the
graph, on the contraction's product, through lowering, the kernel cache's key and saved plans; devices without a
reduced-precision path compute it exactly (the cpu and OpenCL, as JAX on the CPU). The CUDA tensor-core kernels it
selects are tests/codegen/test_render_fragments.py's."""
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.runtime.disk_cache import kernel_key
from prepjit.uop import Ops, dtypes


def _product_precisions(kernels) -> set:
    return {u.arg for k in kernels for u in k.ast.toposort() if u.op is Ops.MUL and u.dtype == dtypes.float32}


def _operands(m=40, k=24, n=32):
    rng = np.random.default_rng(3)
    return rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_the_precision_rides_on_the_contractions_product(device, precision):
    """precision=, the default's context and einsum all put the resolved precision on the kernel's product; the
    default "highest" puts none; so the kernels differ in the cache's key."""
    a, b = _operands()
    plans = {
        "arg": pj.prepare(lambda x, y: pnp.matmul(x, y, precision=precision) + 1, device=device).plan(a, b),
        "einsum": pj.prepare(lambda x, y: pnp.einsum("ik,kj->ij", x, y, precision=precision) + 1,
                             device=device).plan(a, b),
        "highest": pj.prepare(lambda x, y: x @ y + 1, device=device).plan(a, b),
    }
    with pj.default_matmul_precision(precision):
        plans["context"] = pj.prepare(lambda x, y: x @ y + 1, device=device).plan(a, b)
    for name in ("arg", "einsum", "context"):
        assert _product_precisions(plans[name].kernels) == {precision}, name
    assert _product_precisions(plans["highest"].kernels) == {None}
    (reduced,), (exact,) = plans["arg"].kernels, plans["highest"].kernels
    assert kernel_key(reduced.ast, device, "x") != kernel_key(exact.ast, device, "x")


def test_saved_plans_keep_the_precision(device, tmp_path):
    a, b = _operands()
    f = pj.prepare(lambda x, y: pnp.matmul(x, y, precision="tf32") + 2, device=device)
    path = str(tmp_path / "tf32.pjplan")
    f.save(path, a, b)
    for loaded in (pj.load(path), pj.load(path, recompile=True)):
        assert _product_precisions(loaded.plan.kernels) == {"tf32"}
        assert np.array_equal(np.asarray(loaded(a, b)), np.asarray(f(a, b)))


def test_float64_and_integer_contractions_ignore_it(device):
    """As in JAX, the precision is about float32 (and 16-bit) operands: a float64 or integer product carries none."""
    a, b = _operands(8, 16, 8)
    f = pj.prepare(lambda x, y: (pnp.matmul(x.astype(pnp.float64), y.astype(pnp.float64), precision="tf32"),
                                 pnp.matmul(x.astype(pnp.int32), y.astype(pnp.int32), precision="bf16")), device=device)
    wide, ints = f(a, b)
    assert not any(u.op is Ops.MUL and u.arg is not None for k in f.plan(a, b).kernels for u in k.ast.toposort())
    np.testing.assert_allclose(np.asarray(wide), a.astype(np.float64) @ b, rtol=1e-12)
    assert np.array_equal(np.asarray(ints), a.astype(np.int32) @ b.astype(np.int32))


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_devices_without_tensor_cores_compute_it_exactly(device, precision):
    """The cpu ("tf32" as JAX on the CPU; "bf16" too where its float32 kernels have no bf16 path) and OpenCL give
    the exact kernel's bits; a CUDA GPU is within the reduced precision's error of float64."""
    a, b = _operands(130, 96, 70)
    w = np.ascontiguousarray(b.T)   # x @ W.T: both operands contiguous along k (wgmma's tf32 tiles on sm_90)
    for fn, args in ((lambda x, y, p: pnp.matmul(x, y, precision=p), (a, b)),
                     (lambda x, y, p: pnp.matmul(x, y.T, precision=p), (a, w))):
        got = np.asarray(pj.prepare(lambda x, y: fn(x, y, precision), device=device)(*args))
        exact = np.asarray(pj.prepare(lambda x, y: fn(x, y, "highest"), device=device)(*args))
        if device == "cuda":
            bits = 10 if precision == "tf32" else 7
            want = a.astype(np.float64) @ b
            assert np.abs(got - want).max() <= 2.0 ** -bits * (np.abs(a) @ np.abs(b)).max()
            assert not np.array_equal(got, exact)   # (the operands were rounded)
        else:
            assert np.array_equal(got, exact)


def test_vmap_keeps_it_and_the_gradients_contractions_are_exact(device):
    """vmap batches the product with its precision; grad's contractions (the cotangent's products) carry none
    (docs/tracing.md says so), and equal NumPy's."""
    a, b = _operands(16, 24, 8)
    batched = pj.prepare(pj.vmap(lambda x, y: pnp.matmul(x, y, precision="tf32")), device=device)
    stacked = (np.stack([a, a * 2]), np.stack([b, b]))
    assert _product_precisions(batched.plan(*stacked).kernels) == {"tf32"}
    np.testing.assert_allclose(np.asarray(batched(*stacked)), stacked[0] @ b, rtol=1e-2, atol=1e-2)
    grad = pj.prepare(pj.grad(lambda x, y: pnp.matmul(x, y, precision="tf32").sum()), device=device)
    assert _product_precisions(grad.plan(a, b).kernels) == {None}
    np.testing.assert_allclose(np.asarray(grad(a, b)), np.ones((16, 8), np.float32) @ b.T, rtol=1e-5)
