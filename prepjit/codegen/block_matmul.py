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
run in at most one block of each power of two below R, largest first (optimize.row_nests): one row costs what
matvec.py's one-row kernel costs, three rows a block of 2 and a block of 1, not a block of R recomputing its last.

One row's sum is the same sequence of operations in a block of any size (a vector of lane sums accumulated over
the block ranges in order, its lanes added up once): row b's result has the same bits for B = 1 and B = 64 (a
serving engine's greedy output does not depend on its batch; tests/codegen/test_block_matmul.py checks it). The
sum is reassociated as in the one-row kernel.
"""
from __future__ import annotations

from ..uop import Ops, UOp
from .block_split import split_blocks
from .llvm_reductions import UNROLLED_STEPS
from .optimize import (DEFAULT_BLOCKING, Blocking, block_stores, contraction_axes, new_range, panel_group, renumber,
                       row_nests, stride_along)
from .target import CPUTarget, host_target

SPARE_REGISTERS = 3  # vector registers a step needs besides the sums: an unpacked block, an activation, a scale


def reads_blocks(ast: UOp, target: CPUTarget | None = None) -> bool:
    """Whether `ast` is a contraction `block_matmul` computes from its weight's blocks (its operands are read as
    they are: packing a copy of the weight would materialise it as floats)."""
    split = split_blocks(ast)
    return split is not ast and block_matmul(split, target or host_target()) is not None


def block_matmul(split: UOp, target: CPUTarget, blocking: Blocking = DEFAULT_BLOCKING) -> UOp | None:
    """The register-blocked kernel (see the module docstring) of a contraction `split` at its weight's blocks
    (block_split.split_blocks) with two loops, rows and columns, where the rows are not one static row (matvec.py's
    one-row kernel) and the columns are static; None for any other kernel."""
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
    rows, columns = _register_block(red, target, blocking, j.src[0].arg)
    column_bytes = sum({ld.src[0]: (stride_along(ld.src[1], j) or 0) * ld.dtype.itemsize for ld in weights}.values())
    panels = j.src[0].arg // columns
    group = panel_group(panels, columns * column_bytes, target)
    axis = max(u.arg[0] for u in split.toposort() if u.op is Ops.RANGE) + 1
    groups = new_range(UOp.const(panels // group), -1)
    if groups.op is not Ops.RANGE:  # one panel: no loop for threads to split around the row nests
        return None

    def panel(n: int) -> UOp:  # groups outermost (threads split them), a group's panels innermost
        return groups * group + new_range(UOp.const(group), n) if group > 1 else groups
    stores = [s for block_rows, n in row_nests(i.src[0], rows, axis)
              for s in block_stores(store, j, i, [panel(n + 1) * columns + c for c in range(columns)], block_rows, {})]
    return renumber(UOp(Ops.SINK, split.dtype, tuple(stores), split.arg))


def _register_block(red: UOp, target: CPUTarget, blocking: Blocking, columns: int) -> tuple[int, int]:
    """(rows, columns) of the register block: as many vector sums as the accumulator budget holds, each the
    vector of the lane range's float sums (times the renderer's unrolled innermost steps), two columns when
    four sums fit and the columns are even (AVX-512: 4 x 2, AVX2: 3 x 1)."""
    lanes, inner = red.src[-1].src[0].arg, red.src[-2].src[0] if len(red.src) > 2 else UOp.const(1)
    unrolled = inner.arg if inner.op is Ops.CONST and inner.arg <= UNROLLED_STEPS else 1
    registers = -(-lanes * red.dtype.itemsize * unrolled // target.vector_bytes)
    budget = min(blocking.max_accumulators, target.vector_registers - SPARE_REGISTERS)
    sums = max(1, budget // registers)
    across = 2 if sums >= 4 and columns % 2 == 0 else 1
    return max(1, sums // across), across
