"""Contractions of several rows over a weight stored in blocks (pj.quant): decode batches and prefill.

`x @ pj.quant.dequantize(b, kind).T` with x of B rows (a var, as a serving engine's batch, or static) reads its
weight as blocks: block_split.py splits the reduction at them, so each block is unpacked in registers as one
vector (its bytes loaded as a vector, its scale converted once per block). One row (matvec.py) unpacks each block
once and uses it once. With B rows, unpacking the weight once per row would cost B times the one-row kernel; a
float32 copy of the weight (dequantized per call, then packed) costs 4/1.06 (q8_0) to 4/0.63 (q4_1) times its bytes
twice over, every call. Here instead the kernel is register-blocked: a block of R rows x C columns keeps R x C
vector sums (one per output, each the lanes of a block's weights, added up once at the end as in the one-row
kernel); each step unpacks C columns' blocks once and uses each for all R rows, and loads R rows' activations
once for all C columns. The renderer (render_llvm's lane_sum) computes every sum over the same block ranges in
one loop nest and each shared value once.

Loops: column panels of C columns, grouped so a group's blocks fit half the L2 cache (optimize.panel_group),
the group index outermost (threads split it), then the row blocks, then the group's panels: a group's blocks
are read from memory once per call and from L2 by every row block, and a row block's activations stay in L1
across the group's panels. The rows past the last full block (a var count, or a static one R does not divide)
run as one block of their own count (optimize.row_nests with every_count: a nest of 0 or 1 iterations for each
count below R): one row costs what matvec.py's one-row kernel costs, three rows one read of the weights, not a
block of R recomputing its last, nor a block of 2 and a block of 1, each reading and unpacking all the blocks
(3072 x 576 q4_1, one thread, B = 3 223 -> 153 us; B = 2 124, B = 4 171).

A prefill (the rows' maximum MIN_TILE_ROWS or more) reuses each unpacked block for all its rows instead: the
column panels are the outermost loop (threads split them), and each panel's C columns are unpacked once per call
into a tile of the kernel's own (DEFINE_LOCAL: C x K floats on the calling thread's stack, TILE_BYTES at most,
laid out along the reduction), then every row block's sums read the tile as contiguous vectors of the target's
float lanes, the reduction one range of them (k = kk * lanes + lane): no unpacking inside the sums, R + C vector
loads for R x C FMAs. Each row block streams its R rows of activations from L2 once per panel, so the blocks are
wide in columns (3 x 6 on AVX-512: 128 rows x 576 @ 1536 q4_1 on one thread 1.34-1.54 ms against 4 x 4's
1.44-1.78, 2 x 8's 1.65 and the block kernel's 2.46-2.75; NumPy's float32 matmul 1.42-1.45). The rows past the
full blocks run one at a time over the tile (optimize.row_nests' one_row_tail): one nest of C sums, not one for
each count below R, whose code cost LLVM and the bounds proof more than it saved (SmolLM2's prefill at T = 128 and
127 in the same time; its o-projection's IR 85 -> 59 KB). The bounds proof sees the tile's accesses against the
size its DEFINE_LOCAL names; no float32 copy of the weight is made.

A decode batch (more rows at most than one register block holds, fewer than MIN_TILE_ROWS: a serving engine's B
up to 16) gets a tile too, whose use depends on the live row count: the column panels outermost (threads split
them), each panel's blocks unpacked into the tile only when the rows are more than one register block holds (the
fill's column loop runs 0 or C times), the tile's sums over the block split's own ranges (the block kernel's sums,
not the prefill tile's flat range), and fewer rows reading the panel's blocks in the block kernel's register
blocks. Why: 16 rows in 4 x 2 blocks unpacked each weight block 4 times (q4_1: ~12 vector instructions for two
vectors of weights, beside the 16 FMAs of a step, on the two ports that do both): SmolLM2's 16-row projections ran
at 80-90 GFLOP/s on one thread against the prefill tile's 130-150. With the tile (4 columns of two-register sums,
3 x 4 blocks on AVX-512), one thread, q4_1: 3072 x 576 at B = 16 0.65-0.70 -> 0.45-0.50 ms, 576 x 576 0.125 ->
0.09, 576 x 1536 0.30-0.33 -> 0.28-0.29 (its 16 rows of activations stream from L2 per panel); q8_0 head 49152 x
576, two threads, 9.6-9.7 -> 6.9-7.9 ms; B <= 4 as before (B = 1 head 1.34-1.53 vs 1.36-1.39). A decode batch's
register block holds DECODE_ACCUMULATORS sums, not the default 16 (AVX-512: 6 x 2 blocks, not 4 x 2; AVX2's 13
registers keep 3 x 1), so 5 and 6 rows are one read of the blocks, not a tile's fill and two blocks of it: one
thread, B = 5 and 6, 3072 x 576 q4_1 211-227 -> 190-203 and 255 -> 230 us, q8_0 210 -> 203 and 233 -> 232, 576 x
1536 q4_1 137 -> 103 and 156 -> 116; other B within noise (7 x 2 measured no better at 7).

One row's sum is the same sequence of operations in a block of any size (a vector of lane sums accumulated over
the block ranges in order, its lanes added up once): row b's result has the same bits for B = 1 and B = 64 (a
serving engine's greedy output does not depend on its batch; tests/codegen/test_block_matmul.py checks it). The
sum is reassociated as in the one-row kernel. Over a tile the sums add k in another grouping than over the blocks
(one vector of lanes per step, not one per nibble half): a row still has the same bits in any batch of one plan.
A decode batch's tile sums as its blocks do: a row's bits are the same on or off the tile.

A quantized weight's 4- or 8-bit values are unpacked in int32 (block_scales' widening: the same values, so the same
bits), not in bytes: on AVX2 a q4_1 nibble's shift and mask in i8 vectors took a variable shift and two selects a
vector (x86 has no byte shifts). One thread, SmolLM2 gguf's paged decode step (AMD EPYC, Zen 3, shared host): B = 1
18.7-20.7 -> 14.2-16.9 ms (gate/up 7.1-7.8 -> 5.1-5.9), B = 16's projections ~13% less; the prefill as before.

Where the target's vectors are narrower than a block's lanes (AVX2), a batch's sums take their block scales out of
the in-block sums as the one-row kernel's do (block_scales.factored_scales: d times a lane sum of x * q, plus m
times x's block totals, which the kernel computes once per call for every row, in an array laid out for the most
rows); unpacking a weight is then a conversion and an FMA, and the blocks read again for each register block of
rows cost less than a decode batch's tile (its fill and its sums of dequantized floats): such a batch reads the
blocks at every B. A row has the same bits in any batch (the in-block sums start at -0.0 alone or in a block,
llvm_reductions.py). One thread, AMD EPYC (Zen 3), fastest of 7 x 50 calls, B = 1 / 4 / 8 / 16: q4_1 3072 x 576
172 / 470 / 832 / 1679 -> 139 / 375 / 672 / 1357 us, 576 x 1536 103 / 263 / 477 / 833 -> 67 / 189 / 339 / 643;
q8_0 3072 x 576 172 / 560 / 1106 / 2213 -> 133 / 345 / 687 / 1310 (host shared with a test suite); SmolLM2 gguf's
paged decode step (pj.profile, one thread) B = 1 14.0-16.1 -> 11.6-14.2 ms, B = 16 148-173 -> 127-148 ms.
"""
from __future__ import annotations

import functools

from ..uop import Ops, UOp, dtypes, simplify
from .block_scales import TABLE_LANES, factored_scales, widened
from .block_split import split_blocks
from .llvm_reductions import UNROLLED_STEPS
from .lower import linear_index
from .optimize import (
    DEFAULT_BLOCKING,
    Blocking,
    block_stores,
    contraction_axes,
    new_range,
    panel_group,
    renumber,
    row_nests,
    stride_along,
)
from .target import CPUTarget, host_target

SPARE_REGISTERS = 3  # vector registers a step needs besides the sums: an unpacked block, an activation, a scale
MIN_TILE_ROWS = 128  # rows (their maximum) from which each panel's weights are unpacked once into a tile
TILE_BYTES = 1 << 15  # a tile's bytes, at most: it lives on the stack of each thread calling the kernel
TILE_COLUMNS = (6, 4, 2)  # a tile's columns: the first that divides the weight's, fits TILE_BYTES and a quarter
# of the registers (a batch's tile: its columns' sums do, AVX-512 q4_1 / q8_0: 4 columns of two registers each)
DECODE_ACCUMULATORS = 24  # a decode batch's register block (fewer rows than MIN_TILE_ROWS): see the docstring
TILE_ROWS = 3  # rows of a register block over a tile, at most (with 6 columns: 18 sums, 6 column vectors, a row's)


def reads_blocks(ast: UOp, target: CPUTarget | None = None) -> bool:
    """Whether `ast` is a contraction `block_matmul` computes from its weight's blocks (its operands are read as
    they are: packing a copy of the weight would materialise it as floats). Asks `_blocked`, not the build."""
    split = split_blocks(ast)
    return split is not ast and _blocked(split, target or host_target(), DEFAULT_BLOCKING) is not None


def _blocked(split: UOp, target: CPUTarget, blocking: Blocking) -> tuple | None:
    """What `block_matmul` builds its kernel of `split` from (the contraction's store, reduction, column and row
    ranges, the rows' maximum, the register block, the panels' group, the groups' range and the next axis), or None
    where it builds none: its checks without the build (packing asks them of every contraction it schedules, where
    the build cost SmolLM2's prefill some 60 ms before optimisation built the same kernels again)."""
    found = contraction_axes(split)
    if found is None:
        return None
    store, red, loops, j, i = found
    lane = red.src[-1]
    if i is None or len(loops) != 2 or len(store.src) != 3 or j.src[0].op is not Ops.CONST or \
            lane.op is not Ops.RANGE or lane.arg[1] != "lane" or i.src[0].op is Ops.CONST and i.src[0].arg == 1:
        return None
    weights = [ld for ld in red.toposort() if ld.op is Ops.LOAD and j in ld.src[1].toposort()]
    if not any(stride_along(ld.src[1], lane) == 1 for ld in weights):
        return None
    most = i.src[0].vmax  # a prefill's tile for all rows; a batch's for more rows than one register block holds
    decode = most < MIN_TILE_ROWS and blocking == DEFAULT_BLOCKING  # (PREPJIT_TUNE's blocking as it chose)
    rows, columns = _register_block(red, target, DECODE_ACCUMULATORS if decode else blocking.max_accumulators,
                                    j.src[0].arg)
    column_bytes = sum({ld.src[0]: (stride_along(ld.src[1], j) or 0) * ld.dtype.itemsize for ld in weights}.values())
    panels = j.src[0].arg // columns
    group = panel_group(panels, columns * column_bytes, target)
    axis = max(u.arg[0] for u in split.toposort() if u.op is Ops.RANGE) + 1
    groups = new_range(UOp.const(panels // group), -1)
    if groups.op is not Ops.RANGE:  # one panel: no loop for threads to split around the row nests
        return None
    return store, red, j, i, most, rows, columns, group, groups, axis


@functools.lru_cache(maxsize=256)
def block_matmul(split: UOp, target: CPUTarget, blocking: Blocking = DEFAULT_BLOCKING) -> UOp | None:
    """The register-blocked kernel (see the module docstring) of a contraction `split` at its weight's blocks
    (block_split.split_blocks) with two loops, rows and columns, where the rows are not one static row (matvec.py's
    one-row kernel) and the columns are static; None for any other kernel (`_blocked`). Each build some 10 ms."""
    found = _blocked(split, target, blocking)
    if found is None:
        return None
    store, red, j, i, most, rows, columns, group, groups, axis = found
    totals, factored = _factored_sums(store, i, target)
    tiled = _weight_tile(split, store, red, j, i, target, None if most >= MIN_TILE_ROWS else (rows, columns)) \
        if most > rows and (most >= MIN_TILE_ROWS or factored is store) else None
    if tiled is not None:  # each panel's weights unpacked into a tile once, for all rows
        return _unpacked_in_int32(tiled, target)

    def panel(n: int) -> UOp:  # groups outermost (threads split them), a group's panels innermost
        return groups * group + new_range(UOp.const(group), n) if group > 1 else groups
    stores = [s for block_rows, n in row_nests(i.src[0], rows, axis, every_count=True)
              for s in block_stores(factored, j, i, [panel(n + 1) * columns + c for c in range(columns)], block_rows,
                                    {})]
    return _unpacked_in_int32(renumber(UOp(Ops.SINK, split.dtype, (*totals, *stores), split.arg)), target)


def _factored_sums(store: UOp, i: UOp, target: CPUTarget) -> tuple[tuple[UOp, ...], UOp]:
    """(the stores of x's block totals, once per call for every row, and `store` with its block scales factored out
    of the in-block sums: block_scales.factored_scales, with the row range `i` among the totals' ranges), or
    ((), `store`) where the target does not factor them (vectors as wide as the lane range, or tables) or the
    totals would not be hoisted (too many rows: a second lane sum an output would take a block's registers)."""
    out = factored_scales(UOp(Ops.SINK, store.dtype, (store,)), target, (i,))
    factored = out.src[-1]
    lane_sums = [u for u in factored.toposort() if u.op is Ops.REDUCE and u.src[-1].arg[1] == "lane"]
    return (out.src[:-1], factored) if len(lane_sums) <= 1 else ((), store)


def _unpacked_in_int32(kernel: UOp, target: CPUTarget) -> UOp:
    """`kernel` with its quantized values unpacked in int32 (block_scales' widening, the same values), where the
    target's q4 blocks are not looked up in tables (AVX-512's permutes read the bytes' nibbles as they are)."""
    return kernel if target.lanes(4) >= TABLE_LANES else widened(kernel)


def _weight_tile(split: UOp, store: UOp, red: UOp, j: UOp, i: UOp, target: CPUTarget,
                 direct: tuple[int, int] | None) -> UOp | None:
    """The kernel of a sum of products x(i, k) * w(j, k) that unpacks each panel's weights w once into a tile for
    all its rows (see the module docstring), or None where the products are not so or the tile would not fit
    TILE_BYTES. With `direct`, the (rows, columns) of the block kernel's register block (a batch of a few rows,
    at most MIN_TILE_ROWS), the tile's sums run over the split's own ranges, as the block kernel's do, and the
    tile is filled and read only when the live rows are more than one such block holds; fewer rows read the
    panel's blocks themselves in blocks of that shape (the same sums of the same floats: a row's bits do not
    depend on which it took)."""
    body, reduces = red.src[0], red.src[1:]
    if body.op is not Ops.MUL or red.dtype != dtypes.float32:
        return None
    x, w = body.src if j in body.src[1].toposort() else body.src[::-1]
    lane, width = reduces[-1], target.lanes(red.dtype.itemsize)
    extents = [r.src[0].arg if r.src[0].op is Ops.CONST else 0 for r in reduces]
    steps = _product(extents)
    if j in x.toposort() or not {u for u in w.toposort() if u.op is Ops.RANGE} <= {j, *reduces} or \
            not steps or extents[-1] % width:
        return None
    sums = 1 if direct is None else _sum_registers(red, target)  # vector registers of one output's sums
    columns = next((c for c in TILE_COLUMNS if j.src[0].arg % c == 0 and c <= target.vector_registers // 4 and
                    c * steps * w.dtype.itemsize <= TILE_BYTES and j.src[0].arg // c >= 2 and
                    (direct is None or c % direct[1] == 0 and c * sums <= target.vector_registers // 4)), None)
    if columns is None:
        return None
    fit = (target.vector_registers - columns - 1) // (columns * sums)  # rows of sums beside the column vectors
    rows = max(1, min(TILE_ROWS, fit) if direct is None else fit)
    # the reduction as one range of vectors of `width` lanes: k = kk * width + lane
    axis = 1 + max(u.arg[0] for u in split.toposort() if u.op is Ops.RANGE)
    kk = UOp(Ops.RANGE, dtypes.index, (UOp.const(steps // width),), (axis, "reduce"))
    flat_lane = UOp(Ops.RANGE, dtypes.index, (UOp.const(width),), (axis + 1, "lane"))

    per_lane = extents[-1] // width  # vectors of `width` lanes in the split's lane range

    def split_ranges(vectors: UOp) -> dict:  # each range of the block split as an expression of the flat one
        mapping, outer = {lane: vectors % per_lane * width + flat_lane if per_lane > 1 else flat_lane}, \
            vectors // per_lane if per_lane > 1 else vectors
        for r, extent in zip(reversed(reduces[:-1]), reversed(extents[:-1])):
            mapping[r], outer = outer % extent, outer // extent
        return mapping
    number = 1 + max((u.arg[0] for u in split.toposort() if u.op is Ops.DEFINE_LOCAL), default=-1)
    tile = UOp(Ops.DEFINE_LOCAL, w.dtype, (), (number, columns * steps))
    panel = UOp(Ops.RANGE, dtypes.index, (UOp.const(j.src[0].arg // columns),), (-1, "loop"))
    # the fill runs the split's own ranges (serial loops, a block's scales loaded once, its nibble halves a loop
    # of constant steps LLVM unrolls), then the lane's vectors
    fill_ranges = [UOp(Ops.RANGE, dtypes.index, (UOp.const(e),), (axis + 2 + n, "serial"))
                   for n, e in enumerate([columns, *extents[:-1], per_lane])]
    column, *outer, part = fill_ranges
    fill_lane = part * width + flat_lane
    fill = UOp(Ops.STORE, dtypes.bool, (tile, simplify(column * steps + linear_index([*outer, fill_lane], extents)),
                                        _simplified_loads(w.substitute({j: panel * columns + column, lane: fill_lane,
                                                                         **dict(zip(reduces[:-1], outer))}))))
    panel_columns = [panel * columns + c for c in range(columns)]
    if direct is None:
        read = UOp(Ops.LOAD, w.dtype, (tile, (j % columns) * steps + kk * width + flat_lane))
        flat = UOp(Ops.REDUCE, red.dtype, (_simplified_loads(x.substitute(split_ranges(kk))) * read, kk, flat_lane),
                   red.arg)
        stores = [s for block_rows, n in row_nests(i.src[0], rows, axis + 3 + len(fill_ranges), one_row_tail=True)
                  for s in block_stores(store.substitute({red: flat}), j, i, panel_columns, block_rows, {})]
        return renumber(UOp(Ops.SINK, split.dtype, (fill, *stores), split.arg))
    # a few rows: the tile only for more live rows than a direct block holds (shared = 1), else the blocks
    shared = simplify((i.src[0] // (direct[0] + 1)).smin(1))
    fill = fill.substitute({column: UOp(Ops.RANGE, dtypes.index, (simplify(shared * columns),), column.arg),
                            part: UOp.const(0), flat_lane: lane})  # one lane range: the sums'
    read = UOp(Ops.LOAD, w.dtype, (tile, (j % columns) * steps + linear_index(reduces, extents)))
    on_tile = store.substitute({red: UOp(Ops.REDUCE, red.dtype, (x * read, *reduces), red.arg)})
    first = axis + 3 + len(fill_ranges)
    nests = row_nests(simplify(i.src[0] * shared), rows, first, every_count=True)
    stores = [s for block_rows, _ in nests for s in block_stores(on_tile, j, i, panel_columns, block_rows, {})]
    after = 2 + max((n for _, n in nests), default=first)

    def direct_columns(n: int) -> list[UOp]:  # a loop over the panel's blocks of direct[1] columns, inside nest n
        sub = new_range(UOp.const(columns // direct[1]), n + 1)
        return [panel * columns + sub * direct[1] + c for c in range(direct[1])]
    stores += [s for block_rows, n in row_nests(simplify(i.src[0] - i.src[0] * shared), direct[0], after,
                                                         every_count=True)
               for s in block_stores(store, j, i, direct_columns(n), block_rows, {})]
    return renumber(UOp(Ops.SINK, split.dtype, (fill, *stores), split.arg))


def _simplified_loads(u: UOp) -> UOp:
    return u.substitute({ld: UOp(Ops.LOAD, ld.dtype, (ld.src[0], *(simplify(s) for s in ld.src[1:])), ld.arg)
                         for ld in u.toposort() if ld.op is Ops.LOAD})


def _product(extents: list[int]) -> int:
    out = 1
    for e in extents:
        out *= e
    return out


def _sum_registers(red: UOp, target: CPUTarget) -> int:
    """Vector registers of one output's sums: the lane range's float sums times the renderer's unrolled innermost
    steps (llvm_reductions.lane_sum)."""
    lanes, inner = red.src[-1].src[0].arg, red.src[-2].src[0] if len(red.src) > 2 else UOp.const(1)
    unrolled = inner.arg if inner.op is Ops.CONST and inner.arg <= UNROLLED_STEPS else 1
    return -(-lanes * red.dtype.itemsize * unrolled // target.vector_bytes)


def _register_block(red: UOp, target: CPUTarget, accumulators: int, columns: int) -> tuple[int, int]:
    """(rows, columns) of the register block: as many vector sums as `accumulators` and the registers hold, each
    `_sum_registers`, two columns when four sums fit and the columns are even (AVX-512: 4 x 2 of 16, 6 x 2 of
    DECODE_ACCUMULATORS; AVX2: 3 x 1)."""
    registers = _sum_registers(red, target)
    budget = min(accumulators, target.vector_registers - SPARE_REGISTERS)
    sums = max(1, budget // registers)
    across = 2 if sums >= 4 and columns % 2 == 0 else 1
    return max(1, sums // across), across
