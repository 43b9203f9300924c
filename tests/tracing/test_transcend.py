"""log1p, expm1, hyperbolic and inverse trig functions, arctan2, hypot, logaddexp, nan_to_num and the shift
operators against NumPy: dtypes (NumPy 2's), precision in ulps over wide ranges, special values, every device,
static and symbolic shapes."""
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp

UNARY = "log1p expm1 sinh cosh tan arctan arcsin arccos arcsinh arccosh arctanh".split()
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast")
SPECIAL = np.array([0.0, -0.0, 1.0, -1.0, 2.0, -2.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30, 0.5, -0.5, 88.0,
                    -88.0, 700.0, 1e300, -1e300])


def _samples(name: str, rng) -> np.ndarray:
    if name in ("arcsin", "arccos", "arctanh"):
        return rng.uniform(-1, 1, 600)
    if name == "arccosh":
        return np.concatenate([1 + np.exp(rng.uniform(-30, 5, 300)), np.exp(rng.uniform(0, 40, 300))])
    if name == "log1p":
        return np.concatenate([np.exp(rng.uniform(-40, 5, 300)), -np.exp(rng.uniform(-40, -0.001, 300))])
    return rng.standard_normal(600) * np.exp(rng.uniform(-20, 4, 600))


def _ulps(got: np.ndarray, want64: np.ndarray, dt) -> float:
    want = want64.astype(dt)
    ok = np.isfinite(want)
    assert np.array_equal(np.isnan(got), np.isnan(want)), "NaN where NumPy has none (or the reverse)"
    assert np.array_equal(got[~ok & ~np.isnan(want)], want[~ok & ~np.isnan(want)]), "infinities differ"
    return float((np.abs(got[ok].astype(np.float64) - want64[ok]) / np.spacing(np.abs(want[ok]))).max())


@pytest.mark.parametrize("name", UNARY)
@pytest.mark.parametrize("dt", ["float32", "float64"])
def test_unary_precision(name, dt, rng):
    x = _samples(name, rng).astype(dt)
    f = pj.prepare(lambda a: getattr(pnp, name)(a))
    got = np.asarray(f(x))
    assert got.dtype == np.dtype(dt)
    with np.errstate(all="ignore"):
        want64 = getattr(np, name)(x.astype(np.float64))  # the float32 results against float64 truth
    assert _ulps(got, want64, dt) <= 4


@pytest.mark.parametrize("name", UNARY)
def test_unary_special_values_and_dtypes(name, device):
    f = pj.prepare(lambda a: getattr(pnp, name)(a), device=device)
    for dt in ["float32", "float16"] + (["float64"] if device == "cpu" else []):
        x = SPECIAL.astype(dt)
        with np.errstate(all="ignore"):
            want = getattr(np, name)(x)
        got = np.asarray(f(x))
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-2 if dt == "float16" else 4e-6, equal_nan=True, err_msg=dt)
        assert np.array_equal(np.signbit(got[want == 0]), np.signbit(want[want == 0])), "signed zeros differ"
    for dt in ["int8", "int16", "int32", "uint8", "bool"]:  # ints -> float16 / float32 / float64, as NumPy
        x = np.array([0, 1, 1, 0], dt)
        with np.errstate(all="ignore"):
            want = getattr(np, name)(x)
        got = np.asarray(f(x))
        assert got.dtype == want.dtype, dt
        np.testing.assert_allclose(got, want, rtol=1e-3, equal_nan=True)


@pytest.mark.parametrize("name", ["arctan2", "hypot", "logaddexp"])
def test_binary(name, device, rng):
    f = pj.prepare(lambda a, b: getattr(pnp, name)(a, b), device=device)
    x = np.concatenate([rng.standard_normal(200) * 10, SPECIAL]).astype(np.float32)
    y = np.concatenate([rng.standard_normal(200) * 10, SPECIAL[::-1]]).astype(np.float32)
    xx, yy = np.meshgrid(x[-len(SPECIAL):], y[-len(SPECIAL):])  # every pair of special values too
    for a, b in [(x, y), (xx.ravel(), yy.ravel())]:
        with np.errstate(all="ignore"):
            want = getattr(np, name)(a, b)
        got = np.asarray(f(a, b))
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=4e-6, atol=0, equal_nan=True)
    g = pj.prepare(lambda a: (getattr(pnp, name)(a, 2), getattr(pnp, name)(a, np.float64(2))), device=device)
    ints = np.arange(-3, 4, dtype=np.int32)
    for got, want in zip(g(ints), (getattr(np, name)(ints, 2), getattr(np, name)(ints, np.float64(2)))):
        assert np.asarray(got).dtype == want.dtype
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)


def test_float64_binary_precision(rng):
    a, b = rng.standard_normal(500) * 1e3, rng.standard_normal(500) * 1e-3
    for name in ["arctan2", "hypot", "logaddexp"]:
        got = np.asarray(pj.prepare(lambda x, y: getattr(pnp, name)(x, y))(a, b))
        np.testing.assert_allclose(got, getattr(np, name)(a, b), rtol=5e-16, atol=0, err_msg=name)


def test_symbolic_shapes():
    f = pj.prepare(vars={"n": (0, 16)}, shapes={"x": ("n", 3)})(
        lambda x: (pnp.log1p(x * x), pnp.arctan2(x, 1.0), pnp.cosh(x)))
    for n in (0, 1, 5, 16):
        x = np.linspace(-2, 2, n * 3, dtype=np.float32).reshape(n, 3)
        for got, want in zip(f(x), (np.log1p(x * x), np.arctan2(x, 1.0), np.cosh(x))):
            np.testing.assert_allclose(np.asarray(got), want, rtol=4e-6)
    assert f.stats["traces"] == 1


def test_nan_to_num(device):
    x = np.array([np.nan, np.inf, -np.inf, 1.5, -0.0], np.float32)
    f = pj.prepare(lambda a: (pnp.nan_to_num(a), pnp.nan_to_num(a, nan=-1.0, posinf=9.0, neginf=-9.0),
                              pnp.nan_to_num(a.astype(pnp.int32))), device=device)
    got = [np.asarray(g) for g in f(x)]
    with np.errstate(invalid="ignore"):
        wants = (np.nan_to_num(x), np.nan_to_num(x, nan=-1.0, posinf=9.0, neginf=-9.0), np.nan_to_num(np.array(
            [0, 0, 0, 1, 0], np.int32)))
    for g, w in zip(got[:2], wants[:2]):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)
    assert got[2].dtype == np.int32


def test_shift_and_xor_operators(device):
    f = pj.prepare(lambda a, b: (a << b, a >> b, a ^ b, 1 << b, 256 >> b, 5 ^ a, a << 2, a >> 1), device=device)
    a = np.array([1, -8, 100, 7, 0], np.int32)
    b = np.array([0, 1, 3, 4, 2], np.int32)
    wants = (a << b, a >> b, a ^ b, 1 << b, 256 >> b, 5 ^ a, a << 2, a >> 1)
    for got, want in zip(f(a, b), wants):
        assert np.asarray(got).dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got), want)
    u = np.array([1, 2, 200], np.uint8)
    got = pj.prepare(lambda a: (a << 1, a >> 1, a ^ 255), device=device)(u)
    for g, w in zip(got, (u << 1, u >> 1, u ^ 255)):
        assert np.asarray(g).dtype == w.dtype
        np.testing.assert_array_equal(np.asarray(g), w)
