"""Fixtures of the runtime tests."""
import pytest

from tests.runtime.native_threads import DEVICE, three_threads


@pytest.fixture
def worker_threads(monkeypatch):
    """The cpu device with two worker threads, whatever this host's cores (tests of the split must not pass by
    running on one thread): plans prepared during the test split their large kernels over them."""
    threads = three_threads()
    assert threads.workers == 2
    monkeypatch.setattr(DEVICE, "threads", threads)
    return threads
