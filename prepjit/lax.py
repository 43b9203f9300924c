"""`pj.lax`: functions named and shaped as JAX's `jax.lax`, for code written against it (top_k)."""
from .trace.numpy_sort import top_k

__all__ = ["top_k"]
