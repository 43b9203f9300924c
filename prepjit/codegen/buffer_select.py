"""Selects between reads of different buffers made one read of the selected buffer, a pass of every target
(targets.py: the last of its passes): in an elementwise kernel, a WHERE on outer loop indices whose arms compute the
same expression over different buffers (a stack of layers' rows, stack_pieces.py: WHERE(r < k, ..., piece k), each
piece the same RoPE over its layer's keys) becomes that expression once, its reads LOAD(BUFFER_SELECT(cond, buffer
a, buffer b), index) (uop/ops.py).

The kernel as launched holds the select, so the bounds proof sees it: it proves the read's index inside each buffer
the select chooses from (ops.buffers_of), as it proved each arm's read before; the values are the selected arm's.
render_llvm renders a select of buffers as a select of their pointers, which LLVM hoists out of the inner loops, and
render_c as a select of pointers a work-item makes (it read every piece's buffers before and kept one value).
SmolLM2's decode stacks 30 layers' RoPE'd key rows: each output computed all 30 pieces and selected one (the keys'
and values' stacks 44-48 us a step on a loaded AMD EPYC, 26-28 us with the select of buffers).
Only where the condition reads outer loop indices alone (one buffer for a whole inner row: a condition that
varies along the innermost loop would turn the cpu's vector loads of a row into gathers) and in a kernel without
reductions.
"""
from __future__ import annotations

from ..uop import Ops, UOp

_LEAVES = (Ops.CONST, Ops.DEFINE_VAR, Ops.RANGE)


def with_buffer_selects(ast: UOp) -> UOp:
    """`ast` (a kernel as its target launches it) with each WHERE whose arms differ only in the buffers their
    reads take, on a condition of outer loop indices, one read of the selected buffers; `ast` itself when none."""
    topo = ast.toposort()
    if any(u.op is Ops.REDUCE for u in topo):
        return ast
    loops = [u for u in topo if u.op is Ops.RANGE and u.arg[1] == "loop"]
    if not loops:
        return ast
    innermost = max(loops, key=lambda r: r.arg[0])
    memo: dict[UOp, UOp] = {}
    for node in topo:
        src = tuple(memo[s] for s in node.src)
        new = node if src == node.src else UOp(node.op, node.dtype, src, node.arg)
        if new.op is Ops.WHERE and _outer(new.src[0], innermost):
            merged = _merged(new.src[1], new.src[2], new.src[0], {})
            if merged is not None:
                new = merged
        memo[node] = new
    return memo[ast]


def _outer(cond: UOp, innermost: UOp) -> bool:
    """Whether `cond` reads loop indices (no lane's, not the innermost loop's), vars and constants only."""
    nodes = cond.toposort()
    ranges = [u for u in nodes if u.op is Ops.RANGE]
    return bool(ranges) and innermost not in ranges and all(r.arg[1] == "loop" for r in ranges) and \
        all(u.op not in (Ops.LOAD, Ops.DEFINE_GLOBAL, Ops.DEFINE_LOCAL, Ops.REDUCE) for u in nodes)


def _merged(a: UOp, b: UOp, cond: UOp, memo: dict) -> UOp | None:
    """`a` with the buffers it reads where `b` reads others WHERE(cond, a's, b's), when `a` and `b` are the same
    expression but for those buffers (reads at the same indices, under the same gates); else None."""
    if a is b:
        return a
    key = (a, b)
    if key not in memo:
        memo[key] = _merge(a, b, cond, memo)
    return memo[key]


def _merge(a: UOp, b: UOp, cond: UOp, memo: dict) -> UOp | None:
    if a.op is not b.op or a.dtype != b.dtype or a.arg != b.arg or len(a.src) != len(b.src) or a.op in _LEAVES:
        return None
    if a.op is Ops.LOAD:
        same_reads = a.src[1:] == b.src[1:] and a.src[0].dtype == b.src[0].dtype
        if not (same_reads and _buffer(a.src[0]) and _buffer(b.src[0])):
            return None
        selected = UOp(Ops.BUFFER_SELECT, a.src[0].dtype, (cond, a.src[0], b.src[0]))
        return UOp(Ops.LOAD, a.dtype, (selected, *a.src[1:]), a.arg)
    src = []
    for x, y in zip(a.src, b.src):
        m = _merged(x, y, cond, memo)
        if m is None:
            return None
        src.append(m)
    return UOp(a.op, a.dtype, tuple(src), a.arg)


def _buffer(u: UOp) -> bool:
    """A kernel's buffer slot, or a select of them."""
    return u.op in (Ops.DEFINE_GLOBAL, Ops.BUFFER_SELECT)
