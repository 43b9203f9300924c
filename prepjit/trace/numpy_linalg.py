"""NumPy-named linear algebra on traced arrays: matmul (batched and vector cases), dot, outer."""
from __future__ import annotations

from ..errors import TraceError
from . import prims
from .numpy_math import multiply, sum
from .numpy_shape import expand_dims, reshape, swapaxes
from .prims import to_tracer
from .tracer import Tracer


def matmul(a, b) -> Tracer:
    a, b = to_tracer(a), to_tracer(b)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError("matmul: input operand does not have enough dimensions")
    a2 = expand_dims(a, 0) if a.ndim == 1 else a
    b2 = expand_dims(b, 1) if b.ndim == 1 else b
    if not prims.dims_equal(a2.uop.shape[-1], b2.uop.shape[-2]):
        raise ValueError(f"matmul: contracted dims differ: {a.shape_str} @ {b.shape_str}")
    dt = prims.result_dtype(a, b)
    # (..., M, K) -> (..., M, 1, K);  (..., K, N) -> (..., 1, N, K);  multiply and sum over K
    lhs = expand_dims(prims.cast(a2, dt), -2)
    rhs = expand_dims(swapaxes(prims.cast(b2, dt), -1, -2), -3)
    out = sum(multiply(lhs, rhs), axis=-1, dtype=dt)
    if a.ndim == 1:
        out = reshape(out, out.uop.shape[:-2] + out.uop.shape[-1:])
    if b.ndim == 1:
        out = reshape(out, out.uop.shape[:-1])
    return out


def dot(a, b) -> Tracer:
    a, b = to_tracer(a), to_tracer(b)
    if a.ndim == 0 or b.ndim == 0:
        return multiply(a, b)
    if b.ndim > 2:
        raise TraceError("dot with a >2-d second operand is not supported; use matmul or einsum")
    return matmul(a, b)


def outer(a, b) -> Tracer:
    a, b = to_tracer(a), to_tracer(b)
    return multiply(reshape(a, (-1, 1)), reshape(b, (1, -1)))
