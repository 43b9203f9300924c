"""NumPy-named movement functions on traced arrays: reshape, transpose, concatenate, pad, flip, roll, tile, ..."""
from __future__ import annotations

import builtins

import numpy as np

from ..errors import TraceError
from ..uop import Ops, UOp, as_int_if_const, as_uop, dtypes
from . import prims
from .indexing import getitem
from .numpy_create import iota
from .numpy_math import clip, less, mod, subtract, where
from .prims import normalize_axis, to_sint, to_tracer
from .tracer import Tracer

builtins_max = builtins.max


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
    out, before, position = None, 0, None
    for x, size in zip(xs, sizes):
        widths = [(0, 0)] * ndim
        widths[axis] = (before, total - before - size)
        padded = prims.pad(x, widths)
        if out is None:
            out = padded
        else:  # select, rather than add, so that values (-0.0 included) come through exactly
            position = iota(padded.uop.shape, axis) if position is None else position
            out = prims.elementwise(Ops.WHERE, prims.elementwise(Ops.CMPLT, position, before), out, padded)
        before = before + size
    return out


def stack(arrays, axis=0) -> Tracer:
    xs = [to_tracer(a) for a in arrays]
    if not xs:
        raise ValueError("need at least one array to stack")
    return concatenate([expand_dims(x, axis) for x in xs], axis=axis)


def moveaxis(x, source, destination) -> Tracer:
    x = to_tracer(x)
    src = [normalize_axis(a, x.ndim) for a in (source if isinstance(source, (tuple, list)) else (source,))]
    dst = [normalize_axis(a, x.ndim) for a in (destination if isinstance(destination, (tuple, list)) else (destination,))]
    if len(src) != len(dst):
        raise ValueError("`source` and `destination` arguments must have the same number of elements")
    order = [a for a in range(x.ndim) if a not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return prims.permute(x, order)


def flip(x, axis=None) -> Tracer:
    x = to_tracer(x)
    axes = prims.normalize_axes(axis, x.ndim)
    spec = [((UOp.const(0) + d - 1), -1, d) if i in axes else (0, 1, d) for i, d in enumerate(x.uop.shape)]
    return prims.shrink(x, [(as_int_if_const(s) if isinstance(s, UOp) else s, st, n) for s, st, n in spec])


def roll(x, shift, axis=None) -> Tracer:
    """NumPy's roll: out[i] = x[(i - shift) mod n] along each axis (shifts may be symbolic)."""
    x = to_tracer(x)
    if axis is None:
        return prims.reshape(roll(ravel(x), shift, 0), x.uop.shape)
    shifts = shift if isinstance(shift, (tuple, list)) else (shift,)
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    if len(shifts) == 1:
        shifts = shifts * len(axes)
    if len(axes) == 1:
        axes = axes * len(shifts)
    if len(shifts) != len(axes):
        raise ValueError("'shift' and 'axis' should be scalars or 1D sequences of the same length")
    total = {}
    for s, a in zip(shifts, axes):
        a = normalize_axis(a, x.ndim)
        total[a] = UOp.const(0) + total.get(a, 0) + to_sint(s, "a roll shift")
    if not x.ndim:
        return x
    shape = x.uop.shape
    dims = []
    indices = []
    for a in range(x.ndim):
        if a in total:
            position = prims.elementwise(Ops.SUB, iota(shape, a), Tracer(as_uop(total[a])))
            indices.append(prims.elementwise(Ops.MOD, position, Tracer(as_uop(shape[a]))))
            dims.append(("index", len(indices) - 1))
        else:
            dims.append(("dim", a))
    if not indices:
        return x
    return prims.gather(x, indices, dims)


def tile(x, reps) -> Tracer:
    x = to_tracer(x)
    reps = tuple(reps) if isinstance(reps, (tuple, list)) else (reps,)
    reps = tuple(to_sint(r, "a tile count") for r in reps)
    ndim = builtins_max(len(reps), x.ndim)
    reps = (1,) * (ndim - len(reps)) + reps
    shape = (1,) * (ndim - x.ndim) + tuple(x.uop.shape)
    interleaved = [v for d in shape for v in (1, d)]
    expanded = [v for r, d in zip(reps, shape) for v in (r, d)]
    out = prims.broadcast_to(prims.reshape(x, interleaved), expanded)
    return prims.reshape(out, [UOp.const(0) + r * d if isinstance(r, UOp) or isinstance(d, UOp) else r * d
                               for r, d in zip(reps, shape)])


def repeat(x, repeats, axis=None) -> Tracer:
    """NumPy's repeat with one (static or symbolic) count for every element."""
    x = to_tracer(x)
    if isinstance(repeats, (tuple, list)) or isinstance(repeats, Tracer) and repeats.ndim:
        raise TraceError("repeat with per-element counts gives a data-dependent shape; pass one int count")
    r = to_sint(repeats, "a repeat count")
    if axis is None or x.ndim == 0:  # NumPy repeats a 0-d array as a 1-d one (axis 0 or -1)
        if axis is not None:
            normalize_axis(axis, 1)
        x, axis = ravel(x), 0
    axis = normalize_axis(axis, x.ndim)
    shape = tuple(x.uop.shape)
    split_shape = shape[:axis + 1] + (1,) + shape[axis + 1:]
    out = prims.broadcast_to(prims.reshape(x, split_shape), shape[:axis + 1] + (r,) + shape[axis + 1:])
    return prims.reshape(out, shape[:axis] + (UOp.const(0) + shape[axis] * r,) + shape[axis + 1:])


def _triangle(x, k: int, lower: bool) -> Tracer:
    x = to_tracer(x)
    if x.ndim < 2:
        raise ValueError("input array must be at least 2-d")
    shape = x.uop.shape
    rows, cols = iota(shape, x.ndim - 2), iota(shape, x.ndim - 1)
    if lower:  # keep j <= i + k
        keep = prims.elementwise(Ops.CMPLT, cols, prims.elementwise(Ops.ADD, rows, k + 1))
    else:  # keep j >= i + k
        keep = prims.elementwise(Ops.CMPLT, prims.elementwise(Ops.ADD, rows, k - 1), cols)
    return prims.elementwise(Ops.WHERE, keep, x, prims.cast(to_tracer(0), x.dtype))


def tril(x, k: int = 0) -> Tracer:
    return _triangle(x, k, lower=True)


def triu(x, k: int = 0) -> Tracer:
    return _triangle(x, k, lower=False)


def pad(x, pad_width, mode: str = "constant", constant_values=0) -> Tracer:
    """NumPy's pad in modes constant, edge, wrap, reflect and symmetric; widths may be symbolic ints."""
    x = to_tracer(x)
    widths = _pad_widths(pad_width, x.ndim)
    if mode in _PAD_SOURCE:
        for axis, (before, after) in enumerate(widths):
            x = _pad_by_gather(x, axis, to_sint(before, "a pad width"), to_sint(after, "a pad width"), mode)
        return x
    if mode != "constant":
        raise ValueError(f"mode {mode!r} is not supported: pad takes constant, edge, wrap, reflect or symmetric")
    padded = prims.pad(x, widths)
    if isinstance(constant_values, (tuple, list)):
        raise TraceError("pad with per-side constant_values is not supported yet; pass one scalar")
    fill = prims.cast(to_tracer(constant_values), x.dtype)
    if fill.uop.op is Ops.CONST and fill.uop.arg == 0 and np.signbit(fill.uop.arg) == 0:
        return padded
    inside = prims.pad(prims.broadcast_to(Tracer(UOp.const(True, dtypes.bool)), x.uop.shape), widths)
    return prims.elementwise(Ops.WHERE, inside, padded, Tracer(fill.uop, weak=True))


# per mode: the source index along the axis of output position p - before (any int), in an axis of size n
_PAD_SOURCE = {
    "edge": lambda q, n: clip(q, 0, n - 1),
    "wrap": lambda q, n: mod(q, n),
    "reflect": lambda q, n: _fold(mod(q, 2 * n - 2), n, 2 * n - 2),
    "symmetric": lambda q, n: _fold(mod(q, 2 * n), n, 2 * n - 1),
}


def _fold(q, n, mirror):
    return where(less(q, n), q, subtract(mirror, q))


def _pad_by_gather(x: Tracer, axis: int, before, after, mode: str) -> Tracer:
    if isinstance(before, int) and isinstance(after, int) and before == after == 0:
        return x
    n = x.uop.shape[axis]
    if (n if isinstance(n, int) else n.vmin) < 1:
        if isinstance(n, int):
            raise ValueError(f"can't extend empty axis {axis} using modes other than 'constant' or 'empty'")
        raise TraceError(f"pad mode {mode!r} along axis {axis}, whose size {n.render()} may be 0: NumPy cannot "
                         "extend an empty axis; give the var a minimum of 1")
    shape = tuple(as_int_if_const(as_uop(d) + before + after) if i == axis else d for i, d in enumerate(x.uop.shape))
    n_index = n if isinstance(n, int) else Tracer(n, weak=True)
    source = _PAD_SOURCE[mode](subtract(iota(shape, axis), to_tracer(before)), n_index)
    dims = [("index", 0) if m == axis else ("dim", m) for m in range(x.ndim)]
    return prims.gather(x, [source], dims)


def _pad_widths(pad_width, ndim: int) -> tuple:
    if isinstance(pad_width, (int, np.integer, UOp, Tracer)):
        return ((pad_width, pad_width),) * ndim
    pw = tuple(pad_width)
    if pw and not isinstance(pw[0], (tuple, list)):
        pw = (pw,)
    pw = tuple(tuple(p) if len(p) == 2 else (p[0], p[0]) for p in pw)
    if len(pw) == 1:
        pw = pw * ndim
    if len(pw) != ndim:
        raise ValueError(f"pad_width has {len(pw)} entries for an array of dimension {ndim}")
    return pw


def split(x, indices_or_sections, axis=0) -> list:
    """NumPy's split: equal sections (an int, dims may be symbolic) or a list of split points."""
    x = to_tracer(x)
    axis = normalize_axis(axis, x.ndim)
    n = x.uop.shape[axis]
    if isinstance(indices_or_sections, (tuple, list)):
        points = [0, *indices_or_sections, None]
    else:
        sections = to_sint(indices_or_sections, "a section count")
        if not isinstance(sections, int) or sections <= 0:
            raise TraceError("split needs a static positive number of sections")
        size = as_int_if_const(UOp.const(0) + n) // sections if isinstance(n, int) else (UOp.const(0) + n) // sections
        if not prims.dims_equal(UOp.const(0) + size * sections, n):
            raise ValueError("array split does not result in an equal division")
        points = [as_int_if_const(UOp.const(0) + size * i) for i in range(sections)] + [None]
    pieces = []
    for lo, hi in zip(points[:-1], points[1:]):
        pieces.append(getitem(x, (slice(None),) * axis + (slice(lo, hi),)))
    return pieces
