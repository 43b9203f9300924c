"""Numerical accuracy against NumPy: large reductions, transcendental functions in ulps, integer and float
floor division / modulo with negatives and zeros, and float -> int edge cases that NumPy defines."""
from __future__ import annotations

import math

import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp

INT_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


def ulp_distance(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in units of the spacing at `want` (0 where both are equal, inf included)."""
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    return np.where(same, 0, np.abs(got.astype(np.float64) - want) / np.spacing(np.abs(want)).astype(np.float64))


@pytest.fixture(scope="module")
def normals():
    return np.random.default_rng(0).standard_normal(2**20).astype(np.float32)


@pytest.mark.parametrize("shape", [(2**20,), (1024, 1024), (16, 65536)])
def test_float32_sum_of_2_20_normals(normals, shape, device):
    f = pj.prepare(device=device)(lambda x: (pnp.sum(x), pnp.mean(x)))
    x = normals.reshape(shape)
    total, mean = (float(np.asarray(v)) for v in f(x))
    exact = x.astype(np.float64).sum()
    assert abs(total - exact) <= 1e-4 * abs(exact)
    assert abs(mean - exact / x.size) <= 1e-4 * abs(exact / x.size)


def test_float32_sum_with_symbolic_length(normals, device):
    f = pj.prepare(vars={"n": (1, 2**20)}, shapes={"x": ("n",)}, device=device)(lambda x: x.sum())
    for n in (2**20, 2**20 - 3, 1000):
        exact = normals[:n].astype(np.float64).sum()
        assert abs(float(np.asarray(f(normals[:n]))) - exact) <= 1e-4 * abs(exact)
    assert f.stats["traces"] == 1


def test_float32_sum_over_a_strided_axis(normals, device):
    x = normals.reshape(4096, 256)
    got = np.asarray(pj.prepare(device=device)(lambda x: x.sum(axis=0))(x))
    exact = x.astype(np.float64).sum(axis=0)
    np.testing.assert_allclose(got, exact, rtol=1e-4, atol=1e-4 * np.abs(exact).max())


def test_var_of_offset_data_does_not_cancel(device):
    x = (np.random.default_rng(1).standard_normal(100_000) + 1000).astype(np.float32)
    got = float(np.asarray(pj.prepare(device=device)(lambda x: pnp.var(x))(x)))
    assert abs(got - x.astype(np.float64).var()) <= 1e-3 * x.astype(np.float64).var()


def _sample(dtype, lo, hi, n=20_000):
    rng = np.random.default_rng(2)
    return np.concatenate([rng.uniform(lo, hi, n), np.linspace(lo, hi, n)]).astype(dtype)


TRANSCENDENTAL = [  # (name, NumPy reference, useful range)
    ("exp", np.exp, (-80.0, 80.0)),
    ("log", np.log, (1e-30, 1e30)),
    ("tanh", np.tanh, (-20.0, 20.0)),
    ("sin", np.sin, (-100.0, 100.0)),
    ("erf", np.vectorize(math.erf, otypes=[np.float64]), (-6.0, 6.0)),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name, ref, bounds", TRANSCENDENTAL, ids=[t[0] for t in TRANSCENDENTAL])
def test_transcendentals_within_a_few_ulp(name, ref, bounds, dtype, device):
    lo, hi = bounds
    if name == "log":
        x = np.exp(_sample("float64", math.log(lo), math.log(hi))).astype(dtype)
    else:
        x = _sample(dtype, lo, hi)
    got = np.asarray(pj.prepare(device=device)(lambda x: getattr(pnp, name)(x))(x))
    want = ref(x.astype(np.float64)).astype(dtype) if name == "erf" else ref(x)
    assert got.dtype == want.dtype
    assert ulp_distance(got, want).max() <= 4, name


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_integer_floor_division_and_modulo(dtype, device):
    info = np.iinfo(dtype)
    candidates = {info.min, info.min + 1, -7, -3, -1, 0, 1, 3, 7, info.max - 1, info.max}
    values = np.array(sorted(v for v in candidates if info.min <= v <= info.max), dtype)
    a, b = np.meshgrid(values, values)
    divisor = -2 if info.min < 0 else 2
    f = pj.prepare(device=device)(lambda a, b: (a // b, a % b, pnp.floor_divide(a, 3), pnp.mod(a, divisor)))
    with np.errstate(all="ignore"):
        want = (a // b, a % b, np.floor_divide(a, 3), np.mod(a, divisor))
    for g, w in zip(f(a, b), want):
        np.testing.assert_array_equal(np.asarray(g), w)


def test_float_floor_division_and_modulo(device):
    values = np.array([-7.5, -3.0, -1.0, -0.5, -0.0, 0.0, 0.1, 0.5, 1.0, 3.0, 7.5, 1e300, np.inf, -np.inf, np.nan])
    a, b = np.meshgrid(values, values)
    f = pj.prepare(device=device)(lambda a, b: (a // b, a % b))
    with np.errstate(all="ignore"):
        want = (a // b, a % b)
    for g, w in zip(f(a, b), want):
        g = np.asarray(g)
        np.testing.assert_array_equal(g, w)
        np.testing.assert_array_equal(np.signbit(g[~np.isnan(w)]), np.signbit(w[~np.isnan(w)]))


def test_float16_sum_accumulates_like_numpy(device):
    x = np.random.default_rng(3).uniform(0, 1, 4096).astype(np.float16)
    got = np.asarray(pj.prepare(device=device)(lambda x: x.sum())(x))
    assert got.dtype == np.float16
    assert abs(float(got) - float(x.astype(np.float64).sum())) <= 2 * float(np.spacing(x.sum()))
