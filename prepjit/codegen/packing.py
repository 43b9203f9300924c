"""Operand packing for large contractions: copy the column operand into contiguous register-block panels.

A register-blocked contraction (optimize.py) keeps a block of UI x UJ outputs in registers and, for
every step of its reduction, reads UJ contiguous values of the column operand `y` (one row of a
panel of UJ columns). When `y`'s rows lie a power-of-two stride apart (B of a 1024 x 1024 matmul:
4 KB), a panel's rows all fall into a few cache sets, so the panel does not stay in cache between
row blocks and is fetched from memory again for each of them. Packing computes `y` once into a
buffer laid out as (other loops..., J / UJ, reduce ranges..., UJ): each panel is then one
contiguous run that stays in L2 while every row block uses it. The copy reads and writes `y`
once, so it is made only when enough rows reuse each panel (`MIN_ROWS`; `MIN_SYMBOLIC_ROWS` for a var count, which
may be a decode batch of a few rows) and the panel is long,
or whatever the panel's length when `y` is not contiguous along the output's columns (`k.T` in
attention scores): then every block would gather its UJ values one by one instead of loading vectors.
Where the columns end in a peeled tail (a symbolic count), the full panels are packed and the operand
becomes `where(j < full columns, packed, y)`, which the blocking resolves per block (optimize.py).
A weight stored in blocks (pj.quant) is never packed: block_matmul.py reads the blocks themselves.

A 16-bit float operand (bfloat16, float16 widened to float32 for the product) is packed widened: each value
widened once by the copy, where every register block would widen its panel's values (and broadcast row values)
again, a zero extension and a shift each, beside one FMA; its row operand then gets a widened copy of its own in its
order (`_widened_rows`) where the columns are packed. Only AMX tiles (amx.py) take their panels 16-bit, as stored.
On an AVX512_BF16 Xeon without AMX (Emerald Rapids, KVM, 2 vCPUs) MiniLM batch 32 in bfloat16 went 484 -> 810-820
sentences/s (float32: 806-880): its matmuls 98-131 -> 186-238 GFLOP/s. vdpbf16ps pairing (a PREPJIT_TUNE choice,
optimize.Blocking.bf16_dot) so applies to contractions that read their 16-bit operands unpacked.

The row operand `x` is packed too when it lies along the output's rows and across the reduction
(`h.T` in a weight gradient `h.T @ delta`): each reduction step of a block then broadcasts its row values
from a new row of `x`, a whole row (4 KB for h of 1024 columns) after the last, so every step's values
come from another page and, at a power-of-two stride, from one cache set. Its copy is laid out (loops it
depends on..., reduction ranges...), contiguous along the reduction, so each block row reads one
contiguous stream; it is made when every column block reuses it (`MIN_ROWS` columns at least) and the
reduction is `MIN_REDUCE` long at least, on targets whose register blocks have `ROW_PACK_BLOCK_ROWS` rows
at most. Each packed operand has a kernel of its own. Zen 5, min of 10-15 profiles, the MLP training step's
h.T @ delta (h (256, 1024), delta (256, 512), delta packed in both): AVX2 code (PREPJIT_CPU=haswell,
6-row blocks) 1.46-1.53 ms -> 1.06-1.07 + 0.04 for h's copy; x.T @ g (x (256, 512)) 1.10 -> 1.06-1.08 +
0.02. AVX-512 code (8-row blocks: 16 FMAs a step to hide the strided broadcasts in) gains nothing: h.T @
delta 0.59 -> 0.54 + 0.04, x.T @ g 0.54 -> 0.55 + 0.02; so it is not packed there.
"""
from __future__ import annotations

from ..uop import Ops, UOp, dtypes, simplify
from .block_matmul import reads_blocks
from .lower import kernel_name, linear_index
from .optimize import column_block, contraction_axes, in_full_blocks, register_block, stride_along
from .target import CPUTarget, host_target

MIN_ROWS = 64      # rows of the other operand that reuse each packed panel, at least
MIN_SYMBOLIC_ROWS = 256  # at least, when their count is symbolic (its maximum) and `y` is contiguous along the
# columns (no gathers to save): a decode batch (B up to 64) mostly runs a few rows, where the copy (a pass over the
# weight each call) cost 3x the product (x @ W (576, 1536) f32, var B = 1: 0.63 ms with the copy, 0.20 without;
# B = 64 about the same either way); a prefill of 256 rows or more packs
MIN_REDUCE = 64    # reduction length, at least: shorter panels sit in cache unpacked
ROW_RUN = 8        # reduction steps a packed row operand's copy writes contiguously per row
ROW_PACK_BLOCK_ROWS = 6  # rows of the target's register blocks, at most, for row operands to be packed


def _size(end: UOp) -> int:
    return end.arg if end.op is Ops.CONST else max(0, end.vmax)


def pack_contraction(ast: UOp, slot: int, target: CPUTarget | None = None) -> tuple[UOp, tuple] | None:
    """(contraction AST reading its packed operands, ((packing kernel AST, packed shape), ...)), or None when
    nothing is packed. The n-th packed copy is read from buffer `slot + n`.

    Each packing kernel writes slot 0 and reads the contraction's own input slots, so it runs on the
    same buffer list with its packed buffer in slot 0. Panels are as wide as optimize.py's column blocks
    for `target` (by default this host's CPU); columns that end in a peeled tail are not packed.
    """
    found = contraction_axes(ast)
    if found is None or reads_blocks(ast, target):
        return None
    _, value, loops, j, i = found
    if value.src[0].op is not Ops.MUL:
        return None
    reduces = list(value.src[1:])
    x, y = value.src[0].src
    if j in x.toposort():
        x, y = y, x
    packs, target = [], target or host_target()
    from .amx import tiled_operands  # amx.py builds on optimize.py, as this module does
    narrow = tiled_operands(target, value, j, i) is not None   # AMX tiles multiply 16-bit operands as stored
    columns = _pack_columns(ast, x, y, value, loops, j, i, reduces, slot, target, narrow)
    if columns is not None:
        ast, pack = columns
        packs.append(pack)
    rows = _pack_rows(ast, x, loops, j, reduces, slot + len(packs), narrow) \
        if register_block(target, value.dtype.itemsize)[0] <= ROW_PACK_BLOCK_ROWS else None
    if rows is None and columns is not None and not narrow and _widened_narrow(x):
        rows = _widened_rows(ast, x, loops, j, reduces, slot + len(packs))
    if rows is not None:
        ast, pack = rows
        packs.append(pack)
    return (ast, tuple(packs)) if packs else None


def _stored(operand: UOp, narrow: bool):
    """(the value a packed copy of `operand` holds, how a read of the copy becomes `operand` again): a 16-bit
    float widened to its compute dtype is packed widened (the copy widens each value once, where the contraction's
    register blocks would widen it again for every block), or, `narrow`, as it is stored (AMX tiles multiply it so:
    half the bytes) and widened where it is read."""
    if narrow and _widened_narrow(operand):
        return operand.src[0], lambda load: UOp(Ops.CAST, operand.dtype, (load,))
    return operand, lambda load: load


def _widened_narrow(operand: UOp) -> bool:
    """Whether `operand` is a 16-bit float widened to its compute dtype."""
    inner = operand.src[0] if operand.op is Ops.CAST else None
    return inner is not None and inner.dtype.narrow and operand.dtype == inner.dtype.compute


def _pack_columns(ast: UOp, x: UOp, y: UOp, value: UOp, loops: list, j: UOp, i: UOp | None, reduces: list,
                  slot: int, target: CPUTarget, narrow: bool) -> tuple[UOp, tuple] | None:
    """(contraction reading the column operand `y` packed in panels from `slot`, (packing AST, shape)), or None.

    A contraction on AMX tiles (amx.py) gets its panels in the tiles' VNNI layout, (..., J / UJ, K / 2, UJ, 2):
    rows k and k + 1 interleaved, so a tile of B is 16 rows of 64 bytes a panel row apart (llvm_amx.py)."""
    width, tail = column_block(target, value.dtype.itemsize, j.src[0])
    y_ranges = set(y.toposort())
    if width == 1 or j not in y_ranges or j in x.toposort() or not all(k in y_ranges for k in reduces):
        return None
    rows = [r for r in loops if r not in y_ranges]
    reuse = 1
    for r in rows:
        reuse *= _size(r.src[0])
    reduce_size = 1
    for k in reduces:
        reduce_size *= _size(k.src[0])
    gathers = any(ld.op is Ops.LOAD and j in ld.src[1].toposort() and stride_along(ld.src[1], j) != 1
                  for ld in y.toposort())
    least = MIN_SYMBOLIC_ROWS if not gathers and any(r.src[0].op is not Ops.CONST for r in rows) else MIN_ROWS
    if not rows or reuse < least or reduce_size < MIN_REDUCE and not gathers or tail and not gathers:
        return None
    outer = [r for r in loops if r in y_ranges and r is not j]
    inner = (simplify(reduces[0].src[0] // 2), UOp.const(width), UOp.const(2)) if narrow else \
        tuple(k.src[0] for k in reduces) + (UOp.const(width),)
    shape = tuple(r.src[0] for r in outer) + (simplify(j.src[0] // width),) + inner
    new = [UOp(Ops.RANGE, dtypes.index, (end,), (n, "loop")) for n, end in enumerate(shape)]
    panel = new[len(outer)]
    if narrow:   # (AMX tiles' VNNI layout: one static reduce range, a multiple of 32)
        mapping = dict(zip(outer, new)) | {reduces[0]: new[-3] * 2 + new[-1], j: panel * width + new[-2]}
        read = (j // width, reduces[0] // 2, j % width, reduces[0] % 2)
    else:
        mapping = dict(zip(outer, new)) | dict(zip(reduces, new[len(outer) + 1:-1])) | {j: panel * width + new[-1]}
        read = (j // width, *reduces, j % width)
    stored, widen = _stored(y, narrow)
    packed_load = widen(_read_copy(stored.dtype, slot, tuple(outer) + read, shape))
    if tail:  # only the full panels are packed; the peeled tail's columns read `y` itself
        packed_load = UOp(Ops.WHERE, y.dtype, (in_full_blocks(j, width), packed_load, y))
    return ast.substitute({y: packed_load}), _copy(stored.substitute(mapping), new, shape)


def _pack_rows(ast: UOp, x: UOp, loops: list, j: UOp, reduces: list, slot: int,
               narrow: bool) -> tuple[UOp, tuple] | None:
    """(contraction reading the row operand `x` from `slot`, (packing AST, shape)) with `x` copied contiguous
    along the reduction, when it is loaded along the output's rows and across the innermost reduction (see the
    module docstring), else None."""
    x_ranges = set(x.toposort())
    if not reduces or j in x_ranges or not all(k in x_ranges for k in reduces) or _size(j.src[0]) < MIN_ROWS:
        return None
    rows = [r for r in loops if r in x_ranges]
    reduce_size = 1
    for k in reduces:
        reduce_size *= _size(k.src[0])
    inner = reduces[-1]
    across = [ld for ld in x.toposort() if ld.op is Ops.LOAD and inner in ld.src[1].toposort()]
    if not rows or reduce_size < MIN_REDUCE or not across or \
            not all(stride_along(ld.src[1], inner) != 1 and stride_along(ld.src[1], rows[-1]) == 1 for ld in across):
        return None
    shape = tuple(r.src[0] for r in rows) + tuple(k.src[0] for k in reduces)
    # loops (other reductions..., innermost reduction / ROW_RUN, rows..., ROW_RUN steps of it): a run of the
    # copy reads ROW_RUN rows of `x` (one cache set's ways when they lie 4 KB apart) along the contiguous rows
    # and writes ROW_RUN contiguous values; the last run clamps to the last step (rewriting it, same values)
    end = inner.src[0]
    outer = [UOp(Ops.RANGE, dtypes.index, (k.src[0],), (n, "loop")) for n, k in enumerate(reduces[:-1])]
    run = UOp(Ops.RANGE, dtypes.index, (simplify((end + (ROW_RUN - 1)) // ROW_RUN),), (len(outer), "loop"))
    row_ranges = [UOp(Ops.RANGE, dtypes.index, (r.src[0],), (len(outer) + 1 + n, "loop")) for n, r in enumerate(rows)]
    step = UOp(Ops.RANGE, dtypes.index, (UOp.const(ROW_RUN),), (len(outer) + 1 + len(rows), "loop"))
    new = row_ranges + outer + [(run * ROW_RUN + step).smin(end - 1)]
    stored, widen = _stored(x, narrow)
    packed_load = widen(_read_copy(stored.dtype, slot, tuple(rows) + tuple(reduces), shape))
    return ast.substitute({x: packed_load}), _copy(stored.substitute(dict(zip(rows + reduces, new))), new, shape)


def _widened_rows(ast: UOp, x: UOp, loops: list, j: UOp, reduces: list, slot: int) -> tuple[UOp, tuple] | None:
    """(contraction reading the 16-bit row operand `x` widened, from `slot`, (copy AST, shape)): a copy in `x`'s
    order (rows..., reduction...), each value widened once, where every column block would widen it again."""
    x_ranges = set(x.toposort())
    rows = [r for r in loops if r in x_ranges]
    if not reduces or j in x_ranges or not rows or _size(j.src[0]) < MIN_ROWS:
        return None
    shape = tuple(r.src[0] for r in rows) + tuple(k.src[0] for k in reduces)
    new = [UOp(Ops.RANGE, dtypes.index, (end,), (n, "loop")) for n, end in enumerate(shape)]
    read = _read_copy(x.dtype, slot, tuple(rows) + tuple(reduces), shape)
    return ast.substitute({x: read}), _copy(x.substitute(dict(zip(rows + reduces, new))), new, shape)


def _copy(value: UOp, at: list, shape: tuple) -> tuple[UOp, tuple]:
    """(the kernel storing `value` at `at` (its loops' index into `shape`) of its slot 0, the copy's shape): named by
    what it packs, not by its contraction, so two contractions packing one operand alike share one kernel."""
    store = UOp(Ops.STORE, dtypes.bool, (UOp(Ops.DEFINE_GLOBAL, value.dtype, (), 0),
                                        simplify(linear_index(at, shape)), value))
    return (UOp(Ops.SINK, dtypes.bool, (store,), kernel_name("pack_", shape)),
            tuple(s.arg if s.op is Ops.CONST else s for s in shape))


def _read_copy(dtype, slot: int, at: tuple, shape: tuple) -> UOp:
    """A contraction's read of its copy (of `dtype`, in buffer `slot`) at `at` (its index into `shape`)."""
    return UOp(Ops.LOAD, dtype, (UOp(Ops.DEFINE_GLOBAL, dtype, (), slot), simplify(linear_index(at, shape))))
