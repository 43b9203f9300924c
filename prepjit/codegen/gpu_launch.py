"""The work-group targets' pass (opencl, cuda): how a kernel is launched, decided on the kernel AST before the
bounds proof and the renderer, so both (and the caches, and PREPJIT_TUNE) see one kernel.

A kernel becomes one of three launches, recorded as a LAUNCH node, the SINK's last source, which the C-style
renderer (render_c.py) follows and never decides itself:
- ("tile", rows, columns, splits[, fragments[, variant]]): a contraction tiled through local memory
  (render_tiles.py); the tile is the Blocking's (PREPJIT_TUNE's choice) or the tile policy's; `fragments`
  (render_tiles.fragment_kind: a 16-bit float's name where both operands are that float widened, or "tf32" /
  "bfloat16" where the contraction's precision allows; k split between `splits` sets of work-items where one
  operand unpacks quantized blocks, `unpacked_tile`, else one set) where the dialect has tensor cores
  (render_fragments.py); the variant "tma" (tensor_maps.BULK_VARIANT) where the dialect has bulk tensor copies
  (Hopper) and the tile is a wide one of 16-bit operands or tf32's (`wide_tile`: render_fragments_tma.py,
  its operands read through tensor maps the runtime encodes per launch); a var batch of quantized weights' rows
  (a decode step's sequences) whose least is at least TENSOR_BATCH_ROWS, of 16-bit activations, is one tile of the
  batch's rows by few columns (`tensor_batch_tile`) rather than a batch row kernel;
- ("rows", group, pack, run[, fold]): a row kernel (row_plan.py; work-items take runs of `run` elements; a
  work-group computing `fold` rows along a range its heavy loads do not read, Rows.fold), its row
  reductions' passes rewritten to share the columns' range where every pass is one static run per work-item
  (`share_passes`: the proof sees that range);
- ("batch", group, pack, run, block): a row kernel of a var batch of at most FEW_VAR_ROWS rows over a quantized
  weight (row_plan.batch_plan, `few_var_batch`; a tile where `tensor_batch_tile` takes it): a block of `block`
  columns (more than one where the weight is wide: a model's head) a warp or part of one (a work-group's without
  shuffles), their weights held in registers for a chunk of the batch's rows, a few rows' sums combined and stored
  at a time (render_batch_rows.py);
- ("attention", rows, key block, kind): softmax(q @ k^T ...) @ v, its softmax inside (softmax_contraction.py), on
  tensor cores, a work-group per block of `rows` queries (attention_tiles.py, render_attention.py);
- ("items", n): a work-item per `n` outputs (the dialect's items per thread; one where the kernel has fewer than
  FEW_OUTPUTS outputs, `items_per_work_item`).
"""
from __future__ import annotations

import math

import attrs

from ..uop import Ops, UOp, dtypes
from .attention_tiles import attention_launch
from .fused_reductions import FEW_VAR_ROWS   # a quantized contraction with a side of a var of at most this many: rows
from .optimize import DEFAULT_BLOCKING, Blocking
from .row_plan import (batch_plan, held_parts, loop_ranges, row_plan, share_batch_ranges, share_passes,
                       split_matvec_blocks)
from .softmax_contraction import MAX_ROWS_A_VALUE
from .render_fragments import KINDS, minors
from .render_tiles import FRAGMENT_THREADS, MIN_FILL, MIN_WARPS, _fill, fragment_kind, match_contraction, unpacks_blocks
from .tile_pairs import PAIR, match_pair

WARP_ROWS = 4             # rows of one warp each a work-group packs (dialects with shuffles)
BULK_VARIANT = "tma"       # a tile's variant on bulk tensor copies (Hopper: render_fragments_tma.py, tensor_maps.py)
WIDE_COLUMNS = 256         # columns of its tiles (`wide_tile`)
WIDE_TF32_TRANSPOSED = True   # a tf32 a @ b (b minor along its columns) takes the wide tile, b's tiles transposed in
                              # local memory (`wide_tile`); False: x @ W.T only (a @ b on mma.sync m16n8k8)
UNPACKED_TILE = (64, 32)   # rows and columns of a tile of a quantized weight on tensor cores (`unpacked_tile`)
UNPACKED_SPLITS = (4, 3, 2)   # sets of work-items that may split its k
TENSOR_BATCH_ROWS = 32    # a var batch over quantized blocks whose least is at least this many rows: tensor cores
                          # (render_tiles.MIN_SIDE at least: match_contraction takes no fewer rows); a var's range
                          # from fewer keeps the batch row kernel (its batch of one: the tile's 2-3x slower)
BATCH_TILE = (FEW_VAR_ROWS, 32)   # rows and columns of its tiles (`tensor_batch_tile`)
BATCH_TILE_SPLITS = (6, 4, 3)   # sets of work-items that may split its k (6: 768 work-items; 3 stages of 6 sets'
                                # slices on wgmma, 108 KB of local memory)
BATCH_TILE_WARPS = MIN_WARPS    # warps its tiles should run in all, where fewer sets give them
FEW_OUTPUTS = 1 << 18     # an elementwise kernel of fewer outputs (at most) takes one a work-item: its work-items
                          # would not fill a GPU of ~100 multiprocessors twice over at several each


def warp_rows(dialect) -> int:
    """Rows a work-group of a dialect packs where a row's group is one warp."""
    return WARP_ROWS if dialect.shuffle_xor else 1


def launch(ast: UOp, dialect, blocking: Blocking = DEFAULT_BLOCKING) -> UOp:
    """`ast` as launched on a `dialect` GPU: with its LAUNCH node (idempotent: a launched AST is returned as is)."""
    if launch_of(ast) is not None:
        return ast
    attention = attention_launch(ast, dialect, MAX_ROWS_A_VALUE)
    if attention is not None:
        return _with_launch(ast, attention)
    contraction = match_contraction(ast, blocking.tile)
    batch_tile = tensor_batch_launch(ast, contraction, dialect) if blocking.tile is None else None
    if batch_tile is not None:
        return _with_launch(ast, batch_tile)
    if contraction is not None and (blocking.tile is not None or not few_var_rows(contraction)):
        return _tile_launch(ast, contraction, dialect, blocking.tile)
    packed = warp_rows(dialect)
    split = split_matvec_blocks(ast, packed)
    batch = batch_plan(split, dialect.items_per_thread, packed)
    if batch is not None and few_var_batch(batch):
        return _with_launch(share_batch_ranges(split, batch),
                            ("batch", batch.group, batch.pack, batch.run, batch.block))
    shared = share_passes(split, dialect.items_per_thread, packed)
    rows = row_plan(shared, dialect.items_per_thread, packed)
    if rows is not None:
        fold = (rows.folded,) if rows.folded > 1 else ()   # (a work-group's rows along a range: Rows.fold)
        return _with_launch(shared, ("rows", rows.group, rows.pack, rows.run, *fold))
    if contraction is not None:
        return _tile_launch(ast, contraction, dialect, blocking.tile)
    ast = shared
    return _with_launch(ast, ("items", items_per_work_item(ast, dialect)))


def few_var_rows(c) -> bool:
    """Whether contraction `c` multiplies a side of one var range of at most FEW_VAR_ROWS (a decode step's batch of
    sequences) by an operand that unpacks quantized blocks (integer loads): its kernel is a row kernel where the row
    plan takes it, each weight unpacked in registers as in a one-row step, rather than a tile of 32 or more rows that
    unpacks every weight of a slice into local memory and computes padding at a batch of a few. On an H100 the paged
    step's Q4_1 tiles took 48-168 us a projection at one sequence (bfloat16 weights' tiles 21-46 us)."""
    for side, other in ((c.i, c.b), (c.j, c.a)):
        if len(side) == 1 and side[0].src[0].op is not Ops.CONST and side[0].src[0].vmax <= FEW_VAR_ROWS \
                and unpacks_blocks(other):
            return True
    return False


def few_var_batch(rows) -> bool:
    """Whether a batch row kernel (row_plan.batch_plan) is launched as one: a batch of at most FEW_VAR_ROWS rows, its
    reductions reading quantized blocks (integer loads). Each weight is then unpacked once per
    chunk of rows, where a row kernel of a warp per (row, column) unpacked it again for every row (an H100, the
    paged step at 64 sequences: qkv 65 us, the output projection 43 us for 0.2-0.6 MB of weights) and the tile
    launch of gate/up and the head (more than MANY_OUTPUTS rows at the batch's most) computed 32-row tiles at a
    batch of one (70 and 421 us)."""
    return rows.batch.src[0].vmax <= FEW_VAR_ROWS and any(unpacks_blocks(part) for u in rows.order
                                                           for part in held_parts(u, rows.batch))


def tensor_batch_launch(ast: UOp, c, dialect) -> tuple | None:
    """The tile launch of a var batch's projection on tensor cores (`tensor_batch_tile`) of `ast`'s contraction `c`,
    or of its two sums side by side where it has two (tile_pairs.match_pair: SiLU(gate) * up of gate/up's one
    contraction, each output's two sums in one tile's accumulators: its launch ends with PAIR), or None."""
    if not dialect.tensor_core_mma:
        return None
    paired = match_pair(ast) if c is None else None
    tile = tensor_batch_tile(c or paired, dialect) if c or paired else None
    if tile is None:
        return None
    return ("tile", *tile) if paired is None else ("tile", *tile, None, PAIR)


def tensor_batch_tile(c, dialect) -> tuple | None:
    """(rows, columns, splits, fragments) of the tensor-core tile of a var batch of rows (a decode step's sequences)
    by a weight unpacked from quantized blocks, x @ pj.quant.dequantize(b, kind).T of 16-bit activations
    (fragment_kind "bfloat16"), where the batch's least is at least TENSOR_BATCH_ROWS; else None (few_var_rows's
    batch row kernel). One tile's rows hold the whole batch (BATCH_TILE: its rows past the batch's are staged as
    zeros and never stored), so each weight is unpacked once, where the batch row kernel unpacks it once per
    BATCH_CHUNK rows and multiplies on the CUDA cores (an H100, the paged step at 64 sequences: ~6 TFLOP/s); its 32
    columns give the most work-groups the fragments allow (960 columns: 30), and its k is split between sets of 4
    warps, each staging a share of k's slices (two at least): the fewest of BATCH_TILE_SPLITS (or one set) that
    divide the slices and give BATCH_TILE_WARPS warps in all, else the most (a projection of 576 or 960 columns: 6;
    a head of 49152, 1536 tiles: one set, so a multiprocessor holds several tiles at once: 24 KB of local memory, not
    150). (Fewer rows, or two sets, would stage their slices in 48 KB of static local memory, to which the sets'
    combining tiles, fragment_results.py, add past the 48 KB a kernel may declare: render_fragments.declare_tiles.)
    The kernel is compiled once for the var's range, so the choice holds for its every batch: a range from one row
    keeps the batch row kernel, whose batch of one is 2-3x faster than the tile's (an H100, SmolLM2's paged step: the
    head 25.8 us against 84.0, down 8.6 against 26.0), where the tile at 64 rows is 1.1-5.5x faster (the head 326.9 us
    against 59.1); a caller wanting both prepares two ranges (examples/models/llama_paged.prepared)."""
    var = c.i[0].src[0] if len(c.i) == 1 else None
    if not dialect.tensor_core_mma or var is None or var.op is Ops.CONST or not few_var_rows(c) or \
            var.vmin < TENSOR_BATCH_ROWS or unpacked_tile(c, fragment_kind(c)) is None:
        return None
    end = c.k.src[0]
    slices = -(-end.arg // KINDS["bfloat16"].slice_k) if end.op is Ops.CONST else 0
    fitting = sorted({1, *(s for s in BATCH_TILE_SPLITS if slices % s == 0 and slices >= 2 * s)})
    warps = -(-math.prod(r.src[0].vmax for r in c.j) // BATCH_TILE[1]) * FRAGMENT_THREADS // 32   # (a set's, in all)
    splits = next((s for s in fitting if warps * s >= BATCH_TILE_WARPS), fitting[-1])
    return *BATCH_TILE, splits, "bfloat16"


def _tile_launch(ast: UOp, c, dialect, tile: tuple | None) -> UOp:
    """The tile launch of contraction `c`: the Blocking's `tile` where it names one (its splits kept where it names
    fragments too), else the policy's."""
    fragments = fragment_kind(c) if dialect.tensor_core_mma else None
    unpacked = unpacked_tile(c, fragments) if tile is None else None
    if unpacked is not None:
        return _with_launch(ast, ("tile", *unpacked, fragments))
    if fragments is not None and dialect.bulk_copies and wide_tile(c, fragments):
        return _with_launch(ast, ("tile", c.tm, WIDE_COLUMNS, 1, fragments, BULK_VARIANT))
    if fragments is not None:
        splits = c.splits if tile is not None and len(tile) > 3 else 1
        return _with_launch(ast, ("tile", c.tm, c.tn, splits, fragments))
    return _with_launch(ast, ("tile", c.tm, c.tn, c.splits))


def unpacked_tile(c, fragments: str | None) -> tuple | None:
    """(rows, columns, splits) of a tensor-core tile whose columns' operand is unpacked from quantized blocks (x @
    pj.quant.dequantize(b, kind).T, bfloat16 x: fragment_kind), or None: UNPACKED_TILE, its k split between the
    tile's sets of work-items (render_fragments: each set stages and multiplies every splits-th slice, set 0 adds
    up), the most of UNPACKED_SPLITS that divides k's slices (the first where none does). Unpacking, not the
    tensor cores' arithmetic, is the tile's work: the policy's tiles (32 x 128 for SmolLM2's projections, 128 x
    128 for its head) put it on few work-groups of 4 warps, each unpacking its columns' slices one after
    another (on an H100 ~50 us whatever the rows up to 128: 8-30 work-groups on 132 multiprocessors); 32 columns
    give 4x the work-groups of 128, and 4 sets 16 warps a group, each unpacking a quarter of the slices."""
    if fragments != "bfloat16" or not unpacks_blocks(c.b) or unpacks_blocks(c.a):
        return None
    end = c.k.src[0]
    slices = -(-end.arg // KINDS[fragments].slice_k) if end.op is Ops.CONST else 0
    return (*UNPACKED_TILE, next((s for s in UNPACKED_SPLITS if slices % s == 0), UNPACKED_SPLITS[0]))


def wide_tile(c, fragments: str) -> bool:
    """Whether a contraction of `fragments` on a dialect with bulk tensor copies (Hopper) takes the wide tile of the
    "tma" variant (render_fragments_tma.py: 128 x WIDE_COLUMNS, a producer and two consumer warpgroups): 16-bit
    operands, or tf32's float32 ones where both are minor along k (wgmma cannot transpose 32-bit tiles: x @ W.T) or,
    with WIDE_TF32_TRANSPOSED, a's along k and b's along its columns (a @ b: the producer's rounders transpose b's
    tiles in local memory), of a contraction the tile policy gives 128 x 128 tiles (many outputs), whose columns fill
    wide tiles as well."""
    m, n = (math.prod(r.src[0].vmax for r in side) for side in (c.i, c.j))
    axes = minors(attrs.evolve(c, fragments=fragments))
    return ((KINDS[fragments].bytes == 2 or axes == ["k", "k"] or WIDE_TF32_TRANSPOSED and axes == ["k", "own"])
            and (c.tm, c.tn) == (128, 128) and n >= WIDE_COLUMNS and _fill(m, n, (c.tm, WIDE_COLUMNS)) >= MIN_FILL)


def items_per_work_item(ast: UOp, dialect) -> int:
    """Outputs a work-item of an elementwise kernel stores: the dialect's items per thread, or one where the kernel
    has fewer than FEW_OUTPUTS outputs at most. A small kernel is latency-bound: each work-item runs its outputs'
    code one after another (a 30-way concatenation of RoPE'd rows: ~3,000 instructions an output), so one output a
    work-item puts that many times more work in flight."""
    outputs = math.prod(r.src[0].vmax for r in loop_ranges(ast))
    return dialect.items_per_thread if outputs >= FEW_OUTPUTS else 1


def _with_launch(ast: UOp, arg: tuple) -> UOp:
    return UOp(Ops.SINK, ast.dtype, (*ast.src, UOp(Ops.LAUNCH, dtypes.bool, (), arg)), ast.arg)


def launch_of(ast: UOp) -> tuple | None:
    """The LAUNCH decision of a launched kernel AST, or None."""
    last = ast.src[-1] if ast.src else None
    return last.arg if last is not None and last.op is Ops.LAUNCH else None
