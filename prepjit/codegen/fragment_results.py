"""A tensor-core tile's results (render_fragments.py): each accumulator stored at its output, checked against the
output's extents; where the tile's sets of work-items split k (gpu_launch.unpacked_tile), set 0 first adds the
other sets' accumulators through local memory and stores them alone."""
from __future__ import annotations

from ..uop import dtypes
from .render_tiles import Contraction, _extent


def emit_results(r, c: Contraction, cells: list):
    """Store each accumulator (name, row and column in the tile) at its output, checked; where the tile's sets
    split k, set 0 first adds the others' accumulators (`_combine_sets`) and stores them alone."""
    store, long, m, n = r.ast.src[0], r.long, r.value(_extent(c.i)), r.value(_extent(c.j))
    if c.splits > 1:
        _combine_sets(r, c, cells)
        r.open_block("if (kset == 0)", {})
    for acc, row, col in cells:
        r.open_block(f"if (i0 + {row} < {m} && j0 + {col} < {n})", {})
        r.emit(f"const {long} oi = i0 + {row}, oj = j0 + {col};")
        r.scopes[-1].update({**r.unflatten("oi", list(c.i)), **r.unflatten("oj", list(c.j)), c.reduce: acc})
        r.emit(r.store_line(store))
        r.close_block()
    if c.splits > 1:
        r.close_block()


def _combine_sets(r, c: Contraction, cells: list):
    """Add the other sets' accumulators into set 0's, one set at a time through a local tile of the outputs (a
    work-item of each set holds the same cells; every work-item reaches every barrier)."""
    acc_t = r.d.ctype(dtypes.float32)
    tile = r.d.local_array.format(type=acc_t, name="Cs", n=f"{c.tm}][{c.tn}") + ";"
    if tile not in r.locals:   # (once for both variants of the arithmetic)
        r.locals.append(tile)
    for other in range(1, c.splits):
        r.open_block(f"if (kset == {other})", {})
        r.emit(" ".join(f"Cs[{row}][{col}] = {acc};" for acc, row, col in cells))
        r.close_block()
        r.emit(r.d.barrier)
        r.open_block("if (kset == 0)", {})
        r.emit(" ".join(f"{acc} += Cs[{row}][{col}];" for acc, row, col in cells))
        r.close_block()
        r.emit(r.d.barrier)
