"""Searching and data-dependent selection on traced arrays: searchsorted, and JAX's static-size forms of
unique, nonzero, flatnonzero, argwhere and one-argument where.

A result whose length depends on the data (how many unique values, how many nonzeros) has no static
shape, so, as in JAX, these take `size=`: the result has exactly `size` entries, the first ones found and
then `fill_value`. Without `size=` they raise TraceError saying so.

searchsorted is a branchless binary search (ceil(log2 n) probes per needle, inlined into one kernel); the
others are built on it: slot m of nonzero is the first position whose running count of nonzeros reaches
m + 1, and slot m of unique the first position of the sorted array that starts the (m + 1)-th run.
"""
from __future__ import annotations

import numpy as np

from ..errors import TraceError
from ..uop import Ops, dtypes
from . import prims
from .numpy_create import iota
from .numpy_math import where as where3
from .numpy_reduce import cumsum, sum as sum_
from .numpy_shape import ravel, stack
from .numpy_sort import sort_order
from .prims import to_tracer
from .tracer import Tracer


def _op(op: Ops, *xs, dtype=None) -> Tracer:
    return prims.elementwise(op, *xs, dtype=dtype)


def _nan_less(a: Tracer, b: Tracer) -> Tracer:
    """a < b in sort order: NaN after every number (NumPy's)."""
    less = _op(Ops.CMPLT, a, b)
    if not a.dtype.is_float:
        return less
    return _op(Ops.OR, less, _op(Ops.AND, _op(Ops.CMPNE, b, b), _op(Ops.CMPEQ, a, a)))


def _gather1(a: Tracer, index: Tracer) -> Tracer:
    """a[index] for 1-d `a` (out-of-range ids clamp: callers mask what they read there)."""
    return prims.gather(a, [index], [("index", 0)])


def _search(a: Tracer, v: Tracer, right: bool) -> Tracer:
    """The number of entries of sorted 1-d `a` before each needle of `v` (int64, v's shape)."""
    dt = prims.result_dtype(a, v)
    a, v = prims.cast(a, dt), prims.cast(v, dt)
    m = a.uop.shape[0]
    longest = m if isinstance(m, int) else m.vmax
    count = prims.broadcast_to(prims.cast(to_tracer(0), dtypes.int64), v.uop.shape)
    step = 1 << (longest.bit_length() - 1) if longest else 0
    while step:
        candidate = _op(Ops.ADD, count, step)
        probe = _gather1(a, _op(Ops.MIN, _op(Ops.SUB, candidate, 1), _op(Ops.SUB, to_tracer(m), 1)))  # (m - 1:
        # an index the bounds proof can see is below m on every path)
        before = _op(Ops.NOT, _nan_less(v, probe)) if right else _nan_less(probe, v)
        inside = _op(Ops.CMPLT, candidate, _op(Ops.ADD, to_tracer(m), 1))
        count = _op(Ops.WHERE, _op(Ops.AND, inside, before), candidate, count)
        step //= 2
    return count


def searchsorted(a, v, side="left", sorter=None) -> Tracer:
    """NumPy's searchsorted: where each value of `v` would go into sorted 1-d `a` (NaNs sort last)."""
    a, v = to_tracer(a), to_tracer(v)
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right' (got {side!r})")
    if a.ndim != 1:
        raise ValueError(f"searchsorted needs a 1-d array to search, got shape {a.shape_str}")
    if sorter is not None:
        from .numpy_index import take
        a = take(a, sorter)
    return _search(a, v, side == "right")


def _static_size(size, name: str) -> int:
    if size is None:
        raise TraceError(f"{name} without size= has a data-dependent shape, which a traced function cannot have: "
                         f"pass size=N (a static int, as in JAX) to get exactly N entries, the rest fill_value")
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
        raise TraceError(f"{name}: size must be a static non-negative int, got {size!r}")
    return int(size)


def _slots(flags: Tracer, size: int) -> tuple[Tracer, Tracer, Tracer]:
    """For 1-d bool `flags`: (running counts, the position of the (m + 1)-th set flag per slot m < size,
    whether slot m has one)."""
    counts = cumsum(flags, dtype=dtypes.int64)
    slot = iota((size,), 0)
    position = _search(counts, _op(Ops.ADD, slot, 1), right=False)
    valid = _op(Ops.CMPLT, slot, sum_(flags, dtype=dtypes.int64))
    return counts, position, valid


def _fill(valid: Tracer, value: Tracer, fill, dtype) -> Tracer:
    fill = to_tracer(fill)
    return prims.cast(where3(valid, value, fill if fill.weak else prims.cast(fill, dtype)), dtype)


def nonzero(a, *, size=None, fill_value=None) -> tuple:
    """NumPy's nonzero with JAX's size=: per dim, the int64 indices of the first `size` nonzero elements
    (row-major), then fill_value (0 by default; a tuple gives one per dim)."""
    a = to_tracer(a)
    if a.ndim == 0:
        raise ValueError("Calling nonzero on 0d arrays is not allowed. Use np.atleast_1d(scalar).nonzero() "
                         "instead.")
    size = _static_size(size, "nonzero")
    fills = tuple(fill_value) if isinstance(fill_value, (tuple, list)) else (fill_value,) * a.ndim
    if len(fills) != a.ndim:
        raise ValueError(f"fill_value must be a scalar or a tuple of {a.ndim} values, got {len(fills)}")
    _, position, valid = _slots(_op(Ops.CMPNE, ravel(a), prims.cast(to_tracer(0), a.dtype)), size)
    out = []
    for d, fill in zip(reversed(a.uop.shape), reversed(fills)):
        d = to_tracer(d)
        out.append(_fill(valid, _op(Ops.MOD, position, d) if a.ndim > 1 else position, 0 if fill is None else fill,
                         dtypes.int64))
        position = _op(Ops.IDIV, position, d)
    return tuple(reversed(out))


def flatnonzero(a, *, size=None, fill_value=None) -> Tracer:
    return nonzero(ravel(a), size=size, fill_value=fill_value)[0]


def argwhere(a, *, size=None, fill_value=None) -> Tracer:
    """NumPy's argwhere with JAX's size=: a (size, ndim) int64 array of the nonzero elements' indices."""
    a = to_tracer(a)
    if a.ndim == 0:
        size = _static_size(size, "argwhere")
        return prims.broadcast_to(prims.cast(to_tracer(0), dtypes.int64), (size, 0))
    return stack(nonzero(a, size=size, fill_value=fill_value), axis=1)


def where(condition, x=None, y=None, /, *, size=None, fill_value=None) -> Tracer:
    """NumPy's where: where(cond, x, y) chooses elementwise; where(cond) is nonzero(cond) (with size=)."""
    if x is None and y is None:
        return nonzero(condition, size=size, fill_value=fill_value)
    if x is None or y is None:
        raise ValueError("either both or neither of x and y should be given")
    if size is not None or fill_value is not None:
        raise ValueError("size= and fill_value= are for the one-argument where(condition) only")
    return where3(condition, x, y)


def unique(ar, return_index=False, return_inverse=False, return_counts=False, axis=None, *, equal_nan=True,
           size=None, fill_value=None, sorted=True):  # noqa: A002 - NumPy's names
    """NumPy's unique of the flattened array with JAX's size=: the first `size` sorted unique values, then
    fill_value (by default the smallest value, as JAX); return_index / return_inverse / return_counts as
    NumPy (filler slots: the smallest value's index, count 0)."""
    if axis is not None:
        raise TraceError("unique with axis= is not supported on traced arrays (only the flattened array)")
    size = _static_size(size, "unique")
    x = to_tracer(ar)
    flat = ravel(x)
    n = flat.uop.shape[0]
    perm = sort_order(flat)
    s = prims.gather(flat, [perm], [("index", 0)])
    previous = prims.shrink(prims.pad(s, [(1, 0)]), [(0, 1, n)])
    new_run = _op(Ops.CMPNE, s, previous)
    if s.dtype.is_float and equal_nan:
        both_nan = _op(Ops.AND, _op(Ops.CMPNE, s, s), _op(Ops.CMPNE, previous, previous))
        new_run = _op(Ops.AND, new_run, _op(Ops.NOT, both_nan))
    new_run = _op(Ops.OR, new_run, _op(Ops.CMPEQ, iota((n,), 0), 0))
    counts, start, valid = _slots(new_run, size)
    smallest = _gather1(s, prims.broadcast_to(to_tracer(0), (size,)))
    values = _gather1(s, start)
    fill = smallest if fill_value is None else prims.cast(to_tracer(fill_value), s.dtype)
    out = [prims.cast(where3(valid, values, fill), s.dtype)]
    if return_index:
        out.append(where3(valid, _gather1(perm, start), _gather1(perm, prims.broadcast_to(to_tracer(0), (size,)))))
    if return_inverse:
        if s.dtype.is_float and not equal_nan:  # each NaN its own value: the rank of each element in s
            first = sort_order(perm)
        else:  # the first position of s holding the element's value
            first = _search(s, flat, right=False)
        inverse = _op(Ops.SUB, _gather1(counts, first), 1)
        out.append(prims.reshape(inverse, x.uop.shape))
    if return_counts:
        following = _search(counts, _op(Ops.ADD, iota((size,), 0), 2), right=False)
        out.append(where3(valid, _op(Ops.SUB, following, start), prims.cast(to_tracer(0), dtypes.int64)))
    return out[0] if len(out) == 1 else tuple(out)
