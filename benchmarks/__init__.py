"""prepjit's benchmark suite: prepjit against NumPy, JAX, tinygrad and PyTorch on the same machine.

Run `python -m benchmarks` (full sizes) or `python -m benchmarks --smoke` (tiny sizes, one run).
Peers that are not installed are skipped. See benchmarks/README section in the project README.
"""
