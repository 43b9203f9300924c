"""The gather primitive (GATHER: reads at index arrays) and the leaves of a traced graph, with the gather's
reverse-mode rule: the cotangent added back at the positions read (a scatter-add)."""
from __future__ import annotations

from ...errors import TraceError
from ...uop import Ops, UOp, dtypes
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


# ---------- reverse-mode rule ----------

@primitive(Ops.GATHER).def_vjp
def _gather_vjp(ct: Tracer, node: UOp):
    """The cotangent of the source: each output's cotangent added at the position it read (ids wrapped once as
    the gather wraps them; an out-of-range id read 0 and gets nothing). Computed densely, as a one-hot
    contraction over the indexed axes."""
    from .pointwise import elementwise as e
    from .reduction import reduce
    from .movement import permute, reshape
    src = node.src[0]
    if not src.dtype.is_float:
        return (None,) * len(node.src)
    out_shape = tuple(node.shape)
    mapped = [n for kind, n in node.arg if kind == "dim"]
    if len(set(mapped)) != len(mapped):
        raise TraceError("cannot differentiate a gather that reads one output dim along two source dims")
    indexed = [(m, n) for m, (kind, n) in enumerate(node.arg) if kind == "index"]
    sizes = tuple(src.shape[m] for m, _ in indexed)
    full = out_shape + sizes
    spread = broadcast_to(reshape(ct, out_shape + (1,) * len(sizes)), full)
    hit = None
    for p, (m, k) in enumerate(indexed):
        ids = Tracer(node.src[1 + k])
        ids = e(Ops.WHERE, e(Ops.CMPLT, ids, 0), e(Ops.ADD, ids, to_tracer(sizes[p])), ids)
        ids = broadcast_to(reshape(ids, out_shape + (1,) * len(sizes)), full)
        here = e(Ops.CMPEQ, ids, Tracer(UOp(Ops.IOTA, dtypes.int64, (), (full, len(out_shape) + p))))
        hit = here if hit is None else e(Ops.AND, hit, here)
    zeros = broadcast_to(Tracer(UOp.const(0.0, ct.dtype)), full)
    summed = [n for n in range(len(out_shape)) if n not in mapped]
    total = reduce(e(Ops.WHERE, hit, spread, zeros), Ops.ADD, tuple(summed))
    kept = [n for n in range(len(out_shape)) if n in mapped]  # total's leading dims, then the indexed ones
    order = [kept.index(n) if kind == "dim" else len(kept) + [m for m, _ in indexed].index(m)
             for m, (kind, n) in enumerate(node.arg)]
    return (reshape(permute(total, order), src.shape),) + (None,) * (len(node.src) - 1)


for _op in (Ops.CONST, Ops.DEFINE_VAR, Ops.INPUT, Ops.IOTA, Ops.CARRY):
    primitive(_op)  # leaves
