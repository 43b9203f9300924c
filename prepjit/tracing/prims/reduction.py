"""Reduction primitives: REDUCE_AXIS (sum, product, max, min, all, any over axes) and `materialize`, with the
dtype rule (a sum or product of 16-bit floats accumulates in float32 and is rounded once), the reverse-mode rules (max/min: the cotangent split evenly among the tied extremes, as in JAX; product: exact
with zeros in the reduced slice)."""
from __future__ import annotations

from ...uop import Ops, UOp, dtypes
from ..tracer import Tracer
from .core import normalize_axes
from .movement import broadcast_to, reshape
from .pointwise import cast
from .registry import primitive


def reduce(x: Tracer, op: Ops, axis=None, keepdims: bool = False) -> Tracer:
    axes = normalize_axes(axis, x.ndim)
    shape = x.uop.shape
    if not axes:
        return x
    acc = x.dtype.compute if op in (Ops.ADD, Ops.MUL) else x.dtype  # max / min are exact in any dtype
    red = Tracer(UOp(Ops.REDUCE_AXIS, acc, (cast(x, acc).uop,), (op, axes)))
    red = cast(red, x.dtype)
    if keepdims:
        return red
    return reshape(red, tuple(d for i, d in enumerate(shape) if i not in axes))


def materialize(x: Tracer) -> Tracer:
    """`x` computed once into a buffer of its own rather than inlined into its readers (for values a kernel
    would read at several indices, like a scan's steps): a reduction over an added unit axis, which the
    scheduler always realizes."""
    column = reshape(x, tuple(x.uop.shape) + (1,))
    op = Ops.OR if x.dtype == dtypes.bool else Ops.ADD
    return reshape(Tracer(UOp(Ops.REDUCE_AXIS, x.dtype, (column.uop,), (op, (x.ndim,)))), x.uop.shape)



# ---------- reverse-mode rule ----------

@primitive(Ops.REDUCE_AXIS).def_vjp
def _reduce_vjp(ct: Tracer, node: UOp):
    from .pointwise import elementwise as e
    op, axes = node.arg
    x = Tracer(node.src[0])
    if not x.dtype.is_float:
        return (None,)
    spread = broadcast_to(ct, x.uop.shape)  # the reduced dims are 1 in node's shape: broadcast back
    if op is Ops.ADD:
        return (spread,)
    out = broadcast_to(Tracer(node), x.uop.shape)
    if op in (Ops.MAX, Ops.MIN):  # split among the positions equal to the extreme
        hits = cast(e(Ops.CMPEQ, x, out), x.dtype)
        count = broadcast_to(reduce(hits, Ops.ADD, axes, keepdims=True), x.uop.shape)
        return (e(Ops.MUL, spread, e(Ops.FDIV, hits, count)),)
    if op is Ops.MUL:  # the product of the others: out / x without zeros, or the product of the non-zeros
        zero = e(Ops.CMPEQ, x, 0)
        nonzero = e(Ops.WHERE, zero, 1.0, x)
        rest = broadcast_to(reduce(nonzero, Ops.MUL, axes, keepdims=True), x.uop.shape)
        zeros = broadcast_to(reduce(cast(zero, x.dtype), Ops.ADD, axes, keepdims=True), x.uop.shape)
        others = e(Ops.WHERE, e(Ops.CMPEQ, zeros, 0), e(Ops.FDIV, rest, x),
                   e(Ops.WHERE, e(Ops.AND, e(Ops.CMPEQ, zeros, 1), zero), rest, 0.0))
        return (e(Ops.MUL, spread, others),)
    return (None,)  # AND / OR: bool
