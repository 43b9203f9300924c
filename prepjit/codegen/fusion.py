"""Fusion decisions: which elementwise values to materialise instead of inlining into every reader.

Inlining an elementwise value into each kernel that reads it is free when one kernel reads it,
and costs recomputation when several do. A value is materialised (computed once into a buffer)
when the recomputation it saves outweighs writing and re-reading it, or when inlining it would
make kernels grow without bound (a Python loop chaining reductions recomputes the whole chain
in every kernel otherwise).
"""
from __future__ import annotations

from ..uop import Ops, UOp
from ..uop.ops import ELEMENTWISE
from .lower import REALIZED

MEMORY_COST = 4        # ops-equivalent of writing an element and reading it back, per reader
LAUNCH_COST = 2000     # ops-equivalent of one more kernel launch
MAX_INLINE_COST = 256  # a value this costly is materialised whenever two kernels read it


def _elements(node: UOp) -> int:
    size = 1
    for d in node.shape:
        size *= d if isinstance(d, int) else max(0, d.vmax)
    return max(size, 1)


def kernel_roots(outputs: list[UOp]) -> tuple[list[UOp], list[UOp]]:
    """(all graph nodes parents-first, the nodes some kernel computes: outputs, reductions, loop results)."""
    roots = list(outputs)
    for node in UOp(Ops.SINK, outputs[0].dtype, tuple(outputs)).toposort() if outputs else []:
        if node.op is Ops.LOOP:
            roots += list(node.src) + list(node.arg.body_outputs)
    graph = UOp(Ops.SINK, outputs[0].dtype, tuple(roots)).toposort()[::-1] if roots else []
    roots += [n for n in graph if n.op is Ops.REDUCE_AXIS]
    return graph, roots


def choose_materialized(outputs: list[UOp]) -> set[UOp]:
    graph, roots = kernel_roots(outputs)
    is_root = set(roots)
    cost: dict[UOp, int] = {}
    for node in reversed(graph):  # children first: inline cost, ignoring later cuts (an over-estimate)
        inline = [cost[s] for s in node.src if s.op not in REALIZED and s in cost]
        cost[node] = min(10**9, (1 if node.op in ELEMENTWISE else 0) + sum(inline))
    chosen: set[UOp] = set()
    readers: dict[UOp, set] = {}  # node -> the kernel roots whose kernels compute it inline
    for node in graph:  # parents first, so a node's readers are final when it is reached
        mine = readers.get(node, set())
        if node.op in ELEMENTWISE and node not in is_root and node.shape and _worth_materialising(node, mine, cost):
            chosen.add(node)
            mine = set()
        passes = {node} if node in is_root or node in chosen else mine
        for s in node.src:
            if s.op not in REALIZED:
                readers.setdefault(s, set()).update(passes)
    return chosen


def _worth_materialising(node: UOp, readers: set, cost: dict) -> bool:
    k = len(readers)
    if k < 2:
        return False
    c = cost[node]
    return c >= MAX_INLINE_COST or (k - 1) * c * _elements(node) > MEMORY_COST * k * _elements(node) + LAUNCH_COST
