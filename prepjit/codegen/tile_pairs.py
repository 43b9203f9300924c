"""Two sums of one tensor-core tile: a kernel whose output combines two contractions of the same activations by
two weights that are one weight's rows `n` apart (SiLU(gate) * up of gate/up's one contraction, the weights
stacked: llama.swiglu; a decode step fuses it into one kernel, fused_reductions._in_slices) is tiled as one
contraction over twice its columns, so one tile's accumulators hold both sums of each of its outputs.

The tile's columns are virtual (`virtual_column`): in each group of 2 x FRAG_N, the first FRAG_N are the sums of
the first weight at FRAG_N output columns, the next FRAG_N the second's at the same ones; the staged weight operand
is the first sum's with its column index mapped so (column j of the second sum is the first's j + n), so each chunk
is unpacked once, from one weight row. A matrix instruction's 8 columns are then one sum's, and a warp's
(a wgmma accumulator's) fragments pair up: fragment 2q holds the first sum of the outputs whose second sum fragment
2q + 1 holds, in the same registers of the same lanes (render_fragments: _WarpTiles' and _WarpgroupTile's
accumulators, listed fragment by fragment, 4 cells each), which fragment_results stores together (`paired_cells`).
The output columns must be a static multiple of FRAG_N (virtual columns below 2n are then exactly the outputs'
sums), the tile's columns a multiple of 2 x FRAG_N.
"""
from __future__ import annotations

import attrs

from ..uop import Ops, UOp, simplify

FRAG_N = 8     # columns of one matrix instruction's outputs (m16n8; render_fragments imports it from here: it imports
               # this module through fragment_results)
PAIR = "pair"  # a tile launch's last element where it holds two sums (gpu_launch.tensor_batch_launch)


@attrs.frozen
class Pair:
    """The second sum of a paired tile, the store's column range the virtual columns map onto, and its extent."""
    reduce: UOp
    columns: UOp
    n: int

    def column(self, virtual: str) -> str:
        """The output column (from the tile's first, `j0 / 2`) of a virtual column within the tile (C)."""
        return f"(({virtual}) / {2 * FRAG_N} * {FRAG_N} + ({virtual}) % {FRAG_N})"


def _alone(ast: UOp, red: UOp) -> UOp:
    """`ast` storing sum `red` alone (what render_tiles.match_contraction reads its operands from)."""
    store = ast.src[0]
    return UOp(Ops.SINK, ast.dtype, (UOp(store.op, store.dtype, (*store.src[:2], red), store.arg),), ast.arg)


def match_pair(ast: UOp, tile: tuple | None = None):
    """The contraction of the paired tile of `ast` (its `pair` set), or None where `ast` is not two such sums: the
    second's activations the first's (over its k), its weight the first's at columns j + n (the stacked weight's
    rows), one static column range of n outputs, n a multiple of FRAG_N. `tile`: (rows, columns, splits, fragments)
    of the virtual columns, or None for the tile policy's (matching only)."""
    from .render_tiles import match_contraction   # (which imports this module)
    store = ast.src[0]
    reduces = [u for u in store.toposort() if u.op is Ops.REDUCE] if store.op is Ops.STORE else []
    if len(reduces) != 2:
        return None
    for first, second in (reduces, reduces[::-1]):
        c, d = (match_contraction(_alone(ast, red), tile and tuple(tile[:4])) for red in (first, second))
        if c is None or d is None or c.i != d.i or c.j != d.j or len(c.j) != 1 or c.batch or d.batch:
            continue
        (j,), end = c.j, c.j[0].src[0]
        if end.op is not Ops.CONST or end.arg % FRAG_N:
            continue
        n = end.arg
        if simplify(d.a.substitute({d.k: c.k})) is not simplify(c.a) or \
                simplify(d.b.substitute({d.k: c.k})) is not simplify(c.b.substitute({j: j + n})):
            continue
        axis = max(u.arg[0] for u in ast.toposort() if u.op is Ops.RANGE) + 1
        virtual = UOp(Ops.RANGE, j.dtype, (UOp.const(2 * n, end.dtype),), (axis, "loop"))
        column = (virtual // (2 * FRAG_N)) * FRAG_N + virtual % FRAG_N + (virtual // FRAG_N) % 2 * n
        return attrs.evolve(c, b=c.b.substitute({j: column}), j=(virtual,), pair=Pair(second, j, n))
    return None


def paired_cells(cells: list) -> tuple[list, dict]:
    """(the first sum's cells, {a first sum's accumulator: the second's}) of a paired tile's cells (accumulator, row,
    column): 4 a fragment, fragments in pairs (the module docstring)."""
    firsts, seconds = [], {}
    for p in range(0, len(cells), 8):
        for e in range(4):
            firsts.append(cells[p + e])
            seconds[cells[p + e][0]] = cells[p + 4 + e][0]
    return firsts, seconds
