"""Where prepare time goes: a per-thread tally of named stages (tracing, scheduling and lowering, optimisation,
rendering, compilation, loading compiled code) that `PREPJIT_LOG=compiles` reports after each prepare."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager

_local = threading.local()


@contextmanager
def tally():
    """Collect this thread's stage times while the block runs, into the dict it yields (stage -> seconds)."""
    outer = getattr(_local, "times", None)
    _local.times = times = {}
    try:
        yield times
    finally:
        _local.times = outer


@contextmanager
def stage(name: str):
    """Add the block's wall time to stage `name` of this thread's open tally (if any)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        times = getattr(_local, "times", None)
        if times is not None:
            times[name] = times.get(name, 0.0) + time.perf_counter() - start


def describe(times: dict[str, float], total: float) -> str:
    """`12.3 ms: tracing 1.0 ms, ...`, with what no stage covers as `other`."""
    parts = [f"{name} {1e3 * t:.1f} ms" for name, t in times.items()]
    other = total - sum(times.values())
    if other >= 5e-4:
        parts.append(f"other {1e3 * other:.1f} ms")
    return f"{1e3 * total:.1f} ms: " + ", ".join(parts)
