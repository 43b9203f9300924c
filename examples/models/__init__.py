"""Model code shared by the example scripts and `python -m benchmarks`.

Every forward pass is written once against a NumPy-like namespace `xp`: `prepjit.numpy` when prepared,
`numpy_namespace()` (NumPy plus `erf`) for the reference run that `--check` falls back to.
"""
