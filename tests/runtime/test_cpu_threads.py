"""The cpu device's native worker threads (runtime/cpu_threads.py): split launches run from the replay program,
chunked over the threads, with the var-dependent ones sized per call; results match NumPy. Every test runs with
two worker threads (the `worker_threads` fixture), whatever this host's cores, and checks the split it names."""
import ctypes
import threading
import time

import numpy as np

import prepjit as pj
from prepjit.runtime.cpu import PARALLEL_MIN_ITERATIONS
from prepjit.runtime.cpu_threads import AFTER_STALL as MIN_BACKOFF_TICKS
from prepjit.runtime.cpu_threads import (BACKOFF, COOLDOWN, CYCLES_FN, MAX_BACKOFF, MIN_BACKOFF, SLEEPERS, SPIN_TICKS,
                                         TICKET, WORKER_SPIN_S, NativeThreads)
from tests.runtime.native_threads import launch_entries, published


def test_a_static_kernel_splits_natively(rng, worker_threads):
    x = rng.standard_normal((512, 1024)).astype(np.float32)
    f = pj.prepare(lambda x: (x * 2 + 1).sum(axis=1), device="cpu")
    assert launch_entries(f.plan(x)._runner.first_launches) == [(512, worker_threads.chunks(512))]
    assert worker_threads.chunks(512) == 12
    for _ in range(4):  # the first call, then replays through the native program: one split launch each
        splits, out = published(worker_threads, f, x)
        np.testing.assert_allclose(np.asarray(out), (x * 2 + 1).sum(axis=1), rtol=1e-4)
        assert splits == 1


def test_a_var_sized_kernel_is_sized_per_call(rng, worker_threads):
    f = pj.prepare(lambda x: np.float32(3) * x + 1, vars={"n": (1, 1 << 20)}, shapes={"x": ("n",)}, device="cpu")
    small, large = rng.standard_normal(100).astype(np.float32), rng.standard_normal((1 << 20) - 3).astype(np.float32)
    (split,) = f.plan(small)._runner.splits
    for x in (small, large, small, large[:PARALLEL_MIN_ITERATIONS + 1]):
        splits, out = published(worker_threads, f, x)
        np.testing.assert_allclose(np.asarray(out), 3 * x + 1, rtol=1e-6)
        large_now = x.size > PARALLEL_MIN_ITERATIONS
        assert splits == (1 if large_now else 0)   # a small call runs alone
        want = (x.size, worker_threads.chunks(x.size) if large_now else 0)
        assert {(array[k], array[k + 1]) for array, k in split.cells} == {want}


def test_a_batch_fixed_at_one_row_splits_its_columns(rng, worker_threads):
    """A batch matvec whose row count is a var fixed at 1 (a decode plan's batch of one: B in (1, 1)) splits over
    the threads along its columns, as the same matvec of a static row does (the size-1 rows' range ran it on one
    thread)."""
    x, w = rng.standard_normal((1, 576)).astype(np.float32), rng.standard_normal((1536, 576)).astype(np.float32)
    f = pj.prepare(lambda x, w: x @ w.T, vars={"B": (1, 1)}, shapes={"x": ("B", None)}, device="cpu")
    splits, out = published(worker_threads, f, x, w)
    np.testing.assert_allclose(np.asarray(out), x @ w.T, rtol=1e-4, atol=1e-4)
    ((size, chunks),) = launch_entries(f.plan(x, w)._runner.first_launches)
    assert size > 1 and chunks == worker_threads.chunks(size) > 1 and splits == 1


def test_callers_on_several_threads_share_the_workers(rng, worker_threads):
    x = rng.standard_normal((256, 2048)).astype(np.float32)
    f = pj.prepare(lambda x: (x * x).sum(axis=1), device="cpu")
    want = (x * x).sum(axis=1)
    assert published(worker_threads, f, x)[0] == 1
    errors = []

    def call():
        for _ in range(20):
            if not np.allclose(np.asarray(f(x)), want, rtol=1e-4):
                errors.append("mismatch")
    callers = [threading.Thread(target=call) for _ in range(3)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert not errors


def _settles(read, want: int) -> bool:
    """Whether `read()` reaches `want` within 5 s."""
    return _settles_within(read, want, pause=0.001)


def _settles_within(read, want: int, pause: float = 0.0, seconds: float = 5) -> bool:
    deadline = time.monotonic() + seconds
    while read() != want and time.monotonic() < deadline:
        time.sleep(pause)
    return read() == want


def test_sleeping_workers_wake_and_a_forked_child_runs_inline(rng, worker_threads):
    threads = NativeThreads(3, worker_threads.parallel_address, worker_threads.worker_address,
                            worker_threads.cycles_address)
    assert threads.workers == 2 and threads.chunks(300) == 12
    x = rng.standard_normal((300, 1000)).astype(np.float32)
    f = pj.prepare(lambda x: x.max(axis=1), device="cpu")
    out = np.asarray(f(x))  # the launch's output slot now points at `out`
    fn, bufs, vals = list(f.plan(x)._runner.first_launches.launches)[:3]
    for wait in (0.0, 0.3):  # the second time, the workers have gone to sleep
        time.sleep(wait)
        assert wait == 0 or _settles(lambda: threads.words[SLEEPERS], 2)
        out[:] = 0
        threads.parallel(fn, bufs, vals, 300, threads.chunks(300))
        np.testing.assert_array_equal(out, x.max(axis=1))
        # the task's chunk claims: its 12 chunks, and one past them by the caller and by each worker that joined
        assert _settles(lambda: threads.words[TICKET] & 0xFFFFFFFF, 12 + 3)
    threads._forked()
    assert threads.chunks(300) == 0
    out[:] = 0
    generation = threads.words[TICKET] >> 32
    threads.parallel(fn, bufs, vals, 300, 12)  # inline
    np.testing.assert_array_equal(out, x.max(axis=1))
    assert threads.words[TICKET] >> 32 == generation   # nothing was published


CHUNK_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)


def _checked_launch(threads: NativeThreads, fn: int, cycles) -> str:
    """One split launch of `fn`, checked against the back-off rules through the words it publishes, whatever the
    OS did to the threads meanwhile: "alone" (nothing published, BACKOFF and COOLDOWN kept: it began before the
    time alone ended), "stalled" (published after that time, and the publisher waited for a worker: BACKOFF
    doubled up to MAX_BACKOFF, COOLDOWN moved to the launch's end plus the BACKOFF it began with) or "clean"
    (published after that time without a stall: BACKOFF halved down to MIN_BACKOFF, COOLDOWN kept)."""
    words = threads.words
    generation, backoff, cooldown, begun = words[TICKET] >> 32, words[BACKOFF], words[COOLDOWN], cycles()
    threads.parallel(fn, 0, 0, 1000, 1000)
    ended = cycles()
    if words[TICKET] >> 32 == generation:
        assert (words[BACKOFF], words[COOLDOWN]) == (backoff, cooldown) and begun < cooldown
        return "alone"
    assert ended >= cooldown, "a split launch published its task before the time alone ended"
    if words[COOLDOWN] != cooldown:
        assert words[BACKOFF] == min(2 * backoff, words[MAX_BACKOFF])
        assert begun + backoff <= words[COOLDOWN] <= ended + backoff
        return "stalled"
    assert words[BACKOFF] == max(backoff // 2, words[MIN_BACKOFF])
    return "clean"


def test_a_stall_runs_split_launches_alone_for_a_while_then_threads_again(worker_threads):
    """A worker that takes far longer than the publisher's chunks (preempted on a loaded host) makes split launches
    run alone for BACKOFF cycles, not for a count of launches: a launch after that time is split again. Each stall
    in a row doubles the time (up to MAX_BACKOFF), launches without one halve it (down to MIN_BACKOFF).

    Every launch is checked through the words it publishes and the cycle counter around it (_checked_launch), so
    the OS preempting a thread (a loaded 2-core CI host) changes which outcome a launch has, never whether the
    rules hold; each outcome the test needs is retried until seen, a bounded number of times."""
    threads = NativeThreads(2, worker_threads.parallel_address, worker_threads.worker_address,  # its own state
                            worker_threads.cycles_address)
    cycles, words = CYCLES_FN(threads.cycles_address), threads.words
    caller, stall = threading.get_ident(), []

    def chunk(bufs, vals, lo, hi):
        if threading.get_ident() != caller and stall:
            stall.pop()
            time.sleep(0.05)   # the worker's chunk: 50 ms, against the caller's few microseconds

    fn = ctypes.cast(keep := CHUNK_FN(chunk), ctypes.c_void_p).value

    def after_the_time_alone():
        while cycles() <= words[COOLDOWN]:
            time.sleep(0.005)

    def stalling_launch(backoff: int | None) -> tuple[str, int]:
        """(outcome, BACKOFF before) of the launch whose worker took the stalling chunk (launching again until the
        worker, perhaps still waking up, takes a chunk), BACKOFF set to `backoff` before each launch if given (the
        launches whose worker came too late for a chunk halve it)."""
        stall[:] = [True]
        for _ in range(200):
            after_the_time_alone()
            if backoff is not None:
                words[BACKOFF] = backoff
            before = words[BACKOFF]
            outcome = _checked_launch(threads, fn, cycles)
            if not stall:
                return outcome, before
        raise AssertionError("no worker took a chunk in 200 split launches")

    assert words[BACKOFF] == words[MIN_BACKOFF] == MIN_BACKOFF_TICKS
    # longer times alone than the defaults (~25 ms doubling to ~100 ms at 2.6 GHz), so that a launch right after a
    # stall usually comes within it
    least = words[MIN_BACKOFF] = words[BACKOFF] = 1 << 26
    words[MAX_BACKOFF] = 1 << 28
    seen = {"alone": 0, "stalled": 0, "clean": 0, "doubled": 0, "capped": 0}
    for n in range(60):  # stalls, each followed at once by a launch: alone if it came within the time alone
        outcome, backoff = stalling_launch(words[MAX_BACKOFF] if n % 2 else None)  # (every other one at the most)
        if outcome == "stalled":
            seen["capped" if backoff == words[MAX_BACKOFF] else "doubled"] += 1
            seen[_checked_launch(threads, fn, cycles)] += 1
        if seen["doubled"] and seen["capped"] and seen["alone"] >= 3:
            break
    assert seen["doubled"] and seen["capped"] and seen["alone"] >= 3, seen
    for _ in range(60):  # after the time alone: split again, and without a stall the time halves
        after_the_time_alone()
        if _checked_launch(threads, fn, cycles) == "clean":
            break
    else:
        raise AssertionError("no split launch without a stall in 60")
    for _ in range(200):  # at its least, a launch without a stall keeps it there (checked, not waited for: on a
        # host whose other tests keep both cores busy the worker is preempted often, each time a stall that doubles
        # the time alone again, and settling back took over 30 s in a CI run)
        after_the_time_alone()
        words[BACKOFF] = least
        if _checked_launch(threads, fn, cycles) == "clean":
            assert words[BACKOFF] == least
            break
    else:
        raise AssertionError("no split launch without a stall in 200")
    del keep


def test_a_kernel_filling_its_own_array_first_takes_one_chunk_a_thread(rng, worker_threads):
    """A decode batch's projection computes its normalised rows once per call into an array of its own
    (operand_prologue.py) before its split loop: each chunk of a split would do it again, so the launch is cut into
    one chunk a thread, not CHUNKS_PER_THREAD; a kernel without such a prologue keeps its chunks."""
    import prepjit.numpy as pnp

    def project(x, g, w):
        return (x / pnp.sqrt(pnp.mean(x * x, axis=-1, keepdims=True) + 1e-5) * g) @ w.T
    x, g = rng.standard_normal((16, 576)).astype(np.float32), rng.standard_normal(576).astype(np.float32)
    w = rng.standard_normal((1536, 576)).astype(np.float32)
    f = pj.prepare(project, vars={"B": (1, 16)}, shapes={"x": ("B", None)}, device="cpu")
    want = (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5) * g) @ w.T
    np.testing.assert_allclose(np.asarray(f(x, g, w)), want, rtol=1e-3, atol=1e-3)
    plan = f.plan(x, g, w)
    (kernel,) = plan.kernels
    assert any(u.op.name == "DEFINE_LOCAL" for u in kernel.ast.toposort()), "no operand prologue: not the path named"
    ((size, chunks),) = launch_entries(plan._runner.first_launches)
    assert chunks == worker_threads.chunks(size, 1) == worker_threads.workers + 1 < worker_threads.chunks(size)


def test_an_idle_worker_spins_for_a_time_of_this_hosts_clock_then_sleeps(worker_threads):
    """An idle worker polls for a new task for WORKER_SPIN_S, timed by the cycle counter whose rate the threads
    measured when they started (a count of polls lasts 10 us on one host and 50 on another), then sleeps."""
    threads = NativeThreads(2, worker_threads.parallel_address, worker_threads.worker_address,  # its own state
                            worker_threads.cycles_address)
    cycles = CYCLES_FN(threads.cycles_address)
    start, counted = time.perf_counter(), cycles()
    time.sleep(0.05)
    rate = (cycles() - counted) / (time.perf_counter() - start)
    assert abs(threads.cycles_per_second / rate - 1) < 0.1
    assert threads.words[SPIN_TICKS] == round(WORKER_SPIN_S * threads.cycles_per_second)
    fn = ctypes.cast(keep := CHUNK_FN(lambda bufs, vals, lo, hi: None), ctypes.c_void_p).value
    assert _settles(lambda: threads.words[SLEEPERS], 1)   # idle since it started
    threads.words[SPIN_TICKS] = round(0.5 * threads.cycles_per_second)   # half a second of polls
    threads.words[COOLDOWN] = 0
    threads.parallel(fn, 0, 0, 1000, 1000)   # wakes the worker, which then polls for the next task
    assert _settles(lambda: threads.words[SLEEPERS], 0)
    time.sleep(0.1)
    assert threads.words[SLEEPERS] == 0   # still polling a tenth of a second on
    assert _settles(lambda: threads.words[SLEEPERS], 1)   # and asleep once the half second is out
    del keep
