"""NumPy-named reductions and scans on traced arrays: sum, prod, mean, max, min, argmax, var, std, cumsum, ..."""
from __future__ import annotations

import numpy as np

from ..uop import DType, Ops, dtypes, sym_prod, to_dtype
from . import prims
from .numpy_math import equal, isnan, logical_or, multiply, sqrt, subtract, true_divide, where
from .numpy_create import iota
from .numpy_shape import moveaxis, ravel
from .prims import to_tracer
from .tracer import Tracer


def _reduction_dtype(name: str, x: Tracer, dtype) -> DType:
    if dtype is not None:
        return to_dtype(dtype)
    with np.errstate(all="ignore"):
        return to_dtype(getattr(np, name)(np.ones(1, x.dtype.np)).dtype)


def _check_not_empty(x: Tracer, axis, name: str):
    """NumPy raises for max/min/argmax over an empty static axis (there is no identity)."""
    for a in prims.normalize_axes(axis, x.ndim):
        if isinstance(x.uop.shape[a], int) and x.uop.shape[a] == 0:
            raise ValueError(f"zero-size array to reduction operation {name} which has no identity")


def sum(x, axis=None, keepdims=False, dtype=None):  # noqa: A001 - NumPy's name
    x = to_tracer(x)
    dt = _reduction_dtype("sum", x, dtype)
    return prims.reduce(prims.cast(x, dt), Ops.OR if dt == dtypes.bool else Ops.ADD, axis, keepdims)


def prod(x, axis=None, keepdims=False, dtype=None):
    x = to_tracer(x)
    dt = _reduction_dtype("prod", x, dtype)
    return prims.reduce(prims.cast(x, dt), Ops.AND if dt == dtypes.bool else Ops.MUL, axis, keepdims)


def max(x, axis=None, keepdims=False):  # noqa: A001 - NumPy's name
    x = to_tracer(x)
    _check_not_empty(x, axis, "maximum")
    return prims.reduce(x, Ops.OR if x.dtype == dtypes.bool else Ops.MAX, axis, keepdims)


def min(x, axis=None, keepdims=False):  # noqa: A001 - NumPy's name
    x = to_tracer(x)
    _check_not_empty(x, axis, "minimum")
    return prims.reduce(x, Ops.AND if x.dtype == dtypes.bool else Ops.MIN, axis, keepdims)


amax, amin = max, min


def all(x, axis=None, keepdims=False):  # noqa: A001 - NumPy's name
    return prims.reduce(prims.cast(to_tracer(x), dtypes.bool), Ops.AND, axis, keepdims)


def any(x, axis=None, keepdims=False):  # noqa: A001 - NumPy's name
    return prims.reduce(prims.cast(to_tracer(x), dtypes.bool), Ops.OR, axis, keepdims)


def _count(x: Tracer, axis) -> Tracer:
    return to_tracer(sym_prod(x.uop.shape[a] for a in prims.normalize_axes(axis, x.ndim)))


def _float_work_dtype(x: Tracer, dtype) -> tuple[DType, DType]:
    """(result dtype, accumulation dtype) of mean/var: ints -> float64, float16 accumulates in float32."""
    dt = to_dtype(dtype) if dtype is not None else _reduction_dtype("mean", x, None)
    return dt, dtypes.float32 if dt == dtypes.float16 else dt


def mean(x, axis=None, keepdims=False, dtype=None):
    x = to_tracer(x)
    dt, acc = _float_work_dtype(x, dtype)
    total = sum(prims.cast(x, acc), axis=axis, keepdims=keepdims)
    return prims.cast(true_divide(total, prims.cast(_count(x, axis), acc)), dt)


def var(x, axis=None, dtype=None, ddof=0, keepdims=False):
    """NumPy's var: mean of squared deviations from the mean, divided by max(n - ddof, 0)."""
    x = to_tracer(x)
    dt, acc = _float_work_dtype(x, dtype)
    xa = prims.cast(x, acc)
    centered = subtract(xa, mean(xa, axis=axis, keepdims=True))
    squares = sum(multiply(centered, centered), axis=axis, keepdims=keepdims)
    divisor = prims.elementwise(Ops.MAX, prims.elementwise(Ops.SUB, _count(x, axis), ddof), 0)
    return prims.cast(true_divide(squares, prims.cast(divisor, acc)), dt)


def std(x, axis=None, dtype=None, ddof=0, keepdims=False):
    return sqrt(var(x, axis=axis, dtype=dtype, ddof=ddof, keepdims=keepdims))


def _arg_extreme(x, axis, keepdims, extreme, name: str) -> Tracer:
    """The first index of the extreme value along `axis` (the first NaN if any, like NumPy)."""
    x = to_tracer(x)
    if axis is None:
        out = _arg_extreme(ravel(x), 0, False, extreme, name)
        return prims.reshape(out, (1,) * x.ndim) if keepdims else out
    axis = prims.normalize_axis(axis, x.ndim)
    n = x.uop.shape[axis]
    if isinstance(n, int) and n == 0:
        raise ValueError(f"attempt to get {name} of an empty sequence")
    hit = equal(x, extreme(x, axis=axis, keepdims=True))
    if x.dtype.is_float:
        hit = logical_or(hit, isnan(x))
    positions = where(hit, iota(x.uop.shape, axis), to_tracer(n))
    return prims.reduce(prims.cast(positions, dtypes.int64), Ops.MIN, axis, keepdims)


def argmax(x, axis=None, keepdims=False):
    return _arg_extreme(x, axis, keepdims, max, "argmax")


def argmin(x, axis=None, keepdims=False):
    return _arg_extreme(x, axis, keepdims, min, "argmin")


def _scan(x, axis, dtype, name: str, op: Ops) -> Tracer:
    """out[..., i] = op-reduction of x[..., :i + 1] along `axis`: a masked reduction over a square."""
    x = to_tracer(x)
    if axis is None:
        x, axis = ravel(x), 0
    axis = prims.normalize_axis(axis, x.ndim)
    dt = _reduction_dtype(name, x, dtype)
    moved = moveaxis(prims.cast(x, dt), axis, -1)
    n = moved.uop.shape[-1]
    square = prims.broadcast_to(prims.reshape(moved, moved.uop.shape[:-1] + (1, n)), moved.uop.shape + (n,))
    keep = prims.elementwise(Ops.CMPLT, iota((n, n), 1), prims.elementwise(Ops.ADD, iota((n, n), 0), 1))  # j <= i
    kept = where(keep, square, prims.cast(to_tracer(0 if op is Ops.ADD else 1), dt))
    reduce_op = {Ops.ADD: Ops.OR, Ops.MUL: Ops.AND}[op] if dt == dtypes.bool else op
    return moveaxis(prims.reduce(kept, reduce_op, -1), -1, axis)


def cumsum(x, axis=None, dtype=None):
    return _scan(x, axis, dtype, "cumsum", Ops.ADD)


def cumprod(x, axis=None, dtype=None):
    return _scan(x, axis, dtype, "cumprod", Ops.MUL)
