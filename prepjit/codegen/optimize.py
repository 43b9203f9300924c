"""Kernel optimisation passes on the kernel AST, applied before rendering.

Register blocking for contractions (matmul and its relatives): a kernel that stores one float
sum-reduction per output element (possibly inside an elementwise epilogue such as a bias and an
activation), where the output is contiguous along a loop axis `j` and some operand does not depend
on another loop axis `i`, is upcast: `j` and `i` are split into an outer range and a constant
unrolled offset (j = j_o * UJ + uj, i = i_o * UI + ui), giving UI x UJ stores whose reductions share
their reduce ranges. Renderers compute reductions over the same ranges in one loop nest, so each
loaded operand is reused UJ (or UI) times from registers and the UJ contiguous loads and
accumulators vectorise. The UJ columns are UJ / W stores of W lanes each: column j_o * UJ + b + lane,
where `lane` is a RANGE of kind "lane" (0 <= lane < W, one vector register) that is no loop: the
LLVM renderer computes whatever depends on it as one W-wide vector, so LLVM is handed vector IR
instead of UJ scalar copies to re-vectorise (an 8 x 32 block of GELU epilogues was 1 MB of IR and
~2 s of SLP vectorisation).

The block shape comes from the target CPU (target.py): UJ is two vectors of columns and UI fills
the vector registers with accumulators, leaving room for one reduction step's column vectors and a
broadcast row value: 8 x 32 float32 with AVX-512's 32 registers (MAX_ACCUMULATORS), 6 x 16 with
AVX2's 16 (12 accumulators, 2 column vectors, 1 broadcast). More accumulators than MAX_ACCUMULATORS
spill in LLVM's schedule (measured). AVX2 code on Zen 5 (PREPJIT_CPU=haswell), 6 x 16 against the
5 x 16 that left a second step's column vectors free: 1024^2 matmul 8.8 ms vs 9.6-10.1, the MLP train
step's h.T @ delta (1024 x 512, n = 256) 1.56 ms vs 1.85-1.92, x.T @ g 1.11 vs 1.25, g @ W.T 1.09 vs 1.18.

Neither the block shape nor the loop order depends on the extents being static. Rows are blocked
whatever their count: a count the block divides is cut exactly; any other (symbolic, like a batch
var, or static and indivisible) runs ceil(rows / UI) blocks whose last one clamps its row index to
the last row (i = min(i_o * UI + ui, rows - 1), for every row of every block: one min per row block, and the
bounds proof sees each row below `rows`), so rows past the end recompute and rewrite the last row with
the same value instead of reading or writing out of bounds. A symbolic count over columns the blocks divide into
more than one group (a decode batch's x @ W) runs its full blocks and then, for the rows past them, at most one
block of each power of two below UI (row_nests: loop nests of 0 or 1 iterations inside the column groups), so a
batch of one row computes one row, not UI. Columns whose count the
block does not divide (symbolic, or static and indivisible) run J // UJ full blocks and a peeled
tail loop over the last J % UJ columns, each tail step computing one column of every row of the
row block: loops are (other loops..., row blocks, {column blocks, tail}), so the tail shares every
loop that threads split. A count of 0 runs nothing.

When the block divides the columns exactly, the column panels are grouped: the group index is the
outermost loop (threads split it) and a group's panels the innermost, inside the row blocks, so a
group's panels of the other operand (packed contiguous by packing.py when large) stay in L2 while
every row block uses them, and each row block is fetched once per group.
"""
from __future__ import annotations

import functools

import attrs

from ..uop import Ops, UOp, dtypes, simplify
from .reuse import store_shared_value
from .target import CPUTarget, host_target

MAX_ACCUMULATORS = 16     # vector accumulators a block keeps in registers, at most
COLUMN_VECTORS = 2        # vectors of contiguous output columns per block row
MIN_PANEL_GROUPS = 4      # groups to split over threads, at least
PAIR_LANES = 16           # float32 lanes of vdpbf16ps (one 512-bit register)


def _tile(value) -> tuple[int, int, int] | None:
    return None if value is None else tuple(value)


@attrs.frozen
class Blocking:
    """The block-shape knobs a kernel is optimised with: the defaults, or what PREPJIT_TUNE's timed search chose
    for it (prepjit/jit/tune.py). Column widths stay as they are (packing.py lays panels out by them)."""
    max_accumulators: int = MAX_ACCUMULATORS   # vector accumulators of a register block: its rows
    matvec_row_bytes: int | None = None        # bytes of columns per block of a one-row matvec (None: matvec.py's)
    # a GPU contraction's tiles: (rows, columns, splits), one of render_tiles.tile_candidates (None: the policy's)
    tile: tuple[int, int, int] | None = attrs.field(default=None, converter=_tile)
    # bfloat16 products summed in pairs by vdpbf16ps where the target has it; else widened (one FMA a product);
    # a contraction reading its operands unpacked (packed copies hold them widened: packing.py).
    # Off by default, a PREPJIT_TUNE candidate: on a Xeon (model 167) a 512^2 bf16 matmul took 3.1 ms paired against
    # 2.5 widened (one thread) and MiniLM bf16 batch 32 ~10% longer paired; SmolLM2's bf16 decode the same either way.
    # There vdpbf16ps zmm issues at a quarter of vfmadd231ps zmm's rate (16 independent chains: 1.8 vs 7.2 G/s), so a
    # pair of products costs twice one float32 FMA: 4096 x 384 @ 384 one thread, paired 11.8-12.1 ms, widened 9.9,
    # float32 6.0. Its AMX_BF16 tiles (permitted by arch_prctl there) ran tdpbf16ps at 497 G products/s on one core
    # against the FMAs' ~115 G float32 products/s: where the host permits them, amx.py's tiles take these contractions
    bf16_dot: bool = False


DEFAULT_BLOCKING = Blocking()


def const_end(r: UOp) -> int | None:
    end = r.src[0]
    return end.arg if end.op is Ops.CONST else None


def stride_along(index: UOp, r: UOp) -> int | None:
    """The constant step of `index` when range `r` steps by one, or None."""
    step = simplify(index.substitute({r: r + 1}) - index)
    return step.arg if step.op is Ops.CONST else None


def register_block(target: CPUTarget, itemsize: int, blocking: Blocking = DEFAULT_BLOCKING) -> tuple[int, int]:
    """(rows, columns) of the register block of a contraction with elements of `itemsize` bytes."""
    budget = min(target.vector_registers - COLUMN_VECTORS - 1, blocking.max_accumulators)
    return max(1, budget // COLUMN_VECTORS), COLUMN_VECTORS * target.lanes(itemsize)


def column_block(target: CPUTarget, itemsize: int, end: UOp) -> tuple[int, bool]:
    """(columns per block, whether a peeled tail follows the full blocks) for a column range ending at `end`.

    A static count takes the widest block (down to one vector) that divides it; others take the full
    width and a tail, or a narrower block where even the most columns are fewer than the full width."""
    _, width = register_block(target, itemsize)
    widths = [w for w in (width, width // 2, target.lanes(itemsize)) if w > 1]
    if end.op is Ops.CONST:
        exact = next((w for w in widths if end.arg % w == 0 and end.arg >= w), None)
        if exact:
            return exact, False
    most = end.vmax
    return next(((w, True) for w in widths if most >= w), (1, False))


def in_full_blocks(j: UOp, width: int) -> UOp:
    """Whether column `j` lies in a full block of `width` columns (not in the peeled tail)."""
    return UOp(Ops.CMPLT, dtypes.bool, (j, simplify(j.src[0] // width * width)))


def row_block(rows: int, end: UOp) -> tuple[int, bool]:
    """(rows per block, whether the last block clamps) for a row range ending at `end`."""
    if end.op is Ops.CONST:
        if end.arg <= rows:
            return max(1, end.arg), False
        return rows, end.arg % rows != 0
    rows = min(rows, max(1, end.vmax))
    return rows, rows > 1


def row_nests(end: UOp, rows: int, axis: int, every_count: bool = False,
              one_row_tail: bool = False) -> list[tuple[list[UOp], int]]:
    """(row indices, the axis its loops start at) of each loop nest over a row range ending at `end` in blocks of
    `rows` rows: the full blocks (axis `axis`), then the rows past them in nests of 0 or 1 iterations (two axes a
    nest), largest first: at most one block of each power of two below `rows` (few nests: a wide block's code stays
    small), or with `every_count` one nest for each count below `rows`, so the rows past the blocks are one block
    of their own count (block_matmul.py: each nest reads and unpacks all the weight blocks, so three rows cost one
    such read, not a block of 2 and one of 1), or with `one_row_tail` one nest of one-row blocks that runs once a
    row past the blocks (a prefill's tile, read from L1 by each block: a smaller block saves little beside the code
    it adds). A count of rows the blocks do not divide (a var: a decode batch) costs its own rows, not a block of
    `rows` recomputing the last one."""
    rest, nests = simplify(end % rows), []
    full = simplify(end // rows)
    if not (full.op is Ops.CONST and full.arg == 0):
        block = new_range(full, axis)
        nests.append(([simplify(block * rows + a) for a in range(rows)], axis))
    if one_row_tail and rows > 1 and not (rest.op is Ops.CONST and rest.arg == 0):
        block = new_range(rest, axis + 2)
        return nests + [([simplify(end - rest + block)], axis + 2)]
    sizes = range(rows - 1, 0, -1) if every_count else [1 << p for p in reversed(range((rows - 1).bit_length()))]
    for size in sizes:  # rest < 2 * size here (rest <= size with every_count): this nest runs at most once
        count = simplify(rest // size)
        axis += 2
        if not (count.op is Ops.CONST and count.arg == 0):
            block = new_range(count, axis)
            nests.append(([simplify(end - rest + block * size + a) for a in range(size)], axis))
        rest = simplify(rest % size)
    return nests


def panel_group(panels: int, panel_bytes: int, target: CPUTarget) -> int:
    """Column panels per group: the most that divide `panels`, fit half the L2 cache and leave MIN_PANEL_GROUPS."""
    most = min(target.l2_bytes // 2 // max(1, panel_bytes), panels // MIN_PANEL_GROUPS)
    return next((g for g in range(most, 1, -1) if panels % g == 0), 1)


def _contraction(ast: UOp):
    """(store, the float ADD reduction its value computes) of a one-store kernel, or None."""
    if ast.op is not Ops.SINK or len(ast.src) != 1:
        return None
    store = ast.src[0]
    reduces = [u for u in store.src[2].toposort() if u.op is Ops.REDUCE]
    if len(reduces) != 1 or reduces[0].arg is not Ops.ADD or reduces[0].dtype not in (dtypes.float32, dtypes.float64):
        return None
    return store, reduces[0]


def contraction_axes(ast: UOp):
    """(store, reduction, loop ranges in order, column axis j, row axis i or None) of a blockable contraction, or None.

    `j` is the innermost loop along which the output is contiguous and some operand varies while another
    does not; `i` is the innermost other loop that the operand varying along `j` does not depend on."""
    found = _contraction(ast)
    if found is None:
        return None
    store, red = found
    index = store.src[1]
    loops = sorted({u for u in store.toposort() if u.op is Ops.RANGE and u.arg[1] == "loop"}, key=lambda r: r.arg[0])
    loads = [u for u in red.toposort() if u.op is Ops.LOAD]
    uses = {ld: set(ld.src[1].toposort()) for ld in loads}
    j = next((r for r in reversed(loops) if stride_along(index, r) == 1), None)
    if j is None or not any(j in u for u in uses.values()) or all(j in u for u in uses.values()):
        return None
    others = [r for r in loops if r is not j and any(r not in u for u in uses.values() if j in u)]
    return store, red, loops, j, others[-1] if others else None


def upcast_contraction(ast: UOp, target: CPUTarget, blocking: Blocking = DEFAULT_BLOCKING) -> UOp:
    """Register-block a kernel computing one float ADD reduction per output element; others are returned as is."""
    axes_found = contraction_axes(ast)
    if axes_found is None:
        return ast
    store, red, loops, j, i = axes_found
    out, index, value = store.src
    acc = red.dtype.itemsize  # blocks hold accumulators: float32 also where 16-bit floats are stored
    from .amx import TILE_ROWS, tiled_operands  # amx.py builds on this module's contraction analysis
    tiled = tiled_operands(target, red, j, i) is not None
    rows_per_block = TILE_ROWS if tiled else register_block(target, acc, blocking)[0]
    uj, tail = column_block(target, acc, j.src[0])
    if uj == 1:
        return ast
    ui, clamp = row_block(rows_per_block, i.src[0]) if i is not None else (1, False)
    axis = max(r.arg[0] for r in ast.toposort() if r.op is Ops.RANGE) + 1
    i_outer = new_range((i.src[0] + (ui - 1)) // ui, axis) if ui > 1 else None
    shared = [r for r in loops if r is not j and (r is not i or ui == 1)] + [i_outer]
    if tail and not any(r is not None and r.op is Ops.RANGE for r in shared):
        return ast  # a tail needs a loop it shares with the blocks, for threads to split
    rows = [i] if i is not None and ui == 1 else [None] if i is None else \
        [(i_outer * ui + a).smin(i.src[0] - 1) if clamp else i_outer * ui + a for a in range(ui)]
    width = lane_width(target, acc, uj) if len(store.src) == 3 and store.arg is None else 1
    if tiled and width == PAIR_LANES:  # on AMX tiles (amx.py, llvm_amx.py)
        store, red = _pair_bfloat16_products(store, red, axis + 4, "tile")
    elif target.bf16_dot and blocking.bf16_dot and width == PAIR_LANES:
        store, red = _pair_bfloat16_products(store, red, axis + 4)
    lane = UOp(Ops.RANGE, dtypes.index, (UOp.const(width),), (axis + 3, "lane")) if width > 1 else UOp.const(0)
    memo: dict = {}
    if not tail:
        panels, reduce_size = j.src[0].arg // uj, 1
        for r in red.src[1:]:
            reduce_size *= max(1, int(r.src[0].vmax))
        group = panel_group(panels, uj * reduce_size * acc, target)
        groups = new_range(UOp.const(panels // group), -1)

        def columns(n: int) -> list[UOp]:  # groups of panels outermost, each group's panels innermost (axis n):
            j_outer = groups * group + new_range(UOp.const(group), n) if group > 1 else groups  # in cache for all rows
            return [j_outer * uj + b + lane for b in range(0, uj, width)]
        # a var row count: the rows past the full blocks in smaller blocks, the groups the loop threads split
        if clamp and i.src[0].op is not Ops.CONST and groups.op is Ops.RANGE:
            stores = [s for block_rows, n in row_nests(i.src[0], ui, axis + 5)
                      for s in block_stores(store, j, i, columns(n + 1), block_rows, memo)]
        else:
            stores = block_stores(store, j, i, columns(axis + 1), rows, memo)
    else:  # row blocks outermost (after the other loops), then the full column blocks, then the peeled tail
        full = simplify(j.src[0] // uj)
        j_outer = new_range(full, axis + 1)
        inside = in_full_blocks(j, uj)  # what packing asked of each column: resolved here, per block
        stores = block_stores(store, j, i, [j_outer * uj + b + lane for b in range(0, uj, width)], rows, memo,
                               {inside: UOp.const(True, dtypes.bool)})
        t = new_range(j.src[0] - full * uj, axis + 2)  # the tail's columns, last first: J - 1 - t
        stores += block_stores(store, j, i, [j.src[0] - 1 - t], rows, memo, {inside: UOp.const(False, dtypes.bool)})
    return renumber(UOp(Ops.SINK, ast.dtype, tuple(stores), ast.arg))


def _pair_bfloat16_products(store: UOp, red: UOp, axis: int, kind: str = "pair") -> tuple[UOp, UOp]:
    """(store, reduction) with a sum of products of two bfloat16 loads over an even static innermost reduction
    k summed in pairs, k = 2 k2 + p for a RANGE p of kind `kind` (2 steps, no loop): "pair" for vdpbf16ps (a
    target's `bf16_dot`), "tile" for AMX tiles (amx.py); any other store as it is."""
    x, k = red.src[0], red.src[-1]
    if x.op is not Ops.MUL or not all(widened_bfloat16_load(s) for s in x.src) or \
            k.src[0].op is not Ops.CONST or k.src[0].arg % 2 or k.src[0].arg < 2:
        return store, red
    k2 = UOp(Ops.RANGE, dtypes.index, (UOp.const(k.src[0].arg // 2),), k.arg)
    p = UOp(Ops.RANGE, dtypes.index, (UOp.const(2),), (axis, kind))
    paired = UOp(Ops.REDUCE, red.dtype, (x.substitute({k: k2 * 2 + p}), *red.src[1:-1], k2, p), red.arg)
    return store.substitute({red: paired}), paired


def widened_bfloat16_load(u: UOp) -> bool:
    return u.op is Ops.CAST and u.dtype == dtypes.float32 and u.src[0].op is Ops.LOAD and \
        u.src[0].dtype == dtypes.bfloat16 and len(u.src[0].src) == 2


def lane_width(target: CPUTarget, itemsize: int, columns: int) -> int:
    """Lanes of the vectors a block's columns are computed in: one vector register of the target (at most 512
    bits), when they divide the block's `columns`; else 1 (scalar columns)."""
    lanes = min(target.lanes(itemsize), max(1, 64 // itemsize))
    return lanes if lanes > 1 and columns % lanes == 0 else 1


def new_range(end: UOp, axis: int) -> UOp:
    """A loop range ending at `end`; one of a single iteration is its index 0 (the simplifier folds it so)."""
    end = simplify(end)
    return UOp.const(0) if end.op is Ops.CONST and end.arg == 1 else UOp(Ops.RANGE, dtypes.index, (end,), (axis, "loop"))


def block_stores(store: UOp, j: UOp, i: UOp | None, cols: list, rows: list, memo: dict,
                  known: dict | None = None) -> list[UOp]:
    """The stores of `store` at every (row, column) of a block: its index and value with `j` and `i` replaced
    (and the conditions in `known` by their values)."""
    out, index, value = store.src
    value = _resolve(value, known) if known else value
    stores, step = [], len(cols) > 1 and simplify(cols[1] - cols[0]).arg  # columns apart (a vector's lanes, or 1)
    for row in rows:
        base = {j: cols[0]} if row is None or row is i else {j: cols[0], i: row}
        row_index = simplify(index.substitute(base))  # the store index steps by 1 along j
        for b, col in enumerate(cols):
            mapping = {**base, j: col}
            store_index = UOp(Ops.ADD, dtypes.index, (row_index, UOp.const(b * step))) if b else row_index
            stores.append(UOp(Ops.STORE, store.dtype, (out, store_index, _instantiate(value, mapping, memo))))
    return stores


def _resolve(u: UOp, known: dict) -> UOp:
    """`u` with the conditions in `known` replaced by their values and the wheres on them by the branch taken."""
    u = u.substitute(known)
    return u.substitute({w: w.src[1] if w.src[0].arg else w.src[2] for w in u.toposort()
                         if w.op is Ops.WHERE and w.src[0].op is Ops.CONST})


def _instantiate(u: UOp, mapping: dict, memo: dict) -> UOp:
    """`u` with `mapping` (a block's offsets: index expressions) substituted and the index (and gate) of each of its
    loads simplified.

    `memo` keeps the simplified indices across a kernel's blocks: an operand that depends on one blocked
    axis only has as many distinct indices as that axis has offsets, so each is simplified once. One walk of `u`
    (kept on it: every block of a kernel instantiates one value), not a substitution and a walk of the new graph
    (a third of a SmolLM2 prefill's optimisation): `plain` is the substitution, `out` the same with each load's
    index simplified, the loads in that index as substituted (as replacing the loads of the substituted value
    left them)."""
    def simple(x: UOp) -> UOp:
        if x not in memo:
            memo[x] = simplify(x)
        return memo[x]
    plain, out = dict(mapping), dict(mapping)
    for node in u.toposort():
        if node in plain:
            continue
        src = tuple([plain[s] for s in node.src])
        plain[node] = new = node if src == node.src else UOp(node.op, node.dtype, src, node.arg)
        if node.op is Ops.LOAD:
            out[node] = UOp(Ops.LOAD, new.dtype, (new.src[0], *(simple(s) for s in new.src[1:])), new.arg)
        else:
            src = tuple([out[s] for s in node.src])
            out[node] = node if src == node.src else UOp(node.op, node.dtype, src, node.arg)
    return out[u]


def renumber(ast: UOp) -> UOp:
    """Give the ranges axis numbers 0, 1, ... in their current order (loops first, then reduces)."""
    ranges = sorted({u for u in ast.toposort() if u.op is Ops.RANGE}, key=lambda r: (r.arg[1] != "loop", r.arg[0]))
    return ast.substitute({r: UOp(Ops.RANGE, r.dtype, r.src, (n, r.arg[1])) for n, r in enumerate(ranges)})


def optimize(ast: UOp, language: str, target: CPUTarget | None = None) -> UOp:
    """`optimize_with` the default Blocking."""
    return optimize_with(ast, language, target, DEFAULT_BLOCKING)


@functools.lru_cache(maxsize=4096)
def optimize_with(ast: UOp, language: str, target: CPUTarget | None, blocking: Blocking) -> UOp:
    """The optimised AST for a renderer: for llvm, blocked for `target` (by default this host's CPU) with
    `blocking` (the default, or PREPJIT_TUNE's choice: the caller passes it, targets.Target.launched); renderers
    that cannot yet take multi-store kernels get it unchanged. Memoised: the bounds proof and the renderer ask
    for the same kernel."""
    if language != "llvm":
        return ast
    from .amx import tiled  # amx.py and matvec.py build on this module's contraction analysis
    from .matvec import matvec
    ast = store_shared_value(ast)
    found = None if tiled(ast, target or host_target()) else matvec(ast, target or host_target(), blocking)
    return found if found is not None else upcast_contraction(ast, target or host_target(), blocking)


def blocking_candidates(ast: UOp, target: CPUTarget | None = None) -> list[Blocking]:
    """The Blockings worth timing for `ast` (PREPJIT_TUNE): the default first, then others that give a kernel of
    another shape; a single one when the kernel has nothing to choose."""
    target = target or host_target()
    options = [DEFAULT_BLOCKING] + [Blocking(max_accumulators=a) for a in (8, 12, 24)] + \
        [Blocking(matvec_row_bytes=b) for b in (128, 256, 512, 1024)] + [Blocking(bf16_dot=True)]
    seen, chosen = set(), []
    for blocking in options:
        kernel = optimize_with(ast, "llvm", target, blocking)
        if kernel not in seen:
            seen.add(kernel)
            chosen.append(blocking)
    return chosen
