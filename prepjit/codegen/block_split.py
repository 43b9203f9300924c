"""Reduction ranges split at the blocks of the formats their operands are stored in (pj.quant's block formats).

A contraction with a quantized weight (x @ pj.quant.dequantize(b, "q8_0").T) reads weight k of a row at
(k // 32) * 34 + k % 32 + 2 and its block's float16 scale at (k // 32) * 34: over one reduce range k, neighbouring
steps are no constant stride apart (nothing vectorises) and the scale is rebuilt from its two bytes for every
weight. `split_blocks` splits k = kb * B + kl for the largest constant B dividing k's extent that an expression
of k is divided by or taken modulo by, then kl the same way for the smaller ones (q4_1's nibbles: 32, then 16;
q6_k: 256, 128, 64, 32, 16), until the innermost range is free of them; the simplifier folds (kb * B + kl) // B
to kb and % B to kl, so the in-block indices are plain offsets. The innermost range becomes a "lane" range of the
reduction: the LLVM renderer computes the body as one vector of its steps (the bytes loaded as <32 x i8>, nibbles
unpacked with vector shifts and masks), accumulates those vectors over the outer ranges and adds the lanes up
once at the end; whatever depends only on the outer ranges (a block's scale and min) is a scalar computed once
per block (render_llvm.py renders it before the inner loops open) and splatted. This reassociates the sum: the
result differs from the sequential one by reduction order only.

`split_kernel_at_blocks` applies the same split to every loop of a cpu kernel but its parallel one: a reduction's
range or a loop over elements (an embedding's quantized rows read inside a norm: its sum of squares and its stores,
a matvec's operand prologue) becomes a loop over blocks around a loop over a block's steps, whose reads are then
contiguous; LLVM vectorised the flat loop of 576 steps over 34-byte q8_0 blocks with gathers (64-100 ms of
compilation each for SmolLM2's). Blocks shorter than MIN_BLOCK steps stay as they are.
"""
from __future__ import annotations

from ..uop import Ops, UOp, dtypes, simplify
from .kernel import parallel_range
from .optimize import const_end

MAX_LANES = 32   # steps of the innermost range computed as one vector, at most (LLVM splits it into registers)
MIN_BLOCK = 32   # steps of a block split_kernel_at_blocks splits a loop at, at least: a block's halves of 16 nibbles
                 # LLVM vectorises with shuffles as well (split, the q4_1 embedding rows: 15-17 -> 18 ms of LLVM)


def split_blocks(ast: UOp) -> UOp:
    """`ast` with its float sum's last reduce range split at the blocks its operands index by (see the module
    docstring) and the innermost part a "lane" range; `ast` itself when nothing divides or modulo-reduces that
    range, or when one of those divisors does not divide its extent."""
    reduces = [u for u in ast.toposort() if u.op is Ops.REDUCE]
    if len(reduces) != 1 or reduces[0].arg is not Ops.ADD or \
            reduces[0].dtype not in (dtypes.float32, dtypes.float64):
        return ast
    red = reduces[0]
    k = red.src[-1]
    if k.op is not Ops.RANGE or k.arg[1] != "reduce" or const_end(k) is None:
        return ast
    axis = max(u.arg[0] for u in ast.toposort() if u.op is Ops.RANGE) + 1
    body, (*outer, k) = split_at_blocks(red.src[0], k, axis)
    if not outer or _divisors_by_range(body).get(k):
        return ast
    lanes = split_lanes(body, k, k.arg[0] + 1)
    if lanes is None:
        return ast
    body, steps, lane = lanes
    return ast.substitute({red: UOp(Ops.REDUCE, red.dtype, (body, *red.src[1:-1], *outer, *steps, lane), red.arg)})


def split_at_blocks(body: UOp, k: UOp, axis: int) -> tuple[UOp, list[UOp]]:
    """(`body` over reduce range `k` split at the blocks it indexes by (see the module docstring: k = kb * B + kl,
    then kl the same way), the ranges k became, outermost first, numbered from `axis`): ([k] where nothing splits)."""
    outer = []
    while (block := _block(body, k)) is not None:
        kb = UOp(Ops.RANGE, dtypes.index, (UOp.const(const_end(k) // block),), (axis, "reduce"))
        kl = UOp(Ops.RANGE, dtypes.index, (UOp.const(block),), (axis + 1, "reduce"))
        body, k, axis = _simplified_indices(body.substitute({k: kb * block + kl})), kl, axis + 2
        outer.append(kb)
    return body, [*outer, k]


def split_kernel_at_blocks(ast: UOp) -> UOp:
    """`ast` with each of its loop, serial and reduce ranges but the parallel one split at the blocks it indexes by
    (see `split_at_blocks`) where they have at least MIN_BLOCK steps, the new ranges numbered in place of the old
    (loops nest in their order); `ast` itself where none does."""
    while True:
        prange = parallel_range(ast)
        blocks = {r: _largest_block(d, const_end(r)) for r, d in _divisors_by_range(ast).items()
                  if r is not prange and r.arg[1] in ("loop", "serial", "reduce") and const_end(r) is not None}
        found = next(((r, b) for r, b in sorted(blocks.items(), key=lambda rb: rb[0].arg[0])
                      if b is not None and b >= MIN_BLOCK), None)
        if found is None:
            return ast
        ranges = sorted({u for u in ast.toposort() if u.op is Ops.RANGE}, key=lambda r: r.arg[0])
        ast = _split_range(ast, ranges, *found)


def _split_range(ast: UOp, ranges: list[UOp], k: UOp, block: int) -> UOp:
    """`ast` with range `k` (one of `ranges`, in order) split into kb * block + kl, kb and kl numbered in its place
    (the ranges after it one further on)."""
    at = ranges.index(k)
    kb = UOp(Ops.RANGE, dtypes.index, (UOp.const(const_end(k) // block),), (at, k.arg[1]))
    kl = UOp(Ops.RANGE, dtypes.index, (UOp.const(block),), (at + 1, k.arg[1]))
    mapping: dict[UOp, UOp] = {k: kb * block + kl}
    for n, r in enumerate(ranges):   # an end may be an expression of an outer range
        if r is not k:
            mapping[r] = UOp(Ops.RANGE, r.dtype, tuple(e.substitute(mapping) for e in r.src), (n + (n > at), r.arg[1]))
    for red in [u for u in ast.toposort() if u.op is Ops.REDUCE and k in u.src[1:]]:   # k's: over kb and kl
        over = [x for r in red.src[1:] for x in ((kb, kl) if r is k else (mapping[r],))]
        mapping[red] = UOp(Ops.REDUCE, red.dtype, (red.src[0].substitute(mapping), *over), red.arg)
    return _simplified_indices(ast.substitute(mapping))


def split_lanes(body: UOp, k: UOp, axis: int) -> tuple[UOp, list[UOp], UOp] | None:
    """(`body` over k = step * lanes + lane, the step range if any, the "lane" range of at most MAX_LANES steps),
    the new ranges numbered from `axis`: vectors of MAX_LANES steps where k is longer; None where MAX_LANES does not
    divide a longer k."""
    steps = const_end(k)
    lanes = min(steps, MAX_LANES)
    if steps % lanes:
        return None
    lane = UOp(Ops.RANGE, dtypes.index, (UOp.const(lanes),), (axis + 1, "lane"))
    if steps == lanes:
        return body.substitute({k: lane}), [], lane
    step = UOp(Ops.RANGE, dtypes.index, (UOp.const(steps // lanes),), (axis, "reduce"))
    return _simplified_indices(body.substitute({k: step * lanes + lane})), [step], lane


def _divisors_by_range(body: UOp) -> dict[UOp, set[int]]:
    """Each range of `body` -> the constants an expression of it is divided by or taken modulo by there."""
    divisors: dict[UOp, set[int]] = {}
    for u in body.toposort():
        if u.op in (Ops.IDIV, Ops.MOD) and u.src[1].op is Ops.CONST:
            for r in u.src[0].toposort():
                if r.op is Ops.RANGE:
                    divisors.setdefault(r, set()).add(u.src[1].arg)
    return divisors


def _block(body: UOp, k: UOp) -> int | None:
    """The largest divisor of `k` in `body` below its extent, when every such divisor divides the extent."""
    return _largest_block(_divisors_by_range(body).get(k, set()), const_end(k))


def _largest_block(divisors: set[int], steps: int) -> int | None:
    """The largest of `divisors` below `steps`, when every such divisor divides `steps`."""
    inside = [b for b in divisors if 1 < b < steps]
    if not inside or any(steps % b for b in inside):
        return None
    return max(inside)


def _simplified_indices(body: UOp) -> UOp:
    """`body` with each of its index expressions (the largest ones: a load's index, a shift's amount) simplified."""
    roots = {s for u in body.toposort() if u.dtype != dtypes.index for s in u.src
             if s.dtype == dtypes.index and s.op not in (Ops.CONST, Ops.RANGE)}
    return body.substitute({r: simplify(r) for r in roots})
