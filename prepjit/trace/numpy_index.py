"""Gathers: integer-array indexing (`table[ids]`, `x[:, ids]`, `x[i, j]`), take and take_along_axis.

Everything becomes one GATHER node: index arrays are broadcast to the output shape, and the
lowering reads the source at the loaded positions. Negative indices wrap once like NumPy's;
out-of-range values are clamped (as in JAX) since they cannot be checked while tracing, so no
read ever leaves the array. Static out-of-range ints still raise IndexError like NumPy.
"""
from __future__ import annotations

from ..errors import TraceError
from ..uop import UOp
from . import prims
from .indexing import getitem, index_int, is_array_index
from .numpy_math import clip, mod
from .numpy_shape import ravel
from .prims import normalize_axis, to_tracer
from .tracer import Tracer


def advanced_getitem(x: Tracer, key: tuple) -> Tracer:
    """NumPy advanced indexing with integer arrays mixed with ints, slices, None and `...`."""
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
    if sum(1 for k in key if k is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if n_real > x.ndim:
        raise IndexError(f"too many indices for array: array is {x.ndim}-dimensional, but {n_real} were indexed")
    advanced_slots = [i for i, k in enumerate(key) if not (k is None or k is Ellipsis or isinstance(k, slice))]
    adjacent = advanced_slots == list(range(advanced_slots[0], advanced_slots[0] + len(advanced_slots)))
    if Ellipsis in [k for k in key if not isinstance(k, Tracer)]:
        i = next(i for i, k in enumerate(key) if k is Ellipsis)
        key = key[:i] + (slice(None),) * (x.ndim - n_real) + key[i + 1:]
    else:
        key = key + (slice(None),) * (x.ndim - n_real)
    basic, positions, indices = [], [], []
    x_dim = 0
    for k in key:
        if k is None or isinstance(k, slice):
            basic.append(k)
            x_dim += k is not None
            continue
        if is_array_index(k):
            index = to_tracer(k)
        else:  # an int next to an index array is itself an (0-d) index array, as in NumPy
            start, _, _ = index_int(k, x.uop.shape[x_dim])
            index = Tracer(start if isinstance(start, UOp) else UOp.const(start))
        positions.append(len(basic))
        indices.append(index)
        basic.append(slice(None))
        x_dim += 1
    y = getitem(x, tuple(basic))
    y_positions = positions  # every basic entry left (a slice or None) is one dim of y
    batch = prims.broadcast_shapes(*[t.uop.shape for t in indices])
    rest = [d for i, d in enumerate(y.uop.shape) if i not in y_positions]
    first = sum(1 for i in range(y_positions[0]) if i not in y_positions) if adjacent else 0
    out_shape = tuple(rest[:first]) + tuple(batch) + tuple(rest[first:])
    after = len(out_shape) - first - len(batch)
    placed = [prims.broadcast_to(prims.reshape(prims.broadcast_to(t, batch), (1,) * first + tuple(batch) + (1,) * after),
                                 out_shape) for t in indices]
    dims, rest_i = [], 0
    for i in range(y.ndim):
        if i in y_positions:
            dims.append(("index", y_positions.index(i)))
        else:
            dims.append(("dim", rest_i if rest_i < first else rest_i + len(batch)))
            rest_i += 1
    return prims.gather(y, placed, dims)


def take(a, indices, axis=None, mode=None) -> Tracer:
    """NumPy's take. mode None/'raise' wraps negatives then clamps (out-of-range ids cannot raise while
    tracing); 'wrap' takes indices modulo the dim; 'clip' clamps without wrapping negatives."""
    a = to_tracer(a)
    if axis is None:
        a, axis = ravel(a), 0
    axis = normalize_axis(axis, a.ndim)
    if isinstance(indices, (list, tuple)):
        raise TraceError("take with a constant list of indices is not supported; pass the indices as an argument")
    n = a.uop.shape[axis]
    if isinstance(indices, Tracer) and mode == "wrap":
        indices = mod(indices, n)
    elif isinstance(indices, Tracer) and mode == "clip":
        indices = clip(indices, 0, n - 1)
    elif mode not in (None, "raise", "wrap", "clip"):
        raise ValueError(f"clipmode must be one of 'clip', 'raise', or 'wrap' (got {mode!r})")
    key = (slice(None),) * axis + (indices,)
    return advanced_getitem(a, key) if is_array_index(indices) else getitem(a, key)


def take_along_axis(arr, indices, axis) -> Tracer:
    """NumPy's take_along_axis: out[..., i, ...] = arr[..., indices[..., i, ...], ...], other dims broadcast."""
    arr, indices = to_tracer(arr), to_tracer(indices)
    if axis is None:
        if indices.ndim != 1:
            raise ValueError("when axis=None, `indices` must have a single dimension.")
        arr, axis = ravel(arr), 0
    if not indices.dtype.is_int:
        raise IndexError("`indices` must be an integer array")
    if indices.ndim != arr.ndim:
        raise ValueError("`indices` and `arr` must have the same number of dimensions")
    axis = normalize_axis(axis, arr.ndim)
    others = prims.broadcast_shapes(*[tuple(1 if i == axis else d for i, d in enumerate(t.uop.shape))
                                      for t in (arr, indices)])
    out_shape = tuple(indices.uop.shape[axis] if i == axis else d for i, d in enumerate(others))
    arr = prims.broadcast_to(arr, tuple(arr.uop.shape[axis] if i == axis else d for i, d in enumerate(others)))
    dims = [("index", 0) if i == axis else ("dim", i) for i in range(arr.ndim)]
    return prims.gather(arr, [prims.broadcast_to(indices, out_shape)], dims)
