"""fori_loop plans cost no object per iteration: prepare time and memory of `fori_loop(0, N)` (issue: <= 0.5 s and
<= 20 MB at N = 100,000), measured with tracemalloc and ru_maxrss, next to N = 1,000 prepared in the same run and a
replay next to the same loop in NumPy.

    .venv/bin/python -m benchmarks.fori_loop_prepare [N]
"""
from __future__ import annotations

import resource
import sys
import time
import tracemalloc

import numpy as np

import prepjit as pj


def loop_fn(n_iter: int):
    @pj.prepare(vars={"n": (1, 64)}, shapes={"x": ("n",)})
    def f(x):
        return pj.fori_loop(0, n_iter, lambda i, acc: acc * 0.5 + i, x)
    return f


def measure(n_iter: int, x) -> dict:
    f = loop_fn(n_iter)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    start = time.perf_counter()
    plan = f.plan(x)
    seconds = time.perf_counter() - start
    retained, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    grown_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss
    start = time.perf_counter()
    out = np.asarray(f(x))
    replay = time.perf_counter() - start
    want = x.copy()
    start = time.perf_counter()
    for i in range(n_iter):
        want = want * np.float32(0.5) + np.float32(i)
    numpy_s = time.perf_counter() - start
    assert np.allclose(out, want, rtol=1e-5), "prepjit and NumPy disagree"
    assert len(plan.kernels) >= n_iter and plan.kernels[n_iter - 1].fixedvars
    return {"iterations": n_iter, "prepare_s": seconds, "retained_mb": retained / 1e6, "peak_mb": peak / 1e6,
            "maxrss_growth_mb": grown_kb / 1e3, "replay_s": replay, "numpy_loop_s": numpy_s}


def main(argv: list[str]) -> int:
    n_iter = int(argv[0]) if argv else 100_000
    x = np.ones(8, np.float32)
    loop_fn(3).plan(x)  # compile the body kernel once: both sizes below share it
    for row in (measure(1_000, x), measure(n_iter, x)):
        print("  ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
