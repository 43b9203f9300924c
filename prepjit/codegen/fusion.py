"""Fusion decisions: which elementwise values to materialise instead of inlining into every reader, and
which reductions to compute inside the one kernel that reads them.

Inlining an elementwise value into a kernel that reads it computes the value once for every
iteration of that kernel that reaches it. That is free when each value is computed once (one reader,
no broadcast), and costs recomputation when several kernels read it or one kernel reads each value
many times: a contraction operand is read once per output column, a value broadcast into a
reduction once per broadcast element. Fusion counts those evaluations (each reader's iterations),
and a value is materialised (computed once into a buffer) when the recomputation it saves outweighs
writing it and reading it back, or when inlining it would make kernels grow without bound (a Python
loop chaining reductions recomputes the whole chain in every kernel otherwise).

A reduction read by exactly one kernel, element for element (through elementwise ops and reshapes
only: a bias and an activation after a matmul, a reshape of a sum), is computed inside that kernel:
its reader stores `f(reduce(...))` directly, without a buffer and a pass of its own.
"""
from __future__ import annotations

from ..uop import Ops, UOp
from ..uop.ops import ELEMENTWISE
from .lower import REALIZED

MEMORY_COST = 6        # ops-equivalent of writing an element and reading it back once
LAUNCH_COST = 2000     # ops-equivalent of one more kernel launch
MAX_INLINE_COST = 256  # a value this costly is materialised whenever two kernels read it
OP_COST = {Ops.EXP: 4, Ops.EXP2: 4, Ops.LOG: 8, Ops.LOG2: 8, Ops.SQRT: 2, Ops.FDIV: 2, Ops.IDIV: 8, Ops.MOD: 8,
           Ops.SIN: 16, Ops.COS: 16, Ops.TANH: 24, Ops.ERF: 24, Ops.POW: 24, Ops.ATAN2: 32}  # ops-equivalents; others cost 1


def _elements(node: UOp) -> int:
    size = 1
    for d in node.shape:
        size *= d if isinstance(d, int) else max(0, d.vmax)
    return max(size, 1)


def _iterations(root: UOp) -> int:
    """Iterations of the kernel computing `root`: its elements, times the reduced ones for a reduction."""
    return _elements(root.src[0] if root.op is Ops.REDUCE_AXIS else root)


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
    for node in reversed(graph):  # children first: inline cost (its ops and loads), ignoring later cuts
        inline = [1 if s.op in REALIZED else cost[s] for s in node.src if s.op in REALIZED or s in cost]
        own = OP_COST.get(node.op, 1) if node.op in ELEMENTWISE else 0
        cost[node] = min(10**9, own + sum(inline))
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
    if not readers:
        return False
    c, size = cost[node], _elements(node)
    if len(readers) >= 2 and c >= MAX_INLINE_COST:
        return True
    evaluations = sum(_iterations(r) for r in readers)  # inlined: each costs c; materialised: one load
    return (c - 1) * evaluations > (c + MEMORY_COST) * size + LAUNCH_COST


def fused_reductions(outputs: list[UOp], materialized: set[UOp]) -> set[UOp]:
    """The reductions computed inside their only reader's kernel (see the module docstring)."""
    graph, roots = kernel_roots(outputs)
    explicit = set(roots) - {n for n in roots if n.op is Ops.REDUCE_AXIS} | set(outputs)
    in_loops = {n for node in graph if node.op is Ops.LOOP
                for n in UOp(Ops.SINK, node.dtype, node.arg.body_outputs).toposort()}
    reads: dict[UOp, list] = {}  # reduction -> [(reader root, whether it reads it element for element)]
    for root in dict.fromkeys(roots + sorted(materialized, key=graph.index)):
        for red, direct in _reductions_read(root, materialized):
            reads.setdefault(red, []).append((root, direct))
    fused = set()
    for red, readers in reads.items():
        root = readers[0][0]
        if red in explicit or red in in_loops or root in in_loops or root.op is Ops.REDUCE_AXIS:
            continue
        if all(r is root and direct for r, direct in readers):
            fused.add(red)
    return fused


def _reductions_read(root: UOp, materialized: set[UOp]) -> list[tuple[UOp, bool]]:
    """The reductions the kernel computing `root` reads, each with whether a path reaches it through more
    than elementwise ops and reshapes (False: then some of its values are read more than once, or not at all)."""
    out, seen, stack = [], set(), [(root, root.op is not Ops.REDUCE_AXIS)]
    while stack:
        n, direct = stack.pop()
        if (n, direct) in seen:
            continue
        seen.add((n, direct))
        if n is not root and n.op is Ops.REDUCE_AXIS:
            out.append((n, direct))
        if n is root or not (n.op in REALIZED or n in materialized):
            keep = direct and (n.op in ELEMENTWISE or n.op is Ops.RESHAPE)
            stack.extend((s, keep) for s in n.src)
    return out
