"""The gather primitive (GATHER: reads at index arrays) and the leaves of a traced graph, with the gather's
reverse-mode rule: the cotangent added back at the positions read (a scatter-add)."""
from __future__ import annotations

from ...errors import TraceError
from ...uop import Ops, UOp
from ..tracer import Tracer
from .core import dims_equal, fmt_shape, to_tracer
from .movement import broadcast_to
from .registry import primitive


def gather(x: Tracer, indices, dims) -> Tracer:
    """out[i] = x[j] where, per x dim m, j[m] = i[n] for dims[m] == ("dim", n) or the value of indices[k][i]
    for dims[m] == ("index", k). Every index array has the output's shape; negative values wrap once and
    out-of-range values clamp (so no read is out of bounds)."""
    indices = [to_tracer(t) for t in indices]
    out_shape = indices[0].uop.shape
    for t in indices:
        if not t.dtype.is_int:
            raise TraceError(f"gather indices must be integers, not {t.dtype.name}")
        if t.uop.shape != out_shape:
            raise TraceError("gather index arrays must share one shape")
    dims = tuple((kind, int(n)) for kind, n in dims)
    if len(dims) != x.ndim:
        raise TraceError(f"gather needs one spec per dim of {fmt_shape(x.uop.shape)}, got {len(dims)}")
    for (kind, n), d in zip(dims, x.uop.shape):
        if kind == "dim" and not dims_equal(out_shape[n], d) and not (isinstance(d, int) and d == 1):
            raise TraceError(f"gather: output dim {n} does not match {fmt_shape(x.uop.shape)}")
    x = broadcast_to(x, tuple(out_shape[n] if kind == "dim" else d for (kind, n), d in zip(dims, x.uop.shape)))
    return Tracer(UOp(Ops.GATHER, x.dtype, (x.uop, *(t.uop for t in indices)), dims))


# ---------- reverse-mode rules (a gather and a scatter-add are each other's transposes) ----------

@primitive(Ops.GATHER).def_vjp
def _gather_vjp(ct: Tracer, node: UOp):
    """The source's cotangent: each output's cotangent added at the position it read (repeated ids accumulate;
    an out-of-range id read nothing and gets nothing)."""
    from ..scatter import scatter
    src = node.src[0]
    if not src.dtype.is_float:
        return (None,) * len(node.src)
    zeros = broadcast_to(Tracer(UOp.const(0.0, src.dtype)), src.shape)
    indices = [Tracer(i) for i in node.src[1:]]
    return (scatter(zeros, indices, node.arg, ct, Ops.ADD),) + (None,) * len(indices)


@primitive(Ops.SCATTER).def_vjp
def _scatter_vjp(ct: Tracer, node: UOp):
    """set: the target's cotangent is zero where it was overwritten, the updates' is the cotangent read there;
    add: both pass it on (the updates' read there). Multiplying, min and max scatters have no rule yet."""
    from ..scatter import scatter
    dims, combine = node.arg
    updates, indices = node.src[1], [Tracer(i) for i in node.src[2:]]
    if combine not in (None, Ops.ADD):
        raise TraceError(f"cannot differentiate a scatter combining with {combine.name} (only .at[].set and "
                         ".at[].add have gradients)")
    read = gather(ct, indices, dims)
    if combine is None:
        zeros = broadcast_to(Tracer(UOp.const(0.0, ct.dtype)), updates.shape)
        return (scatter(ct, indices, dims, zeros, None), read) + (None,) * len(indices)
    return (ct, read) + (None,) * len(indices)


for _op in (Ops.CONST, Ops.DEFINE_VAR, Ops.INPUT, Ops.IOTA, Ops.CARRY):
    primitive(_op)  # leaves
