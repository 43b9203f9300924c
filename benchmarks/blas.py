"""NumPy's BLAS in benchmark processes: the CPU's own kernel, named in the results.

A workplace may pin OpenBLAS to one kernel for every process (`OPENBLAS_CORETYPE=Haswell` holds it to AVX2 on an
AVX-512 host; `OPENBLAS_L2_SIZE` sets the cache size its blocking assumes). OpenBLAS reads both when NumPy loads
it, so a benchmark process that finds them set runs itself again without them (`run_unpinned`, called by the
package's `__init__` when Python starts `python -m benchmarks[.module]`) and every NumPy figure is against the
kernel a user of this CPU gets. Tests and other programs that import the package keep their environment.
The results record the BLAS libraries NumPy loaded (`blas_info`) in their machine line.
"""
from __future__ import annotations

import os
import sys

PINS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
FIELDS = ("internal_api", "version", "architecture", "num_threads")  # what the results keep of each library


def unpinned_environment() -> dict:
    """This process's environment without the BLAS pins."""
    return {name: value for name, value in os.environ.items() if name not in PINS}


def run_unpinned():
    """Replace this process with the same command run without the BLAS pins, if any is set (before NumPy loads)."""
    if any(name in os.environ for name in PINS):
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable] + sys.orig_argv[1:], unpinned_environment())


def blas_info() -> list[dict] | None:
    """The BLAS libraries NumPy loaded (threadpoolctl: library, version, the kernel's CPU architecture, threads),
    or None without threadpoolctl (`pip install -e .[bench]`)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    import numpy  # noqa: F401  (loads its BLAS)
    return [{k: lib.get(k) for k in FIELDS} for lib in threadpool_info() if lib.get("user_api") == "blas"]


def describe(blas: list[dict] | None) -> str:
    """The BLAS part of the machine line: e.g. "openblas 0.3.31 SkylakeX kernel, 2 threads"."""
    if blas is None:
        return "unknown (threadpoolctl is not installed)"
    return "; ".join(f"{b['internal_api']} {b['version']} {b['architecture']} kernel, {b['num_threads']} threads"
                     for b in blas) or "none found"

