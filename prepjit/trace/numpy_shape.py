"""NumPy-named movement and creation functions on traced arrays (reshape, transpose, concatenate, zeros...)."""
from __future__ import annotations

from ..errors import TraceError
from ..uop import Ops, UOp, dtypes, to_dtype
from . import prims
from .prims import normalize_axis, to_sint, to_tracer
from .tracer import Tracer


def reshape(x, shape) -> Tracer:
    shape = (shape,) if not isinstance(shape, (tuple, list)) else shape
    return prims.reshape(to_tracer(x), shape)


def transpose(x, axes=None) -> Tracer:
    x = to_tracer(x)
    return prims.permute(x, tuple(reversed(range(x.ndim))) if axes is None else axes)


def swapaxes(x, a: int, b: int) -> Tracer:
    x = to_tracer(x)
    order = list(range(x.ndim))
    a, b = normalize_axis(a, x.ndim), normalize_axis(b, x.ndim)
    order[a], order[b] = order[b], order[a]
    return prims.permute(x, order)


def expand_dims(x, axis) -> Tracer:
    x = to_tracer(x)
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    ndim = x.ndim + len(axes)
    axes = sorted(normalize_axis(a, ndim) for a in axes)
    shape = list(x.uop.shape)
    for a in axes:
        shape.insert(a, 1)
    return prims.reshape(x, shape)


def squeeze(x, axis=None) -> Tracer:
    x = to_tracer(x)
    shape = x.uop.shape
    if axis is None:
        axes = [i for i, d in enumerate(shape) if isinstance(d, int) and d == 1]
    else:
        axes = [normalize_axis(a, x.ndim) for a in (axis if isinstance(axis, (tuple, list)) else (axis,))]
        for a in axes:
            if not (isinstance(shape[a], int) and shape[a] == 1):
                raise ValueError("cannot select an axis to squeeze out which has size not equal to one")
    return prims.reshape(x, [d for i, d in enumerate(shape) if i not in axes])


def broadcast_to(x, shape) -> Tracer:
    return prims.broadcast_to(to_tracer(x), tuple(shape) if isinstance(shape, (tuple, list)) else (shape,))


def ravel(x) -> Tracer:
    return prims.reshape(to_tracer(x), (-1,))


def concatenate(arrays, axis=0) -> Tracer:
    xs = [to_tracer(a) for a in arrays]
    if not xs:
        raise ValueError("need at least one array to concatenate")
    if axis is None:
        xs, axis = [ravel(x) for x in xs], 0
    ndim = xs[0].ndim
    if any(x.ndim != ndim for x in xs):
        raise ValueError("all the input arrays must have same number of dimensions")
    axis = normalize_axis(axis, ndim)
    dt = prims.result_dtype(*xs)
    xs = [prims.cast(x, dt) for x in xs]
    for x in xs[1:]:
        for i in range(ndim):
            if i != axis and not prims.dims_equal(x.uop.shape[i], xs[0].uop.shape[i]):
                raise ValueError(f"concatenate: dimension {i} differs: {xs[0].shape_str} vs {x.shape_str}")
    sizes = [x.uop.shape[axis] for x in xs]
    total = sum(sizes[1:], start=UOp.const(0) + sizes[0])
    out, before = None, 0
    for x, size in zip(xs, sizes):
        after = total - before - size
        widths = [(0, 0)] * ndim
        widths[axis] = (before, after)
        padded = prims.pad(x, widths)
        out = padded if out is None else prims.elementwise(Ops.OR if dt == dtypes.bool else Ops.ADD, out, padded)
        before = before + size
    return out


def stack(arrays, axis=0) -> Tracer:
    xs = [to_tracer(a) for a in arrays]
    if not xs:
        raise ValueError("need at least one array to stack")
    return concatenate([expand_dims(x, axis) for x in xs], axis=axis)


# ---------- creation ----------

def _shape_arg(shape) -> tuple:
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    return tuple(to_sint(d, "a dimension") for d in shape)


def full(shape, fill_value, dtype=None) -> Tracer:
    value = to_tracer(fill_value)
    dt = to_dtype(dtype) if dtype is not None else (value.dtype if not value.weak else
                                                     {"b": dtypes.bool, "i": dtypes.int64, "u": dtypes.int64,
                                                      "f": dtypes.float64}[value.dtype.kind])
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


def iota(shape, axis: int, dtype=dtypes.int64) -> Tracer:
    """An array whose elements are their own index along `axis`."""
    shape = _shape_arg(shape)
    return prims.cast(Tracer(UOp(Ops.IOTA, dtypes.int64, (), (shape, axis))), to_dtype(dtype))


def arange(start, stop=None, step=1, dtype=None) -> Tracer:
    if stop is None:
        start, stop = 0, start
    floats = any(isinstance(v, float) for v in (start, stop, step))
    if floats:
        raise TraceError("arange with float bounds is not supported yet; use integer bounds and scale the result")
    start, stop, step = to_sint(start, "arange start"), to_sint(stop, "arange stop"), to_sint(step, "arange step")
    if not isinstance(step, int) or step == 0:
        raise TraceError("arange step must be a non-zero static int")
    size = (UOp.const(0) + stop - start + (step - 1 if step > 0 else step + 1)) // step
    size = to_sint(size.smax(0), "arange size")
    out = prims.elementwise(Ops.ADD, prims.elementwise(Ops.MUL, iota((size,), 0), step), start)
    return prims.cast(out, dtypes.int64 if dtype is None else to_dtype(dtype))
