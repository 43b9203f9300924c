"""The FMA primitive (Ops.FMA, prims.fma): a * b + c rounded once on every device, against an exact reference
(the product and sum in fractions, rounded once to the dtype), its derivatives and batching, its dtypes."""
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import prepjit as pj
from prepjit.codegen.ast_check import _check_node
from prepjit.tracing import prims
from prepjit.uop import Ops, UOp, dtypes


def _round_once(exact: Fraction, dt) -> float:
    """`exact` rounded to nearest (ties to even) in `dt`: the float64 rounding's dtype neighbourhood searched
    for the nearest value (float64 then float32 may round twice)."""
    near = dt(float(exact))
    candidates = [np.nextafter(near, dt(-np.inf)), near, np.nextafter(near, dt(np.inf))]
    finite = [v for v in candidates if np.isfinite(v)]

    def distance(v):
        return abs(Fraction(float(v)) - exact)
    best = min(distance(v) for v in finite)
    ties = [v for v in finite if distance(v) == best]
    return min(ties, key=lambda v: int(np.array(v).view(np.int32 if dt is np.float32 else np.int64)) & 1)


def _operands(dt, n=600, seed=0):
    """Random a, b and c; in every other element c is -(a * b rounded), so a * b + c is the product's rounding
    error: 0 unless the product and sum are rounded once."""
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal(n) * 2.0 ** rng.integers(-8, 8, n)).astype(dt)
    b = (rng.standard_normal(n) * 2.0 ** rng.integers(-8, 8, n)).astype(dt)
    c = (rng.standard_normal(n) * 2.0 ** rng.integers(-8, 8, n)).astype(dt)
    c[::2] = -(a[::2] * b[::2])
    return a, b, c


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_fma_rounds_once(dt, device):
    a, b, c = _operands(dt)
    out = np.asarray(pj.prepare(prims.fma, device=device)(a, b, c))
    want = np.array([_round_once(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)), dt)
                     for x, y, z in zip(a, b, c)], dt)
    assert out.dtype == dt
    np.testing.assert_array_equal(out, want)
    assert np.count_nonzero(out[::2]) > 100  # the rounding errors a separate multiply and add would lose


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_a_product_plus_a_sum_rounds_twice_as_numpy_does(dt, device):
    """`a * b + c` written out (no FMA op) is rounded after the product and after the sum, as NumPy does, on
    every device: a compiler free to contract it into one fused multiply-add (OpenCL C's default: NVIDIA's
    contracted) returns the product's rounding error where c = -(a * b) instead of 0."""
    a, b, c = _operands(dt)
    out = np.asarray(pj.prepare(lambda a, b, c: a * b + c, device=device)(a, b, c))
    np.testing.assert_array_equal(out, a * b + c)


def test_fma_special_values(device):
    inf, nan = np.float32(np.inf), np.float32(np.nan)
    a = np.array([inf, 0, inf, 1, 3e38, 1], np.float32)
    b = np.array([0, 2, 1, 1, 10, 2], np.float32)
    c = np.array([1, -0.0, -inf, nan, -np.inf, np.inf], np.float32)
    with np.errstate(all="ignore"):
        want = a.astype(np.float64) * b + c  # exact here but for overflow, which float64 shows as inf too
    out = np.asarray(pj.prepare(prims.fma, device=device)(a, b, c))
    np.testing.assert_array_equal(out, want.astype(np.float32))
    assert np.signbit(out[1]) == np.signbit(np.float32(0) * 2 + np.float32(-0.0))


def test_fma_broadcasts_and_promotes(device):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    f = pj.prepare(lambda a, b: prims.fma(a, b, 0.5), device=device)
    out = np.asarray(f(a, np.float32(3)))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, a * 3 + 0.5)
    g = pj.prepare(lambda a, b: prims.fma(a, b, 1), device=device)
    np.testing.assert_array_equal(np.asarray(g(a, np.arange(3.0))), a * np.arange(3.0) + 1)  # float64


def test_fma_grad(device):
    a, b, c = (np.random.default_rng(i).standard_normal((3, 4)).astype(np.float32) for i in range(3))
    weights = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)

    def loss(a, b, c):
        return (prims.fma(a, b, c) * weights).sum()
    ga, gb, gc = (np.asarray(g) for g in pj.prepare(pj.grad(loss, argnums=(0, 1, 2)), device=device)(a, b, c))
    np.testing.assert_allclose(ga, b * weights, rtol=1e-6)
    np.testing.assert_allclose(gb, a * weights, rtol=1e-6)
    np.testing.assert_array_equal(gc, weights)


def test_fma_vmap(device):
    a, b = np.arange(12, dtype=np.float32).reshape(3, 4), np.arange(4, dtype=np.float32)
    f = pj.prepare(pj.vmap(lambda a, b, c: prims.fma(a, b, c), in_axes=(0, None, 0)), device=device)
    c = np.ones(3, np.float32)[:, None] * np.ones(4, np.float32)
    np.testing.assert_array_equal(np.asarray(f(a, b, c)), a * b + c)


@pytest.mark.parametrize("dt", [np.float16, ml_dtypes.bfloat16, np.int32])
def test_fma_of_other_dtypes_is_refused(dt):
    """16-bit floats are computed in float32 and rounded after each op: a float32 FMA would round twice."""
    f = pj.prepare(lambda x: prims.fma(x, x, x))
    with pytest.raises(pj.TraceError, match="float32 or float64"):
        f(np.ones(3, dt))
    assert np.asarray(f(np.ones(3, np.float32))).tolist() == [2, 2, 2]  # still works afterwards


def test_a_saved_kernel_with_a_16_bit_fma_is_refused():
    x = UOp(Ops.CONST, dtypes.float16, (), 1.0)
    with pytest.raises(ValueError, match="FMA"):
        _check_node(UOp(Ops.FMA, dtypes.float16, (x, x, x)))
    y = UOp(Ops.CONST, dtypes.float32, (), 1.0)
    _check_node(UOp(Ops.FMA, dtypes.float32, (y, y, y)))
    with pytest.raises(ValueError, match="FMA takes 3 sources"):
        _check_node(UOp(Ops.FMA, dtypes.float32, (y, y)))


def test_a_saved_plan_with_fma_recompiles(device, tmp_path):
    """A plan file's kernel ASTs with FMA pass the loader's checks and are rebuilt rounding once."""
    a, b, c = _operands(np.float32, n=64, seed=5)
    f = pj.prepare(prims.fma, device=device)
    path = str(tmp_path / "fma.pjplan")
    f.save(path, a, b, c)
    g = pj.load(path, recompile=True)
    np.testing.assert_array_equal(np.asarray(g(a, b, c)), np.asarray(f(a, b, c)))
