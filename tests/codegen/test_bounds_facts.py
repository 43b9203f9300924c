"""The bounds proof's facts (codegen/facts.py) take bounded work: facts that bound each other end, with the
proof as strong as before. A regression here used to hang prepare, so each case runs under a deadline."""
import contextlib
import signal

import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen.facts import MAX_ATOM_BOUNDS, facts_of, linear
from prepjit.uop import Ops, UOp, dtypes, simplify
from prepjit.uop.symbolic import poly

n = UOp.variable("n", 0, 6)


@contextlib.contextmanager
def deadline(seconds: float):
    """Fail the test (instead of hanging the run) when the block takes longer than `seconds`."""
    def expired(signum, frame):
        raise TimeoutError(f"took longer than {seconds} s")
    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_facts_that_keep_bounding_their_atom_again_end():
    """x[-3:], pad 1 in front, x[-3:] on x of shape (n,): the pad gate r0 + m >= 1 (m = max(min(1, n - 2), 0)) and
    the loop's end min(4 - m, n + 1 - m) >= 1 pair into new bounds of n through the min, whose pairs give n new
    ones again (n >= m - 2, m - 4, m - 6, ...): pairing an atom's bounds over and over never ended."""
    m = simplify((n - 2).smin(1).smax(0))
    end = simplify((4 - m).smin(n + 1 - m))
    r0 = UOp(Ops.RANGE, dtypes.index, (end,), (0, "loop"))
    terms = frozenset({linear(simplify((n + 1).smin(4)), simplify(r0 + m), -1), linear(end, None, -1),
                       linear(simplify(r0 + m), None, -1)})
    with deadline(20):
        facts = facts_of(terms)
    assert all(len(lows) <= MAX_ATOM_BOUNDS and len(highs) <= MAX_ATOM_BOUNDS for lows, highs in facts.atoms.values())
    assert len(set(facts.atoms[n][0])) == len(facts.atoms[n][0])  # each bound once
    assert any(poly(b) == poly(simplify(1 - m)) for b in facts.atoms[r0][0])  # the pad gate: r0 >= 1 - m


def test_the_fuzz_program_that_hung_prepare_is_proven_and_matches_numpy(tmp_path, monkeypatch):
    """The large fuzz profile's seeds 1020 and 1024: x[-3:], pad, x[-3:], tanh on a float16 x of shape (n,)."""
    monkeypatch.setenv("PREPJIT_CACHE_DIR", str(tmp_path))  # no proof recorded on disk: the proof runs
    def program(m, x):
        x = x[-3:]
        x = m.pad(x, [(1, 0)], constant_values=0)
        return m.tanh(x[-3:])
    with deadline(60):
        f = pj.prepare(lambda x: program(pnp, x), vars={"n": (0, 6)}, shapes={"x": ("n",)})
        for size in range(7):
            x = np.linspace(-2, 2, size).astype(np.float16)
            np.testing.assert_allclose(np.asarray(f(x)), program(np, x), rtol=2e-3, atol=2e-3)
    assert f.stats["traces"] == 1 and f.stats["proven_accesses"] > 0


@pytest.mark.parametrize("room", [MAX_ATOM_BOUNDS, 0])
def test_a_dropped_bound_proves_less_never_wrongly(room, monkeypatch):
    """out[r] = x[r // 4] under the gate r // 2 < 2n needs the bound the gate gives the atom r // 2 (and through it
    r <= 4n - 1): with room for no bound the access is refused, never accepted."""
    from prepjit.codegen import facts as facts_module
    from prepjit.codegen.bounds import prove_kernel
    monkeypatch.setattr(facts_module, "MAX_ATOM_BOUNDS", room)
    facts_module.facts_of.cache_clear()
    r = UOp(Ops.RANGE, dtypes.index, (n * 8,), (0, "loop"))
    load = UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 1), r // 4, r // 2 < n * 2))
    store = UOp(Ops.STORE, dtypes.bool, (UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0), r, load))
    kernel = UOp(Ops.SINK, dtypes.bool, (store,), "E_gated")
    try:
        if room:
            assert prove_kernel(kernel, [(n * 8,), (n,)]) == 2
        else:
            with pytest.raises(pj.CompileError, match="load from buffer slot 1"):
                prove_kernel(kernel, [(n * 8,), (n,)])
    finally:
        facts_module.facts_of.cache_clear()


@pytest.mark.parametrize("work", [None, 0])
def test_a_proof_out_of_work_answers_not_proven(work, monkeypatch):
    """Each access's proof spends at most MAX_WORK (bounds worked out, sums built): one that runs out is refused
    with a CompileError saying so, never accepted (a fuzz program's proof of nested mins of n took 100 s)."""
    from prepjit.codegen import bounds
    if work is not None:
        monkeypatch.setattr(bounds, "MAX_WORK", work)
    r = UOp(Ops.RANGE, dtypes.index, (n * 8,), (0, "loop"))
    load = UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 1), r // 4, r // 2 < n * 2))
    store = UOp(Ops.STORE, dtypes.bool, (UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0), r, load))
    kernel = UOp(Ops.SINK, dtypes.bool, (store,), "E_work")
    if work is None:
        assert bounds.prove_kernel(kernel, [(n * 8,), (n,)]) == 2
    else:
        with pytest.raises(pj.CompileError, match="work limit"):
            bounds.prove_kernel(kernel, [(n * 8,), (n,)])
