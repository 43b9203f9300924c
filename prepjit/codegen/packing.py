"""Operand packing for large contractions: copy the column operand into contiguous register-block panels.

A register-blocked contraction (optimize.py) keeps a block of UI x UJ outputs in registers and, for
every step of its reduction, reads UJ contiguous values of the column operand `y` (one row of a
panel of UJ columns). When `y`'s rows lie a power-of-two stride apart (B of a 1024 x 1024 matmul:
4 KB), a panel's rows all fall into a few cache sets, so the panel does not stay in cache between
row blocks and is fetched from memory again for each of them. Packing computes `y` once into a
buffer laid out as (other loops..., J / UJ, reduce ranges..., UJ): each panel is then one
contiguous run that stays in L2 while every row block uses it. The copy reads and writes `y`
once, so it is made only when enough rows reuse each panel (`MIN_ROWS`) and the panel is long,
or whatever the panel's length when `y` is not contiguous along the output's columns (`k.T` in
attention scores): then every block would gather its UJ values one by one instead of loading vectors.
Where the columns end in a peeled tail (a symbolic count), the full panels are packed and the operand
becomes `where(j < full columns, packed, y)`, which the blocking resolves per block (optimize.py).
"""
from __future__ import annotations

from ..uop import Ops, UOp, dtypes, simplify
from .lower import kernel_name, linear_index
from .optimize import column_block, contraction_axes, in_full_blocks, stride_along
from .target import CPUTarget, host_target

MIN_ROWS = 64      # rows of the other operand that reuse each packed panel, at least
MIN_REDUCE = 64    # reduction length, at least: shorter panels sit in cache unpacked


def _size(end: UOp) -> int:
    return end.arg if end.op is Ops.CONST else max(0, end.vmax)


def pack_contraction(ast: UOp, slot: int, target: CPUTarget | None = None) -> tuple[UOp, UOp, tuple] | None:
    """(packing kernel AST, contraction AST reading the packed copy from buffer `slot`, packed shape), or None.

    The packing kernel writes slot 0 and reads the contraction's own input slots, so it runs on the
    same buffer list with the packed buffer in slot 0. Panels are as wide as optimize.py's column blocks
    for `target` (by default this host's CPU); columns that end in a peeled tail are not packed.
    """
    found = contraction_axes(ast)
    if found is None:
        return None
    _, value, loops, j, _ = found
    if value.src[0].op is not Ops.MUL:
        return None
    reduces = list(value.src[1:])
    width, tail = column_block(target or host_target(), value.dtype.itemsize, j.src[0])
    x, y = value.src[0].src
    if j in x.toposort():
        x, y = y, x
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
    if not rows or reuse < MIN_ROWS or reduce_size < MIN_REDUCE and not gathers or tail and not gathers:
        return None
    outer = [r for r in loops if r in y_ranges and r is not j]
    shape = tuple(r.src[0] for r in outer) + (simplify(j.src[0] // width),) + \
        tuple(k.src[0] for k in reduces) + (UOp.const(width),)
    new = [UOp(Ops.RANGE, dtypes.index, (end,), (n, "loop")) for n, end in enumerate(shape)]
    mapping = dict(zip(outer, new)) | dict(zip(reduces, new[len(outer) + 1:-1]))
    mapping[j] = new[len(outer)] * width + new[-1]
    packed_value = y.substitute(mapping)
    pack_store = UOp(Ops.STORE, dtypes.bool, (UOp(Ops.DEFINE_GLOBAL, y.dtype, (), 0),
                                             simplify(linear_index(new, shape)), packed_value))
    # named by what it packs, not by its contraction: two contractions packing one operand alike share one kernel
    pack = UOp(Ops.SINK, dtypes.bool, (pack_store,), kernel_name("pack_", shape))
    read_index = simplify(linear_index(tuple(outer) + (j // width,) + tuple(reduces) + (j % width,), shape))
    packed_load = UOp(Ops.LOAD, y.dtype, (UOp(Ops.DEFINE_GLOBAL, y.dtype, (), slot), read_index))
    if tail:  # only the full panels are packed; the peeled tail's columns read `y` itself
        packed_load = UOp(Ops.WHERE, y.dtype, (in_full_blocks(j, width), packed_load, y))
    contraction = ast.substitute({y: packed_load})
    return pack, contraction, tuple(s.arg if s.op is Ops.CONST else s for s in shape)
