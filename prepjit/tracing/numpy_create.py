"""NumPy-named creation functions inside traced functions: zeros, ones, full, *_like, arange, eye, linspace.

Shapes and sizes may be symbolic ints (vars). Created arrays are broadcast constants or index
arithmetic (`iota`), so they cost no memory.
"""
from __future__ import annotations

import numpy as np

from ..errors import TraceError
from ..uop import Ops, UOp, dtypes, to_dtype
from . import prims
from .prims import to_sint, to_tracer
from .tracer import Tracer

_DEFAULT_OF_KIND = {"b": dtypes.bool, "i": dtypes.int64, "u": dtypes.int64, "f": dtypes.float64}


def _shape_arg(shape) -> tuple:
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    return tuple(to_sint(d, "a dimension") for d in shape)


def full(shape, fill_value, dtype=None) -> Tracer:
    value = to_tracer(fill_value)
    dt = to_dtype(dtype) if dtype is not None else _DEFAULT_OF_KIND[value.dtype.kind] if value.weak else value.dtype
    return prims.broadcast_to(Tracer(prims.cast(value, dt).uop), _shape_arg(shape))


def zeros(shape, dtype=None) -> Tracer:
    return full(shape, 0, dtypes.float64 if dtype is None else dtype)


def ones(shape, dtype=None) -> Tracer:
    return full(shape, 1, dtypes.float64 if dtype is None else dtype)


def full_like(x, fill_value, dtype=None) -> Tracer:
    x = to_tracer(x)
    return full(x.uop.shape, fill_value, x.dtype if dtype is None else dtype)


def zeros_like(x, dtype=None) -> Tracer:
    return full_like(x, 0, dtype)


def ones_like(x, dtype=None) -> Tracer:
    return full_like(x, 1, dtype)


def asarray(a, dtype=None) -> Tracer:
    """A traced array from a traced array, a scalar, a NumPy array or nested lists (captured as a plan constant:
    tracing/constants.py)."""
    if isinstance(a, (list, tuple)):
        a = np.asarray(a)
    t = to_tracer(a)
    return t if dtype is None else prims.cast(t, to_dtype(dtype))


array = asarray


def iota(shape, axis: int, dtype=dtypes.int64) -> Tracer:
    """An array whose elements are their own index along `axis`."""
    shape = _shape_arg(shape)
    return prims.cast(Tracer(UOp(Ops.IOTA, dtypes.int64, (), (shape, axis))), to_dtype(dtype))


def arange(start, stop=None, step=1, dtype=None) -> Tracer:
    """NumPy's arange; integer bounds may be symbolic, float bounds must be static."""
    if stop is None:
        start, stop = 0, start
    if any(isinstance(v, (float, np.floating)) for v in (start, stop, step)):
        return _arange_float(float(start), float(stop), float(step), dtype)
    start, stop, step = to_sint(start, "arange start"), to_sint(stop, "arange stop"), to_sint(step, "arange step")
    if not isinstance(step, int) or step == 0:
        raise TraceError("arange step must be a non-zero static int")
    if isinstance(start, int) and isinstance(stop, int):
        size = len(range(start, stop, step))
    else:  # ceil((stop - start) / step), with a positive divisor so that bounds stay tight
        span = UOp.const(0) + (stop - start if step > 0 else start - stop)
        size = to_sint(((span + (abs(step) - 1)) // abs(step)).smax(0), "arange size")
    out = prims.elementwise(Ops.ADD, prims.elementwise(Ops.MUL, iota((size,), 0), step), start)
    return prims.cast(out, dtypes.int64 if dtype is None else to_dtype(dtype))


def _arange_float(start: float, stop: float, step: float, dtype) -> Tracer:
    """NumPy fills start + i * delta with delta = (start + step) - start, in float64."""
    size = len(np.arange(start, stop, step))
    delta = (start + step) - start
    values = prims.elementwise(Ops.ADD, prims.elementwise(Ops.MUL, iota((size,), 0, dtypes.float64), delta), start)
    return prims.cast(values, dtypes.float64 if dtype is None else to_dtype(dtype))


def eye(N, M=None, k: int = 0, dtype=dtypes.float64) -> Tracer:  # noqa: N803 - NumPy's names
    shape = _shape_arg((N, N if M is None else M))
    diagonal = prims.elementwise(Ops.CMPEQ, prims.elementwise(Ops.ADD, iota(shape, 0), k), iota(shape, 1))
    return prims.cast(diagonal, dtype)


def identity(n, dtype=dtypes.float64) -> Tracer:
    return eye(n, dtype=dtype)


def tri(N, M=None, k: int = 0, dtype=dtypes.float64) -> Tracer:  # noqa: N803 - NumPy's names
    """Ones at and below the k-th diagonal: [i, j] = j <= i + k."""
    shape = _shape_arg((N, N if M is None else M))
    below = prims.elementwise(Ops.CMPLT, iota(shape, 1), prims.elementwise(Ops.ADD, iota(shape, 0), k + 1))
    return prims.cast(below, dtype)


def linspace(start, stop, num=50, endpoint: bool = True, dtype=None) -> Tracer:
    """NumPy's linspace for scalar bounds: start + i * step in float64, the last element exactly `stop`."""
    start, stop = to_tracer(start), to_tracer(stop)
    if start.ndim or stop.ndim:
        raise TraceError("linspace supports scalar start and stop only")
    default = prims.result_dtype(start, stop, to_tracer(1.0))
    num = to_sint(num, "linspace num")
    if isinstance(num, int) and num < 0:
        raise ValueError(f"Number of samples, {num}, must be non-negative.")
    f64 = dtypes.float64
    start, stop = prims.cast(start, f64), prims.cast(stop, f64)
    div = prims.elementwise(Ops.SUB, to_tracer(num), 1 if endpoint else 0)
    positions = iota((num,), 0, f64)
    delta = prims.elementwise(Ops.SUB, stop, start)
    step = prims.elementwise(Ops.FDIV, delta, prims.cast(prims.elementwise(Ops.MAX, div, 1), f64))
    values = prims.elementwise(Ops.ADD, prims.elementwise(Ops.MUL, positions, step), start)
    if endpoint:
        index = iota((num,), 0)
        last = prims.elementwise(Ops.AND, prims.elementwise(Ops.CMPEQ, index, div),
                                 prims.elementwise(Ops.CMPLT, 0, index))
        values = prims.elementwise(Ops.WHERE, last, stop, values)
    out = default if dtype is None else to_dtype(dtype)
    if out.is_int:
        values = prims.elementwise(Ops.FLOOR, values)
    return prims.cast(values, out)
