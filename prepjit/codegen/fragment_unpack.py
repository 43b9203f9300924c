"""A tensor-core tile's computed operand staged a chunk at a time from the blocks it is unpacked from (the weight of
x @ pj.quant.dequantize(b, kind).T with 16-bit activations: render_tiles.fragment_kind rounds it to their float).

fragment_copies.py stages a computed operand element by element, each element's whole expression again: for a
dequantized weight, the block's float16 scale (and q4_1's min) rebuilt from its bytes for each of a chunk's 8
weights, and each element's own bounds check. Here the operand's reduce range k is split at its blocks as the
cpu's kernels split it (block_split.split_at_blocks: k = kb * 32 + kl for q8_0; q4_1 32 then 16, the k-quants
down to their sub-blocks), so a chunk of 8 consecutive k (a multiple of 8 from a multiple of 8, inside one
innermost block) binds every outer block range once: what depends on them alone (the scale, the min, the block's
address) is rendered once for the chunk, then each element's unpacking (a byte, a shift, a mask, a multiply-add)
at the innermost offset plus 0 ... 7, rounded to the tile's 16-bit float into registers, and the chunk stored to
local memory as one 16-byte store (a tile of 16-bit elements: CUDA's, the one dialect with tensor-core tiles). The
chunk is checked once, wholly in range or out (k's static extent a multiple of the chunk).
"""
from __future__ import annotations

import functools

import attrs

from ..uop import Ops, UOp
from .block_split import split_at_blocks
from .optimize import const_end

_UNNAMED = (Ops.CONST, Ops.RANGE, Ops.DEFINE_VAR, Ops.DEFINE_GLOBAL, Ops.DEFINE_LOCAL)   # (no values of their own)


@attrs.frozen
class BlockSplit:
    operand: UOp           # the operand over the split ranges
    ranges: tuple          # the ranges k became, outermost first (the last the innermost block's offset)
    blocks: tuple          # each range's step in k (its block: 32, 16, ..., 1 for the last)


@functools.lru_cache(maxsize=256)
def block_split(operand: UOp, k: UOp, chunk: int) -> BlockSplit | None:
    """`operand` over reduce range `k` split at its blocks, where k's extent is static and a multiple of `chunk` and
    the innermost block is too (a chunk then lies in one block); None where nothing splits or it does not fit."""
    end = const_end(k)
    if end is None or end % chunk:
        return None
    axis = max(u.arg[0] for u in operand.toposort() if u.op is Ops.RANGE) + 1
    body, ranges = split_at_blocks(operand, k, axis)
    if len(ranges) == 1 or const_end(ranges[-1]) % chunk:
        return None
    blocks, step = [], end
    for r in ranges:
        step //= const_end(r)
        blocks.append(step)
    return BlockSplit(body, tuple(ranges), tuple(blocks))


def emit_unpacked_chunk(r, c, s, gk: str, go: str, extent: str, dst: str) -> bool:
    """Stage operand `s`'s chunk at k `gk` (a multiple of the chunk) and own index `go` into `dst` (the chunk's
    elements, zeros out of range) as the module docstring says; False (nothing emitted) where its k does not split."""
    from .fragment_copies import element_type   # (which calls this module)
    chunk = s.kind.chunk
    split = block_split(s.operand, c.k, chunk) if s.minor == "k" and s.kind.bytes == 2 else None
    if split is None:
        return False
    r.open_block(f"if ({gk} < {r.value(c.k.src[0])} && {go} < {extent})", {})
    r.scopes[-1].update(r.unflatten(go, list(s.own)))
    *outer, inner = split.ranges
    above = None
    for rng, block in zip(outer, split.blocks):   # range i is k's digit at its block, below the block above it
        r.scopes[-1][rng] = f"(({gk}) / {block})" if above is None else f"(({gk}) % {above} / {block})"
        above = block
    base = f"({gk}) % {above}"
    per_chunk = _per_chunk(split.operand, inner)
    for u in per_chunk:
        r.value(u)
    r.emit(f"{element_type(r, s.kind)} q[{chunk}];")
    for e in range(chunk):
        r.open_block("", {inner: f"({base} + {e})"})
        r.emit(f"q[{e}] = {s.kind.staged.format(v=r.value(split.operand))};")
        r.close_block()
    words = [f"q[{e}] | (unsigned)q[{e + 1}] << 16" for e in range(0, chunk, 2)]
    r.emit(f"*(uint4 *){dst} = uint4{{{', '.join(words)}}};")   # (one 16-byte store: the chunk is aligned)
    r.close_block()
    r.open_block("else", {})
    r.emit(f"*(uint4 *){dst} = uint4{{0, 0, 0, 0}};")
    r.close_block()
    return True


def _per_chunk(operand: UOp, inner: UOp) -> list[UOp]:
    """The largest parts of `operand` that do not depend on range `inner` (and are worth a name: no constants)."""
    varies = set()
    for u in operand.toposort():   # (operands first)
        if u is inner or any(x in varies for x in u.src):
            varies.add(u)
    return list(dict.fromkeys(s for u in varies for s in u.src
                              if s not in varies and s.op not in _UNNAMED))
