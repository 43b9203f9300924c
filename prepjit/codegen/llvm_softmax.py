"""The cpu's lowering of a softmax computed inside its contraction's kernel (softmax_contraction.py: decode
attention's scores, max, sum and p @ V as one kernel): one loop step a softmax row, the row's values in arrays of
the kernel's own.

The scheduled kernel computes each output column (a value dimension d) as a sum over the row's positions t of
p(t) * V[t, d], where p(t) reads the row's reductions (its max and sum), which read the scores s(t) again. As
written, a loop nest computes the scores 2 + (head dimension) times a position. Here the kernel is rewritten so
that, per row (its loop ranges other than the columns', flattened into the one outermost loop that threads split:
a decode batch's B x heads rows), every value of a position that does not depend on the column is computed once
into a row array (DEFINE_LOCAL, laid out for SOFTMAX_ROW_MAX positions at most, on each thread's stack), in the
order the reductions need them:

    for row:                                   (parallel)
        a0[t] = s(t)                           the scores (each a dot product: lanes over the head dimension)
        a1[t] = exp(a0[t] - max_t' a0[t'])     the row's max read back from a0 (the renderer computes a reduction
        a2[t] = a1[t] / sum_t' a1[t']          reading the kernel's own stores after them: render_llvm.py)
        out[d] = sum_t a2[t] * V[t, d]         lanes over d

Every value and rounding of the graph stays (a bfloat16 model's rounded probabilities are an array's values; the
same reduction read in several places is one node after `_canonical` names every reduction's ranges by its
depth and extents), so a row's bits depend on its own inputs only. The contraction's and the dot products' sums
are vectorised over the target's lanes where the dimension is a multiple of them.
"""
from __future__ import annotations

import math

from ..uop import Ops, UOp, dtypes, simplify
from ..uop.ops import ALU
from .lower import linear_index
from .operand_prologue import _free_ranges
from .softmax_contraction import SOFTMAX_ROW_MAX
from .target import CPUTarget

MAX_VECTORS = 8  # vectors of output columns a row's contraction accumulates at once (a head of 64: 4 of 16 lanes)


def softmax_rows(ast: UOp, target: CPUTarget) -> UOp | None:
    """`ast` lowered as the module docstring says, or None where it is no softmax computed inside its contraction
    (a store of a sum over positions whose operand reads reductions of the row over the same positions)."""
    if ast.op is not Ops.SINK or len(ast.src) != 1 or ast.src[0].op is not Ops.STORE or len(ast.src[0].src) != 3 \
            or ast.src[0].arg is not None or ast.src[0].src[0].op is not Ops.DEFINE_GLOBAL:
        return None
    store = ast.src[0]
    first = 1 + max((u.arg[0] for u in ast.toposort() if u.op is Ops.RANGE), default=-1)
    value = _canonical(store.src[2], first)
    free = _free_ranges(value.toposort())
    loops = free[value] | _free_ranges(store.src[1].toposort())[store.src[1]]
    positional = [u for u in value.toposort() if u.op is Ops.REDUCE and _nested(u)]
    rows = {free[u] for u in positional if free[u] < loops}
    if len(rows) != 1 or any(not (free[u] < loops or free[u] == loops) for u in positional):
        return None
    row = next(iter(rows))
    positions = {u.src[1:] for u in positional}
    if len(positions) != 1 or not row or row == loops:
        return None
    positions = next(iter(positions))
    extents = [_max_end(r) for r in positions]
    if math.prod(extents) > SOFTMAX_ROW_MAX:
        return None
    columns = loops - row
    arrays: list[UOp] = []  # the row arrays' stores, in order
    axis = first + 1000     # past the canonical ranges
    while True:
        part = _next_part(value, positions, columns, free)
        if part is None:
            break
        scratch = UOp(Ops.DEFINE_LOCAL, part.dtype, (), (len(arrays), math.prod(extents)))
        own = [UOp(Ops.RANGE, dtypes.index, r.src, (axis + k, "serial")) for k, r in enumerate(positions)]
        axis += len(positions)
        kept = {u: u for u in part.toposort() if u.op is Ops.REDUCE and u.src[1:] == positions}  # (the row's)
        arrays.append(UOp(Ops.STORE, dtypes.bool, (scratch, simplify(linear_index(own, extents)),
                                                   part.substitute({**kept, **dict(zip(positions, own))}))))
        value = value.substitute({part: UOp(Ops.LOAD, part.dtype, (scratch, simplify(linear_index(positions,
                                                                                               extents))))})
        free = _free_ranges(value.toposort())
    if not arrays:
        return None
    out = UOp(Ops.STORE, store.dtype, (store.src[0], store.src[1], value))
    lowered = UOp(Ops.SINK, ast.dtype, (*arrays, out), ast.arg)
    return _one_row_loop(_lanes(lowered, columns, target.lanes(4), axis), sorted(row, key=lambda r: r.arg[0]),
                         axis + 1)


def _nested(reduce: UOp) -> bool:
    """Whether reduction `reduce` sums over positions a value computed from another reduction (the scores)."""
    return any(u.op is Ops.REDUCE for u in reduce.src[0].toposort())


def _next_part(value: UOp, positions: tuple, columns: frozenset, free: dict) -> UOp | None:
    """The first value over `positions` (innermost first) to store in a row array: a reduction's operand over
    them, or, in a contraction (an operand that depends on the `columns`), its largest parts that do not; a load of
    a row array is no part."""
    for red in value.toposort():
        if red.op is not Ops.REDUCE or red.src[1:] != positions:
            continue
        body = red.src[0]
        if not free[body] & columns:
            if _computes(body):
                return body
            continue
        stack = [body]
        while stack:
            n = stack.pop()
            if free[n] & columns or not free[n] & set(positions):
                if n.op is not Ops.LOAD:
                    stack.extend(n.src)
            elif _computes(n):
                return n
    return None


def _computes(n: UOp) -> bool:
    """Whether `n` is a float computation other than a read of a row array (possibly through a cast)."""
    return n.dtype.is_float and any(u.op in ALU or u.op is Ops.REDUCE for u in n.toposort()
                                    if u.op is not Ops.LOAD) and not (n.op is Ops.LOAD)


def _max_end(r: UOp) -> int:
    return max(1, int(r.src[0].vmax))


def _canonical(value: UOp, first: int) -> UOp:
    """`value` with every reduction's ranges replaced by ranges named by their place, extent and level (one more
    than the highest level of the reductions under it that read them): the same reduction written with other
    ranges (a softmax row's scores read by its max, its sum and its contraction) becomes one node. Two reductions
    with the same names are never one inside the other reading its ranges (the outer one's level is higher)."""
    names: dict = {}
    level: dict = {}
    memo: dict = {}
    for u in value.toposort():
        src = tuple(memo[s] for s in u.src)
        new = u if src == u.src else UOp(u.op, u.dtype, src, u.arg)
        if u.op is Ops.REDUCE:
            body, bound = new.src[0], set(new.src[1:])
            free = _free_ranges(body.toposort())
            n = 1 + max((level[x] for x in body.toposort() if x.op is Ops.REDUCE and free[x] & bound), default=0)
            canon = []
            for k, r in enumerate(new.src[1:]):
                key = (n, k, r.src[0])
                if key not in names:
                    names[key] = UOp(Ops.RANGE, r.dtype, r.src, (first + len(names), "reduce"))
                canon.append(names[key])
            new = UOp(Ops.REDUCE, new.dtype, (body.substitute(dict(zip(new.src[1:], canon))), *canon), new.arg)
            level[new] = n
        memo[u] = new
    return memo[value]


def _lanes(ast: UOp, columns: frozenset, width: int, axis: int) -> UOp:
    """`ast` with the single range of each sum of products that reads no reduction (a score's dot product over the
    head dimension) split into steps of `width` lanes, one "lane" range (render_llvm.py: one vector; a sum over it
    adds the lanes up once), and its one column range (the contraction's output dimension) unrolled into a store
    of a vector of lanes each (a register block: their sums share each position's loads), where their extents are
    multiples of `width` (the columns at most MAX_VECTORS of them)."""
    lane = UOp(Ops.RANGE, dtypes.index, (UOp.const(width),), (axis, "lane"))
    mapping = {}
    for u in ast.toposort():
        if u.op is Ops.REDUCE and u.arg is Ops.ADD and len(u.src) == 2 and not _nested(u) and \
                u.src[1].src[0].op is Ops.CONST and u.src[1].src[0].arg % width == 0:
            r = u.src[1]
            steps = UOp(Ops.RANGE, dtypes.index, (UOp.const(r.src[0].arg // width),), r.arg)
            mapping[u] = UOp(Ops.REDUCE, u.dtype, (u.src[0].substitute({r: steps * width + lane}), steps, lane), u.arg)
    ast = ast.substitute(mapping)
    column = next(iter(columns))
    extent = column.src[0].arg if len(columns) == 1 and column.src[0].op is Ops.CONST else 0
    if not extent or extent % width or extent // width > MAX_VECTORS:
        return ast
    *arrays, out = ast.src
    stores = [out.substitute({column: UOp.const(k * width) + lane}) for k in range(extent // width)]
    return UOp(Ops.SINK, ast.dtype, (*arrays, *stores), ast.arg)


def _one_row_loop(ast: UOp, row: list[UOp], axis: int) -> UOp:
    """`ast` with the `row` ranges (outermost first) flattened into one loop, the outermost (threads split it: a
    batch row's query heads are steps of it), and its other loops (the columns') numbered after it from `axis`."""
    size = row[0].src[0]
    for r in row[1:]:
        size = size * r.src[0]
    loops = sorted({u for u in ast.toposort() if u.op is Ops.RANGE and u.arg[1] == "loop"}, key=lambda r: r.arg[0])
    flat = UOp(Ops.RANGE, dtypes.index, (size,), (loops[0].arg[0], "loop"))
    mapping, rest = {}, flat
    for r in reversed(row):
        mapping[r] = rest % r.src[0] if r is not row[0] else rest
        rest = rest // r.src[0]
    others = [r for r in loops if r not in row]
    mapping.update({r: UOp(Ops.RANGE, r.dtype, r.src, (axis + k, "loop")) for k, r in enumerate(others)})
    return ast.substitute(mapping)
