"""Gathers: integer-array indexing (`table[ids]`, `x[:, ids]`, `x[i, j]`), take and take_along_axis.

Everything becomes one GATHER node: index arrays are broadcast to the output shape, and the
lowering reads the source at the loaded positions, negative ids wrapped once (NumPy), gated on the
id being in range, so no read ever leaves the array. Ids of any integer dtype first become int64 ids
that mean the same (`index_ids`: the one place the dtype matters). The mode says what an out-of-range id does:
None / "raise" (NumPy's): the call raises IndexBoundError (a flag the trace returns, checks.py);
"clip" / "wrap": clamped / taken modulo the dim (a non-empty gather from an empty axis still raises);
"fill": reads `fill_value` (JAX's). Static out-of-range ints raise IndexBoundError at once.
"""
from __future__ import annotations

from ..uop import Ops, UOp, as_int_if_const, dtypes, simplify, sym_prod
from . import prims
from .checks import record_flag
from .indexing import constant_index, getitem, index_int, is_array_index
from .numpy_math import clip, greater_equal, less, logical_and, logical_or, minimum, mod, where
from .numpy_reduce import any as any_
from .numpy_shape import ravel
from .prims import normalize_axis, to_tracer
from .tracer import Tracer


MODES = (None, "raise", "clip", "wrap", "fill")


def advanced_getitem(x: Tracer, key: tuple, mode=None, fill_value=None, checked_if=None) -> Tracer:
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
            start, _, _ = index_int(k, x.uop.shape[x_dim], f"axis {x_dim}")
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
    sizes = [y.uop.shape[p] for p in y_positions]
    return checked_gather(y, placed, dims, indices, sizes, mode, fill_value, checked_if)


def index_ids(ids: Tracer, size, wrap: bool = False) -> Tracer:
    """Index-array `ids` for an axis of `size` as int64 ids that mean the same, so that the range rules after
    it compare and clip in one dtype that holds every size (never in a narrow id dtype, where a size or -size
    would wrap). Signed ids cast exactly. Unsigned ids are never negative: they are compared in uint64 (which
    holds every unsigned id and every size), and one >= size (uint64's past int64's range too) becomes size,
    out of range as it was. `wrap`: taken modulo size first (mode 'wrap'), in the ids' own signedness."""
    if not ids.dtype.is_unsigned:
        ids = prims.cast(ids, dtypes.int64)
        return mod(ids, size) if wrap else ids
    ids, n = prims.cast(ids, dtypes.uint64), prims.cast(to_tracer(size), dtypes.uint64)
    return prims.cast(mod(ids, n) if wrap else minimum(ids, n), dtypes.int64)


def in_range(ids: Tracer, size) -> Tracer:
    """int64 ids in [-size, size): NumPy's valid range, negatives wrapping once."""
    return logical_and(greater_equal(ids, UOp.const(0) - size), less(ids, size))


def checked_gather(x: Tracer, placed: list, dims: list, indices: list, sizes: list, mode, fill_value,
                   checked_if=None) -> Tracer:
    """The gather of `x` at `placed` (indices broadcast to the output), with `mode`'s out-of-range rule.

    `indices` are the index arrays before broadcasting and `sizes` the dims they index (for the flag);
    `checked_if` (a symbolic bool) is when ids are checked at all (NumPy's take checks none when the dims
    before its axis hold no element).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(repr(m) for m in MODES[1:])} (got {mode!r})")
    placed = [index_ids(t, d, mode == "wrap") for t, d in zip(placed, sizes)]
    indices = [index_ids(t, d) for t, d in zip(indices, sizes)]
    if mode == "fill":
        out = prims.gather(x, placed, dims)
        inside = None
        for t, d in zip(placed, sizes):
            inside = in_range(t, d) if inside is None else logical_and(inside, in_range(t, d))
        fill = prims.to_tracer(0 if fill_value is None else fill_value)
        return prims.cast(where(inside, out, fill if fill.weak else prims.cast(fill, x.dtype)), x.dtype)
    if fill_value is not None:
        raise ValueError("fill_value is only used with mode='fill'")
    if mode == "clip":
        placed = [clip(t, 0, UOp.const(0) + d - 1) for t, d in zip(placed, sizes)]
    bad = None
    for t, d in zip(indices, sizes):
        if mode in (None, "raise"):
            wrong = ~in_range(t, d)
        elif (d if isinstance(d, int) else d.vmin) <= 0:  # clip / wrap: only an empty axis is out of range
            wrong = prims.broadcast_to(prims.to_tracer(UOp(Ops.CMPLT, dtypes.bool, (UOp.const(0) + d, UOp.const(1)))),
                                       t.uop.shape)
        else:
            continue
        bad = wrong if bad is None else logical_or(bad, wrong)
    if bad is not None and checked_if is not None:
        bad = logical_and(bad, prims.to_tracer(checked_if))
    if bad is not None:
        what = " (a non-empty gather from an empty axis)" if mode in ("clip", "wrap") else (
            ": an index is out of range (pnp.take / take_along_axis take mode='clip', 'wrap' or 'fill' to choose "
            "otherwise)")
        record_flag(any_(bad), f"a gather from {x.shape_str}{what}")
    return prims.gather(x, placed, dims)


def take(a, indices, axis=None, mode=None, fill_value=None) -> Tracer:
    """NumPy's take (out-of-range ids raise IndexBoundError), with JAX's 'fill' mode as well."""
    a = to_tracer(a)
    if axis is None:
        a, axis = ravel(a), 0
    axis = normalize_axis(axis, a.ndim)
    indices = constant_index(list(indices) if isinstance(indices, tuple) else indices)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(repr(m) for m in MODES[1:])} (got {mode!r})")
    if mode == "fill" and not is_array_index(indices):  # a scalar index: a gather of one id, so it can miss
        out_shape = tuple(d for i, d in enumerate(a.uop.shape) if i != axis)
        k = prims.cast(Tracer(UOp.const(0) + prims.to_sint(indices, "an index")), dtypes.int64)
        k = prims.broadcast_to(k, out_shape)
        dims = [("index", 0) if i == axis else ("dim", i - (i > axis)) for i in range(a.ndim)]
        return checked_gather(a, [k], dims, [k], [a.uop.shape[axis]], mode, fill_value)
    if is_array_index(indices):
        outer = simplify(UOp(Ops.CMPLT, dtypes.bool, (UOp.const(0), UOp.const(0) + sym_prod(a.uop.shape[:axis]))))
        return advanced_getitem(a, (slice(None),) * axis + (indices,), mode, fill_value,
                                None if outer.op is Ops.CONST and outer.arg else outer)
    n, k = UOp.const(0) + a.uop.shape[axis], UOp.const(0) + prims.to_sint(indices, "an index")
    if mode == "clip":  # an empty axis leaves -1: the index constraint then raises, as NumPy does
        k = k.smax(0).smin(n - 1)
    elif mode == "wrap":
        k = UOp(Ops.WHERE, dtypes.index, (UOp(Ops.CMPLT, dtypes.bool, (UOp.const(0), n)), k % n.smax(1), UOp.const(0)))
    return getitem(a, (slice(None),) * axis + (as_int_if_const(simplify(k)),))


def take_along_axis(arr, indices, axis, mode=None, fill_value=None) -> Tracer:
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
    return checked_gather(arr, [prims.broadcast_to(indices, out_shape)], dims, [indices], [arr.uop.shape[axis]],
                          mode, fill_value)
