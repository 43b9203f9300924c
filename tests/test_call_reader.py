"""A prepared function has one reader of its calls (prepjit/jit/signature.py): a call whose concrete key is known
(the fast path, prepjit/jit/replay.py) returns what the full path returns for it, and raises the full path's error,
class and message, itself: a var out of its bounds (a scalar var, or a dim of an array whose shapes spec names a
var), vars that disagree, a broken index constraint; calls the key cannot cover (a wrong rank or static dim) take
the full path."""
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp

VARS = {"n": (1, 8), "m": (1, 5), "pos": (0, 4)}
SHAPES = {"x": ("n", 3), "y": ("m",)}


def body(xp, x, y, pos, m):
    return x[pos] * m + xp.sum(y)   # x[pos]: the index constraint pos < n; m: y.shape[0] and an argument


FAULTS = {  # call -> what a fault changes in it
    "pos below its bounds": lambda c: {"pos": -1},
    "pos above its bounds": lambda c: {"pos": VARS["pos"][1] + 1},
    "pos far above its bounds": lambda c: {"pos": 9},
    "pos outside x (pos < n broken)": lambda c: {"pos": c["rows"]},
    "m disagrees with y.shape[0]": lambda c: {"m": c["y_len"] + 1},
    "m and y.shape[0] above m's bounds": lambda c: {"m": VARS["m"][1] + 1, "y_len": VARS["m"][1] + 1},
    "m and y.shape[0] below m's bounds": lambda c: {"m": 0, "y_len": 0},
    "n above its bounds": lambda c: {"rows": VARS["n"][1] + 1},
    "n below its bounds": lambda c: {"rows": 0},
    "a static dim of x differs": lambda c: {"cols": 4},
    "x has another rank": lambda c: {"rank3": True},
}


def outcome(call):
    """("ok", the result as a NumPy array), or (the error's class, its message)."""
    try:
        return "ok", np.asarray(call())
    except (pj.PrepjitError, ValueError, TypeError, IndexError) as e:
        return type(e), str(e)


def test_known_calls_return_and_raise_what_the_full_path_does(device):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    f = pj.prepare(lambda x, y, pos, m: body(pnp, x, y, pos, m), vars=VARS, shapes=SHAPES, device=device)
    reads = []
    real_read = f.signature.read
    f.signature.read = lambda args, kwargs: reads.append(1) or real_read(args, kwargs)
    seen_fast = set()  # the outcomes the fast path gave

    # a valid call (n: 1..8, m: 1..5, pos: 0..4 and pos < n) with up to two faults
    @settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
    @given(rows=st.integers(1, 8), y_len=st.integers(1, 5), pos=st.integers(0, 4),
           faults=st.lists(st.sampled_from(sorted(FAULTS)), max_size=2))
    def check(rows, y_len, pos, faults):
        call = {"rows": rows, "cols": 3, "rank3": False, "y_len": y_len, "pos": min(pos, rows - 1), "m": y_len}
        for fault in faults:
            call.update(FAULTS[fault](call))
        rows, cols, rank3, y_len, pos, m = (call[k] for k in ("rows", "cols", "rank3", "y_len", "pos", "m"))
        x = np.arange(rows * cols, dtype=np.float32).reshape((rows, cols, 1) if rank3 else (rows, cols))
        y = np.linspace(-1, 1, y_len, dtype=np.float32)
        full = outcome(lambda: f(x=x, y=y, pos=pos, m=m))   # keyword arguments: always the full path
        known = outcome(lambda: f(x, y, 0, y_len))[0] == "ok"   # a valid call learns this key
        reads.clear()
        fast = outcome(lambda: f(x, y, pos, m))
        if known:   # the fast path answered, errors included
            assert not reads, (full, fast)
            seen_fast.add(fast[0])
        assert fast[0] is full[0] if full[0] != "ok" else fast[0] == "ok", (full, fast)
        if full[0] == "ok":
            np.testing.assert_allclose(fast[1], full[1], rtol=1e-6)
            np.testing.assert_allclose(fast[1], body(np, x, y, pos, m), rtol=1e-5, atol=1e-6)
        else:
            assert fast[1] == full[1]
    check()
    assert seen_fast >= {"ok", pj.VarBoundError, pj.SignatureError, pj.IndexBoundError}, seen_fast
    assert f.stats["traces"] == 1


def test_a_known_calls_errors_name_the_full_paths_sources(device):
    f = pj.prepare(lambda x, y, pos, m: body(pnp, x, y, pos, m), vars=VARS, shapes=SHAPES, device=device)
    x, y = np.ones((4, 3), np.float32), np.ones(2, np.float32)
    f(x, y, 1, 2)
    reads = []
    real_read = f.signature.read
    f.signature.read = lambda args, kwargs: reads.append(1) or real_read(args, kwargs)
    cases = [((x, y, 5, 2), pj.VarBoundError, r"var 'pos' = 5 \(from pos\) is outside its bounds \[0, 4\]"),
             ((x, y, 1, 3), pj.SignatureError, r"var 'm' disagrees: y.shape\[0\] = 2 but m = 3"),
             ((x, y, 4, 2), pj.IndexBoundError,
              r"the constraint pos < n does not hold for n = 4 \(from x.shape\[0\]\), pos = 4 \(from pos\)")]
    for args, error, message in cases:
        with pytest.raises(error, match=message):
            f(*args)
        np.testing.assert_allclose(np.asarray(f(x, y, 3, 2)), body(np, x, y, 3, 2))   # and the next call works
    assert not reads and f.stats["traces"] == 1   # every call above took the fast path
