"""Kernel optimisation passes on the kernel AST, applied before rendering.

Register blocking for contractions (matmul and its relatives): a kernel that stores one float
sum-reduction per output element, where the output is contiguous along a loop axis `j` and some
operand does not depend on another loop axis `i`, is upcast: `j` and `i` are split into an outer
range and a constant unrolled offset (j = j_o * UJ + uj, i = i_o * UI + ui), giving UI x UJ
stores whose reductions share their reduce ranges. Renderers compute reductions over the same
ranges in one loop nest, so each loaded operand is reused UJ (or UI) times from registers and
the UJ contiguous loads and accumulators vectorise. The column blocks (panels) are grouped: the
group index is the outermost loop (threads split it) and a group's panels the innermost, inside
the row blocks, so a group's panels of the other operand (packed contiguous by packing.py when
large) stay in L2 while every row block uses them, and each row block is fetched once per group.

Rows are blocked whatever their count: a static count that some UI divides is cut exactly;
any other count (symbolic, like a batch var, or static and indivisible) runs ceil(rows / UI)
blocks whose last one clamps its row index to the last row (i = min(i_o * UI + ui, rows - 1)),
so rows past the end recompute and rewrite the last row with the same value instead of reading
or writing out of bounds; a count of 0 runs no block.
"""
from __future__ import annotations

from ..uop import Ops, UOp, dtypes, simplify

UPCAST_J = (32, 16, 8)   # contiguous output columns per block, largest that divides the axis first
UPCAST_I = (8, 4, 2)     # rows per block
PANEL_GROUP_BYTES = 1 << 20  # column panels a group of blocks keeps in (L2) cache while every row block uses them
MIN_PANEL_GROUPS = 4         # groups to split over threads, at least


def const_end(r: UOp) -> int | None:
    end = r.src[0]
    return end.arg if end.op is Ops.CONST else None


def stride_along(index: UOp, r: UOp) -> int | None:
    """The constant step of `index` when range `r` steps by one, or None."""
    step = simplify(index.substitute({r: r + 1}) - index)
    return step.arg if step.op is Ops.CONST else None


def pick_block(end: int | None, choices: tuple) -> int:
    return next((u for u in choices if end is not None and end % u == 0 and end > u), 1)


def _row_block(end: UOp) -> tuple[int, bool]:
    """(rows per block, whether the last block clamps) for a row range ending at `end`."""
    exact = pick_block(end.arg if end.op is Ops.CONST else None, UPCAST_I)
    if exact > 1:
        return exact, False
    clamped = next((u for u in UPCAST_I if end.vmax > u), 1)
    return clamped, clamped > 1


def _panel_group(panels: int, panel_bytes: int) -> int:
    """Column panels per group: the most that divide `panels`, fit PANEL_GROUP_BYTES and leave MIN_PANEL_GROUPS."""
    most = min(PANEL_GROUP_BYTES // max(1, panel_bytes), panels // MIN_PANEL_GROUPS)
    return next((g for g in range(most, 1, -1) if panels % g == 0), 1)


def upcast_contraction(ast: UOp) -> UOp:
    """Register-block a kernel computing one float ADD reduction per output element; others are returned as is."""
    if ast.op is not Ops.SINK or len(ast.src) != 1:
        return ast
    store = ast.src[0]
    out, index, value = store.src
    if value.op is not Ops.REDUCE or value.arg is not Ops.ADD or value.dtype not in (dtypes.float32, dtypes.float64):
        return ast
    loops = sorted({u for u in store.toposort() if u.op is Ops.RANGE and u.arg[1] == "loop"}, key=lambda r: r.arg[0])
    loads = [u for u in value.toposort() if u.op is Ops.LOAD]
    j = next((r for r in reversed(loops) if stride_along(index, r) == 1 and const_end(r)), None)
    if j is None or not any(j in ld.src[1].toposort() for ld in loads) \
            or not any(j not in ld.src[1].toposort() for ld in loads):
        return ast
    uj = pick_block(const_end(j), UPCAST_J)
    others = [r for r in loops if r is not j
              and any(r not in ld.src[1].toposort() for ld in loads if j in ld.src[1].toposort())]
    i = others[-1] if others else None
    ui, clamp = _row_block(i.src[0]) if i is not None else (1, False)
    if uj == 1:
        return ast
    axes = max(r.arg[0] for r in value.toposort() + store.toposort() if r.op is Ops.RANGE) + 1
    panels, reduce_size = const_end(j) // uj, 1
    for r in value.src[1:]:
        reduce_size *= max(1, int(r.src[0].vmax))
    group = _panel_group(panels, uj * reduce_size * value.dtype.itemsize)
    if group > 1:  # groups of panels outermost, each group's panels innermost: they stay in cache for all rows
        j_outer = UOp(Ops.RANGE, dtypes.index, (UOp.const(panels // group),), (-1, "loop")) * group + \
            UOp(Ops.RANGE, dtypes.index, (UOp.const(group),), (axes + 1, "loop"))
    else:
        j_outer = UOp(Ops.RANGE, dtypes.index, (UOp.const(panels),), (-1, "loop"))
    i_outer = UOp(Ops.RANGE, dtypes.index, (simplify((i.src[0] + (ui - 1)) // ui),), (axes, "loop")) \
        if ui > 1 else None
    cols = [j_outer * uj + b for b in range(uj)]
    rows = [None] if i_outer is None else \
        [(i_outer * ui + a).smin(i.src[0] - 1) if clamp and a else i_outer * ui + a for a in range(ui)]
    stores, simplified = [], {}
    reduced = value.src[0]
    loads = [u for u in reduced.toposort() if u.op is Ops.LOAD]
    for row in rows:
        row_mapping = {j: cols[0]} if row is None else {j: cols[0], i: row}
        row_index = simplify(index.substitute(row_mapping))  # the store index steps by 1 along j
        for b, col in enumerate(cols):
            mapping = {j: col} if row is None else {j: col, i: row}
            new_value = UOp(Ops.REDUCE, value.dtype, (_blocked_loads(reduced, loads, mapping, simplified),
                                                      *value.src[1:]), value.arg)
            store_index = UOp(Ops.ADD, dtypes.index, (row_index, UOp.const(b))) if b else row_index
            stores.append(UOp(Ops.STORE, store.dtype, (out, store_index, new_value)))
    return _renumber(UOp(Ops.SINK, ast.dtype, tuple(stores), ast.arg))


def _blocked_loads(u: UOp, loads: list[UOp], mapping: dict, simplified: dict) -> UOp:
    """`u` with `mapping` substituted and the index (and gate) of each of its `loads` simplified.

    `simplified` memoises across a kernel's blocks: an operand that depends on one blocked axis only
    has as many distinct indices as that axis has offsets, so each is simplified once.
    """
    def simple(x: UOp) -> UOp:
        x = x.substitute(mapping)
        if x not in simplified:
            simplified[x] = simplify(x)
        return simplified[x]
    return u.substitute({ld: UOp(Ops.LOAD, ld.dtype, (ld.src[0], *(simple(s) for s in ld.src[1:])), ld.arg)
                         for ld in loads})


def _renumber(ast: UOp) -> UOp:
    """Give the ranges axis numbers 0, 1, ... in their current order (loops first, then reduces)."""
    ranges = sorted({u for u in ast.toposort() if u.op is Ops.RANGE}, key=lambda r: (r.arg[1] != "loop", r.arg[0]))
    return ast.substitute({r: UOp(Ops.RANGE, r.dtype, r.src, (n, r.arg[1])) for n, r in enumerate(ranges)})


def optimize(ast: UOp, language: str) -> UOp:
    """The optimised AST for a renderer; renderers that cannot yet take multi-store kernels get it unchanged."""
    if language != "llvm":
        return ast
    return upcast_contraction(ast)
