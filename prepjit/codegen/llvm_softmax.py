"""The cpu's lowering of a softmax computed inside its contraction's kernel (softmax_contraction.py: decode
attention's scores, max, sum and p @ V as one kernel): one loop step a softmax row (or a kv head's group of query
rows), the row's values in arrays of the kernel's own.

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
are vectorised over the target's lanes where the dimension is a multiple of them; the loops filling a1 and a2
(scalar here) and the row's max are vectorised by LLVM's loop and SLP vectorisers (16 lanes on AVX-512, exp's
polynomial too: checked in the optimised IR of the paged and the one-row kernels). The row's sum over a part's
positions is a sum over lanes (`_lanes`): its positions rounded up to whole vectors (the arrays are laid out so),
masked to 0 past the part's end, a vector accumulator a lane added up once. Its order is then fixed by the lanes,
not by the trip count: a batch's rows see positions they do not have (a wider table than theirs, a window longer
than their chunk), exact zeros, and LLVM's own vectorisation of a reassociated sum (the window's from 8 positions
on, the blocks' loop from 16 blocks on) made the order, so a row's bits, follow the call's NB and window.

Grouped-query attention's query heads of one kv head read the same keys and values: the row ranges no load over
the positions reads (`_shared_rows`: the group) are not steps of the parallel loop but computed by one step
together, each store repeated per query row (`_unrolled`), so a gathered key row, value row and block-table entry
are loaded once for the group (the group's dot products one vector sum, its p @ V one register block of
group x column vectors), where those sums fit the vector registers. Each row's max stays its own lone reduction and
its sum over lanes adds its lanes up as alone (llvm_reductions' lanes_added_up), so the bits are those of a step a
row.

A softmax read in parts (a prefill's attention: the cached blocks' positions and the chunk's own window, each a
sum of its own: p_cached @ V + p_own @ v_own) has arrays per part, filled in the order the reductions need them
(both parts' scores before either's exponentials: the row's max reads both). A fill computed from row arrays
alone (the exponentials, the probabilities) runs over its positions rounded up to the lanes (the arrays are laid
out so): a short var trip count (a window of 14) is then one vector step, not LLVM's vector epilogue and scalar
remainder of a 40-instruction exp each; what it writes past the positions is never read.

The schedule asks softmax_contraction.py on every target which softmaxes to compute inside their contraction, so
this lowering takes every kernel that gives: a row of any rank (a batch's rows x heads, one row alone), scores
computed or loaded. The one it leaves (None) has no columns (p @ w with a vector w): the generic loop nest then
computes each of the row's reductions once anyway.
"""
from __future__ import annotations

import itertools
import math

from ..uop import Ops, UOp, dtypes, simplify
from ..uop.ops import ALU
from .lower import linear_index
from .operand_prologue import free_ranges_by_node as free_ranges
from .softmax_contraction import SOFTMAX_ROW_MAX
from .target import CPUTarget

MAX_VECTORS = 8  # vectors of output columns a row's contraction accumulates at once (a head of 64: 4 of 16 lanes)
SPARE_REGISTERS = 4  # vector registers a step of the contraction needs besides its sums (a value row's vector, a
# probability splatted, the next ones loaded)


def softmax_rows(ast: UOp, target: CPUTarget) -> UOp | None:
    """`ast` lowered as the module docstring says, or None where it is no softmax computed inside its contraction
    (a store of a sum over positions whose operand reads reductions of the row over the same positions), or one
    without columns."""
    if ast.op is not Ops.SINK or len(ast.src) != 1 or ast.src[0].op is not Ops.STORE or len(ast.src[0].src) != 3 \
            or ast.src[0].arg is not None or ast.src[0].src[0].op is not Ops.DEFINE_GLOBAL:
        return None
    store = ast.src[0]
    first = 1 + max((u.arg[0] for u in ast.toposort() if u.op is Ops.RANGE), default=-1)
    value = _canonical(store.src[2], first)
    free = free_ranges(value.toposort())
    loops = free[value] | free_ranges(store.src[1].toposort())[store.src[1]]
    positional = [u for u in value.toposort() if u.op is Ops.REDUCE and _nested(u)]
    rows = {free[u] for u in positional if free[u] < loops}
    if len(rows) != 1 or any(not (free[u] < loops or free[u] == loops) for u in positional):
        return None
    row = next(iter(rows))  # (empty: one softmax row)
    parts = list(dict.fromkeys(u.src[1:] for u in positional))  # each part's positions (a prefill: cached, own)
    if row == loops or not any(free[u] == loops for u in positional):
        return None  # (no contraction: a value of the row's own reductions)
    extents = {p: [_max_end(r) for r in p] for p in parts}
    if sum(math.prod(e) for e in extents.values()) > SOFTMAX_ROW_MAX:
        return None
    columns = loops - row
    width = target.lanes(4)
    every = [r for p in parts for r in p]  # the positions' ranges of every part
    shared = _shared_rows(value, row, every, free, _column_vectors(columns, width), target)
    together = [_max_end(r) for r in shared]  # the rows one loop step computes: each position's loads shared
    layout = {p: together + e[:-1] + [_whole_vectors(e[-1], width)] for p, e in extents.items()}  # (rows padded)
    arrays: list[UOp] = []  # the row arrays' stores, in order
    axis = first + 1000     # past the canonical ranges
    while True:
        found = _next_part(value, parts, columns, free)
        if found is None:
            break
        part, positions = found
        scratch = UOp(Ops.DEFINE_LOCAL, part.dtype, (), (len(arrays), math.prod(layout[positions])))
        ends = [r.src[0] for r in positions]
        if not any(u.op is Ops.DEFINE_GLOBAL for u in part.toposort()):  # computed from row arrays alone
            ends[-1] = simplify(_whole_vectors(ends[-1], width))
        own = [UOp(Ops.RANGE, dtypes.index, (end,), (axis + k, "serial")) for k, end in enumerate(ends)]
        axis += len(positions)
        kept = {u: u for u in part.toposort() if u.op is Ops.REDUCE and u.src[1:] in parts}  # (the row's)
        arrays.append(UOp(Ops.STORE, dtypes.bool, (scratch, simplify(linear_index(shared + own, layout[positions])),
                                                   part.substitute({**kept, **dict(zip(positions, own))}))))
        value = value.substitute({part: UOp(Ops.LOAD, part.dtype, (scratch, simplify(linear_index(
            shared + list(positions), layout[positions]))))})
        free = free_ranges(value.toposort())
    if not arrays:
        return None
    out = UOp(Ops.STORE, store.dtype, (store.src[0], store.src[1], value))
    lowered = _lanes(UOp(Ops.SINK, ast.dtype, (*arrays, out), ast.arg), parts, columns, width, axis)
    axis += 1 + len(parts)  # (the lane, the steps of each part's row sums)
    lowered = _unrolled(lowered, shared, row, parts, axis)
    return _one_row_loop(lowered, sorted(row - set(shared), key=lambda r: r.arg[0]), axis + len(every) *
                         math.prod(together))


def _whole_vectors(end, width: int):
    """`end` (an int or an index UOp) rounded up to whole vectors of `width` lanes: a part's last dimension in its
    row arrays, and the trip count of a fill computed from row arrays alone."""
    return (end + (width - 1)) // width * width


def _column_vectors(columns: frozenset, width: int) -> int:
    """The vectors of output columns a row's contraction accumulates at once (_lanes: one column range whose
    extent is a multiple of `width`, at most MAX_VECTORS of them), else 1 (a loop over the columns)."""
    column = next(iter(columns), None)
    extent = column.src[0].arg if len(columns) == 1 and column.src[0].op is Ops.CONST else 0
    return extent // width if extent and extent % width == 0 and extent // width <= MAX_VECTORS else 1


def _shared_rows(value: UOp, row: frozenset, positions: list, free: dict, vectors: int,
                 target: CPUTarget) -> list[UOp]:
    """The ranges of the row (outermost first) that no load over the positions reads (grouped-query attention:
    the query heads of one kv head read the same keys and values), of constant extents: one loop step computes
    all their rows, each position's key and value (and block-table entry) loaded once for them. Only where their
    contractions' sums fit the vector registers beside a step's operands (AVX-512: 3 heads x 4 vectors of a
    64-wide head; AVX2's 3 x 8 would not). Even where the groups split unevenly over the threads: SmolLM2's 3 kv
    heads on 2 threads run 2 steps on one, 1 on the other, yet a step per query head (9: 5 and 4) is slower, its
    p @ V sums 4 dependent chains of FMAs, not 12, and each key and value row read 3 times (f32 decode, 2 threads,
    its 30 layers' attention launches with the cache in L2: pos 140 0.31 vs 0.37 ms, pos 300 0.51-0.54 vs 0.70-0.86;
    one thread at pos 300 0.62 vs 1.14; whole steps at pos 300 17.9-18.2 vs 19.5-20.2 ms). Splitting the positions
    instead would balance them but change the order of the row's sums, so a row's bits."""
    read = frozenset().union(*(free[u] for u in value.toposort() if u.op is Ops.LOAD and free[u] & set(positions)))
    shared = sorted((r for r in row - read if r.src[0].op is Ops.CONST), key=lambda r: r.arg[0])
    rows = math.prod(_max_end(r) for r in shared)
    return shared if 1 < rows and rows * vectors <= target.vector_registers - SPARE_REGISTERS else []


def _unrolled(ast: UOp, shared: list[UOp], row: frozenset, parts: list[tuple], axis: int) -> UOp:
    """`ast` with its stores repeated for each value of the `shared` row ranges (one after another: the copies of
    a row array's store share its loops, those of the contraction's one reduction loop per part). A row's own
    reductions over a part's positions (its max: no column's; its sum is over lanes, `_lanes`) get ranges of their
    own per row, so each is the reduction it was alone (a lone one: reassociated, vectorised)."""
    if not shared:
        return ast
    copies = []
    every = [r for p in parts for r in p]
    for k, at in enumerate(itertools.product(*(range(_max_end(r)) for r in shared))):
        fixed = [s.substitute({r: UOp.const(v) for r, v in zip(shared, at)}) for s in ast.src]
        own = {r: UOp(Ops.RANGE, dtypes.index, r.src, (axis + k * len(every) + j, "reduce"))
               for j, r in enumerate(every)}
        renamed = {}
        for s in fixed:
            free = free_ranges(s.toposort())
            renamed.update((u, UOp(Ops.REDUCE, u.dtype, (u.src[0].substitute(own), *(own[r] for r in u.src[1:])),
                                   u.arg))
                           for u in free if u.op is Ops.REDUCE and u.src[1:] in parts and free[u] <= row)
        copies.append([s.substitute(renamed) for s in fixed])
    arrays = len(ast.src) - sum(1 for s in ast.src if s.src[0].op is Ops.DEFINE_GLOBAL)
    ordered = [c[i] for i in range(arrays) for c in copies] + [c[i] for c in copies for i in range(arrays,
                                                                                                   len(ast.src))]
    return UOp(Ops.SINK, ast.dtype, tuple(ordered), ast.arg)


def _nested(reduce: UOp) -> bool:
    """Whether reduction `reduce` sums over positions a value computed from another reduction (the scores)."""
    return any(u.op is Ops.REDUCE for u in reduce.src[0].toposort())


def _next_part(value: UOp, parts: list[tuple], columns: frozenset, free: dict) -> tuple | None:
    """The first value over one part's positions (innermost first) to store in a row array, with those positions:
    a reduction's operand over them, or, in a contraction (an operand that depends on the `columns`), its largest
    parts that do not; a load of a row array is no part."""
    for red in value.toposort():
        if red.op is not Ops.REDUCE or red.src[1:] not in parts:
            continue
        body, positions = red.src[0], red.src[1:]
        if not free[body] & columns:
            if _computes(body):
                return body, positions
            continue
        stack = [body]
        while stack:
            n = stack.pop()
            if free[n] & columns or not free[n] & set(positions):
                if n.op is not Ops.LOAD:
                    stack.extend(n.src)
            elif _computes(n):
                return n, positions
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
            free = free_ranges(body.toposort())
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


def _lanes(ast: UOp, parts: list[tuple], columns: frozenset, width: int, axis: int) -> UOp:
    """`ast` with the single range of each sum of products that reads no reduction and is no sum over a part's
    positions (a score's dot product over the head dimension; not the row's sum nor p @ V, whose sums are over
    the columns' lanes) split into steps of `width` lanes, one "lane" range (render_llvm.py: one vector; a sum over
    it adds the lanes up once), and its one column range (the contraction's output dimension) unrolled into a store
    of a vector of lanes each (a register block: their sums share each position's loads), where their extents are
    multiples of `width` (the columns at most MAX_VECTORS of them). A row's sum over a part's positions read from a
    row array has the part's last range split so too, its steps `axis` + 1 on, the positions rounded up to whole
    vectors and masked to 0 past the range's end: one order of its terms for every trip count."""
    lane = UOp(Ops.RANGE, dtypes.index, (UOp.const(width),), (axis, "lane"))
    mapping, steps_of = {}, {}
    for u in ast.toposort():
        if u.op is Ops.REDUCE and u.arg is Ops.ADD and len(u.src) == 2 and not _nested(u) and u.src[1:] not in parts \
                and u.src[1].src[0].op is Ops.CONST and u.src[1].src[0].arg % width == 0:
            r = u.src[1]
            steps = UOp(Ops.RANGE, dtypes.index, (UOp.const(r.src[0].arg // width),), r.arg)
            mapping[u] = UOp(Ops.REDUCE, u.dtype, (u.src[0].substitute({r: steps * width + lane}), steps, lane), u.arg)
        elif u.op is Ops.REDUCE and u.arg is Ops.ADD and u.dtype.is_float and u.src[1:] in parts \
                and u.src[0].op is Ops.LOAD and u.src[0].src[0].op is Ops.DEFINE_LOCAL:
            r = u.src[-1]  # a row's sum over a part's positions, read from a row array (laid out for whole vectors)
            if r not in steps_of:
                steps_of[r] = UOp(Ops.RANGE, dtypes.index, (simplify((r.src[0] + (width - 1)) // width),),
                                  (axis + 1 + len(steps_of), "reduce"))
            at = steps_of[r] * width + lane
            body = u.src[0].substitute({r: at})
            if r.src[0].op is not Ops.CONST or r.src[0].arg % width:
                body = (at < r.src[0]).alu(Ops.WHERE, body, UOp.const(0.0, u.dtype))
            mapping[u] = UOp(Ops.REDUCE, u.dtype, (body, *u.src[1:-1], steps_of[r], lane), u.arg)
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
    batch row's query heads are steps of it), and its other loops (the columns') numbered after it from `axis`; as
    it is without `row` ranges (one softmax row: its arrays filled once a call, before any loop)."""
    if not row:
        return ast
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
