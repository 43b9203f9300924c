"""Matrix-vector contractions: one output row (or a few) against a weight matrix, as in decode steps.

A contraction whose rows are few (`MAX_ROWS` at most, like a decoded token's activations) reads every
weight once and reuses it only that many times: it is bound by memory bandwidth, not arithmetic. The
register blocking of optimize.py suits it when the weight is contiguous along the output columns (x @ W):
each block loads contiguous vectors of a weight row. When the weight is contiguous along the reduction
instead (x @ W.T, an embedding table as the output head), blocking columns would gather UJ values from UJ
rows a row's length apart for every step. Such a kernel is left as one lone sum per output, its loops
reordered so the output columns are the outermost loop (threads split them) and the rows inside: the
renderer reassociates a lone float sum, so LLVM vectorises it along the contiguous reduction with several
independent accumulators (interleaved) and adds them up at the end. No operand is packed.
"""
from __future__ import annotations

from ..uop import Ops, UOp
from .optimize import contraction_axes, stride_along

MAX_ROWS = 8   # output rows (product of the loops the weight does not depend on) of a matvec, at most


def matvec_axes(ast: UOp):
    """(column axis j, the other loops) of a contraction of at most MAX_ROWS rows whose operand varying along
    the output columns is contiguous along a reduction and not along the columns, or None."""
    found = contraction_axes(ast)
    if found is None:
        return None
    _, red, loops, j, _ = found
    reduces = [r for r in red.src[1:] if r.op is Ops.RANGE]
    weights = [ld for ld in red.toposort() if ld.op is Ops.LOAD and j in ld.src[1].toposort()]
    if not weights or not reduces:
        return None
    for ld in weights:
        if stride_along(ld.src[1], j) == 1 or not any(stride_along(ld.src[1], k) == 1 for k in reduces):
            return None
    used = set().union(*(ld.src[1].toposort() for ld in weights))
    rows = 1
    for r in loops:
        if r is not j and r not in used:
            rows *= max(1, int(r.src[0].vmax))
    return (j, [r for r in loops if r is not j]) if rows <= MAX_ROWS else None


def matvec(ast: UOp) -> UOp | None:
    """The kernel of a matvec contraction (see matvec_axes) with its output columns the outermost loop and
    every other loop inside, in order; None for other kernels."""
    found = matvec_axes(ast)
    if found is None:
        return None
    j, others = found
    order = [j] + others + sorted({u for u in ast.toposort() if u.op is Ops.RANGE and u.arg[1] == "reduce"},
                                  key=lambda r: r.arg[0])
    return ast.substitute({r: UOp(Ops.RANGE, r.dtype, r.src, (n, r.arg[1])) for n, r in enumerate(order)})
