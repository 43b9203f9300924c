"""Basic indexing of traced arrays (ints, slices with steps, None, ...) with static and symbolic bounds."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import prepjit as pj
import prepjit.numpy as pnp
from tests.helpers import assert_matches

X = np.arange(5 * 6 * 3, dtype=np.float32).reshape(5, 6, 3)

KEYS = [
    1, -1, (1, 2), (-2, -3, 0), slice(None), slice(1, 4), slice(None, None, 2), slice(None, None, -1),
    slice(4, 0, -2), slice(-2, None), slice(-100, 100), slice(3, 3), slice(4, 1), (slice(None), 2),
    (Ellipsis, 1), (1, Ellipsis), (None,), (None, 1, None), (slice(None, None, -2), None, slice(1, None, 2), 0),
    (Ellipsis, None), (2, slice(None, None, -3), Ellipsis),
]


@pytest.mark.parametrize("key", KEYS, ids=repr)
def test_basic_indexing_matches_numpy(key, device):
    assert_matches(pj.prepare(lambda x: x[key], device=device)(X), X[key])


def _slice_strategy(n):
    bound = st.one_of(st.none(), st.integers(-n - 2, n + 2))
    step = st.one_of(st.none(), st.integers(-3, 3).filter(lambda s: s != 0))
    return st.builds(slice, bound, bound, step)


@settings(max_examples=40, deadline=None)
@given(st.tuples(st.one_of(_slice_strategy(5), st.integers(-5, 4)), _slice_strategy(6),
                 st.one_of(_slice_strategy(3), st.just(Ellipsis), st.none())))
def test_random_slices_match_numpy(key):
    assert_matches(pj.prepare(lambda x: x[key])(X), X[key])


def test_index_errors():
    f = pj.prepare(lambda x, k: x[k])
    with pytest.raises(IndexError):
        f(X, 5)
    with pytest.raises(IndexError):
        f(X, (0, 0, 0, 0))
    with pytest.raises(IndexError):
        f(X, (Ellipsis, Ellipsis))
    with pytest.raises(ValueError):
        f(X, slice(None, None, 0))


# ---- symbolic bounds ----

V = {"n": (1, 16), "pos": (0, 15)}
SHAPES = {"x": ("n", 6)}


def xs(n):
    return np.arange(n * 6, dtype=np.float32).reshape(n, 6) - 7


SYMBOLIC = {
    "x[pos]": (lambda x, pos: x[pos], lambda n, pos: pos < n),
    "x[:, :pos+1]": (lambda x, pos: x[:, :pos + 1], None),
    "x[:pos+1]": (lambda x, pos: x[:pos + 1], None),
    "x[pos:]": (lambda x, pos: x[pos:], None),
    "x[pos:pos+2]": (lambda x, pos: x[pos:pos + 2], None),
    "x[pos::2]": (lambda x, pos: x[pos::2], None),
    "x[:pos:-1]": (lambda x, pos: x[:pos:-1], None),
    "x[::-1]": (lambda x, pos: x[::-1], None),
    "x[-1]": (lambda x, pos: x[-1], None),
    "x[1:-1, ::-2]": (lambda x, pos: x[1:-1, ::-2], None),
    "x[None, ..., pos % 6]": (lambda x, pos: x[None, ..., pos % 6], None),
    "x[n-1]": (lambda x, pos: x[x.shape[0] - 1], None),
    "x[:n//2]": (lambda x, pos: x[:x.shape[0] // 2], None),
}


@pytest.mark.parametrize("name", list(SYMBOLIC))
def test_symbolic_indexing_replays_for_many_values(name, device):
    fn, valid = SYMBOLIC[name]
    f = pj.prepare(fn, vars=V, shapes=SHAPES, device=device)
    cases = [(n, pos) for n, pos in [(1, 0), (4, 2), (16, 15), (5, 5), (3, 7), (9, 0)] if valid is None or valid(n, pos)]
    for n, pos in cases:
        assert_matches(f(xs(n), pos), fn(xs(n), pos))
    assert f.stats["traces"] == 1 and f.stats["replays"] == len(cases)


NEGATIVE_BOUNDS = {
    "x[k:]": lambda x, k: x[k:],
    "x[:k]": lambda x, k: x[:k],
    "x[k:k+3]": lambda x, k: x[k:k + 3],
    "x[k::-1]": lambda x, k: x[k::-1],
    "x[:k:-2]": lambda x, k: x[:k:-2],
}


@pytest.mark.parametrize("name", list(NEGATIVE_BOUNDS))
def test_symbolic_slice_bounds_that_may_be_negative_count_from_the_end(name, device):
    fn = NEGATIVE_BOUNDS[name]
    f = pj.prepare(fn, vars={"n": (0, 9), "k": (-12, 12)}, shapes={"x": ("n",)}, device=device)
    for n in (0, 1, 5, 9):
        x = np.arange(n, dtype=np.float32)
        for k in (-12, -9, -3, -1, 0, 2, 8, 12):
            assert_matches(f(x, k), fn(x, k))
    assert f.stats["traces"] == 1


def test_symbolic_slice_output_shape_is_symbolic():
    traced = pj.trace(pj.prepare(lambda x, pos: x[:, :pos + 1], vars=V, shapes=SHAPES), xs(3), 1)
    shape = traced.outputs[0].shape
    assert shape[0].render() == "n" and "pos" in shape[1].render()



# ---- index arrays of every integer dtype ----

ID_DTYPES = [np.uint8, np.uint32, np.uint64, np.int8]
GATHERS = {
    "x[ids]": (lambda xp, x, ids: x[ids], lambda x, ids: x[ids]),
    "take": (lambda xp, x, ids: xp.take(x, ids), lambda x, ids: x[ids]),
    "take_along_axis": (lambda xp, x, ids: xp.take_along_axis(x, ids, 0), lambda x, ids: x[ids]),
    "take fill": (lambda xp, x, ids: xp.take(x, ids, mode="fill", fill_value=-1), lambda x, ids: x[ids]),
    "take clip": (lambda xp, x, ids: xp.take(x, ids, mode="clip"), lambda x, ids: np.take(x, ids, mode="clip")),
    "take wrap": (lambda xp, x, ids: xp.take(x, ids, mode="wrap"), lambda x, ids: np.take(x, ids, mode="wrap")),
}


def _valid_ids(dtype, n):
    """In-range ids of `dtype` for an axis of n: the ends, and negatives (counting from the end) if signed."""
    hi = min(n - 1, np.iinfo(dtype).max)
    ids = [0, hi, hi // 2, min(3, hi)]
    if np.iinfo(dtype).min < 0:
        ids += [-1, max(-n, np.iinfo(dtype).min)]
    return np.array(ids, dtype)


@pytest.mark.parametrize("name", list(GATHERS))
@pytest.mark.parametrize("dtype", ID_DTYPES, ids=lambda d: np.dtype(d).name)
def test_index_arrays_of_every_integer_dtype_gather_as_numpy(name, dtype, device):
    """Unsigned ids and narrow signed ones on an axis longer than their dtype's range (static and symbolic):
    every in-range id reads its element, and the range is never compared in the id dtype."""
    fn, ref = GATHERS[name]
    static = pj.prepare(lambda x, ids: fn(pnp, x, ids), device=device)
    symbolic = pj.prepare(lambda x, ids: fn(pnp, x, ids), vars={"n": (1, 400), "k": (1, 8)},
                          shapes={"x": ("n",), "ids": ("k",)}, device=device)
    for n in (5, 300):
        x = np.arange(n, dtype=np.float32) * 2 + 1
        ids = _valid_ids(dtype, n)
        assert_matches(static(x, ids), ref(x, ids))
        assert_matches(symbolic(x, ids), ref(x, ids))


@pytest.mark.parametrize("axis", ["static", "symbolic"])
def test_unsigned_ids_out_of_range_follow_the_mode(axis, device):
    """Unsigned ids are never negative (JAX's reading; NumPy would cast uint64 ids past int64's range to
    negative ones): every one >= n is out of range, uint64's largest too."""
    spec = dict(vars={"n": (1, 16), "k": (1, 8)}, shapes={"x": ("n",), "ids": ("k",)}) if axis == "symbolic" else {}
    x = np.arange(10, dtype=np.float32) + 1
    big = np.array([3, 10, 2**63, 2**63 + 4, 2**64 - 1], np.uint64)
    for dtype in (np.uint8, np.uint32, np.uint64):
        ids = big[:2] if dtype != np.uint64 else big
        ids = ids.astype(dtype)
        for fn in (lambda x, ids: x[ids], lambda x, ids: pnp.take(x, ids),
                   lambda x, ids: pnp.take_along_axis(x, ids, 0)):
            with pytest.raises(pj.IndexBoundError):
                pj.prepare(fn, device=device, **spec)(x, ids)
        py = [int(i) for i in ids]
        take = lambda mode, **kw: pj.prepare(lambda x, ids: pnp.take(x, ids, mode=mode, **kw), device=device,
                                             **spec)(x, ids)
        assert_matches(take("fill", fill_value=-1), np.array([x[i] if i < 10 else -1 for i in py], np.float32))
        assert_matches(take("clip"), x[[min(i, 9) for i in py]])
        assert_matches(take("wrap"), x[[i % 10 for i in py]])
