"""`pj.lax`: functions named and shaped as JAX's `jax.lax`, for code written against it (top_k, control flow)."""
from .tracing.control import cond, scan, switch
from .tracing.control import scan_map as map  # noqa: A004 - jax.lax's name
from .tracing.loop import fori_loop, while_loop
from .tracing.numpy_sort import top_k

__all__ = ["top_k", "cond", "switch", "scan", "map", "fori_loop", "while_loop"]
