"""NumPy-named functions for traced arrays: `import prepjit.numpy as pnp` inside a prepared function."""
from .tracing.numpy_api import *  # noqa: F401,F403
from .tracing.numpy_api import __all__, __getattr__  # noqa: F401  (pnp.bfloat16)
