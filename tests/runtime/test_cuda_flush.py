"""The cuda device's queue of launches under threads, with the driver stubbed (no GPU needed): a launch another
thread is flushing stays queued until it is launched, so its owner's flush (before a copy, a sync, or patching
its arguments) waits for that flush instead of returning while the launch has not happened yet."""
import collections
import threading
import time

from prepjit.runtime.cuda import CUDADevice


class SlowLaunch:
    """A launcher as the device sees it; its launch takes a while and records when it finished."""

    def __init__(self, log: list):
        self.queued, self.log = False, log

    def launch(self, stream):
        time.sleep(0.05)
        self.log.append("launched")


def stub_device() -> CUDADevice:
    device = object.__new__(CUDADevice)   # only the launch queue: no driver, context or stream
    device.use_graphs, device._pending, device._graphs = True, [], collections.OrderedDict()
    device._queue_lock, device._stream = threading.Lock(), None
    device.stats = {"graphs_built": 0, "graph_replays": 0, "node_updates": 0, "stream_launches": 0}
    return device


def test_a_flush_in_another_thread_is_waited_for_before_a_launch_counts_as_done():
    device, log = stub_device(), []
    launch = SlowLaunch(log)
    device.enqueue(launch)
    other = threading.Thread(target=device.flush)   # another call's copy flushes this call's launch
    other.start()
    time.sleep(0.01)   # it is launching now
    assert launch.queued   # its arguments must not be repacked yet
    device.flush()      # this call's sync: must not return before the launch happened
    log.append("flushed")
    other.join()
    assert log == ["launched", "flushed"] and not launch.queued


def test_before_wait_runs_in_a_sync_once_the_queued_launches_are_launched():
    """`before_wait` (what a thread hands to others before it blocks) is called by synchronize after the queued
    launches reached the driver and before the stream wait; unset, the sync only launches and waits."""
    from .cuda_stub import stub_device as driver_stub

    class Stream:
        def synchronize(self):
            log.append("wait")

    device, log = driver_stub(), []
    device.stream = Stream()
    for hook in (lambda: log.append("before wait"), None):
        device.before_wait = hook
        device.enqueue(SlowLaunch(log))
        device.synchronize()
    assert log == ["launched", "before wait", "wait", "launched", "wait"]
