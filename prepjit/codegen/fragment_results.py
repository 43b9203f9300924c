"""A tensor-core tile's results (render_fragments.py): each accumulator stored at its output, checked against the
output's extents; where the tile's sets of work-items split k (gpu_launch.unpacked_tile, tensor_batch_tile), set 0
first adds the other sets' accumulators through local memory and stores them alone.

A work-item's accumulators come in pairs of neighbouring columns of one row (mma.sync's c0/c1 and c2/c3, wgmma's
registers 2p and 2p + 1). A 16-bit float output held as its bits in 16-bit unsigned elements (bfloat16; float16 in
CUDA: render_c.sixteen_bits) whose two elements are neighbours in memory (the index of the second one past the
first's) and whose first is at an even index is stored as one 32-bit word: a warp's store then writes 16 bytes of
each of its 8 rows rather than 8, half the store instructions and half the partly written 32-byte sectors (on an
H100, MiniLM's tiles store 3-13 MB of bfloat16 results each). Any other pair (a gated or combining store, a float32
output, an index that is not contiguous or not aligned there) is stored element by element, as is a pair whose
second column is past the output's end."""
from __future__ import annotations

from typing import Callable

from ..uop import dtypes
from .render_tiles import Contraction, _extent
from .tile_pairs import paired_cells


def emit_results(r, c: Contraction, cells: list):
    """Store each accumulator (name, row and column in the tile; consecutive cells are pairs of neighbouring columns
    of a row) at its output, checked; where the tile's sets split k, set 0 first adds the others' accumulators
    (`_combine_sets`) and stores them alone."""
    m, n = r.value(_extent(c.i)), r.value(_extent(c.j))
    if c.splits > 1:
        _combine_sets(r, c, cells)
        r.open_block("if (kset == 0)", {})
    r.lets.update(acc for acc, _, _ in cells)   # (final from here: a result rounded from one is converted from it)
    seconds = {}   # a paired tile's (tile_pairs.py): its first sum's cells, each stored with its second's
    if c.pair is not None:
        cells, seconds = paired_cells(cells)
    store = r.ast.src[0]
    bits = r.sixteen_bits(store.src[2].dtype) if len(store.src) == 3 and store.arg is None else None
    for p in range(0, len(cells), 2):
        pair = cells[p:p + 2]
        if bits and len(pair) == 2:
            _emit_pair(r, c, pair, bits, m, n, seconds)
        else:
            for acc, row, col in pair:
                _emit_cell(r, c, acc, row, col, m, n, seconds)
    if c.splits > 1:
        r.close_block()


def _bind(r, c: Contraction, acc: str, row: str, col: str, seconds: dict):
    """Bind the tile's row and column ranges to the cell's output and the contraction to its accumulator (a paired
    tile's second sum to `seconds`' accumulator of it)."""
    if c.pair is None:
        r.emit(f"const {r.long} oi = i0 + {row}, oj = j0 + {col};")
        r.scopes[-1].update({**r.unflatten("oi", list(c.i)), **r.unflatten("oj", list(c.j)), c.reduce: acc})
        return
    # a paired tile's virtual column -> its output column (j0: a multiple of 2 x FRAG_N virtual columns)
    r.emit(f"const {r.long} oi = i0 + {row}, oj = j0 / 2 + {c.pair.column(col)};")
    r.scopes[-1].update({**r.unflatten("oi", list(c.i)), c.pair.columns: "oj", c.reduce: acc,
                         c.pair.reduce: seconds[acc]})


def _emit_cell(r, c: Contraction, acc: str, row: str, col: str, m: str, n: str, seconds: dict):
    r.open_block(f"if (i0 + {row} < {m} && j0 + {col} < {n})", {})
    _bind(r, c, acc, row, col, seconds)
    r.emit(r.store_line(r.ast.src[0]))
    r.close_block()


def _emit_pair(r, c: Contraction, pair: list, bits: Callable[[str], str], m: str, n: str, seconds: dict):
    """A pair of 16-bit float results of one row (`bits`: a value's bits, render_c.sixteen_bits): one 32-bit store
    where both are in range, neighbours in memory and the first at an even index; else each element's store,
    checked."""
    store, long = r.ast.src[0], r.long
    u16, u32 = r.d.ctype(dtypes.uint16), r.d.ctype(dtypes.uint32)
    (_, row, _), (_, _, last) = pair
    r.open_block(f"if (i0 + {row} < {m} && j0 + {last} < {n})", {})
    r.emit(f"{long} at0, at1; {u16} bits0, bits1;")
    for e, (acc, row, col) in enumerate(pair):   # (each in a block of its own: its bindings end with it)
        r.open_block("", {})
        _bind(r, c, acc, row, col, seconds)
        r.emit(f"at{e} = {r.value(store.src[1])}; bits{e} = {bits(r.value(store.src[2]))};")
        r.close_block()
    buf = f"buf{store.src[0].arg}"
    r.open_block("if (at1 == at0 + 1 && (at0 & 1) == 0)", {})
    r.emit(f"*({u32} *)&{buf}[at0] = ({u32})bits0 | ({u32})bits1 << 16;")
    r.close_block()
    r.open_block("else", {})
    r.emit(f"{buf}[at0] = bits0; {buf}[at1] = bits1;")
    r.close_block()
    r.close_block()
    r.open_block("else", {})
    for acc, row, col in pair:
        _emit_cell(r, c, acc, row, col, m, n, seconds)
    r.close_block()


def _combine_sets(r, c: Contraction, cells: list):
    """Add the other sets' accumulators into set 0's through a local tile of the outputs for each other set: they
    store theirs at once, and after one barrier set 0 adds them in the sets' order (a work-item of each set holds
    the same cells; every work-item reaches the barrier). One set at a time through one tile took two barriers a set:
    ten for a var batch's tile of 6 sets (gpu_launch.tensor_batch_tile), whose work is a few slices a set."""
    acc_t = r.d.ctype(dtypes.float32)
    tile = r.d.local_array.format(type=acc_t, name="Cs", n=f"{c.splits - 1}][{c.tm}][{c.tn}") + ";"
    if tile not in r.locals:   # (once for both variants of the arithmetic)
        r.locals.append(tile)
    r.open_block("if (kset > 0)", {})
    r.emit(" ".join(f"Cs[kset - 1][{row}][{col}] = {acc};" for acc, row, col in cells))
    r.close_block()
    r.emit(r.d.barrier)
    r.open_block("if (kset == 0)", {})
    for other in range(1, c.splits):
        r.emit(" ".join(f"{acc} += Cs[{other - 1}][{row}][{col}];" for acc, row, col in cells))
    r.close_block()
