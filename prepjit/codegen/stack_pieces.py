"""A stack's pieces specialised to their one index: a lowered kernel value that selects along a loop range by
constant thresholds (numpy_shape.concatenate's chain WHERE(r < k, earlier pieces, piece k), a stack of arrays of
extent 1 along the axis) has, in each arm where the range can take one value only, that value substituted.

Lowered as traced, every piece reads its buffers gated on its own position (a pad's validity, `k-1 < r < k+1`)
and yields 0 elsewhere, so each output evaluates the gates of every piece: SmolLM2's decode stacks its 30 layers'
RoPE'd key rows, 30 gated pieces of 5 reads an output, which LLVM did not vectorise (94 us a step for the keys' and
values' stacks on an AMD EPYC, 2 cores; 42 us specialised) and compiled slowly (the four stacking kernels of both plans
0.46-0.54 s of LLVM CPU, 0.31-0.38 s specialised).
Specialised, a piece's gates fold to true and its reads (at the index the original read had at that value,
so one of the accesses the gated read made: the bounds proof's cases are a subset) run ungated. Only a range
confined to one value is substituted: a read ungated over a wider segment would run outside it too (a select
evaluates both arms), where its index may leave its buffer.
"""
from __future__ import annotations

from ..uop import Ops, UOp, simplify


def specialised_pieces(value: UOp) -> UOp:
    """`value` (a kernel's lowered value) with each arm of its leading selects on a loop range that confines the
    range to one value specialised to it; `value` itself when there is none."""
    if value.op is not Ops.WHERE or _split(value.src[0]) is None:
        return value
    return _specialised(value, {})


def _split(cond: UOp) -> tuple[UOp, int, bool] | None:
    """(range, k, whether the true arm is r < k) for a condition `r < k` or `k - 1 < r` on a loop range."""
    if cond.op is not Ops.CMPLT:
        return None
    a, b = cond.src
    if a.op is Ops.RANGE and b.op is Ops.CONST:
        return a, b.arg, True
    if b.op is Ops.RANGE and a.op is Ops.CONST:
        return b, a.arg + 1, False
    return None


def _specialised(value: UOp, bounds: dict) -> UOp:
    single = {r: UOp.const(lo, r.dtype) for r, (lo, hi) in bounds.items() if hi is not None and hi - lo == 1}
    split = _split(value.src[0]) if value.op is Ops.WHERE else None
    if split is not None and split[0] not in single:  # (a select on a range of one value folds: substituted)
        r, k, below_true = split
        lo, hi = bounds.get(r, (0, r.src[0].arg if r.src[0].op is Ops.CONST else None))
        below = {**bounds, r: (lo, k if hi is None else min(hi, k))}
        above = {**bounds, r: (max(lo, k), hi)}
        arms = (below, above) if below_true else (above, below)
        return UOp(Ops.WHERE, value.dtype, (value.src[0], *(_specialised(v, b) for v, b in zip(value.src[1:], arms))))
    return _substituted(value, single) if single else value


def _substituted(value: UOp, single: dict) -> UOp:
    """`value` with the ranges of `single` replaced by their one value, and the gates, indices and select
    conditions this changes simplified: a select on a constant becomes its arm, a read gated on true ungated.
    Computed values are rebuilt as they are (no rewrite of their arithmetic)."""
    memo: dict[UOp, UOp] = dict(single)
    for node in value.toposort():
        if node in memo:
            continue
        src = tuple(memo[s] for s in node.src)
        if src == node.src:
            memo[node] = node
        elif node.op is Ops.LOAD:
            index, *gate = (simplify(s) for s in src[1:])
            ungated = not gate or (gate[0].op is Ops.CONST and bool(gate[0].arg))
            memo[node] = UOp(Ops.LOAD, node.dtype, (src[0], index) + (() if ungated else tuple(gate)), node.arg)
        elif node.op is Ops.WHERE:
            cond = simplify(src[0])
            memo[node] = (src[1] if cond.arg else src[2]) if cond.op is Ops.CONST else \
                UOp(Ops.WHERE, node.dtype, (cond, *src[1:]), node.arg)
        else:
            memo[node] = UOp(node.op, node.dtype, src, node.arg)
    return memo[value]
