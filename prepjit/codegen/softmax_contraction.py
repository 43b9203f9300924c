"""A softmax whose result only a contraction over the softmax's axis reads (decode attention: softmax(q @ K^T) @ V)
becomes one kernel on the work-group targets: the contraction's.

On a GPU the three kernels of before (the scores, the softmax row, p @ V) are each latency-bound at a decode step's
sizes (a few rows of a few hundred positions). Fused, the contraction's kernel is a row kernel (render_rows.py) whose
work-group owns one softmax row (a query head): it computes the row's scores once into local memory, the row's max
and sum over them, the probabilities once into local memory, and then each output column (a value dimension) as a
sum over the row's probabilities, one pass over the keys and one over the values (a computed query row, RoPE's,
held in local memory too). The scores are computed once, and every rounding of the graph stays where it is (a
bfloat16 model's probabilities are rounded before p @ V). Contractions inside a fori_loop's body keep their kernels.

`softmax_contractions(graph)`: per such contraction, the nodes of its softmax (the elementwise values, the row's
reductions, the scores), which fusion.py neither materialises nor gives kernels of their own. A softmax row is at
most SOFTMAX_ROW_MAX elements long (the largest var value): its scores and probabilities are two local arrays of
float32.
"""
from __future__ import annotations

import math

from ..uop import Ops, UOp
from ..uop.ops import ELEMENTWISE

SOFTMAX_ROW_MAX = 4096   # elements of a softmax row kept in local memory (two float32 arrays: 32 KB)
MAX_ROWS_A_VALUE = 8     # softmax rows that read each value row at most (grouped-query heads: 3 in SmolLM2); more
# (an encoder's or a prefill's T queries a key) are tiled contractions: a work-group a row would read the values T times
MAX_COLUMNS = 256        # outputs a softmax row's contraction computes at most (a head's dimension: 64), each of
# them at least one work-item's of the row's work-group (row_plan.REDUCE_GROUP): more (a weight matrix's columns)
# keep the contraction a kernel of its own
_GROWS = (Ops.RESHAPE, Ops.EXPAND)


def softmax_contractions(graph: list[UOp], outputs: list[UOp]) -> dict[UOp, frozenset]:
    """{contraction: the nodes of the softmax it reads} for each contraction of `graph` (kernel_roots' walk) that
    reads a softmax row along its reduced axis, where no other kernel and no output reads the row or its reductions
    (the elementwise nodes others read too, a RoPE table's row, are left out)."""
    readers_of: dict[UOp, set] = {}
    for node in graph:
        for s in node.src:
            readers_of.setdefault(s, set()).add(node)
    for out in outputs:
        readers_of.setdefault(out, set()).add(None)
    in_loops = {n for node in graph if node.op is Ops.LOOP
                for n in UOp(Ops.SINK, node.dtype, node.arg.body_roots).toposort()}
    found = {}
    for c in graph:
        if c in in_loops or not (c.op is Ops.REDUCE_AXIS and c.arg[0] is Ops.ADD and len(c.arg[1]) == 1 and c.src[0].op is Ops.MUL
                and c.arg[1][0] == len(c.src[0].shape) - 1):
            continue
        for side in c.src[0].src:
            p = _grown_from(side)
            other = c.src[0].src[1] if side is c.src[0].src[0] else c.src[0].src[0]
            nodes = _softmax(p) if p is not None and _reuse(c, other) <= MAX_ROWS_A_VALUE and _columns(
                c, p) <= MAX_COLUMNS else None
            inside = (nodes or set()) | {c} | _path(side, p)
            if nodes and all(inside.issuperset(readers_of.get(n, ())) for n in nodes
                             if n is p or n.op is Ops.REDUCE_AXIS):
                found[c] = frozenset(n for n in nodes if inside.issuperset(readers_of.get(n, ())))
                break
    return found


def _elements(node: UOp) -> int:
    return math.prod(_elements_of(d) for d in node.shape)


def _reuse(c: UOp, other: UOp) -> int:
    """How many times the contraction `c` reads each element of its `other` operand (below its broadcasts)."""
    base = other
    while base.op in (*_GROWS, Ops.PERMUTE):
        base = base.src[0]
    return _elements(c.src[0]) // _elements(base)


def _columns(c: UOp, p: UOp) -> int:
    """Outputs of the contraction `c` a row of the softmax `p` gives."""
    return _elements(c) * _elements_of(p.shape[-1]) // _elements(p)


def _elements_of(d) -> int:
    return d if isinstance(d, int) else max(1, d.vmax)


def _grown_from(side: UOp) -> UOp | None:
    """The elementwise value `side` broadcasts through reshapes adding size-1 axes and expands of those (p (h, t) read
    as (h, 1, t) -> (h, d, t) by p @ V), or None."""
    n = side
    while n.op in _GROWS:
        n = n.src[0]
    if n.op not in ELEMENTWISE or not n.shape or side.shape[-1] != n.shape[-1]:
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


def _softmax(p: UOp) -> set | None:
    """The nodes of the softmax row `p`: the values of its shape it computes from (elementwise, broadcasts), the
    reductions along its last axis it reads broadcast (walked into: their operands are rows too) and the scores
    (reductions it reads whose other axes are its own: not walked into, their operands are the kernel's reads); None
    where `p` reads no row reduction or a row longer than SOFTMAX_ROW_MAX."""
    last = p.shape[-1]
    if (last if isinstance(last, int) else last.vmax) > SOFTMAX_ROW_MAX:
        return None
    nodes, stack, rows = set(), [p], 0
    while stack:
        n = stack.pop()
        if n in nodes:
            continue
        if n.op is Ops.REDUCE_AXIS:
            if _row_reduction(n, p):
                rows += 1
                nodes.add(n)
                stack.extend(n.src)
            elif _kept(n.shape) == _kept(p.shape):
                nodes.add(n)
        elif n.shape == p.shape and (n.op in ELEMENTWISE or n.op in _GROWS):
            nodes.add(n)
            stack.extend(n.src)
    return nodes if rows else None


def _row_reduction(n: UOp, p: UOp) -> bool:
    """Whether reduction `n` reduces the last axis of a value of `p`'s shape, keeping the others (a row's max, sum)."""
    return n.src[0].shape == p.shape and n.arg[1] == (len(p.shape) - 1,)
