"""Timing: the median per-call time of repeated runs after warm-up."""
from __future__ import annotations

import statistics
import time


def time_per_call(fn, *, warmup: int = 3, rounds: int = 7, round_seconds: float = 0.05, smoke: bool = False) -> float:
    """Seconds per call of `fn()`: warm up, size a round to about `round_seconds`, take the median round."""
    if smoke:
        fn()
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    for _ in range(warmup):
        fn()
    start = time.perf_counter()
    fn()
    single = max(time.perf_counter() - start, 1e-7)
    calls = max(1, int(round_seconds / single))
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls)
    return statistics.median(samples)
