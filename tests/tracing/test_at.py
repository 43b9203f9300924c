"""Functional updates `x.at[idx].set/add/multiply/min/max(v)` against NumPy (assignment, np.add.at, np.minimum.at)."""
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from tests.guard_pages import guarded
from tests.helpers import assert_matches

RNG = np.random.default_rng(0)
X = RNG.standard_normal((5, 4, 3)).astype(np.float32)
IDS = np.array([0, 3, 3, -1, 1, 3], dtype=np.int64)  # repeats and a negative id
UFUNC = {"add": np.add, "multiply": np.multiply, "min": np.minimum, "max": np.maximum}


def reference(x, key, v, how):
    out = x.copy()
    if how == "set":
        out[key] = v
    else:
        UFUNC[how].at(out, key, v)
    return out


@pytest.mark.parametrize("how", ["set", "add", "multiply", "min", "max"])
def test_integer_array_with_repeats(how, device):
    v = RNG.standard_normal((6, 4, 3)).astype(np.float32)
    f = pj.prepare(lambda x, ids, v: getattr(x.at[ids], how)(v), device=device)
    out = f(X, IDS, v)
    if how == "set":  # repeated ids: one of the updates wins, element by element (JAX leaves the order undefined;
        got = np.asarray(out)  # on a GPU the elements of one row are written by different work-items)
        for i in set(IDS % 5):
            candidates = v[np.flatnonzero(IDS % 5 == i)]
            assert ((got[i] == candidates).any(axis=0)).all(), (got[i], candidates)
        np.testing.assert_array_equal(got[2], X[2])
    else:
        assert_matches(out, reference(X, IDS, v, how))


@pytest.mark.parametrize("key", [
    (1,), (-1, 2), (slice(1, 4),), (slice(None, None, 2), slice(None), 1), (Ellipsis, 0), (slice(None), None, 2),
    (slice(4, 0, -2), slice(1, None)), (IDS, slice(None), 1), (slice(None), np.array([1, 1, 0]), 2),
    (np.array([0, 4, 4]), np.array([3, 3, 3])), (np.array([[0], [4]]), slice(None), np.array([2, 2, 1])),
])
@pytest.mark.parametrize("how", ["set", "add"])
def test_index_kinds_match_numpy(key, how, device):
    shape = X[key].shape
    v = RNG.standard_normal(shape).astype(np.float32)
    arrays = [i for i, k in enumerate(key) if isinstance(k, np.ndarray)]

    def fn(x, v, *arr):
        k = list(key)
        for i, a in zip(arrays, arr):
            k[i] = a
        return getattr(x.at[tuple(k)], how)(v)

    out = pj.prepare(fn, device=device)(X, v, *[key[i] for i in arrays])
    ids_unique = all(len(np.unique(key[i])) == key[i].size for i in arrays)
    if how == "set" and not ids_unique:
        return  # which duplicate wins is unspecified
    assert_matches(out, reference(X, key, v, how))


def test_values_broadcast_and_cast_as_jax():
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    f = pj.prepare(lambda x: (x.at[1].set(2.7), x.at[:, 1:3].add(np.float32(1.5)), x.at[0].multiply(-1)))
    a, b, c = f(x)
    ref_a, ref_b, ref_c = x.copy(), x.copy(), x.copy()
    ref_a[1] = 2
    ref_b[:, 1:3] += 1
    ref_c[0] *= -1
    assert_matches(a, ref_a)
    assert_matches(b, ref_b)
    assert_matches(c, ref_c)
    g = pj.prepare(lambda x, row: x.at[2].set(row))
    assert_matches(g(x, np.array([[9, 8, 7, 6]], np.int32)), np.concatenate([x[:2], [[9, 8, 7, 6]]]).astype(np.int32))
    with pytest.raises(OverflowError):
        pj.prepare(lambda x: x.at[0].set(2**40))(x)
    with pytest.raises(ValueError):
        pj.prepare(lambda x, v: x.at[0].set(v))(x, np.ones(3, np.int32))


def test_bool_and_integer_dtypes():
    b = np.zeros(5, bool)
    ids = np.array([1, 1, 3])
    out = pj.prepare(lambda b, ids: (b.at[ids].add(True), b.at[ids].set(True).at[1].multiply(False)))(b, ids)
    ref = b.copy()
    np.add.at(ref, ids, True)
    assert_matches(out[0], ref)
    assert_matches(out[1], np.array([0, 0, 0, 1, 0], bool))
    i = np.arange(6, dtype=np.int64)
    assert_matches(pj.prepare(lambda i, ids: i.at[ids].min(-i[:3]))(i, ids), np.array([0, -1, 2, -2, 4, 5]))


def test_float16_accumulates_in_half_like_numpy():
    h = np.zeros(3, np.float16)
    ids = np.zeros(300, np.int64)
    v = np.full(300, 0.1, np.float16)
    ref = h.copy()
    np.add.at(ref, ids, v)
    assert_matches(pj.prepare(lambda h, ids, v: h.at[ids].add(v))(h, ids, v), ref, rtol=0, atol=0)


def test_chained_updates_write_one_buffer_and_intermediates_are_untouched():
    def f(x, ids, v):
        y = x * 2
        z = y.at[ids].add(v).at[0].set(0.0)
        return z, y.sum()

    v = np.ones((6, 4, 3), np.float32)
    z, s = pj.prepare(f)(X, IDS, v)
    ref = reference(X * 2, IDS, v, "add")
    ref[0] = 0
    assert_matches(z, ref)
    assert_matches(s, (X * 2).sum(), rtol=1e-4)


def test_symbolic_shapes_one_plan(device):
    f = pj.prepare(lambda x, ids, v, pos: (x.at[ids].add(v), x.at[pos].set(v[0])), device=device,
                   vars={"n": (1, 16), "k": (0, 8), "pos": (0, 15)}, shapes={"x": ("n", 3), "ids": ("k",), "v": ("k", 3)})
    for n, k in [(4, 2), (9, 7), (1, 5)]:
        x = RNG.standard_normal((n, 3)).astype(np.float32)
        ids = RNG.integers(-n, n, k)
        v = RNG.standard_normal((k, 3)).astype(np.float32)
        a, b = f(x, ids, v, n - 1)
        assert_matches(a, reference(x, ids, v, "add"))
        assert_matches(b, reference(x, n - 1, v[0], "set"))
    assert f.stats["traces"] == 1


def test_out_of_range_ids_raise_and_the_function_keeps_working(device):
    f = pj.prepare(lambda x, ids, v: x.at[ids].add(v), vars={"k": (1, 8)}, shapes={"ids": ("k",), "v": ("k", 4, 3)},
                   device=device)
    v = np.ones((3, 4, 3), np.float32)
    for bad in ([0, 5, 1], [-6, 0, 0]):
        with pytest.raises(pj.IndexBoundError):
            f(X, np.array(bad), v)
    assert_matches(f(X, np.array([4, -5, 0]), v), reference(X, np.array([4, -5, 0]), v, "add"))
    with pytest.raises(pj.IndexBoundError):
        pj.prepare(lambda x: x.at[7].set(0.0))(X)
    g = pj.prepare(lambda x, i: x.at[i].set(0.0))
    with pytest.raises(pj.IndexBoundError):
        g(X, 5)
    assert_matches(g(X, -5), reference(X, 0, 0.0, "set"))


@pytest.mark.parametrize("mode", ["drop", "promise_in_bounds", "clip", "wrap"])
def test_jax_modes(mode):
    ids = np.array([0, 7, -9, 2])
    v = np.arange(1, 5, dtype=np.float32)
    x = np.zeros(5, np.float32)
    out = pj.prepare(lambda x, ids, v: x.at[ids].add(v, mode=mode))(x, ids, v)
    ref = x.copy()
    if mode == "clip":
        np.add.at(ref, np.clip(np.where(ids < 0, ids + 5, ids), 0, 4), v)
    elif mode == "wrap":
        np.add.at(ref, ids % 5, v)
    else:
        keep = (ids >= -5) & (ids < 5)
        np.add.at(ref, ids[keep], v[keep])
    if mode == "promise_in_bounds":  # out-of-range updates are the caller's promise broken: only check the rest
        np.testing.assert_array_equal(np.asarray(out)[[0, 2]], ref[[0, 2]])
    else:
        assert_matches(out, ref)
    with pytest.raises(ValueError):
        pj.prepare(lambda x: x.at[0].set(1.0, mode="bogus"))(x)


def test_empty_arrays_touch_nothing(device):
    spec = dict(vars={"n": (0, 8), "k": (0, 8)}, shapes={"x": ("n",), "ids": ("k",), "v": ("k",)}, device=device)
    f = pj.prepare(lambda x, ids, v: x.at[ids].add(v), **spec)
    empty = guarded(np.zeros(0, np.float32))
    assert_matches(f(guarded(np.ones(3, np.float32)), guarded(np.zeros(0, np.int64)), empty), np.ones(3, np.float32))
    with pytest.raises(pj.IndexBoundError):  # a non-empty update of an empty array: every id is out of range
        f(empty, guarded(np.zeros(2, np.int64)), guarded(np.ones(2, np.float32)))
    g = pj.prepare(lambda x, ids, v: x.at[ids].add(v, mode="drop"), **spec)
    assert_matches(g(empty, guarded(np.zeros(2, np.int64)), guarded(np.ones(2, np.float32))), np.zeros(0, np.float32))


def test_inside_fori_loop(device):
    def f(x):
        return pj.fori_loop(0, 4, lambda i, acc: acc.at[i].add(i.astype(pnp.float32)), x)
    assert_matches(pj.prepare(f, device=device)(np.zeros(6, np.float32)), np.array([0, 1, 2, 3, 0, 0], np.float32))


def test_item_assignment_points_at_functional_updates():
    def f(x):
        x[0] = 1.0
        return x
    with pytest.raises(pj.TraceError, match=r"x.at\[idx\].set"):
        pj.prepare(f)(X)


def test_saved_plan_with_updates_loads_and_recompiles(tmp_path):
    f = pj.prepare(lambda x, ids, v: x.at[ids].add(v), vars={"k": (1, 8)}, shapes={"ids": ("k",), "v": ("k", 4, 3)})
    path = str(tmp_path / "at.pjplan")
    f.save(path, X, IDS, np.ones((6, 4, 3), np.float32))
    ids, v = np.array([2, 2, -5]), np.full((3, 4, 3), 0.5, np.float32)
    for g in (pj.load(path), pj.load(path, recompile=True)):  # recompile: the kernels' ASTs proven again
        assert_matches(g(X, ids, v), reference(X, ids, v, "add"))
        with pytest.raises(pj.IndexBoundError):
            g(X, np.array([5]), v[:1])


def test_get_is_indexing():
    f = pj.prepare(lambda x, ids: (x.at[1:3].get(), x.at[ids].get(mode="fill", fill_value=-1.0)))
    a, b = f(X, np.array([0, 9]))
    assert_matches(a, X[1:3])
    assert_matches(b, np.stack([X[0], np.full((4, 3), -1, np.float32)]))


@pytest.mark.parametrize("axis", ["static", "symbolic"])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint32, np.uint64, np.int8], ids=lambda d: np.dtype(d).name)
def test_index_arrays_of_every_integer_dtype(dtype, axis, device):
    """Unsigned ids (never negative, as JAX reads them) and narrow signed ones on an axis longer than their
    dtype's range: each mode's rule is applied in a dtype that holds every id and size, uint64's largest too."""
    spec = dict(vars={"n": (1, 400), "k": (1, 8)}, shapes={"x": ("n",), "ids": ("k",), "v": ("k",)}) \
        if axis == "symbolic" else {}
    x = np.zeros(300, np.float32)
    info = np.iinfo(dtype)
    valid = np.array([0, min(info.max, 299), 3, 3] + ([-1, info.min] if info.min < 0 else []), dtype)
    v = np.arange(1, len(valid) + 1, dtype=np.float32)
    assert_matches(pj.prepare(lambda x, ids, v: x.at[ids].add(v), device=device, **spec)(x, valid, v),
                   reference(x, valid.astype(np.int64), v, "add"))
    if info.min < 0:
        return
    x = np.zeros(200, np.float32)  # shorter than uint8's range
    ids = np.array([5, 200, 199, info.max] + ([2**63, 2**64 - 1] if dtype == np.uint64 else []), dtype)
    v = np.arange(1, len(ids) + 1, dtype=np.float32)
    update = lambda mode: pj.prepare(lambda x, ids, v: x.at[ids].add(v, mode=mode), device=device, **spec)(x, ids, v)
    with pytest.raises(pj.IndexBoundError):
        update(None)
    big = ids.astype(object)  # the ids as Python ints
    for mode, at in (("drop", [i for i in big if i < 200]), ("clip", [min(i, 199) for i in big]),
                     ("wrap", [i % 200 for i in big])):
        keep = [i for i, j in enumerate(big) if mode != "drop" or j < 200]
        assert_matches(update(mode), reference(x, np.array(at, np.int64), v[keep], "add"))
