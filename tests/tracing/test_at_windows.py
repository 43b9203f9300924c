"""`x.at[window].set(v)` where the window's length depends on vars (`pos:pos + k` with v of length k): NumPy clips
the window at the end and takes updates that fit it (their length, or 1); anything else raises
pj.IndexBoundError on that call, checked before anything runs, and the prepared function keeps working."""
import numpy as np
import pytest

import prepjit as pj
from tests.guard_pages import guarded
from tests.helpers import assert_matches

f32 = np.float32
SPEC = dict(vars={"n": (0, 12), "k": (0, 8), "pos": (-12, 15)}, shapes={"x": ("n",), "v": ("k",)})

WINDOWS = {  # name: (the traced update, the same window as a NumPy slice of pos and k)
    "pos:pos+k": (lambda x, v, pos: x.at[pos:pos + v.shape[0]].set(v), lambda p, k: slice(p, p + k)),
    "pos:": (lambda x, v, pos: x.at[pos:].set(v), lambda p, k: slice(p, None)),
    ":pos": (lambda x, v, pos: x.at[:pos].set(v), lambda p, k: slice(None, p)),
    "pos:pos+2k:2": (lambda x, v, pos: x.at[pos:pos + 2 * v.shape[0]:2].set(v), lambda p, k: slice(p, p + 2 * k, 2)),
    "pos::-1": (lambda x, v, pos: x.at[pos::-1].set(v), lambda p, k: slice(p, None, -1)),
}


def numpy_update(x, v, pos, window):
    out = x.copy()
    out[window(pos, len(v))] = v  # ValueError when v does not fit the clipped window
    return out


@pytest.mark.parametrize("name", list(WINDOWS))
def test_windows_match_numpy_or_raise_index_bound_error(name):
    traced, window = WINDOWS[name]
    f = pj.prepare(traced, **SPEC)
    for n in (0, 1, 5, 10):
        for k in (0, 1, 2, 3):
            for pos in sorted({-12, -3, -1, 0, 2, n - k, n - 1, n, n + 1, 15}):
                x, v = guarded(np.arange(n, dtype=f32)), guarded(np.arange(1, k + 1, dtype=f32))
                try:
                    want = numpy_update(np.asarray(x), np.asarray(v), pos, window)
                except ValueError:
                    with pytest.raises(pj.IndexBoundError, match="NumPy: the updates must fit the window"):
                        f(x, v, pos)
                    continue
                assert_matches(f(x, v, pos), want)
    assert f.stats["traces"] == 1


def test_the_error_names_the_constraint_and_the_function_keeps_working(device):
    f = pj.prepare(lambda x, v, pos: x.at[pos:pos + v.shape[0]].add(v), vars={"k": (0, 8), "pos": (0, 15)},
                   shapes={"v": ("k",)}, device=device)
    x = np.zeros(10, f32)
    with pytest.raises(pj.IndexBoundError, match=r"x\.at\[pos:\(k\+pos\)\] .* the constraint \(k\+pos\) <= 10 or "
                                                 r"k <= 1 does not hold for k = 3 \(from v\.shape\[0\]\), pos = 9"):
        f(x, np.ones(3, f32), 9)
    want = x.copy()
    want[7:10] += 1
    assert_matches(f(x, np.ones(3, f32), 7), want)
    assert_matches(f(x, np.ones(1, f32), 12), x)  # one update past the end: NumPy broadcasts it to nothing
    assert_matches(f(x, np.ones(0, f32), 15), x)


def test_a_full_window_and_ops_other_than_set():
    x = np.arange(10, dtype=f32)
    for how, ufunc in (("add", np.add), ("multiply", np.multiply), ("min", np.minimum), ("max", np.maximum)):
        f = pj.prepare(lambda x, v, pos: getattr(x.at[pos:pos + v.shape[0]], how)(v),
                       vars={"k": (0, 10), "pos": (0, 15)}, shapes={"v": ("k",)})
        for k, pos in ((10, 0), (3, 4), (0, 15)):
            v = np.full(k, 4.5, f32)
            want = x.copy()
            want[pos:pos + k] = ufunc(want[pos:pos + k], v)
            assert_matches(f(x, v, pos), want)


def test_two_dims_and_broadcast_updates():
    f = pj.prepare(lambda x, v, pos: x.at[1:, pos:pos + v.shape[-1]].set(v), vars={"k": (0, 4), "pos": (0, 6)},
                   shapes={"v": (None, "k")})
    x = np.zeros((3, 5), f32)
    for v in (np.ones((2, 2), f32), np.ones((1, 3), f32)):
        want = x.copy()
        want[1:, 2:2 + v.shape[1]] = v
        assert_matches(f(x, v, 2), want)
    with pytest.raises(pj.IndexBoundError, match=r"axis 1"):
        f(x, np.ones((2, 3), f32), 4)


def test_an_empty_static_axis():
    f = pj.prepare(lambda x, v, pos: x.at[pos:pos + v.shape[0]].set(v), vars={"k": (0, 3), "pos": (0, 3)},
                   shapes={"v": ("k",)})
    empty = guarded(np.zeros(0, f32))
    for pos in (0, 3):
        assert_matches(f(empty, guarded(np.zeros(0, f32)), pos), np.zeros(0, f32))
        assert_matches(f(empty, guarded(np.ones(1, f32)), pos), np.zeros(0, f32))
    with pytest.raises(pj.IndexBoundError):
        f(empty, guarded(np.ones(2, f32)), 0)


def test_inside_a_long_fori_loop_the_constraint_is_checked_at_its_ends():
    """(i + k) <= n or k <= 1 is linear in the loop counter where it depends on it: checked at i = 0 and i = 4999,
    not one iteration at a time (5,000 would be refused)."""
    f = pj.prepare(lambda x, v: pj.fori_loop(0, 5000, lambda i, x: x.at[i:i + v.shape[0]].add(v), x),
                   vars={"k": (0, 3)}, shapes={"v": ("k",)})
    x = np.zeros(5000, f32)
    assert_matches(f(x, np.ones(1, f32)), np.ones(5000, f32))
    with pytest.raises(pj.IndexBoundError, match="for i = 4999 does not hold for k = 2"):
        f(x, np.ones(2, f32))
    assert_matches(f(x, np.ones(0, f32)), x)


def test_gradient_through_a_window():
    def loss(x, v, pos):
        return (x.at[pos:pos + v.shape[0]].set(v * v) ** 2).sum()
    g = pj.prepare(pj.grad(loss, argnums=(0, 1)), vars={"k": (0, 8), "pos": (0, 15)}, shapes={"v": ("k",)})
    x, v = np.ones(10, f32), np.arange(1, 4, dtype=f32)
    gx, gv = g(x, v, 2)
    want_gx = 2 * x
    want_gx[2:5] = 0
    assert_matches(gx, want_gx)
    assert_matches(gv, 4 * v ** 3)


def test_a_saved_plan_keeps_the_constraint(tmp_path):
    f = pj.prepare(lambda x, v, pos: x.at[pos:pos + v.shape[0]].set(v), vars={"k": (0, 8), "pos": (0, 15)},
                   shapes={"v": ("k",)})
    path = str(tmp_path / "window.pjplan")
    f.save(path, np.zeros(10, f32), np.ones(2, f32), 1)
    for g in (pj.load(path), pj.load(path, recompile=True)):
        with pytest.raises(pj.IndexBoundError):
            g(np.zeros(10, f32), np.ones(3, f32), 8)
        assert_matches(g(np.zeros(10, f32), np.ones(3, f32), 7), np.array([0] * 7 + [1] * 3, f32))


def test_reads_of_a_var_window_still_clip():
    f = pj.prepare(lambda x, pos, k: x[pos:pos + k], vars={"k": (0, 8), "pos": (0, 15)})
    x = np.arange(10, dtype=f32)
    for pos, k in ((2, 3), (8, 5), (15, 2)):
        assert_matches(f(x, pos, k), x[pos:pos + k])
