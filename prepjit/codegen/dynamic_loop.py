"""DynamicLoop: the kernels of a loop the plan runs natively, its trip count known only at call time.

A fori_loop whose bounds are var expressions (the loop var set to lower + k in iteration k, for the call's
`upper - lower` iterations), or a while_loop (iterating while the 0-d bool buffer its predicate kernels write
reads true). Its carries ping-pong between two sets of buffers: the parts are the predicate's and the body's
kernels in an even iteration and in an odd one (whose buffers `swap` exchanges), and `copy`, which moves
the carries back to the even buffers when the loop ends after an odd number of iterations.
"""
from __future__ import annotations

import attrs

from ..uop import Ops, UOp, as_uop, dtypes, sint
from ..uop.segments import Run

PARTS = ("pred_even", "body_even", "pred_odd", "body_odd", "copy")


@attrs.frozen
class DynamicLoop(Run):
    """As a Sequence: every kernel of its parts once, in PARTS order (a nested DynamicLoop's expanded in place)."""

    var: UOp | None          # the loop var (a fori_loop), or None (a while_loop)
    lower: sint | None
    upper: sint | None
    pred_buffer: int | None  # a while_loop's 0-d bool
    parts: tuple             # per PARTS: a tuple of ScheduledKernel and nested DynamicLoop
    swap: tuple
    conditions: tuple = ()   # index conditions on var that every call checks for each of its values
    flat: tuple = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self):
        flat = [k for part in self.parts for seg in part
                for k in (seg.flat if isinstance(seg, DynamicLoop) else (seg,))]
        object.__setattr__(self, "flat", tuple(flat))

    @property
    def name(self) -> str | None:
        return None if self.var is None else self.var.arg[0]

    def __len__(self) -> int:
        return len(self.flat)

    def item(self, i: int):
        return self.flat[i]

    def remapped(self, swap: dict) -> "DynamicLoop":
        """This loop with its kernels' buffers renamed by `swap` (an enclosing loop's odd iteration)."""
        parts = tuple(tuple(remap(seg, swap) for seg in part) for part in self.parts)
        return DynamicLoop(self.var, self.lower, self.upper, self.pred_buffer, parts, self.swap, self.conditions)

    def facts(self) -> list[UOp]:
        """What the bounds proof may assume inside: lower <= var < upper and the index conditions on var the
        calls check, for this loop and the nested ones."""
        out = list(self.conditions)
        if self.var is not None:
            out += [UOp(Ops.CMPLT, dtypes.bool, (self.var, as_uop(self.upper))),
                    UOp(Ops.CMPLT, dtypes.bool, (as_uop(self.lower) - 1, self.var))]
        return out + [f for part in self.parts for seg in part if isinstance(seg, DynamicLoop) for f in seg.facts()]


def remap(seg, swap: dict):
    """A ScheduledKernel or DynamicLoop with its buffers renamed by `swap`."""
    if isinstance(seg, DynamicLoop):
        return seg.remapped(swap)
    return attrs.evolve(seg, buffers=tuple(swap.get(b, b) for b in seg.buffers))


def dynamic_loop(info, pred_buffer, pred: tuple, body: tuple, copy: tuple, swap: dict) -> DynamicLoop:
    """The DynamicLoop of a traced loop (`info`: its LoopInfo) from its even iteration's kernels."""
    odd = lambda part: tuple(remap(seg, swap) for seg in part)  # noqa: E731
    return DynamicLoop(info.var, info.lower, info.upper, pred_buffer, (pred, body, odd(pred), odd(body), copy),
                       tuple(swap.items()), info.facts)
