"""Tiled contractions on tensor cores: the body of a tile kernel whose launch has `fragments` (gpu_launch.py decides
it on the AST: both operands 16-bit floats widened to float32, a dialect with `tensor_core_mma`).

The group stages TILE_K-deep slices of both operands in local memory as 16-bit values (a plain load's bits as
stored, loaded into 16-bit registers: no widening and rounding back), k the minor axis (As[row][k],
Bs[column][k], rows padded so a warp's reads of pairs along k hit 32 banks; loaded as render_tiles.py loads them,
the next slice in flight during the arithmetic) and each warp multiplies its
WARP_TILE of the tile with m16n8k16 matrix instructions, float32 accumulators in registers. A fragment's registers
follow the PTX ISA's layouts for m16n8k16 with 16-bit operands, with g = lane / 4 and t = lane % 4:
- A (16 x 16, row major): a0 = (row g, k 2t and 2t + 1), a1 = row g + 8, a2 = k + 8, a3 = both;
- B (16 x 8, column major): b0 = (k 2t and 2t + 1, column g), b1 = k + 8;
- C (16 x 8 floats): c0, c1 = (row g, columns 2t and 2t + 1), c2, c3 = row g + 8;
two 16-bit values in one 32-bit register, the lower k in the low half: one 32-bit read of the k-minor tile. A TILE_K
slice is one k step.
"""
from __future__ import annotations

from ..uop import Ops, dtypes
from .render_tiles import TILE_K, Contraction, emit_loads, emit_stores, emit_tile_start

WARP = 32
FRAG_M, FRAG_N = 16, 8                # one matrix instruction's outputs
WARP_TILES = ((64, 32), (32, 64))     # a warp's outputs (2048: REG x REG per work-item), the first that divides


def warp_tile(c: Contraction) -> tuple[int, int]:
    return next(w for w in WARP_TILES if c.tm % w[0] == 0 and c.tn % w[1] == 0)


def emit_fragment_contraction(r, c: Contraction):
    """The kernel body through the C-style renderer `r`, whose dialect spells the matrix instruction."""
    d, long = r.d, r.long
    u16, u32 = d.types[dtypes.uint16], d.types[dtypes.uint32]
    kind = "bf16" if c.fragments == "bfloat16" else "f16"
    to_bits = ("pj_float_to_bfloat16({v})" if kind == "bf16" else "pj_float_to_half({v})")
    if kind == "bf16":
        r.bfloat16_helpers()
    r.helpers.setdefault(f"pj_mma_{kind}", d.tensor_core_mma.replace("{kind}", kind))
    wm, wn = warp_tile(c)
    fm, fn = wm // FRAG_M, wn // FRAG_N
    m, n, kk_end, regs = emit_tile_start(r, c, u16, k_major=False)
    r.emit(f"const int lane = lid % {WARP}, fg = lane / 4, ft = lane % 4 * 2;")  # g and 2t
    r.emit(f"const int wm = lid / {WARP} / {c.tn // wn} * {wm}, wn = lid / {WARP} % {c.tn // wn} * {wn};")
    accs = {(x, y, e): f"acc{x}_{y}_{e}" for x in range(fm) for y in range(fn) for e in range(4)}
    for x in range(fm):
        r.emit(" ".join(f"float {accs[x, y, e]} = 0.0f;" for y in range(fn) for e in range(4)))

    def bits(operand):   # a 16-bit element's bits: a plain load's as stored, else the value's rounded (exact)
        inner = operand.src[0]
        if inner.op is Ops.LOAD and len(inner.src) == 2:
            return f"buf{inner.src[0].arg}[{r.value(inner.src[1])}]"
        return to_bits.format(v=r.value(operand))
    emit_loads(r, c, regs, "0", bits)
    r.open_block(f"for ({long} k0 = 0; k0 < {kk_end}; k0 += {TILE_K})", {})
    emit_stores(r, c, regs, k_major=False)
    r.emit(d.barrier)
    r.open_block(f"if (k0 + {TILE_K} < {kk_end})", {})   # the next slice's loads, in flight during the arithmetic
    emit_loads(r, c, regs, f"(k0 + {TILE_K})", bits)
    r.close_block()

    def pair(tile, k, at):   # elements k and k + 1 (4-byte aligned: k even) of a row (A) or column (B) `at`
        return f"*(const {u32} *)&{tile}[{at}][{k}]"
    for x in range(fm):
        row = f"wm + {x * FRAG_M} + fg"
        r.emit(f"const {u32} a{x}_0 = {pair('As', 'ft', row)}, a{x}_1 = {pair('As', 'ft', f'{row} + 8')}, "
               f"a{x}_2 = {pair('As', 'ft + 8', row)}, a{x}_3 = {pair('As', 'ft + 8', f'{row} + 8')};")
    for y in range(fn):
        col = f"wn + {y * FRAG_N} + fg"
        r.emit(f"const {u32} b{y}_0 = {pair('Bs', 'ft', col)}, b{y}_1 = {pair('Bs', 'ft + 8', col)};")
    for x in range(fm):
        for y in range(fn):
            outs = ", ".join(accs[x, y, e] for e in range(4))
            r.emit(f"pj_mma_{kind}({outs}, a{x}_0, a{x}_1, a{x}_2, a{x}_3, b{y}_0, b{y}_1);")
    r.emit(d.barrier)
    r.close_block()
    _emit_fragment_results(r, c, accs, fm, fn, m, n)


def _emit_fragment_results(r, c: Contraction, accs: dict, fm: int, fn: int, m: str, n: str):
    """Store each accumulator at its output (row g or g + 8, columns 2t and 2t + 1 of its fragment), checked."""
    store, long = r.ast.src[0], r.long
    for x in range(fm):
        for y in range(fn):
            for e in range(4):
                row = f"i0 + wm + {x * FRAG_M + (8 if e >= 2 else 0)} + fg"
                col = f"j0 + wn + {y * FRAG_N + e % 2} + ft"
                r.open_block(f"if ({row} < {m} && {col} < {n})", {})
                r.emit(f"const {long} oi = {row}, oj = {col};")
                r.scopes[-1].update({**r.unflatten("oi", list(c.i)), **r.unflatten("oj", list(c.j)),
                                     c.reduce: accs[x, y, e]})
                r.emit(r.store_line(store))
                r.close_block()
