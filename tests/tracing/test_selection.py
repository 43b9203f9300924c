"""pnp.searchsorted, and the static-size (JAX) unique, nonzero, flatnonzero, argwhere and one-argument where,
against NumPy padded as JAX pads."""
import functools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import prepjit as pj
import prepjit.numpy as pnp
from tests.helpers import assert_matches


def _padded(values: np.ndarray, size: int, fill) -> np.ndarray:
    out = np.full(size, fill, values.dtype)
    out[:min(size, len(values))] = values[:size]
    return out


def test_searchsorted_sides_nans_and_sorter(device, rng):
    a = np.sort(rng.integers(0, 20, 33)).astype(np.float32)
    a[-3:] = np.nan
    v = np.array([[-1, 0, 5, 5.5, 19, 100, np.nan, -np.inf]], np.float32)
    perm = rng.permutation(33)
    shuffled = a[np.argsort(perm)]
    f = pj.prepare(lambda a, v, s, p: (pnp.searchsorted(a, v), pnp.searchsorted(a, v, side="right"),
                                       a.searchsorted(3.0), pnp.searchsorted(s, v, sorter=p)), device=device)
    left, right, scalar, sorted_by = f(a, v, shuffled, np.argsort(shuffled, kind="stable"))
    assert_matches(left, np.searchsorted(a, v))
    assert_matches(right, np.searchsorted(a, v, side="right"))
    assert_matches(scalar, np.searchsorted(a, 3.0))
    assert_matches(sorted_by, np.searchsorted(shuffled, v, sorter=np.argsort(shuffled, kind="stable")))


def test_searchsorted_symbolic_lengths(device, rng):
    f = pj.prepare(lambda a, v: (pnp.searchsorted(a, v), pnp.searchsorted(a, v, side="right")),
                   vars={"n": (0, 100), "m": (1, 9)}, shapes={"a": ("n",), "v": ("m",)}, device=device)
    for n, m in ((0, 3), (1, 1), (7, 9), (100, 4), (64, 2)):
        a = np.sort(rng.integers(0, 10, n)).astype(np.int32)
        v = rng.integers(-1, 11, m).astype(np.int32)
        left, right = f(a, v)
        assert_matches(left, np.searchsorted(a, v))
        assert_matches(right, np.searchsorted(a, v, side="right"))
    assert f.stats["traces"] == 1
    with pytest.raises(ValueError, match="side"):
        pj.prepare(lambda a: pnp.searchsorted(a, 1, side="middle"))(np.zeros(3))


def test_nonzero_argwhere_where_with_size(device, rng):
    x = rng.integers(0, 2, (4, 5)) * rng.integers(1, 9, (4, 5))
    f = pj.prepare(lambda x: (pnp.nonzero(x, size=25, fill_value=-1), pnp.argwhere(x, size=7), pnp.where(x > 3, size=3),
                              pnp.flatnonzero(x, size=4), x.nonzero(size=2, fill_value=(8, 9))), device=device)
    nz, aw, w, flat, meth = f(x)
    for got, ref in zip(nz, np.nonzero(x)):
        assert_matches(got, _padded(ref, 25, -1))
    assert_matches(aw, np.concatenate([np.argwhere(x), np.zeros((7, 2), np.int64)])[:7])
    for got, ref in zip(w, np.nonzero(x > 3)):
        assert_matches(got, _padded(ref, 3, 0))
    assert_matches(flat, _padded(np.flatnonzero(x), 4, 0))
    for got, ref, fill in zip(meth, np.nonzero(x), (8, 9)):
        assert_matches(got, _padded(ref, 2, fill))


@functools.lru_cache(maxsize=None)
def _symbolic_nonzero(device: str):
    return pj.prepare(lambda x: pnp.nonzero(x, size=12), vars={"r": (0, 6), "c": (1, 50)}, shapes={"x": ("r", "c")},
                      device=device)


def test_nonzero_symbolic_shape(device, rng):
    f = _symbolic_nonzero(device)
    for r, c in ((0, 3), (1, 1), (6, 50), (3, 17)):
        x = rng.random((r, c)) < 0.2
        for got, ref in zip(f(x), np.nonzero(x)):
            assert_matches(got, _padded(ref, 12, 0))
    assert f.stats["traces"] == 1


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 6), st.integers(1, 50), st.integers(0, 2 ** 32 - 1))
def test_nonzero_symbolic_random(r, c, seed):
    x = np.random.default_rng(seed).random((r, c)) < 0.1
    for got, ref in zip(_symbolic_nonzero("cpu")(x), np.nonzero(x)):
        np.testing.assert_array_equal(np.asarray(got), _padded(ref, 12, 0))


def test_unique_with_size(device, rng):
    u = rng.integers(0, 6, (3, 7)).astype(np.float64)
    u[0, :3] = np.nan
    u[1, 1] = -0.0
    f = pj.prepare(lambda u: (pnp.unique(u, return_index=True, return_inverse=True, return_counts=True, size=9),
                              pnp.unique(u, size=3, fill_value=7), pnp.unique(u, size=20, equal_nan=False,
                                                                              return_inverse=True)), device=device)
    (values, index, inverse, counts), first3, (no_eq, no_eq_inverse) = f(u)
    rv, ri, rinv, rc = np.unique(u, return_index=True, return_inverse=True, return_counts=True)
    k = len(rv)
    assert_matches(values, _padded(rv, 9, rv[0]))
    assert_matches(index, _padded(ri, 9, ri[0]))
    assert_matches(inverse, rinv)
    assert_matches(counts, _padded(rc, 9, 0))
    assert_matches(first3, rv[:3])
    nv, ninv = np.unique(u, equal_nan=False, return_inverse=True)
    assert_matches(no_eq, _padded(nv, 20, nv[0]))
    ours = np.asarray(no_eq_inverse)  # NaNs each their own value: NumPy's order among them is its sort's (unstable)
    np.testing.assert_array_equal(np.asarray(no_eq)[ours], u)
    np.testing.assert_array_equal(ours[~np.isnan(u)], ninv[~np.isnan(u)])
    assert len(set(ours[np.isnan(u)].tolist())) == np.isnan(u).sum()
    assert k < 9


def test_unique_symbolic_length(device, rng):
    f = pj.prepare(lambda x: pnp.unique(x, size=8, return_counts=True), vars={"n": (1, 300)}, shapes={"x": ("n",)},
                   device=device)
    for n in (1, 5, 300):
        x = rng.integers(0, 12, n).astype(np.int32)
        values, counts = f(x)
        rv, rc = np.unique(x, return_counts=True)
        assert_matches(values, _padded(rv, 8, rv[0]))
        assert_matches(counts, _padded(rc, 8, 0))
    assert f.stats["traces"] == 1


def test_data_dependent_sizes_need_size():
    x = np.array([0, 1, 1], np.int32)
    for fn in (pnp.unique, pnp.nonzero, pnp.argwhere, pnp.flatnonzero, pnp.where):
        with pytest.raises(pj.TraceError, match="size="):
            pj.prepare(lambda x: fn(x))(x)
    with pytest.raises(ValueError, match="both or neither"):
        pj.prepare(lambda x: pnp.where(x, x))(x)
    with pytest.raises(ValueError, match="one-argument"):
        pj.prepare(lambda x: pnp.where(x, x, x, size=2))(x)
    with pytest.raises(ValueError, match="0d"):
        pj.prepare(lambda x: pnp.nonzero(x[0], size=2))(x)
    assert_matches(pj.prepare(lambda x: pnp.where(x > 0, x, -x))(x), np.where(x > 0, x, -x))
