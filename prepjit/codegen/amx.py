"""The AST rule for contractions on AMX tiles (AMX_BF16's tdpbf16ps), where the target has them (target.py).

A register-blocked contraction (optimize.py) whose sum is of products of two bfloat16 loads widened to float32
over one static even reduction range k of TILE_K or more is blocked TILE_ROWS rows by one or two 16-lane column
vectors, and k is split in pairs like vdpbf16ps's (k = 2 k2 + p), the pair range of kind "tile": llvm_amx.py
renders a block's sums as one or two 16 x 16 float32 tiles, each step of TILE_K products a tdpbf16ps of a
16 x 32 bfloat16 tile of the row operand A by a 16 x 16-pair tile of the column operand B (VNNI layout: B's rows
k and k + 1 interleaved), the last step's tiles zero past k's end. A's rows are copied into an aligned stack tile
each step (64-byte vectors, so clamped or var row blocks need no stride); B is loaded from packing.py's VNNI
panels where it is packed, else its pairs of rows, read as the renderer reads any lane vector, are interleaved into
another stack tile. So any layout whose A is contiguous along k qualifies. Float32 accumulation, one rounding per
output at the end.

On the Xeon (model 167) here vdpbf16ps issues at a quarter of the float32 FMA rate; tdpbf16ps ran 497 G
products/s on one core, ~4x the FMAs' float32.
"""
from __future__ import annotations

from ..uop import Ops, UOp
from .optimize import contraction_axes, stride_along, widened_bfloat16_load
from .target import CPUTarget

TILE_ROWS = 16   # rows of a tile (A's and C's), the most a block takes
TILE_K = 32      # bfloat16 products a tile row sums per tdpbf16ps (64 bytes: 16 pairs)
TILE_LANES = 16  # float32 columns of a C tile: one 512-bit vector, the block's lane width


def tiled_operands(target: CPUTarget, red: UOp, j: UOp, i: UOp | None) -> tuple[UOp, UOp] | None:
    """(A, B): the row operand's and the column operand's bfloat16 loads when `red`'s contraction goes on tiles
    on `target`, else None."""
    if not target.amx_bf16 or i is None or len(red.src) != 2:
        return None
    x, k = red.src
    if x.op is not Ops.MUL or k.src[0].op is not Ops.CONST or k.src[0].arg % 2 or k.src[0].arg < TILE_K or \
            not all(widened_bfloat16_load(s) for s in x.src):
        return None
    loads = [s.src[0] for s in x.src]
    along_j = [j in ld.src[1].toposort() for ld in loads]
    if along_j.count(True) != 1:
        return None
    b, a = (loads[0], loads[1]) if along_j[0] else (loads[1], loads[0])
    return (a, b) if stride_along(a.src[1], k) == 1 else None


def tiled(ast: UOp, target: CPUTarget) -> bool:
    """Whether the kernel `ast` is a contraction that goes on `target`'s tiles (before matvec.py's rules)."""
    found = contraction_axes(ast)
    return found is not None and tiled_operands(target, found[1], found[3], found[4]) is not None
