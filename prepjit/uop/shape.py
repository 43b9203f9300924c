"""Shapes of traced-graph nodes: what each movement, reduce and loop node produces."""
from __future__ import annotations

from .ops import ELEMENTWISE, Ops
from .uop import UOp, as_int_if_const, sint


def shape_of(u: UOp) -> tuple[sint, ...]:
    op = u.op
    if op in (Ops.INPUT, Ops.CARRY):
        return u.arg[-1]
    if op is Ops.IOTA:
        return u.arg[0]
    if op in (Ops.RESHAPE, Ops.EXPAND):
        return u.arg
    if op is Ops.PERMUTE:
        src = u.src[0].shape
        return tuple(src[i] for i in u.arg)
    if op is Ops.SHRINK:
        return tuple(size for _, _, size in u.arg)
    if op is Ops.GATHER:
        return u.src[1].shape
    if op is Ops.SCATTER:
        return u.src[0].shape
    if op is Ops.PAD:
        return tuple(as_int_if_const(d + b + a) for d, (b, a) in zip(u.src[0].shape, u.arg))
    if op is Ops.REDUCE_AXIS:
        return tuple(1 if i in u.arg[1] else d for i, d in enumerate(u.src[0].shape))
    if op is Ops.LOOP_OUT:
        return u.src[0].arg.carries[u.arg].shape
    if op in ELEMENTWISE:
        return u.src[-1].shape if u.src else ()
    return ()  # CONST, DEFINE_VAR and symbolic ints are scalars
