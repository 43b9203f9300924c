"""NumPy-named reductions and scans on traced arrays: sum, prod, mean, max, min, argmax, var, std, cumsum, ..."""
from __future__ import annotations

import functools

import numpy as np

from ..uop import DType, Ops, UOp, dtypes, sym_prod, to_dtype
from . import checks, numpy_math, prims
from .numpy_math import (add, equal, isnan, logical_and, logical_or, maximum, minimum, multiply, sqrt, subtract,
                         true_divide, where)
from .numpy_create import iota
from .numpy_shape import ravel
from .prims import to_tracer
from .tracer import Tracer


def _reduction_dtype(name: str, x: Tracer, dtype) -> DType:
    return to_dtype(dtype) if dtype is not None else _numpy_reduction_dtype(name, x.dtype)


@functools.lru_cache(maxsize=None)
def _numpy_reduction_dtype(name: str, dt: DType) -> DType:
    """The dtype NumPy's reduction `name` gives an array of `dt` (asked once a pair: ~10 us a reduction)."""
    with np.errstate(all="ignore"):
        return to_dtype(getattr(np, name)(np.ones(1, dt.np)).dtype)


def _axis_of(x: Tracer, axis, scalar_axis_ok: bool = True):
    """`axis` for a reduction of `x`. On a 0-d array NumPy's ufunc reductions take axis 0 or -1 (they reduce
    nothing: axis None here); tuples, and the mean family, raise AxisError."""
    if x.ndim or axis is None or axis == ():
        return axis
    if scalar_axis_ok and isinstance(axis, (int, np.integer)) and not isinstance(axis, bool) and -1 <= axis <= 0:
        return None
    bad = axis[0] if isinstance(axis, (tuple, list)) else axis
    raise np.exceptions.AxisError(f"axis {bad} is out of bounds for array of dimension 0")


def _check_not_empty(x: Tracer, axis, name: str):
    """NumPy raises ValueError for max/min over an empty axis (there is no identity): at once for a static
    one, on every call whose var values make a symbolic one empty (a constraint of the plan)."""
    for a in prims.normalize_axes(axis, x.ndim):
        _require_not_empty(x.uop.shape[a], f"zero-size array to reduction operation {name} which has no identity")


def _require_not_empty(n, message: str):
    if isinstance(n, int):
        if n == 0:
            raise ValueError(message)
    else:
        checks.require(UOp.const(0), n, True, message, f"{n.render()} > 0", error_kind="empty")


def _with_initial(x: Tracer, axis, keepdims, op: Ops, dt: DType, initial, where, name: str) -> Tracer:
    """NumPy's `initial=` and `where=` of a ufunc reduction: elements where `where` is False are left out (set
    to the identity, or to `initial` for max / min, which have none), and the result is combined with `initial`
    (cast to the result dtype; a Python int must fit it), so an empty axis reduces to it."""
    x = prims.cast(x, dt)
    if initial is not None:
        initial = to_tracer(initial)
        if initial.ndim:
            raise ValueError(f"initial= must be a scalar, not an array of shape {initial.shape_str}")
        prims.check_python_int_fits(initial, dt)
        initial = prims.cast(initial, dt)
    if where is not None and where is not True:
        where = to_tracer(where)
        if where.dtype != dtypes.bool:
            raise TypeError(f"where= must be a bool array, not {where.dtype.name} (NumPy casts it with the 'safe' "
                            "rule)")
        if initial is None and op in (Ops.MAX, Ops.MIN):
            raise ValueError(f"reduction operation '{name}' does not have an identity, so to use a where mask one "
                             "has to specify 'initial'")
        fill = initial if op in (Ops.MAX, Ops.MIN) else prims.cast(to_tracer(0 if op is Ops.ADD else 1), dt)
        x = numpy_math.where(where, x, fill)
    if initial is None and op in (Ops.MAX, Ops.MIN):
        _check_not_empty(x, axis, name)
    if dt == dtypes.bool:
        op = {Ops.ADD: Ops.OR, Ops.MUL: Ops.AND, Ops.MAX: Ops.OR, Ops.MIN: Ops.AND}[op]
    out = prims.reduce(x, op, axis, keepdims)
    if initial is None:
        return out
    combine = {Ops.ADD: add, Ops.OR: logical_or, Ops.MUL: multiply, Ops.AND: logical_and, Ops.MAX: maximum,
               Ops.MIN: minimum}[op]
    return prims.cast(combine(out, initial), dt)


def sum(x, axis=None, keepdims=False, dtype=None, initial=None, where=True):  # noqa: A001 - NumPy's name
    x = to_tracer(x)
    return _with_initial(x, _axis_of(x, axis), keepdims, Ops.ADD, _reduction_dtype("sum", x, dtype), initial, where,
                         "add")


def prod(x, axis=None, keepdims=False, dtype=None, initial=None, where=True):
    x = to_tracer(x)
    return _with_initial(x, _axis_of(x, axis), keepdims, Ops.MUL, _reduction_dtype("prod", x, dtype), initial,
                         where, "multiply")


def max(x, axis=None, keepdims=False, initial=None, where=True):  # noqa: A001 - NumPy's name
    x = to_tracer(x)
    return _with_initial(x, _axis_of(x, axis), keepdims, Ops.MAX, x.dtype, initial, where, "maximum")


def min(x, axis=None, keepdims=False, initial=None, where=True):  # noqa: A001 - NumPy's name
    x = to_tracer(x)
    return _with_initial(x, _axis_of(x, axis), keepdims, Ops.MIN, x.dtype, initial, where, "minimum")


amax, amin = max, min


def all(x, axis=None, keepdims=False, where=True):  # noqa: A001 - NumPy's name
    x = to_tracer(x)
    return _with_initial(x, _axis_of(x, axis), keepdims, Ops.MUL, dtypes.bool, None, where, "logical_and")


def any(x, axis=None, keepdims=False, where=True):  # noqa: A001 - NumPy's name
    x = to_tracer(x)
    return _with_initial(x, _axis_of(x, axis), keepdims, Ops.ADD, dtypes.bool, None, where, "logical_or")


def _count(x: Tracer, axis) -> Tracer:
    return to_tracer(sym_prod(x.uop.shape[a] for a in prims.normalize_axes(axis, x.ndim)))


def _float_work_dtype(x: Tracer, dtype) -> tuple[DType, DType]:
    """(result dtype, accumulation dtype) of mean/var: ints -> float64, 16-bit floats accumulate in float32."""
    dt = to_dtype(dtype) if dtype is not None else _reduction_dtype("mean", x, None)
    return dt, dt.compute


def _count_where(x: Tracer, axis, keepdims: bool, where, acc: DType) -> Tracer:
    """How many elements each result of a reduction along `axis` takes (those where `where` is True), as `acc`."""
    if where is None or where is True:
        return prims.cast(_count(x, axis), acc)
    return sum(prims.broadcast_to(prims.cast(to_tracer(where), acc), x.uop.shape), axis=axis, keepdims=keepdims)


def mean(x, axis=None, keepdims=False, dtype=None, where=True):
    """NumPy's mean; with `where=` the mean of the elements where it is True (NaN where none is)."""
    x = to_tracer(x)
    axis = _axis_of(x, axis, scalar_axis_ok=False)
    dt, acc = _float_work_dtype(x, dtype)
    total = sum(prims.cast(x, acc), axis=axis, keepdims=keepdims, where=where)  # checks where= first
    return prims.cast(true_divide(total, _count_where(x, axis, keepdims, where, acc)), dt)


def var(x, axis=None, dtype=None, ddof=0, keepdims=False, where=True):
    """NumPy's var: mean of squared deviations from the mean, divided by max(n - ddof, 0); with `where=` over the
    elements where it is True (n: how many are)."""
    x = to_tracer(x)
    axis = _axis_of(x, axis, scalar_axis_ok=False)
    dt, acc = _float_work_dtype(x, dtype)
    xa = prims.cast(x, acc)
    centered = subtract(xa, mean(xa, axis=axis, keepdims=True, where=where))
    squares = sum(multiply(centered, centered), axis=axis, keepdims=keepdims, where=where)
    divisor = maximum(subtract(_count_where(x, axis, keepdims, where, acc), ddof), 0)
    return prims.cast(true_divide(squares, divisor), dt)


def std(x, axis=None, dtype=None, ddof=0, keepdims=False, where=True):
    return sqrt(var(x, axis=axis, dtype=dtype, ddof=ddof, keepdims=keepdims, where=where))


def _arg_extreme(x, axis, keepdims, extreme, name: str) -> Tracer:
    """The first index of the extreme value along `axis` (the first NaN if any, like NumPy)."""
    x = to_tracer(x)
    axis = _axis_of(x, axis)
    if axis is None:
        out = _arg_extreme(ravel(x), 0, False, extreme, name)
        return prims.reshape(out, (1,) * x.ndim) if keepdims else out
    axis = prims.normalize_axis(axis, x.ndim)
    n = x.uop.shape[axis]
    _require_not_empty(n, f"attempt to get {name} of an empty sequence")
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
    """out[..., i] = op-reduction of x[..., :i + 1] along `axis`, as a log-step (Hillis-Steele) scan: step k
    combines each element with the one 2**k before it, so ceil(log2(n)) steps of n elements (n at its
    maximum for a symbolic length) do O(n log n) work."""
    x = to_tracer(x)
    if axis is None or x.ndim == 0:  # NumPy scans a 0-d array as a 1-d one
        if axis is not None:
            prims.normalize_axis(axis, 1)
        x, axis = ravel(x), 0
    axis = prims.normalize_axis(axis, x.ndim)
    dt = _reduction_dtype(name, x, dtype)
    op = {Ops.ADD: Ops.OR, Ops.MUL: Ops.AND}[op] if dt == dtypes.bool else op
    identity = prims.cast(to_tracer(0 if op in (Ops.ADD, Ops.OR) else 1), dt)
    out = prims.cast(x, dt)
    n = out.uop.shape[axis]
    longest = n if isinstance(n, int) else n.vmax
    position = iota(out.uop.shape, axis)
    step = 1
    while step < longest:  # out[i] = op(out[i], out[i - step]) where i >= step
        before = prims.pad(out, [(step, 0) if d == axis else (0, 0) for d in range(out.ndim)])
        before = prims.shrink(before, [(0, 1, size) for size in out.uop.shape])
        out = prims.materialize(prims.elementwise(op, out, where(prims.elementwise(Ops.CMPLT, position, step),
                                                                   identity, before)))
        step *= 2
    return out


def cumsum(x, axis=None, dtype=None):
    return _scan(x, axis, dtype, "cumsum", Ops.ADD)


def cumprod(x, axis=None, dtype=None):
    return _scan(x, axis, dtype, "cumprod", Ops.MUL)
