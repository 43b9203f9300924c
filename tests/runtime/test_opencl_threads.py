"""The opencl device under threads: no two threads are ever inside its OpenCL runtime calls at once (NVIDIA's
runtime crashed when 6 threads replayed one function), each thread's uploads stay its own, and an empty
call queues no launch of global size 0 (which OpenCL 1.2 rejects)."""
import sys
import threading
import time

import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.runtime.devices import get_device, unavailable_reason

pytestmark = pytest.mark.skipif(unavailable_reason("opencl") is not None,
                                reason=f"opencl: {unavailable_reason('opencl')}")
cl = pytest.importorskip("pyopencl")


class Watch:
    """Counts calls that start while another thread is inside a watched call; each call lingers `linger`
    seconds, so a call another thread could make meanwhile is made then."""

    def __init__(self, linger: float):
        self.linger, self.inside, self.overlaps, self.calls = linger, 0, [], 0
        self.guard = threading.Lock()

    def wrap(self, name: str, fn):
        def watched(*args, **kwargs):
            with self.guard:
                self.inside += 1
                self.calls += 1
                if self.inside > 1:
                    self.overlaps.append(name)
            try:
                time.sleep(self.linger)
                return fn(*args, **kwargs)
            finally:
                with self.guard:
                    self.inside -= 1
        return watched


class WatchedKernel:
    def __init__(self, watch: Watch, kernel):
        self.real = kernel
        self.set_arg = watch.wrap("set_arg", kernel.set_arg)

    def __getattr__(self, name):
        return getattr(self.real, name)


class WatchedProgram:
    """A program whose creation and build are watched."""

    def __init__(self, watch: Watch, *args):
        self._watch = watch
        self.real = watch.wrap("Program", cl.Program)(*args)

    def build(self, *args, **kwargs):
        self._watch.wrap("Program.build", self.real.build)(*args, **kwargs)
        return self

    def __getattr__(self, name):
        return getattr(self.real, name)


class WatchedCL:
    """pyopencl as the device sees it, with every call that queues a command, sets an argument, allocates,
    builds a program or creates a kernel watched."""

    def __init__(self, watch: Watch):
        self._watch = watch
        for name in ("enqueue_copy", "enqueue_marker", "Buffer"):
            setattr(self, name, watch.wrap(name, getattr(cl, name)))
        run = watch.wrap("enqueue_nd_range_kernel", cl.enqueue_nd_range_kernel)
        self.enqueue_nd_range_kernel = lambda queue, kernel, *a, **k: run(queue, kernel.real, *a, **k)

    def Program(self, *args):
        return WatchedProgram(self._watch, *args)

    def Kernel(self, program, name):
        return WatchedKernel(self._watch, self._watch.wrap("Kernel", cl.Kernel)(program.real, name))

    def __getattr__(self, name):
        return getattr(cl, name)


class WatchedPool:
    def __init__(self, watch: Watch, pool):
        self.allocate = watch.wrap("pool.allocate", pool.allocate)


def run_threads(target, count: int) -> None:
    """`target(seed)` in `count` threads at once (seeds 0..count-1), waited for."""
    threads = [threading.Thread(target=target, args=(seed,)) for seed in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@pytest.fixture
def watched_device(monkeypatch):
    device = get_device("opencl")
    watch = Watch(linger=0.001)
    monkeypatch.setattr(device, "cl", WatchedCL(watch))
    monkeypatch.setattr(device, "pool", WatchedPool(watch, device.pool))
    return device, watch


def test_no_two_threads_are_inside_the_opencl_runtime_at_once(watched_device):
    """Threads calling two prepared functions (their kernels built through the watched pyopencl): every
    argument set, launch, copy and allocation is made alone. Without the device's lock around them,
    downloads and allocations outside the plans' locks ran beside other threads' launches (fails so)."""
    device, watch = watched_device
    add = pj.prepare(lambda x, s: x * s + 1, vars={"n": (1, 64)}, shapes={"x": ("n",)}, device="opencl")
    total = pj.prepare(lambda x: pnp.sum(x, axis=1), vars={"n": (1, 64)}, shapes={"x": ("n", 3)},
                       device="opencl")
    add(np.ones(2, np.float32), np.float32(2))   # compiled here, before the threads
    total(np.ones((2, 3), np.float32))
    failures = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        for _ in range(6):
            n = int(rng.integers(1, 65))
            x = rng.standard_normal(n).astype(np.float32)
            if not np.allclose(np.asarray(add(x, np.float32(3))), x * np.float32(3) + 1, rtol=1e-6):
                failures.append(("add", n))
            y = rng.standard_normal((n, 3)).astype(np.float32)
            if not np.allclose(np.asarray(total(y)), y.sum(axis=1), rtol=1e-5, atol=1e-6):
                failures.append(("total", n))

    run_threads(worker, 4)
    assert failures == []
    assert watch.calls > 100
    assert watch.overlaps == []


class KernelUse:
    """Per cl_kernel, the threads that set its arguments and launch it: a thread that sets an argument owns the
    kernel until it launches it; another thread's call on it meanwhile is a shared use (`shared`)."""

    def __init__(self, monkeypatch, device):
        self.owner, self.shared, self.launches, self.guard = {}, [], 0, threading.Lock()
        real_kernel, real_run = cl.Kernel, device.cl.enqueue_nd_range_kernel
        use = self

        class Kernel:
            def __init__(self, *args):
                self.real = real_kernel(*args)

            def set_arg(self, slot, value):
                use.touch(self.real, launch=False)
                return self.real.set_arg(slot, value)

            def __getattr__(self, name):
                return getattr(self.real, name)

        def run(queue, kernel, *args, **kwargs):
            use.touch(kernel.real, launch=True)
            return real_run(queue, kernel.real, *args, **kwargs)

        monkeypatch.setattr(device.cl, "Kernel", Kernel)
        monkeypatch.setattr(device.cl, "enqueue_nd_range_kernel", run)

    def touch(self, kernel, launch: bool):
        me = threading.get_ident()
        with self.guard:
            owner = self.owner.get(kernel.int_ptr)
            if owner not in (None, me):
                self.shared.append(kernel.function_name)
            self.owner[kernel.int_ptr] = None if launch else me
            self.launches += launch
        time.sleep(0.0005)   # (a window another thread could use)


def test_two_threads_never_share_a_kernel_between_its_arguments_and_its_launch(monkeypatch):
    """Threads replaying one prepared function (one plan: its launchers, one cl_kernel each, are shared by the
    calls): from a call's first argument set on a kernel to its launch, no other thread touches that kernel
    (clSetKernelArg on one cl_kernel from two threads is the race OpenCL forbids). The plan's lock makes a call's
    launches one critical section; without it in run_arrays (the fast path these calls take): fails."""
    device = get_device("opencl")
    use = KernelUse(monkeypatch, device)
    f = pj.prepare(lambda x, s: pnp.sum(x * s, axis=1) + 1, vars={"n": (1, 64), "s": (0, 9)}, shapes={"x": ("n", 3)},
                   device="opencl")
    f(np.ones((2, 3), np.float32), 1)
    failures = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        for _ in range(15):
            x, s = rng.standard_normal((int(rng.integers(1, 65)), 3)).astype(np.float32), int(rng.integers(0, 10))
            if not np.allclose(np.asarray(f(x, s)), np.sum(x * s, axis=1) + 1, rtol=1e-5, atol=1e-5):
                failures.append(seed)

    run_threads(worker, 4)
    assert failures == []
    assert use.launches >= 60 and use.shared == []


def test_builds_never_run_beside_other_threads_launches(watched_device):
    """A thread preparing new signatures (each kernel built from source, or from the disk cache's binary, and its
    cl_kernel created) while others replay: the builds and kernel creations are made alone too (NVIDIA's runtime
    is where concurrent calls crashed). Without the lock around compile's and load's builds: overlaps, fails."""
    device, watch = watched_device
    add = pj.prepare(lambda x: x * 3 + 1, vars={"n": (1, 64)}, shapes={"x": ("n",)}, device="opencl")
    add(np.ones(2, np.float32))
    failures, stop = [], threading.Event()

    def replay(seed):
        rng = np.random.default_rng(seed)
        while not stop.is_set():
            x = rng.standard_normal(int(rng.integers(1, 65))).astype(np.float32)
            if not np.allclose(np.asarray(add(x)), x * 3 + 1, rtol=1e-6):
                failures.append(seed)

    threads = [threading.Thread(target=replay, args=(s,)) for s in range(3)]
    for t in threads:
        t.start()
    try:
        x = np.linspace(-1, 1, 5, dtype=np.float32)
        for k in range(4):   # a constant of its own: a kernel no cache holds in this process
            f = pj.prepare(lambda x, k=k: pnp.tanh(x) * (k + 0.125), device="opencl")
            np.testing.assert_allclose(np.asarray(f(x)), np.tanh(x) * (k + 0.125), rtol=1e-5, atol=1e-6)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert failures == []
    assert watch.overlaps == []


def test_downloads_are_blocking_reads_made_under_the_lock(monkeypatch):
    """Threads replaying and reading their results: every read into host memory is blocking and made under the
    device's lock, so none of the runtime's host-side work for it is left to run beside another thread's calls.
    Fails on a non-blocking read. (Its value checks failed on NVIDIA's OpenCL until kernels turned FP_CONTRACT
    off: x * 3 + 1 was contracted, not torn by threads.)"""
    device = get_device("opencl")
    reads, copy = [], cl.enqueue_copy

    def recording(queue, dst, src, **kwargs):
        if isinstance(dst, np.ndarray):
            reads.append((kwargs.get("is_blocking", True), device.lock._is_owned()))
        return copy(queue, dst, src, **kwargs)

    monkeypatch.setattr(device.cl, "enqueue_copy", recording)
    add = pj.prepare(lambda x: x * 3 + 1, vars={"n": (1, 64)}, shapes={"x": ("n",)}, device="opencl")
    failures = []

    def replay(seed):
        rng = np.random.default_rng(seed)
        for _ in range(20):
            x = rng.standard_normal(int(rng.integers(1, 65))).astype(np.float32)
            if not np.allclose(np.asarray(add(x)), x * 3 + 1, rtol=1e-6):
                failures.append(seed)

    run_threads(replay, 4)
    assert failures == []
    assert len(reads) >= 80 and set(reads) == {(True, True)}


def test_an_upload_event_belongs_to_the_thread_that_queued_it():
    """A thread's synchronize lets go of its own upload events only: another thread's pending copy keeps its
    event, and so its host array, until that thread synchronises (a list shared by the device was emptied
    by whichever thread synchronised first: fails so)."""
    device = get_device("opencl")
    device.synchronize()
    buffer = device.allocate(np.float32, 1 << 16)
    host = np.arange(1 << 16, dtype=np.float32)
    alone = sys.getrefcount(host)
    device._upload(buffer.memory, host)
    assert sys.getrefcount(host) == alone + 1   # the upload's event holds it
    other = threading.Thread(target=device.synchronize)
    other.start()
    other.join()
    assert sys.getrefcount(host) == alone + 1
    device.synchronize()
    assert sys.getrefcount(host) == alone
    np.testing.assert_array_equal(device.read_buffer(buffer, (1 << 16,)), host)


def test_an_empty_call_queues_no_zero_size_launch(monkeypatch):
    """At n = 0 every kernel whose size is a multiple of n is skipped, and what is launched is whole work-groups
    (OpenCL 1.2, NVIDIA's, rejects a zero global size with CL_INVALID_GLOBAL_WORK_SIZE); the call after it
    is right (the pad + gather-at-argmin program of the H200's fuzz failure)."""
    device = get_device("opencl")
    sizes = []
    enqueue = cl.enqueue_nd_range_kernel

    def strict(queue, kernel, global_size, local_size, *args, **kwargs):
        sizes.append((global_size[0], local_size[0]))
        if global_size[0] == 0 or global_size[0] % local_size[0]:
            raise cl.LogicError("clEnqueueNDRangeKernel failed: INVALID_GLOBAL_WORK_SIZE")
        return enqueue(queue, kernel, global_size, local_size, *args, **kwargs)

    monkeypatch.setattr(device.cl, "enqueue_nd_range_kernel", strict)

    def gather_at_argmin(xp, x):
        y = xp.pad(x, [(1, 0)])
        return xp.take_along_axis(y, xp.argmin(y, keepdims=True), axis=0), x * 2

    f = pj.prepare(lambda x: gather_at_argmin(pnp, x), vars={"n": (0, 6)}, shapes={"x": ("n",)}, device="opencl")
    for n in (0, 1, 0, 2, 0, 1):
        x = -np.arange(3, 3 + n).astype(np.float32)
        for got, want in zip(f(x), gather_at_argmin(np, x)):
            np.testing.assert_array_equal(np.asarray(got), want)
    assert sizes and all(g > 0 and g % local == 0 for g, local in sizes)
