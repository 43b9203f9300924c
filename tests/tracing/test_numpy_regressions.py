"""Regression tests for bugs found by the parity table and the fuzzer, and the errors NumPy's semantics need."""
from __future__ import annotations

import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.uop import Ops


def run(fn, *args, **prepare_kwargs):
    out = pj.prepare(**prepare_kwargs)(fn)(*args)
    return [np.asarray(o) for o in out] if isinstance(out, (tuple, list)) else np.asarray(out)


# ---- found while building the parity table and fuzzing ----

def test_less_equal_and_greater_equal_are_false_on_nan():
    x = np.array([np.nan, 1.0, 2.0], np.float32)
    got = run(lambda x: (x <= 1.0, x >= 1.0, pnp.less_equal(1.0, x)), x)
    with np.errstate(invalid="ignore"):
        want = (x <= 1.0, x >= 1.0, np.less_equal(1.0, x))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_where_of_python_scalars_keeps_the_array_dtype():
    """A bool condition is not a weak operand: where(c, -0.0, 0.0) * float32 stays float32."""
    x = np.array([1.0, -2.0], np.float32)
    assert run(lambda x: pnp.where(x > 0, 1.5, 0.0) * x, x).dtype == np.float32


def test_ellipsis_between_index_arrays_puts_the_gathered_dims_first():
    t = np.arange(27, dtype=np.float32).reshape(3, 3, 3)
    ids = np.array([2, 0], np.int64)
    np.testing.assert_array_equal(run(lambda t, i: t[None, i, ..., 1], t, ids), t[None, ids, ..., 1])


def test_float_floor_division_and_modulo_keep_numpy_signed_zeros_and_infinite_divisors():
    a = np.array([-0.0, 3.0, -0.5, 0.5], np.float64)
    b = np.array([1.0, -3.0, np.inf, -np.inf])
    got = run(lambda a, b: (a // b, a % b), a, b)
    for g, w in zip(got, (a // b, a % b)):
        np.testing.assert_array_equal(g, w)
        np.testing.assert_array_equal(np.signbit(g), np.signbit(w))


def test_arange_with_negative_step_sizes_its_buffer_statically():
    got = run(lambda x: pnp.arange(5, 0, -2) + x, np.int64(1))
    np.testing.assert_array_equal(got, np.arange(5, 0, -2) + 1)


def test_dot_with_a_python_scalar_promotes_like_an_array():
    x = np.ones(3, np.float32)
    assert run(lambda x: pnp.dot(x, 2.0), x).dtype == np.dot(x, 2.0).dtype


def test_concatenate_keeps_negative_zero():
    x = np.array([-0.0, 1.0], np.float32)
    got = run(lambda x: pnp.concatenate([x, x]), x)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(np.concatenate([x, x])))


def test_integer_power_wraps_like_numpy():
    a = np.array([3, -2, 7, 0], np.int8)
    b = np.array([5, 7, 3, 0], np.int8)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(run(lambda a, b: (a ** b), a, b), a ** b)


def test_python_int_out_of_range_for_the_array_dtype():
    x = np.array([0, 5, 255], np.uint8)
    with pytest.raises(OverflowError):
        run(lambda x: x + -3, x)
    got = run(lambda x: (x < -3, x > 300, x == 256), x)
    for g, w in zip(got, (x < -3, x > 300, x == 256)):
        np.testing.assert_array_equal(g, w)


def test_floor_ceil_rint_of_integers_keep_the_integer_dtype():
    x = np.array([-3, 0, 7], np.int8)
    got = run(lambda x: (pnp.floor(x), pnp.ceil(x), pnp.rint(x)), x)
    for g, w in zip(got, (np.floor(x), np.ceil(x), np.rint(x))):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


# ---- errors ----

def test_static_out_of_range_int_index_raises_index_error():
    with pytest.raises(IndexError):
        run(lambda x: x[3], np.zeros(3, np.float32))
    with pytest.raises(IndexError):
        run(lambda x, i: x[i, 5], np.zeros((3, 3), np.float32), np.zeros(2, np.int32))


def test_out_of_range_gather_ids_raise_like_numpy_or_clip_on_request():
    table = np.arange(6, dtype=np.float32).reshape(3, 2)
    ids = np.array([100, -100, -1], np.int64)
    with pytest.raises(pj.IndexBoundError, match="out of range"):
        run(lambda t, i: t[i], table, ids)
    np.testing.assert_array_equal(run(lambda t, i: pnp.take(t, i, axis=0, mode="clip"), table, ids),
                                  np.take(table, ids, axis=0, mode="clip"))


def test_max_over_an_empty_static_axis_raises_like_numpy():
    with pytest.raises(ValueError, match="zero-size"):
        run(lambda x: x.max(axis=0), np.zeros((0, 2), np.float32))
    with pytest.raises(ValueError, match="empty sequence"):
        run(lambda x: pnp.argmax(x, axis=0), np.zeros((0, 2), np.float32))


@pytest.mark.parametrize("fn, why", [
    (lambda x: x[x > 0], "boolean"),
    (lambda x: pnp.pad(x, 1, mode="median"), "median"),
    (lambda x: pnp.repeat(x, [1, 2, 3]), "data-dependent"),
    (lambda x: pnp.einsum("ii->i", x.reshape(1, 3)), "don't match"),
])
def test_unsupported_forms_raise_trace_error(fn, why):
    with pytest.raises(pj.TraceError, match=why):
        run(fn, np.zeros(3, np.float32))


def test_negative_integer_power_of_a_static_exponent_raises():
    with pytest.raises(ValueError, match="negative integer powers"):
        run(lambda x: x ** -1, np.ones(3, np.int32))


def test_size_zero_cache_window_gives_numpy_results():
    f = pj.prepare(vars={"pos": (0, 7)})(lambda cache, pos: (cache[:pos], cache[:pos].sum(0), cache[:pos].mean(0)))
    cache = np.arange(16, dtype=np.float32).reshape(8, 2)
    for pos in (0, 3):
        with np.errstate(invalid="ignore", divide="ignore"):
            want = (cache[:pos], cache[:pos].sum(0), cache[:pos].mean(0))
        for g, w in zip(f(cache, pos), want):
            assert np.asarray(g).shape == w.shape
            np.testing.assert_array_equal(np.asarray(g), w)
    assert f.stats["traces"] == 1


# ---- found by the adversarial review (issue 10): dtypes, 0-d axes, NumPy's functions on traced arrays ----

def _same(got, want):
    got = np.asarray(got)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name, fn, x", [
    ("power(int, 0)", lambda m, x: m.power(x, 0), np.array([3, -2], np.int32)),
    ("power(bool, 0)", lambda m, x: m.power(x, 0), np.array([True, False])),
    ("square(bool)", lambda m, x: m.square(x), np.array([True, False])),
    ("reciprocal(int32)", lambda m, x: m.reciprocal(x), np.array([1, -1, 2, -3, 7], np.int32)),
    ("reciprocal(uint8)", lambda m, x: m.reciprocal(x), np.array([1, 2, 255], np.uint8)),
    ("reciprocal(bool)", lambda m, x: m.reciprocal(x), np.array([True, True])),
    ("round(bool)", lambda m, x: m.round(x), np.array([True, False])),
    ("round(int, -1)", lambda m, x: m.round(x, -1), np.array([14, 15, 25, -15, 7, 125], np.int32)),
    ("clip(uint8, -20, 20)", lambda m, x: m.clip(x, -20, 20), np.array([1, 200], np.uint8)),
    ("clip(int8, -300, 300)", lambda m, x: m.clip(x, -300, 300), np.array([-5, 100], np.int8)),
    ("repeat(0-d, axis=0)", lambda m, x: m.repeat(x, 3, axis=0), np.array(2.5, np.float32)),
    ("min(0-d, axis=0)", lambda m, x: m.min(x, axis=0), np.array(2.5, np.float32)),
    ("sum(0-d, axis=-1)", lambda m, x: m.sum(x, axis=-1), np.array(4, np.int32)),
    ("argmax(0-d, axis=0)", lambda m, x: m.argmax(x, axis=0), np.array(1.0, np.float32)),
    ("cumsum(0-d, axis=0)", lambda m, x: m.cumsum(x, axis=0), np.array(3.0, np.float32)),
])
def test_numpy_dtypes_and_shapes_of_edge_cases(name, fn, x):
    with np.errstate(all="ignore"):
        want = np.asarray(fn(np, x))
    _same(run(lambda x: fn(pnp, x), x), want)


@pytest.mark.parametrize("fn, numpy_error", [
    (lambda m, x: m.clip(x, 300, 400), OverflowError),         # 300 is not a uint8 and not beyond uint8's max
    (lambda m, x: m.max(x[0], axis=(0,)), np.exceptions.AxisError),
    (lambda m, x: m.mean(x[0], axis=0), np.exceptions.AxisError),
    (lambda m, x: m.min(x[0], axis=1), np.exceptions.AxisError),
])
def test_numpy_errors_are_trace_errors_of_numpys_class(fn, numpy_error):
    x = np.array([1, 200], np.uint8)
    with pytest.raises(numpy_error):
        fn(np, x)
    f = pj.prepare(lambda x: fn(pnp, x))
    with pytest.raises(pj.TraceError) as info:
        f(x)
    assert isinstance(info.value, numpy_error)


def test_round_of_bool_to_decimals_raises_like_numpy():
    with pytest.raises(TypeError):
        np.round(np.array([True]), 1)
    with pytest.raises(pj.TraceError):
        run(lambda x: pnp.round(x, 1), np.array([True]))


@pytest.mark.parametrize("fn", [
    lambda x: np.sum(x), lambda x: np.sum(x, axis=0, keepdims=True), lambda x: np.mean(x), lambda x: np.max(x, 1),
    lambda x: np.min(x), lambda x: np.prod(x, axis=1), lambda x: np.std(x), lambda x: np.var(x, ddof=1),
    lambda x: np.all(x), lambda x: np.any(x, axis=0), lambda x: np.argmax(x), lambda x: np.argmin(x, axis=1),
    lambda x: np.cumsum(x, axis=1), lambda x: np.cumprod(x), lambda x: np.round(x, 1), lambda x: np.clip(x, 0, 1),
    lambda x: np.transpose(x), lambda x: np.reshape(x, (3, 2)),
])
def test_numpy_functions_work_on_traced_arrays(fn):
    x = np.array([[0.5, -1.25, 2.0], [1.5, 0.25, -0.75]], np.float32)
    np.testing.assert_allclose(run(fn, x), fn(x), rtol=1e-6)


def test_numpy_out_argument_on_a_traced_array_is_a_trace_error():
    with pytest.raises(pj.TraceError, match="out="):
        run(lambda x: np.sum(x, out=np.zeros(())), np.ones(3, np.float32))


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_])
def test_cumsum_and_cumprod_match_numpy(dtype):
    rng = np.random.default_rng(0)
    x = (rng.random((3, 37)) * 2).astype(dtype)
    for axis in (None, 0, 1, -1):
        for name in ("cumsum", "cumprod"):
            want = getattr(np, name)(x, axis=axis)
            got = run(lambda x: getattr(pnp, name)(x, axis=axis), x)
            assert got.dtype == want.dtype
            np.testing.assert_allclose(got, want, rtol=1e-5)


def test_cumsum_with_a_symbolic_length_matches_numpy_at_every_length():
    f = pj.prepare(lambda x: pnp.cumsum(x, axis=0), vars={"n": (0, 70)}, shapes={"x": ("n", 2)})
    for n in (0, 1, 2, 5, 64, 70):
        x = np.arange(2 * n, dtype=np.float32).reshape(n, 2) - n
        np.testing.assert_allclose(np.asarray(f(x)), np.cumsum(x, axis=0), rtol=1e-6)
    assert f.stats["traces"] == 1


def test_cumsum_does_o_n_log_n_work():
    """A log-step scan: ceil(log2(n)) kernels of n elements, not one n-by-n masked reduction."""
    x = np.ones(4096, np.float32)
    plan = pj.prepare(lambda x: pnp.cumsum(x)).plan(x)
    assert len(plan.kernels) <= 13
    assert not [u for k in plan.kernels for u in k.ast.toposort() if u.op is Ops.RANGE and u.arg[1] == "reduce"]


def test_a_gather_from_a_static_empty_axis_raises_or_fills(device):
    """Found by the large fuzz profile: x[:, -1:2] of a (n, 3) array is (n, 0); a take from it has a gate that is
    never true, which the bounds proof once could not prove (CompileError)."""
    f = pj.prepare(lambda x, ids: pnp.take(x[:, -1:2].reshape(-1), pnp.mod(ids, 1), axis=0),
                   vars={"n": (0, 6)}, shapes={"x": ("n", 3)}, device=device)
    g = pj.prepare(lambda x, ids: pnp.take(x[:, -1:2].reshape(-1), ids, axis=0, mode="fill", fill_value=7.0),
                   vars={"n": (0, 6)}, shapes={"x": ("n", 3)}, device=device)
    ids = np.array([0, -2, 3], np.int32)
    for n in (0, 4):
        x = np.ones((n, 3), np.float32)
        with pytest.raises(pj.IndexBoundError):
            f(x, ids)
        np.testing.assert_array_equal(np.asarray(g(x, ids)), np.full(3, 7.0, np.float32))


def test_a_strided_slice_of_a_dim_that_may_be_empty_then_repeated(device):
    """Found by the large fuzz profile (seed 1004): x[:2:2] is empty only at n = 0, which the repeat kernel's loop
    end shows only value by value (CompileError before)."""
    f = pj.prepare(lambda x: pnp.repeat(x[:2:2], 2, axis=0), vars={"n": (0, 6)}, shapes={"x": ("n",)}, device=device)
    for n in (0, 1, 4):
        x = np.arange(n, dtype=np.float32)
        np.testing.assert_array_equal(np.asarray(f(x)), np.repeat(x[:2:2], 2, axis=0))


def test_cumsum_along_a_short_axis_then_flattened(device):
    """Found by the large fuzz profile (seed 1021): the flattened cumsum reads r0 - 1 under the gate r0 % 2 > 0,
    which bounds r0 >= 1 only through x >= x % k (CompileError before)."""
    f = pj.prepare(lambda x: pnp.cumsum(x, axis=1).reshape(-1), vars={"n": (0, 6)}, shapes={"x": ("n", 2)},
                   device=device)
    for n in (0, 1, 3, 6):
        x = np.arange(2 * n, dtype=np.float32).reshape(n, 2)
        np.testing.assert_array_equal(np.asarray(f(x)), np.cumsum(x, axis=1).reshape(-1))


@pytest.mark.parametrize("dtype, lengths", [("int8", (0, 1)), ("float32", (0, 1, 2))])
def test_a_gather_at_the_argmin_of_a_padded_array_after_an_empty_call(device, dtype, lengths):
    """Found by the large fuzz profile on the H200's NVIDIA OpenCL (seed 4009; cuda and PoCL pass): pad x by one
    zero in front, gather at its argmin; replayed at n = 0 and then n = 1 (2), it returned the pad's 0 instead of
    x's minimum, or raised IndexBoundError (an argmin matching no element), as if the minimum and the argmin
    kernels read different contents of the staged x."""
    def gather_at_argmin(xp, x, ids):   # ids: staged too, unused (as in the fuzz program)
        y = xp.pad(x, [(1, 0)])
        return xp.take_along_axis(y, xp.argmin(y, keepdims=True), axis=0)
    f = pj.prepare(lambda x, ids: gather_at_argmin(pnp, x, ids), vars={"n": (0, 6)}, shapes={"x": ("n",), "ids": (3,)},
                   device=device)
    ids = np.array([1, -4, 2], np.int32)
    for n in lengths:
        x = -np.arange(3, 3 + n).astype(dtype)
        np.testing.assert_array_equal(np.asarray(f(x, ids)), gather_at_argmin(np, x, ids))
