"""Fixtures of the runtime tests."""
from tests.runtime.native_threads import worker_threads  # noqa: F401 (a fixture)
