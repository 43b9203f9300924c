"""Neural-network helpers for traced arrays: `import prepjit.nn as pnn` inside a prepared function."""
from .tracing.nn_ops import *  # noqa: F401,F403
from .tracing.nn_ops import __all__  # noqa: F401
