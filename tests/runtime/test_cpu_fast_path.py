"""The cpu replay fast path (prepjit/jit/replay.py, runtime/cpu_replay.py) and thread-split kernels match NumPy
and keep every guarantee of the full call path. Each test counts the calls that went through the full path
(`Signature.read`), so a test of the fast path fails when its calls do not take it."""
import threading
import time

import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.runtime.array import Array
from tests.runtime.native_threads import launch_entries, published


def _f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def full_path_reads(f, monkeypatch) -> list:
    """A list that grows by one for each call of `f` that reads its signature (the full path; `f.plan` too)."""
    reads = []
    real = f.signature.read

    def read(args, kwargs):
        reads.append(args)
        return real(args, kwargs)
    monkeypatch.setattr(f.signature, "read", read)
    return reads


def test_repeated_calls_replay_and_return_fresh_outputs(rng, monkeypatch):
    f = pj.prepare(lambda a, b: a * b + 1, device="cpu")
    reads = full_path_reads(f, monkeypatch)
    a, b = _f32(rng, 16), _f32(rng, 16)
    first = f(a, b)
    second = f(b, a + 1)
    assert len(reads) == 1   # the second call replayed on the fast path, into an output of its own
    np.testing.assert_allclose(np.asarray(first), a * b + 1, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(second), b * (a + 1) + 1, rtol=1e-6)
    assert f.stats["traces"] == 1 and f.stats["replays"] == 2


def test_reduction_chain_matches_numpy(rng, monkeypatch):
    def chain(xp, a, b):
        for _ in range(10):
            a = a - xp.sum(a) * 0.01 + b
        return a
    f = pj.prepare(lambda a, b: chain(pnp, a, b), device="cpu")
    reads = full_path_reads(f, monkeypatch)
    a, b = _f32(rng, 1 << 15), _f32(rng, 1 << 15)  # past PROLOGUE_MAX: each sum is a kernel of its own
    assert len(f.plan(a, b).kernels) > 1   # a chain of kernels run back to back by one native program
    for _ in range(3):
        np.testing.assert_allclose(np.asarray(f(a, b)), chain(np, a, b), rtol=1e-5, atol=1e-6)
    assert len(reads) == 2   # f.plan and the first call


def test_symbolic_batch_and_scalar_var_checked_on_every_call(rng, monkeypatch):
    @pj.prepare(vars={"n": (1, 64), "pos": (0, 7)}, shapes={"x": ("n", 8)}, device="cpu")
    def f(x, pos):
        return x[:, :pos + 1] * 2
    reads = full_path_reads(f, monkeypatch)
    for n, pos in [(3, 2), (5, 7), (3, 0), (3, 2), (5, 1), (64, 3)]:
        x = _f32(rng, n, 8)   # another n (read from x's shape) or pos is a fast call of the first's key
        np.testing.assert_allclose(np.asarray(f(x, pos)), x[:, :pos + 1] * 2)
        assert len(reads) == 1
    with pytest.raises(pj.VarBoundError, match=r"'pos' = 8 \(from pos\) is outside its bounds \[0, 7\]"):
        f(_f32(rng, 3, 8), 8)   # the fast path raises the full path's error itself
    with pytest.raises(pj.VarBoundError, match=r"'n' = 65 \(from x.shape\[0\]\) is outside its bounds \[1, 64\]"):
        f(_f32(rng, 65, 8), 1)
    with pytest.raises(pj.SignatureError, match=r"x.shape\[1\] is 9, but shapes declares it static 8"):
        f(_f32(rng, 3, 9), 1)   # a static dim is part of the key: another one is a new key, the full path raises
    with pytest.raises(pj.SignatureError, match=r"x has rank 1"):
        f(_f32(rng, 8), 1)
    x64 = _f32(rng, 3, 8).astype(np.float64)   # another dtype: another key, a plan of its own
    assert np.asarray(f(x64, 1)).dtype == np.float64 and f.stats["traces"] == 2
    assert len(reads) == 4
    x = _f32(rng, 3, 8)
    np.testing.assert_allclose(np.asarray(f(x, 1)), x[:, :2] * 2)
    assert len(reads) == 4


def test_var_from_two_places_must_agree_on_the_fast_path(rng, monkeypatch):
    @pj.prepare(vars={"n": (1, 16)}, shapes={"x": ("n",)}, device="cpu")
    def f(x, n):
        return x * 2
    reads = full_path_reads(f, monkeypatch)
    x = _f32(rng, 4)
    f(x, 4)
    np.testing.assert_allclose(np.asarray(f(x, 4)), x * 2)
    assert len(reads) == 1
    with pytest.raises(pj.SignatureError, match=r"var 'n' disagrees: x.shape\[0\] = 4 but n = 5"):
        f(x, 5)   # the fast path refuses n=5 against x.shape[0]=4, with the full path's error
    assert len(reads) == 1


def test_kernel_vals_and_bindings_follow_fast_calls(rng, monkeypatch):
    f = pj.prepare(lambda x: x * 3, vars={"n": (1, 32)}, shapes={"x": ("n",)}, device="cpu")
    plan = f.plan(_f32(rng, 9))
    reads = full_path_reads(f, monkeypatch)
    f(_f32(rng, 5))   # the full path, then fast for every n
    for n in (5, 9, 5, 32, 5):
        x = _f32(rng, n)
        np.testing.assert_allclose(np.asarray(f(x)), x * 3, rtol=1e-6)
        assert plan.bindings == {"n": n}
        assert [list(k.vals) for k in plan.kernels if k.kernel.var_names == ("n",)] == [[n]]
    assert len(reads) == 1


def test_misaligned_and_non_contiguous_inputs(rng, monkeypatch):
    f = pj.prepare(lambda a, b: a + b, device="cpu")
    reads = full_path_reads(f, monkeypatch)
    a, b = _f32(rng, 16), _f32(rng, 16)
    plan = f.plan(a, b)
    runs = []
    run_arrays = plan.run_arrays

    def recording(arrays, values):
        runs.append(run_arrays(arrays, values))
        return runs[-1]
    monkeypatch.setattr(plan, "run_arrays", recording)   # before the fast path learns the call
    f(a, b)
    raw = np.zeros(16 * 4 + 1, np.uint8)
    misaligned = raw[1:].view(np.float32)
    misaligned[:] = a
    assert not misaligned.flags.aligned
    np.testing.assert_allclose(np.asarray(f(misaligned, b)), a + b)
    refused, ran = runs.count(False), runs.count(True)
    assert refused >= 1 and ran == 1 and runs[-1] and len(reads) == 2   # refused natively, run on aligned copies
    wide = _f32(rng, 32)
    np.testing.assert_allclose(np.asarray(f(wide[::2], b)), wide[::2] + b)
    np.testing.assert_allclose(np.asarray(f(wide[::2], b)), wide[::2] + b)
    assert len(reads) == 4   # a strided argument is never replayed in place: always the full path, which copies
    np.testing.assert_allclose(np.asarray(f(a, b)), a + b)
    assert runs.count(False) == refused and runs.count(True) == 2 and len(reads) == 4


def test_pj_array_inputs_are_not_copied_through_the_host(rng, monkeypatch):
    f = pj.prepare(lambda a: a * 2, device="cpu")
    a = _f32(rng, 8)
    once = f(a)
    reads = full_path_reads(f, monkeypatch)
    converted = []
    monkeypatch.setattr(Array, "__array__", lambda self, *args, **kwargs: converted.append(self))
    twice = f(once)
    thrice = f(once)
    assert not converted and len(reads) == 1   # the pj.Array's buffer is read in place, on both paths
    monkeypatch.undo()
    np.testing.assert_allclose(np.asarray(twice), a * 4)
    np.testing.assert_allclose(np.asarray(thrice), a * 4)


def test_large_kernels_split_over_threads_match_numpy(rng, worker_threads):
    a, b, c = (_f32(rng, 1 << 18) for _ in range(3))
    f = pj.prepare(lambda a, b, c: (a * b + c * 2 - 1) * 0.5, device="cpu")
    for _ in range(2):
        splits, out = published(worker_threads, f, a, b, c)
        np.testing.assert_allclose(np.asarray(out), (a * b + c * 2 - 1) * 0.5, rtol=1e-6)
        assert splits == 1
    ((end, chunks),) = launch_entries(f.plan(a, b, c)._runner.first_launches)
    assert chunks == worker_threads.chunks(end) == 12
    x = _f32(rng, 1000, 300)
    g = pj.prepare(lambda x: x.sum(axis=1), vars={"n": (1, 1000)}, shapes={"x": ("n", 300)}, device="cpu")
    (split,) = g.plan(x)._runner.splits   # sized per call: split only while n * 300 is large
    for n, want_splits in ((1000, 1), (7, 0), (999, 1), (7, 0)):
        splits, out = published(worker_threads, g, x[:n])
        np.testing.assert_allclose(np.asarray(out), x[:n].sum(axis=1), rtol=1e-4, atol=1e-4)
        assert splits == want_splits
        want = (n, worker_threads.chunks(n) if splits else 0)   # in each native program that launches it
        assert {(array[k], array[k + 1]) for array, k in split.cells} == {want}


def test_launches_of_one_kernel_sized_per_call_are_sized_once_and_only_when_their_vars_change(rng, worker_threads):
    """The same kernel at three buffer offsets (a layer's slice of a stacked array, as a decode step's 30 attention
    launches): one _VarSplit sizes all three launches, and a call whose var values are the last call's sizes
    nothing (no Python per such kernel and call)."""
    x = _f32(rng, 1000, 3, 300)
    g = pj.prepare(lambda x: [x[:, i].sum(axis=1) for i in range(3)], vars={"n": (1, 1000)},
                   shapes={"x": ("n", 3, 300)}, device="cpu")
    g(x)
    (split,) = g.plan(x)._runner.splits
    assert len(split.cells) == 3 * 2          # three launches, in each native program that launches them
    sized = []
    size_fn = split.launch.size_fn
    split.launch.size_fn = lambda vals: sized.append(vals[0]) or size_fn(vals)
    for n, want_sized in ((1000, []), (7, [7]), (7, []), (999, [999]), (999, [])):
        sized.clear()
        splits, out = published(worker_threads, g, x[:n])
        for i in range(3):
            np.testing.assert_allclose(np.asarray(out[i]), x[:n, i].sum(axis=1), rtol=1e-4, atol=1e-4)
        assert sized == want_sized
        assert splits == (3 if n > 7 else 0)
        want = (n, worker_threads.chunks(n) if n > 7 else 0)
        assert {(array[k], array[k + 1]) for array, k in split.cells} == {want}


def test_concurrent_calls_are_isolated(rng, monkeypatch):
    """Two kernels with an intermediate between them (the max): calls on several threads replay one plan, its
    buffers and argument slots, one at a time (the native replay is watched: each run sleeps a moment, so a
    second caller would come in meanwhile if nothing kept it out)."""
    f = pj.prepare(lambda a, b: a * b - pnp.max(a * b), device="cpu")
    reads = full_path_reads(f, monkeypatch)
    inputs = [(_f32(rng, 1 << 15), _f32(rng, 1 << 15)) for _ in range(4)]
    plan = f.plan(*inputs[0])
    assert len(plan.kernels) == 2
    f(*inputs[0])
    runner, count = plan._runner, threading.Lock()
    inside, most = [0], [0]
    run = runner.run

    def watched(arrays):
        with count:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.001)
        try:
            return run(arrays)
        finally:
            with count:
                inside[0] -= 1
    monkeypatch.setattr(runner, "run", watched)
    errors = []

    def worker(a, b):
        want = a * b - np.max(a * b)
        for _ in range(50):
            if not np.allclose(np.asarray(f(a, b)), want):
                errors.append("mismatch")
    threads = [threading.Thread(target=worker, args=pair) for pair in inputs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(reads) == 2   # all 200 calls on the fast path, sharing one plan
    assert most == [1]


def test_execute_with_vars_after_fast_calls(rng, monkeypatch):
    f = pj.prepare(lambda x: x + 1, vars={"n": (1, 16)}, shapes={"x": ("n",)}, device="cpu")
    reads = full_path_reads(f, monkeypatch)
    x = _f32(rng, 6)
    f(x)
    last = f(x)   # the fast call patched its own arrays into the kernels' argument slots
    assert len(reads) == 1
    plan = f.plan(x)
    plan.write_input(0, x[:4])
    plan.execute_with_vars({"n": 4})
    np.testing.assert_allclose(plan.read_output(0), x[:4] + 1)
    np.testing.assert_allclose(np.asarray(last), x + 1)   # the plan's own buffers were used, not the call's
