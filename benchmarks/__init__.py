"""prepjit's benchmark suite: prepjit against NumPy, JAX, tinygrad and PyTorch on the same machine.

Run `python -m benchmarks` (full sizes) or `python -m benchmarks --smoke` (tiny sizes, one run).
Peers that are not installed are skipped. See benchmarks/README section in the project README.
A `python -m benchmarks[.module]` process drops a workplace's BLAS pins before NumPy loads (blas.py).
"""
import sys

if sys.argv[:1] == ["-m"]:  # Python is locating a `-m` module of this package (argv[0] is "-m" until it runs)
    from .blas import run_unpinned
    run_unpinned()
