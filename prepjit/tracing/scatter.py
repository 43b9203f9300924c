"""The scatter primitive: a copy of an array with some of its elements set or combined with updates.

`scatter(target, indices, dims, updates, combine)` mirrors `prims.gather`: the updates' index space is
walked, and update element i goes to target element j where, per target dim m, j[m] = i[n] for
dims[m] == ("dim", n) or the value of indices[k][i] for dims[m] == ("index", k) (every index array
has the updates' shape). combine None sets the element; Ops.ADD / MUL / MIN / MAX combine it with
what is there, so repeated ids accumulate (np.add.at, not `x[ids] += v`). With combine None and
repeated ids one of the updates wins, which one is not specified (as in JAX). Negative ids wrap
once (NumPy); an id still outside its dim updates nothing (the NumPy layer, numpy_at.py, flags it
so the call raises IndexBoundError by default). Updates are cast to the target's dtype.

The scheduler (codegen/schedule.py) gives the result a buffer that starts as the target's value
(the target computed straight into it when nothing else reads the target, else a copy), then one
kernel over the updates' index space writes into it (codegen/lower.py: `lower_scatter`).

The transpose of a gather is a scatter-add into zeros: for `out = gather(x, ids, dims)`,
`dx = scatter(zeros_like(x), ids, dims, dout, Ops.ADD)`.
"""
from __future__ import annotations

from ..errors import TraceError
from ..uop import Ops, UOp, dtypes
from . import prims
from .tracer import Tracer

COMBINES = (None, Ops.ADD, Ops.MUL, Ops.MIN, Ops.MAX)
_BOOL_COMBINE = {Ops.ADD: Ops.MAX, Ops.MUL: Ops.MIN}  # NumPy's bool add is `or`, its multiply `and`


def scatter(target, indices, dims, updates, combine=None) -> Tracer:
    """`target` with updates[i] written into (combine None) or combined into element j(i) (see the module)."""
    if combine not in COMBINES:
        raise TraceError(f"scatter combine must be None or one of ADD, MUL, MIN, MAX, not {combine}")
    target, updates = prims.to_tracer(target), prims.to_tracer(updates)
    indices = [prims.to_tracer(t) for t in indices]
    shape = tuple(updates.uop.shape)
    for t in indices:
        if not t.dtype.is_int:
            raise TraceError(f"scatter indices must be integers, not {t.dtype.name}")
        if tuple(t.uop.shape) != shape:
            raise TraceError("scatter index arrays must have the updates' shape "
                             f"{prims.fmt_shape(shape)}, not {t.shape_str}")
    dims = tuple((kind, int(n)) for kind, n in dims)
    if len(dims) != target.ndim:
        raise TraceError(f"scatter needs one spec per dim of {target.shape_str}, got {len(dims)}")
    for (kind, n), d in zip(dims, target.uop.shape):
        if kind == "dim":
            if not 0 <= n < len(shape) or not prims.dims_equal(shape[n], d):
                raise TraceError(f"scatter: updates dim {n} of {updates.shape_str} does not match "
                                 f"target {target.shape_str}")
        elif kind != "index" or not 0 <= n < len(indices):
            raise TraceError(f"scatter: bad dim spec {(kind, n)}")
    if target.dtype == dtypes.bool:
        combine = _BOOL_COMBINE.get(combine, combine)
    updates = prims.cast(updates, target.dtype)
    arg = (dims, combine)
    return Tracer(UOp(Ops.SCATTER, target.dtype, (target.uop, updates.uop, *(t.uop for t in indices)), arg))
