"""The cpu device's native worker threads (runtime/cpu_threads.py): split launches run from the replay program,
chunked over the threads, with the var-dependent ones sized per call; results match NumPy."""
import threading
import time

import numpy as np
import pytest

import prepjit as pj
from prepjit.runtime.cpu import PARALLEL_MIN_ITERATIONS
from prepjit.runtime.cpu_replay import LAUNCH_FIELDS
from prepjit.runtime.cpu_threads import NativeThreads
from prepjit.runtime.devices import get_device

DEVICE = get_device("cpu")
pytestmark = pytest.mark.skipif(DEVICE.threads is None, reason="one thread here: nothing splits")


def _entries(f, *args):
    """(end, chunks) of every launch in the plan's first native program."""
    program = f.plan(*args)._runner.first_launches
    flat = list(program.launches)
    return [(flat[k + 3], flat[k + 4]) for k in range(0, len(flat), LAUNCH_FIELDS)]


def test_a_static_kernel_splits_natively(rng):
    x = rng.standard_normal((512, 1024)).astype(np.float32)
    f = pj.prepare(lambda x: (x * 2 + 1).sum(axis=1), device="cpu")
    np.testing.assert_allclose(np.asarray(f(x)), (x * 2 + 1).sum(axis=1), rtol=1e-4)
    ((end, chunks),) = _entries(f, x)
    assert end == 512 and 1 < chunks <= 512
    for _ in range(3):  # replays through the native program
        np.testing.assert_allclose(np.asarray(f(x)), (x * 2 + 1).sum(axis=1), rtol=1e-4)


def test_a_var_sized_kernel_is_sized_per_call(rng):
    f = pj.prepare(lambda x: np.float32(3) * x + 1, vars={"n": (1, 1 << 20)}, shapes={"x": ("n",)}, device="cpu")
    small, large = rng.standard_normal(100).astype(np.float32), rng.standard_normal((1 << 20) - 3).astype(np.float32)
    for x in (small, large, small, large[:PARALLEL_MIN_ITERATIONS + 1]):
        np.testing.assert_allclose(np.asarray(f(x)), 3 * x + 1, rtol=1e-6)
    runner = f.plan(small)._runner
    (split,) = runner.splits
    assert [tuple(a[k:k + 2]) for a, k in split.cells][0][1] == DEVICE.threads.chunks(PARALLEL_MIN_ITERATIONS + 1)
    f(small)
    assert [tuple(a[k:k + 2]) for a, k in split.cells][0] == (100, 0)  # small now: runs alone


def test_callers_on_several_threads_share_the_workers(rng):
    x = rng.standard_normal((256, 2048)).astype(np.float32)
    f = pj.prepare(lambda x: (x * x).sum(axis=1), device="cpu")
    want = (x * x).sum(axis=1)
    f(x)
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


def test_sleeping_workers_wake_and_a_forked_child_runs_inline(rng):
    threads = NativeThreads(3, DEVICE.threads.parallel_address, DEVICE.threads.worker_address)
    assert threads.workers == 2 and threads.chunks(300) == 12
    x = rng.standard_normal((300, 1000)).astype(np.float32)
    f = pj.prepare(lambda x: x.max(axis=1), device="cpu")
    out = np.asarray(f(x))  # the launch's output slot now points at `out`
    fn, bufs, vals = list(f.plan(x)._runner.first_launches.launches)[:3]
    for wait in (0.0, 0.3):  # the second time, the workers have gone to sleep
        time.sleep(wait)
        out[:] = 0
        threads.parallel(fn, bufs, vals, 300, threads.chunks(300))
        np.testing.assert_array_equal(out, x.max(axis=1))
    threads._forked()
    assert threads.chunks(300) == 0
    out[:] = 0
    threads.parallel(fn, bufs, vals, 300, 12)  # inline
    np.testing.assert_array_equal(out, x.max(axis=1))
