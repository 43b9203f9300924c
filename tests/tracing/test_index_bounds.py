"""Hostile indices: every case ends in NumPy's result or pj.IndexBoundError / ValueError with a clear message, the
prepared function keeps working afterwards, and no kernel reads outside an argument (inputs sit right before a
PROT_NONE guard page, so an out-of-bounds read crashes the run instead of passing unnoticed)."""
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from tests.guard_pages import guarded
from tests.helpers import assert_matches


def rows(n, cols=4, dtype=np.float32):
    return guarded(np.arange(n * cols, dtype=dtype).reshape(n, cols) + 1)


def raises_index(f, *args, match=None):
    with pytest.raises(pj.IndexBoundError, match=match) as info:
        f(*args)
    assert isinstance(info.value, IndexError)
    return str(info.value)


# ---- index constraints on vars ----
def test_symbolic_index_past_the_end_raises_every_call_then_works(device):
    f = pj.prepare(vars={"n": (0, 8), "pos": (0, 10)}, shapes={"x": ("n", 4)}, device=device)(lambda x, pos: x[pos] * 2)
    x = rows(3)
    assert_matches(f(x, 1), x[1] * 2)
    assert_matches(f(x, 1), x[1] * 2)  # the fast path has learnt this call
    for _ in range(3):  # every call is checked, the fast path's included
        msg = raises_index(f, x, 6)
        assert "pos < n" in msg and "pos = 6" in msg and "n = 3" in msg and "x.shape[0]" in msg, msg
    assert_matches(f(x, 2), x[2] * 2)
    assert f.stats["traces"] == 1


def test_symbolic_index_on_an_empty_axis_raises(device):
    f = pj.prepare(vars={"n": (0, 8), "pos": (0, 10)}, shapes={"x": ("n", 4)}, device=device)(lambda x, pos: x[pos] * 2)
    raises_index(f, rows(0), 0, match="pos < n")
    assert_matches(f(rows(5), 4), rows(5)[4] * 2)


def test_negative_symbolic_index_counts_from_the_end(device):
    f = pj.prepare(vars={"n": (0, 8), "pos": (-9, 9)}, shapes={"x": ("n", 4)}, device=device)(lambda x, pos: x[pos] + 1)
    x = rows(5)
    for pos in (-5, -1, 0, 4):
        assert_matches(f(x, pos), x[pos] + 1)
    raises_index(f, x, -6, match="-n <= pos")
    raises_index(f, x, 5, match="pos < n")
    assert_matches(f(x, -2), x[-2] + 1)


@pytest.mark.parametrize("n", [0, 1, 2])
def test_static_index_on_a_symbolic_dim_is_a_constraint(device, n):
    f = pj.prepare(vars={"n": (0, 8)}, shapes={"x": ("n", 4)}, device=device)(lambda x: x[2] * 2)
    raises_index(f, rows(n), match="2 < n")
    assert_matches(f(rows(3)), rows(3)[2] * 2)


def test_negative_static_index_on_a_symbolic_dim(device):
    f = pj.prepare(vars={"n": (0, 8)}, shapes={"x": ("n",)}, device=device)(lambda x: x[-2] + 0)
    assert_matches(f(guarded(np.arange(5.0))), np.float64(3.0))
    raises_index(f, guarded(np.arange(1.0)), match="-n <= -2")


def test_static_index_out_of_range_raises_at_trace_time():
    with pytest.raises(pj.IndexBoundError, match="out of bounds"):
        pj.prepare(lambda x: x[4])(np.zeros(4, np.float32))
    with pytest.raises(pj.IndexBoundError, match="never holds"):  # no n in bounds makes x[9] valid
        pj.prepare(vars={"n": (0, 8)}, shapes={"x": ("n",)})(lambda x: x[9])(np.zeros(4, np.float32))


def test_constraints_the_var_bounds_prove_are_dropped():
    f = pj.prepare(vars={"n": (3, 8), "pos": (0, 2)}, shapes={"x": ("n",)})(lambda x, pos: x[pos] + 1)
    x = np.arange(4, dtype=np.float32)
    assert f.plan(x, 1).constraints == ()
    g = pj.prepare(vars={"n": (0, 8), "pos": (0, 2)}, shapes={"x": ("n",)})(lambda x, pos: x[pos] + 1)
    assert [c.text for c in g.plan(x, 1).constraints] == ["pos < n"]


def test_fori_loop_index_past_the_end_raises(device):
    def body(i, acc, x):
        return acc + x[i]
    f = pj.prepare(vars={"n": (0, 8)}, shapes={"x": ("n",)}, device=device)(
        lambda x: pj.fori_loop(0, 4, lambda i, c: body(i, c, x), pnp.zeros((), np.float32)))
    raises_index(f, guarded(np.ones(2, np.float32)), match="i = 3")
    raises_index(f, guarded(np.ones(0, np.float32)))
    x = guarded(np.arange(6, dtype=np.float32))
    assert_matches(f(x), np.float32(x[:4].sum()))


def test_execute_with_vars_checks_the_constraints():
    f = pj.prepare(vars={"n": (0, 8), "pos": (0, 10)}, shapes={"x": ("n",)})(lambda x, pos: x[pos] + 1)
    plan = f.plan(np.arange(5, dtype=np.float32), 1)
    with pytest.raises(pj.IndexBoundError, match="pos < n"):
        plan.execute_with_vars({"n": 5, "pos": 7})
    plan.write_input(0, np.arange(5, dtype=np.float32))
    plan.execute_with_vars({"n": 5, "pos": 3})
    assert plan.read_output(0) == 4


# ---- scalar vars and their bounds ----
def test_unused_scalar_var_is_bound_checked_on_every_call(device):
    f = pj.prepare(vars={"pos": (0, 10)}, device=device)(lambda x, pos: x * 2)
    x = np.ones(3, np.float32)
    assert_matches(f(x, 1), x * 2)
    assert_matches(f(x, 1), x * 2)
    for bad in (11, -1, 10**30):
        with pytest.raises(pj.VarBoundError, match="outside its bounds"):
            f(x, bad)
    assert_matches(f(x, 10), x * 2)


def test_var_bounds_beyond_int64_are_refused():
    with pytest.raises(ValueError, match="int64"):
        pj.Var("n", 0, 2**63)
    with pytest.raises(ValueError, match="int64"):
        pj.prepare(vars={"n": (-2**64, 4)})(lambda x: x)


# ---- gathers ----
def test_gather_with_an_out_of_range_id_raises_and_returns_nothing(device):
    f = pj.prepare(vars={"n": (0, 8)}, shapes={"t": ("n", 4), "ids": (3,)}, device=device)(lambda t, ids: t[ids] * 2)
    t = rows(8)
    for _ in range(2):
        raises_index(f, t, guarded(np.array([0, 9, 2], np.int32)), match="out of range")
    good = guarded(np.array([0, -8, 7], np.int32))  # -n <= id < n, negatives wrap once
    assert_matches(f(t, good), t[good] * 2)
    assert_matches(f(t, good), t[good] * 2)
    raises_index(f, t, guarded(np.array([0, -9, 2], np.int32)))
    raises_index(f, rows(0), guarded(np.array([0, 0, 0], np.int32)))  # NumPy: index 0 is out of bounds
    assert_matches(f(t, good), t[good] * 2)


def test_gather_of_no_ids_from_an_empty_table(device):
    f = pj.prepare(vars={"n": (0, 8), "k": (0, 4)}, shapes={"t": ("n", 4), "ids": ("k",)}, device=device)(
        lambda t, ids: t[ids] + 1)
    empty_ids = guarded(np.zeros(0, np.int64))
    assert_matches(f(rows(0), empty_ids), rows(0)[empty_ids] + 1)
    assert_matches(f(rows(3), guarded(np.array([2, 0], np.int64))), rows(3)[[2, 0]] + 1)


@pytest.mark.parametrize("mode", ["clip", "wrap"])
def test_take_modes_match_numpy(device, mode):
    f = pj.prepare(vars={"n": (0, 8)}, shapes={"t": ("n",), "ids": (5,)}, device=device)(
        lambda t, ids: pnp.take(t, ids, mode=mode) * 2)
    t, ids = guarded(np.arange(6, dtype=np.float32)), guarded(np.array([-9, -1, 0, 5, 11], np.int32))
    assert_matches(f(t, ids), np.take(t, ids, mode=mode) * 2)
    with pytest.raises(IndexError):  # NumPy's error, for the same reason
        np.take(np.zeros(0, np.float32), ids, mode=mode)
    raises_index(f, guarded(np.zeros(0, np.float32)), ids, match="empty axis")
    assert_matches(f(t, ids), np.take(t, ids, mode=mode) * 2)


def test_take_fill_mode(device):
    f = pj.prepare(vars={"n": (0, 8)}, shapes={"t": ("n",), "ids": (4,)}, device=device)(
        lambda t, ids: pnp.take(t, ids, mode="fill", fill_value=-1.0))
    ids = guarded(np.array([-7, -1, 2, 6], np.int32))
    t = guarded(np.arange(6, dtype=np.float32))
    assert_matches(f(t, ids), np.array([-1, 5, 2, -1], np.float32))
    assert_matches(f(guarded(np.zeros(0, np.float32)), ids), np.full(4, -1, np.float32))


def test_take_fill_mode_with_a_scalar_var_index(device):
    f = pj.prepare(vars={"n": (0, 6), "i": (-9, 9)}, shapes={"t": (2, "n")}, device=device)(
        lambda t, i: pnp.take(t, i, axis=1, mode="fill", fill_value=-1.0))
    for n in (0, 1, 6):
        t = guarded(np.arange(2 * n, dtype=np.float32).reshape(2, n))
        for i in (-9, -n - 1, -1, 0, n - 1, n, 9):
            want = t[:, i] if -n <= i < n else np.full(2, -1, np.float32)
            assert_matches(f(t, i), want)
    assert f.stats["traces"] == 1


def test_take_along_axis_out_of_range_and_empty(device):
    f = pj.prepare(vars={"n": (0, 8)}, shapes={"a": (3, "n"), "ids": (3, 1)}, device=device)(
        lambda a, ids: pnp.take_along_axis(a, ids, 1) * 2)
    a = guarded(np.arange(12, dtype=np.float32).reshape(3, 4))
    ids = guarded(np.array([[0], [3], [-4]], np.int64))
    assert_matches(f(a, ids), np.take_along_axis(a, ids, 1) * 2)
    raises_index(f, a, guarded(np.array([[0], [4], [1]], np.int64)))
    raises_index(f, guarded(np.zeros((3, 0), np.float32)), guarded(np.zeros((3, 1), np.int64)))
    assert_matches(f(a, ids), np.take_along_axis(a, ids, 1) * 2)


def test_gather_inside_fori_loop_flags_out_of_range_ids(device):
    f = pj.prepare(vars={"n": (0, 8)}, shapes={"t": ("n",), "ids": (3,)}, device=device)(
        lambda t, ids: pj.fori_loop(0, 2, lambda i, c: c + t[ids], pnp.zeros(3, np.float32)))
    t = guarded(np.arange(4, dtype=np.float32))
    raises_index(f, t, guarded(np.array([0, 4, 1], np.int32)), match="fori_loop")
    ids = guarded(np.array([3, 0, -1], np.int32))
    assert_matches(f(t, ids), 2 * t[ids])


# ---- empty arguments: computed like NumPy, nothing read outside them ----
def test_pad_with_a_symbolic_width_of_an_empty_array(device):
    f = pj.prepare(vars={"n": (0, 8), "w": (0, 3)}, shapes={"x": ("n",)}, device=device)(
        lambda x, w: pnp.pad(x, (w, w)) + 1)
    for n, w in ((0, 2), (0, 0), (3, 1), (1, 3)):
        x = guarded(np.arange(n, dtype=np.float32))
        assert_matches(f(x, w), np.pad(x, (w, w)) + 1)


def test_concatenate_with_an_empty_block(device):
    f = pj.prepare(vars={"n": (0, 8)}, shapes={"x": ("n",), "y": (3,)}, device=device)(
        lambda x, y: pnp.concatenate([x, y, x]) + 1)
    for n in (0, 2):
        x, y = guarded(np.arange(n, dtype=np.float32)), guarded(np.ones(3, np.float32))
        assert_matches(f(x, y), np.concatenate([x, y, x]) + 1)


# ---- the bounds proof ----
def test_every_access_is_proven_and_counted():
    f = pj.prepare(vars={"n": (0, 8), "pos": (0, 10)}, shapes={"x": ("n", 4)})(lambda x, pos: x[pos] * 2 + x.sum())
    x = rows(3)
    f(x, 1)
    plan = f.plan(x, 1)
    assert plan.proven_accesses >= 3  # one kernel (the sum is its prologue): its two loads and its store
    assert f.stats["proven_accesses"] == plan.proven_accesses


def test_take_checks_ids_only_when_numpy_does(device):
    """NumPy's take reads (and checks) no id when the dims before its axis hold no element."""
    f = pj.prepare(vars={"n": (0, 4), "k": (0, 4)}, shapes={"a": ("n", "k"), "ids": (3,)}, device=device)(
        lambda a, ids: pnp.take(a, ids, axis=1))
    ids = guarded(np.array([0, 5, -9], np.int64))
    empty = guarded(np.zeros((0, 0), np.float32))
    assert_matches(f(empty, ids), np.take(empty, ids, axis=1))
    with pytest.raises(IndexError):
        np.take(np.zeros((2, 0), np.float32), ids, axis=1)
    raises_index(f, guarded(np.zeros((2, 0), np.float32)), ids)
    a = guarded(np.arange(8, dtype=np.float32).reshape(2, 4))
    ok = guarded(np.array([0, 3, -4], np.int64))
    assert_matches(f(a, ok), np.take(a, ok, axis=1))
