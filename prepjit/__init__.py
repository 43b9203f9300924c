"""prepjit: trace NumPy-style functions once, replay prepared kernels with new shapes."""
