"""Test helpers for the cpu device's thread split (runtime/cpu_threads.py): worker threads on any host (the
`worker_threads` fixture: import it into a test module, or use it in tests/runtime), the launch entries of a native replay program, and the split launches a call hands to the workers."""
import functools

import pytest

from prepjit.runtime.cpu_replay import LAUNCH_FIELDS
from prepjit.runtime.cpu_threads import COOLDOWN, TICKET, NativeThreads
from prepjit.runtime.devices import get_device

DEVICE = get_device("cpu")


@functools.cache
def three_threads() -> NativeThreads:
    """A NativeThreads of the cpu device's code with two workers, whatever this host's cores (made once: its
    workers never exit)."""
    address = DEVICE._replay_engine.get_function_address
    return NativeThreads(3, address("prepjit_parallel"), address("prepjit_worker"), address("prepjit_cycles"))


@pytest.fixture
def worker_threads(monkeypatch):
    """The cpu device with two worker threads, whatever this host's cores (tests of the split must not pass by
    running on one thread): plans prepared during the test split their large kernels over them."""
    threads = three_threads()
    assert threads.workers == 2
    monkeypatch.setattr(DEVICE, "threads", threads)
    return threads


def published(threads: NativeThreads, fn, *args) -> tuple[int, object]:
    """(the split launches `fn(*args)` handed to `threads`: the task generations it published, its result), after
    clearing the cooldown an earlier stall may have started (split launches then run on the calling thread alone)."""
    threads.words[COOLDOWN] = 0
    before = threads.words[TICKET] >> 32
    result = fn(*args)
    return (threads.words[TICKET] >> 32) - before, result


def launch_entries(program) -> list[tuple[int, int]]:
    """(end, chunks) of every launch of a native replay program (cpu_replay.NativeProgram)."""
    flat = list(program.launches)
    return [(flat[k + 3], flat[k + 4]) for k in range(0, len(flat), LAUNCH_FIELDS)]
