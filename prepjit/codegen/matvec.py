"""Matrix-vector contractions: one output row (or a few) against a weight matrix, as in decode steps.

A contraction whose rows are few (`MAX_ROWS` at most, like a decoded token's activations) reads every
weight once and reuses it only that many times: it is bound by memory bandwidth, not arithmetic. The
register blocking of optimize.py suits it when the weight is contiguous along the output columns (x @ W):
each block loads contiguous vectors of a weight row. When the weight is contiguous along the reduction
instead (x @ W.T, an embedding table as the output head), blocking columns would gather UJ values from UJ
rows a row's length apart for every step. Such a kernel is left as one lone sum per output, its loops
reordered so the output columns are the outermost loop (threads split them) and the rows inside. A float
weight row's sum (float32, or bfloat16 / float16 widened) is split into steps of MAX_LANES lanes
(summed_over_lanes): the renderer accumulates vectors of lanes and asks for each step's cache lines PREFETCH_BYTES
ahead, so a row streams from memory faster than the hardware prefetchers alone bring it (SmolLM2's float32 decode
reads 540 MB a token; its bfloat16 weights' decode, 2 threads, alternating processes: 11.6-12.3 -> 9.7-10.1 ms a
token with AVX-512 code, 13.3-13.5 -> 10.4-10.8 with AVX2's, than the lone sums below). A row whose length is no
whole number of those steps keeps a lone sum, reassociated so LLVM vectorises it along the contiguous reduction
with several independent accumulators, a 16-bit row's rows ahead prefetched into L2 (prefetch_sum). No operand
is packed. A weight stored in
blocks (pj.quant: the row's bytes indexed k // 32 and k % 32) is contiguous along no reduction until its reduction
is split at the blocks (block_split.py): the split kernel, if it is a matvec, is the one ordered so, its block
ranges and innermost lane range inside the rows, its block scales factored out of the block's sums where the
target's vectors are narrower than the lanes (block_scales.py); with more rows than one static row (a var decode
batch, a prefill) it is register-blocked over rows and columns instead (block_matmul.py).

A single row against a weight contiguous along the columns keeps optimize.py's blocking, with blocks of
many columns instead of two vectors: with no row accumulators the registers are free, and each reduction
step then reads several cache lines of one weight row, so the weight streams in longer runs. A block is
MATVEC_MAX_ROW_BYTES wide when such blocks divide the columns and leave MIN_BLOCKS of them for threads to
share, else narrower, down to MATVEC_ROW_BYTES. Past the register file (AVX2's 16 ymm hold 512 bytes) the
accumulators live in L1, which costs a bandwidth-bound kernel nothing next to the longer runs: x (576) @
W (576, 3072) float32 with W not in cache on Zen 5, timed round robin on a loaded host, 3 trials each:
AVX-512 code 115-138 us with 1024 bytes, 140-170 with 512, 163-194 with 256, 214-292 with 128; AVX2 code
(PREPJIT_CPU=haswell) 147-174 with 1024, 171-249 with 512, 239-317 with 256. Only column counts such
blocks divide are blocked so; others keep optimize.py's blocks.
"""
from __future__ import annotations

import attrs

from ..uop import Ops, UOp
from .block_matmul import block_matmul
from .block_scales import factored_scales
from .block_split import MAX_LANES, split_blocks, split_lanes
from .optimize import (
    COLUMN_VECTORS,
    DEFAULT_BLOCKING,
    Blocking,
    column_block,
    const_end,
    contraction_axes,
    stride_along,
    upcast_contraction,
)
from .target import CPUTarget

MAX_ROWS = 8                 # output rows (product of the loops the weight does not depend on) of a matvec, at most
MATVEC_ROW_BYTES = 256       # bytes of output columns per block of a one-row matvec, at least
MATVEC_MAX_ROW_BYTES = 1024  # and at most
MIN_BLOCKS = 8               # column blocks of a one-row matvec, at least, for threads to share


def matvec_axes(ast: UOp):
    """(column axis j, the other loops) of a contraction of at most MAX_ROWS rows whose operand varying along
    the output columns is contiguous along a reduction and not along the columns (for a weight in blocks: one of
    its loads, the weights, not the scales), or None."""
    found = contraction_axes(ast)
    if found is None:
        return None
    _, red, loops, j, _ = found
    reduces = [r for r in red.src[1:] if r.op is Ops.RANGE]
    weights = [ld for ld in red.toposort() if ld.op is Ops.LOAD and j in ld.src[1].toposort()]
    if not weights or not reduces:
        return None
    if any(stride_along(ld.src[1], j) == 1 for ld in weights) or \
            not any(stride_along(ld.src[1], k) == 1 for ld in weights for k in reduces):
        return None
    used = set().union(*(ld.src[1].toposort() for ld in weights))
    rows = 1
    for r in loops:
        if r is not j and r not in used:
            rows *= max(1, int(r.src[0].vmax))
    return (j, [r for r in loops if r is not j]) if rows <= MAX_ROWS else None


def matvec(ast: UOp, target: CPUTarget, blocking: Blocking = DEFAULT_BLOCKING) -> UOp | None:
    """The kernel of a matvec contraction (see matvec_axes), unblocked, with its output columns the outermost
    loop and every other loop inside, in order (unless another loop is larger, like a batch of matrices: then
    the loops keep their order); a one-row contraction over a weight contiguous along the columns blocked
    wide (see row_bytes, or `blocking`'s width); a contraction of several rows over a weight in blocks
    register-blocked (block_matmul.py); None for other kernels (optimize.py blocks them)."""
    split = split_blocks(ast)
    blocked = block_matmul(split, target, blocking) if split is not ast else None
    if blocked is not None:
        return blocked
    found = matvec_axes(split) if split is not ast else None
    if found is not None:
        ast = split
    else:
        found = matvec_axes(ast)
    if found is None:
        axes = contraction_axes(ast)
        if axes is None or axes[4] is not None:
            return None
        # optimize.py's blocks are COLUMN_VECTORS vectors wide: a target of proportionally wider vectors
        # gives blocks of `row_bytes` (rendering still uses the real target's vectors)
        row_bytes = blocking.matvec_row_bytes or _row_bytes(axes[1].dtype.itemsize, axes[3].src[0])
        wide = attrs.evolve(target, vector_bytes=max(target.vector_bytes, row_bytes // COLUMN_VECTORS))
        width, tail = column_block(wide, axes[1].dtype.itemsize, axes[3].src[0])
        return upcast_contraction(ast, wide, blocking) if width > 1 and not tail else None
    j, others = found
    if any(r.src[0].vmax > j.src[0].vmax for r in others):  # a larger loop (a batch) stays where it is
        return ast
    ast = factored_scales(summed_over_lanes(ast, j), target)
    order = [j] + others + sorted({u for u in ast.toposort() if u.op is Ops.RANGE and u.arg[1] in ("reduce", "lane")},
                                  key=lambda r: r.arg[0])
    return ast.substitute({r: UOp(Ops.RANGE, r.dtype, r.src, (n, r.arg[1])) for n, r in enumerate(order)})


def summed_over_lanes(ast: UOp, j: UOp) -> UOp:
    """`ast`, a matvec ordered as above, with its lone float sum over a float weight row (W (out, in), contiguous
    along the reduction k; float32, or 16-bit floats widened) split into k = step * MAX_LANES + lane: the renderer
    then accumulates vectors of the row's lanes (lane_sum) and asks for each step's cache lines PREFETCH_BYTES
    ahead (prefetch_streams), which the hardware prefetchers alone do not reach (see the module docstring). `ast`
    itself when it already sums over lanes (a weight in blocks) or its reduction is not a whole number of
    MAX_LANES steps."""
    if any(u.op is Ops.RANGE and u.arg[1] == "lane" for u in ast.toposort()):
        return ast
    sums = [u for u in ast.toposort() if u.op is Ops.REDUCE and u.arg is Ops.ADD and u.dtype.is_float and
            len(u.src) == 2 and any(ld.op is Ops.LOAD and j in ld.src[1].toposort() for ld in u.src[0].toposort())]
    if len(sums) != 1:
        return ast
    red, k = sums[0], sums[0].src[1]
    steps = const_end(k)
    if steps is None or steps % MAX_LANES or steps == MAX_LANES:
        return ast
    axis = max(u.arg[0] for u in ast.toposort() if u.op is Ops.RANGE) + 1
    body, step, lane = split_lanes(red.src[0], k, axis)
    return ast.substitute({red: UOp(Ops.REDUCE, red.dtype, (body, *step, lane), red.arg)})


def _row_bytes(itemsize: int, columns: UOp) -> int:
    """Bytes of columns per block of a one-row matvec: the widest from MATVEC_MAX_ROW_BYTES down to
    MATVEC_ROW_BYTES whose blocks divide a static column count and leave MIN_BLOCKS of them."""
    width = MATVEC_MAX_ROW_BYTES
    while width > MATVEC_ROW_BYTES:
        per_block = width // itemsize
        if columns.op is Ops.CONST and columns.arg % per_block == 0 and columns.arg // per_block >= MIN_BLOCKS:
            return width
        width //= 2
    return MATVEC_ROW_BYTES
