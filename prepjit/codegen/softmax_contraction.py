"""A softmax whose result only a contraction over the softmax's axis reads (decode attention: softmax(q @ K^T) @ V)
becomes one kernel on the work-group targets: the contraction's.

On a GPU the three kernels of before (the scores, the softmax row, p @ V) are each latency-bound at a decode step's
sizes (a few rows of a few hundred positions). Fused, the contraction's kernel is a row kernel (render_rows.py) whose
work-group owns one softmax row (a query head): it computes the row's scores once into local memory, the row's max
and sum over them, the probabilities once into local memory, and then each output column (a value dimension) as a
sum over the row's probabilities, one pass over the keys and one over the values (a computed query row, RoPE's,
held in local memory too). The scores are computed once, and every rounding of the graph stays where it is (a
bfloat16 model's probabilities are rounded before p @ V). A grouped-query KV head's query heads (rows reading the same
keys and values) share one work-group (row_plan.Rows.fold), each key and value loaded once for all of them.
Contractions inside a fori_loop's body keep their kernels.

A row may span several trailing axes (a paged cache's blocks and their rows, read through a block table), and one
softmax may be read in parts (llama_paged's decode: the cached positions' scores and the token's own, one max and one
sum over both, p_cached @ V_blocks + p_own @ v_own): the parts' contractions share the row's reductions, and the
node joining their results (their sum) is the one kernel's root, a work-group per (row, query head). A select of the
values by a mask (a paged row's slots past its length: where(visible, V, 0)) is computed where p @ V reads it.

Where each value row is read by more than MAX_ROWS_A_VALUE softmax rows (an encoder's T queries a key), a row kernel
would read the values once per query; on a target with tensor-core attention tiles (`tiles`: CUDA's) such a softmax
is kept inside p @ V all the same where the tile holds it (`_tiled`, attention_tiles.fits), and the kernel is
launched as one (attention_tiles.py, render_attention.py); elsewhere it keeps its three kernels.

`softmax_contractions(graph)`: per such contraction (or join of parts), the nodes of its softmax (the elementwise
values, the row's reductions, the scores; a join's parts' contractions), which fusion.py neither materialises nor
gives kernels of their own; `joins` the roots that schedule.py materialises. A softmax row is at
most SOFTMAX_ROW_MAX elements long (the largest var value): its scores and probabilities are two local arrays of
float32.
"""
from __future__ import annotations

import math

from ..uop import Ops, UOp, dtypes
from ..uop.ops import ELEMENTWISE
from .attention_tiles import SIXTEEN_BITS, fits

SOFTMAX_ROW_MAX = 4096   # elements of a softmax row kept in local memory (two float32 arrays: 32 KB)
MAX_ROWS_A_VALUE = 8     # softmax rows that read each value row at most (grouped-query heads: 3 in SmolLM2); more
# (an encoder's or a prefill's T queries a key) are tiled contractions: a work-group a row would read the values T times
MAX_COLUMNS = 256        # outputs a softmax row's contraction computes at most (a head's dimension: 64), each of
# them at least one work-item's of the row's work-group (row_plan.REDUCE_GROUP): more (a weight matrix's columns)
# keep the contraction a kernel of its own
SCORE_MAX = 256          # elements a score sums at most (q . k over a head's dimension); a row whose values are longer
# sums (an MLP's down projection read by the final norm, whose normalised row a small head reads) is no softmax row:
# its contraction is worth a kernel of its own, which inside would run in one work-group a row (one row: each output's)
_GROWS = (Ops.RESHAPE, Ops.EXPAND)
_RESULT = (Ops.RESHAPE, Ops.CAST)  # what a contraction's result passes through to its join (a bfloat16 model's rounding)


def softmax_contractions(graph: list[UOp], outputs: list[UOp], tiles: bool = False) -> dict[UOp, frozenset]:
    """{kernel root: the nodes computed inside its kernel} for each contraction of `graph` (kernel_roots' walk) that
    reads a softmax row along its reduced axes, where no other kernel and no output reads the row or its reductions
    (the elementwise nodes others read too, a RoPE table's row, are left out), and each value row is read by at most
    MAX_ROWS_A_VALUE rows, or (with `tiles`: a target with tensor-core attention tiles) by any number where the tile
    holds the softmax (`_tiled`: an encoder's attention, attention_tiles.py). Contractions whose softmaxes share a
    row reduction read one softmax in parts (paged attention: the cached positions' probabilities against the
    gathered values, the token's own against its value); the elementwise node that joins their results (their sum)
    is then the kernel's root, which the schedule materialises, and the parts' contractions are among its nodes."""
    readers_of: dict[UOp, set] = {}
    for node in graph:
        for s in node.src:
            readers_of.setdefault(s, set()).add(node)
    for out in outputs:
        readers_of.setdefault(out, set()).add(None)
    in_loops = {n for node in graph if node.op is Ops.LOOP
                for n in UOp(Ops.SINK, node.dtype, node.arg.body_roots).toposort()}
    parts = {}  # contraction -> (its softmax's nodes, its probabilities p, the broadcasts of p it reads)
    for c in graph:
        axes = _contracted(c) if c not in in_loops else 0
        for side in c.src[0].src if axes else ():
            p = _grown_from(side, axes)
            other = c.src[0].src[1] if side is c.src[0].src[0] else c.src[0].src[0]
            few = p is not None and _reuse(c, other) <= MAX_ROWS_A_VALUE
            nodes = _softmax(p, axes) if p is not None and (few or tiles) and _columns(
                c, p, axes) <= MAX_COLUMNS else None
            if nodes and not few and not _tiled(c, p, other, nodes, axes):
                nodes = None
            if nodes:
                parts[c] = (nodes, p, _path(side, p), _masked(other))
                break
    found = {}
    for group in _sharing_reductions(parts):
        root = group[0] if len(group) == 1 else _join(group, readers_of)
        if root is None:
            continue  # parts no one node joins: each part's kernel would compute the whole softmax
        nodes = frozenset().union(*(parts[c][0] for c in group))
        masked = set().union(*(parts[c][3] for c in group))   # (where only the parts' products read them)
        products = masked | {c.src[0] for c in group}
        masked = {n for n in masked if products.issuperset(readers_of.get(n, ()))}
        inside = nodes | set(group) | set().union(*(parts[c][2] for c in group)) | _between(group, root) | masked
        probabilities = {parts[c][1] for c in group}
        if all(inside.issuperset(readers_of.get(n, ())) for n in nodes if n in probabilities or n.op is Ops.REDUCE_AXIS):
            kept = frozenset(n for n in nodes if inside.issuperset(readers_of.get(n, ()))) | masked
            found[root] = kept if len(group) == 1 else kept | frozenset(group)
    return found


def joins(found: dict[UOp, frozenset], outputs: list[UOp]) -> set[UOp]:
    """The kernel roots of `found` (softmax_contractions') that join a softmax's parts and are no outputs: the
    elementwise nodes the schedule materialises (their kernel computes the whole softmax and every part)."""
    return {root for root in found if root.op is not Ops.REDUCE_AXIS} - set(outputs)


def _tiled(c: UOp, p: UOp, other: UOp, nodes: set, axes: int) -> bool:
    """Whether the attention tile (attention_tiles.fits) holds the softmax `nodes` of rows `p` that contraction `c`
    reads with its `other` operand: one key axis, the probabilities and the values 16-bit floats of one kind widened,
    and so the scores' operands."""
    kind = _widened(p)
    scores = [n for n in nodes if n.op is Ops.REDUCE_AXIS and _kept(n.shape) == _kept(p.shape)]
    if axes != 1 or kind is None or _widened(other) != kind or not scores:
        return False
    for s in scores:
        if s.arg[0] is not Ops.ADD or s.src[0].op is not Ops.MUL or any(_widened(x) != kind for x in s.src[0].src):
            return False
    return fits(_row_length(p, axes), max(_summed(s) for s in scores), _columns(c, p, axes))


def _widened(x: UOp):
    """The 16-bit float `x` is widened from (through broadcasts and permutes), or None."""
    while x.op in (*_GROWS, Ops.PERMUTE):
        x = x.src[0]
    return x.src[0].dtype if x.op is Ops.CAST and x.dtype == dtypes.float32 and x.src[0].dtype in SIXTEEN_BITS \
        else None


def _contracted(c: UOp) -> int:
    """How many trailing axes `c` sums products over (0: not such a contraction)."""
    if not (c.op is Ops.REDUCE_AXIS and c.arg[0] is Ops.ADD and c.src[0].op is Ops.MUL):
        return 0
    rank = len(c.src[0].shape)
    return len(c.arg[1]) if sorted(c.arg[1]) == list(range(rank - len(c.arg[1]), rank)) else 0


def _summed(c: UOp) -> int:
    """The most elements reduction `c` sums (a var axis at its largest value)."""
    return math.prod(_elements_of(c.src[0].shape[a]) for a in c.arg[1])


def _sharing_reductions(parts: dict) -> list[list[UOp]]:
    """The contractions of `parts` grouped so that two whose softmaxes share a reduction are in one group, in the
    order of `parts`."""
    groups: list[list[UOp]] = []
    reductions: list[set] = []
    for c, (nodes, *_) in parts.items():
        mine = {n for n in nodes if n.op is Ops.REDUCE_AXIS}
        merged = [k for k, r in enumerate(reductions) if r & mine]
        group = [x for k in merged for x in groups[k]] + [c]
        mine = mine.union(*(reductions[k] for k in merged))
        groups = [g for k, g in enumerate(groups) if k not in merged] + [group]
        reductions = [r for k, r in enumerate(reductions) if k not in merged] + [mine]
    return groups


def _join(group: list[UOp], readers_of: dict) -> UOp | None:
    """The elementwise node that alone reads each contraction of `group` (through reshapes and roundings: _RESULT)
    and reads nothing else, or None."""
    ends = set()
    for c in group:
        n = c
        while len(readers_of.get(n, ())) == 1 and next(iter(readers_of[n])) is not None and next(
                iter(readers_of[n])).op in _RESULT:
            n = next(iter(readers_of[n]))
        ends.add(next(iter(readers_of[n])) if len(readers_of.get(n, ())) == 1 else None)
    join = ends.pop() if len(ends) == 1 else None
    if join is None or join.op not in ELEMENTWISE:
        return None
    return join if {_result_chain(s)[-1] for s in join.src} == set(group) else None


def _between(group: list[UOp], root: UOp) -> set:
    """The reshapes and roundings from the contractions of `group` to their join `root`."""
    return {n for s in root.src for n in _result_chain(s)[:-1]} if root not in group else set()


def _result_chain(n: UOp) -> list[UOp]:
    """`n` and the nodes below it through _RESULT ones, down to the first other node (last)."""
    out = [n]
    while n.op in _RESULT:
        n = n.src[0]
        out.append(n)
    return out


def _elements(node: UOp) -> int:
    return math.prod(_elements_of(d) for d in node.shape)


def _reuse(c: UOp, other: UOp) -> int:
    """How many times the contraction `c` reads each element of its `other` operand (below its broadcasts)."""
    base = other
    while base.op in (*_GROWS, Ops.PERMUTE):
        base = base.src[0]
    return _elements(c.src[0]) // _elements(base)


def _columns(c: UOp, p: UOp, axes: int) -> int:
    """Outputs of the contraction `c` a row (the last `axes` axes) of the softmax `p` gives."""
    return _elements(c) * _row_length(p, axes) // _elements(p)


def _row_length(p: UOp, axes: int) -> int:
    """Elements of a row of `p` (its last `axes` axes) at the vars' maxima."""
    return math.prod(_elements_of(d) for d in p.shape[len(p.shape) - axes:])


def _elements_of(d) -> int:
    return d if isinstance(d, int) else max(1, d.vmax)


def _grown_from(side: UOp, axes: int) -> UOp | None:
    """The elementwise value `side` broadcasts through reshapes adding size-1 axes and expands of those (p (h, t) read
    as (h, 1, t) -> (h, d, t) by p @ V), its last `axes` axes those of `side`, or None."""
    n = side
    while n.op in _GROWS:
        n = n.src[0]
    if n.op not in ELEMENTWISE or len(n.shape) < axes or side.shape[-axes:] != n.shape[-axes:]:
        return None
    chain = side
    while chain is not n:
        if chain.op is Ops.RESHAPE and _kept(chain.shape) != _kept(chain.src[0].shape):
            return None
        chain = chain.src[0]
    return n


def _kept(shape: tuple) -> list:
    return [d for d in shape if not (isinstance(d, int) and d == 1)]


def _path(side: UOp, p: UOp | None) -> set:
    """The broadcasts from `p` to `side` (p @ V's read of p)."""
    path, n = set(), side
    while p is not None and n is not p:
        path.add(n)
        n = n.src[0]
    return path


def _masked(other: UOp) -> set:
    """The views of the contraction's `other` operand (p @ V's values) down to a select of its values by a mask
    (where(visible, V, 0): a paged cache's slots past a sequence's length), and the select: computed where the
    contraction reads them (each value element is read by a few rows: MAX_ROWS_A_VALUE), not materialised; else
    nothing."""
    path, n = set(), other
    while n.op in (*_GROWS, Ops.PERMUTE) or n.op is Ops.CAST and n.src[0].dtype.narrow:   # (and a 16-bit widened)
        path.add(n)
        n = n.src[0]
    return path | {n} if n.op is Ops.WHERE and _is_zero(n.src[2]) else set()


def _is_zero(n: UOp) -> bool:
    """Whether `n` is the constant 0 (through broadcasts)."""
    while n.op in _GROWS:
        n = n.src[0]
    return n.op is Ops.CONST and n.arg == 0


def _softmax(p: UOp, axes: int) -> set | None:
    """The nodes of the softmax whose rows are the last `axes` axes of `p`: the values of its shape or of a row's
    (one value a row: the max, the sum, their parts' combination) it computes from (elementwise, broadcasts), the
    reductions of a row it reads (walked into: their operands are rows, the other part's too) and the scores
    (reductions it reads whose other axes are its own: not walked into, their operands are the kernel's reads); None
    where `p` is no softmax (a row's max and sum and an exponential among them: an RMSNorm's row is none), a row longer
    than SOFTMAX_ROW_MAX or a score summing more than SCORE_MAX."""
    if _row_length(p, axes) > SOFTMAX_ROW_MAX:
        return None
    whole, row = _kept(p.shape), _kept(p.shape[:len(p.shape) - axes])
    nodes, stack, row_ops = set(), [p], set()
    while stack:
        n = stack.pop()
        if n in nodes:
            continue
        if n.op is Ops.REDUCE_AXIS:
            if _row_reduction(n, row):
                row_ops.add(n.arg[0])
                nodes.add(n)
                stack.extend(n.src)
            elif _kept(n.shape) == whole:
                if _summed(n) > SCORE_MAX:
                    return None
                nodes.add(n)
        elif (n.op in ELEMENTWISE or n.op in _GROWS) and n.shape and _kept(n.shape) in (whole, row):
            nodes.add(n)
            stack.extend(n.src)
    is_softmax = Ops.MAX in row_ops and Ops.ADD in row_ops and any(n.op in (Ops.EXP, Ops.EXP2) for n in nodes)
    return nodes if is_softmax else None


def _row_reduction(n: UOp, row: list) -> bool:
    """Whether reduction `n` reduces trailing axes of its operand, keeping the axes `row` (a row's max, sum)."""
    rank = len(n.src[0].shape)
    return _kept(n.shape) == row and sorted(n.arg[1]) == list(range(rank - len(n.arg[1]), rank))
