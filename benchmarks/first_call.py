"""A prepare case's first call (trace + compile + the first run), timed in a fresh Python process.

`python -m benchmarks.first_call CASE [--smoke]` builds the case's inputs, prepares its function and prints one
JSON line: the seconds of the first call and the prepared function's stats (compiles, disk_hits, ...). Nothing is
warm in a new process (no kernel, simplifier or proof cache in memory, no compile workers), so this is what a
user's first call costs; the environment says whether the disk cache is off (PREPJIT_CACHE=0), empty or filled.
The runner (runner.py) starts it once per round.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def first_call(name: str, smoke: bool) -> dict:
    """Time the first call of case `name` in this process."""
    from .cases import CASES
    from .runner import prepjit_call
    case = next(c for c in CASES if c.name == name)
    prepared, args = prepjit_call(case, case.make_inputs(np.random.default_rng(0), smoke))
    start = time.perf_counter()
    prepared(*args)
    return {"seconds": time.perf_counter() - start, "stats": dict(prepared.stats)}


def in_fresh_process(name: str, smoke: bool, env: dict) -> dict:
    """first_call of case `name` in a new Python process whose environment adds `env` to this one's."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.first_call", name] + (["--smoke"] if smoke else []),
                          cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"the first call of {name} failed in a fresh process:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print(json.dumps(first_call(sys.argv[1], "--smoke" in sys.argv[2:])))
