"""A multi-device function's traced graph cut into stages at its collectives, and which outputs vary.

A collective's result is a placeholder leaf (tracing/collectives.py) standing for what the replicas compute
together, so the graph around it splits into what runs before it and what runs after. A node's level is how
many collectives lie on its deepest path from the arguments: stage t computes the nodes of level t, and the
collectives whose source has level t run after it, before stage t + 1. Every stage is a plan of its own (a
PlanSpec instantiated on each replica's device); its inputs are arguments, collective results and values of
earlier stages. An earlier value a later stage needs is handed over when it is worth keeping (a reduction, a
gather, a scatter or a loop went into it) and recomputed from the arguments otherwise (views, elementwise).

Outputs follow shard_map's out_specs with JAX's replication check: an output that depends on a split argument
or on `device_index()` other than through a collective varies across replicas (the call concatenates the
replicas' values along the split axis); any other output is the same on every replica (returned once).
"""
from __future__ import annotations

import attrs

from ..errors import TraceError
from ..tracing.core import Traced
from ..uop import Ops, UOp
from ..uop.uop import children_first

KEPT = (Ops.REDUCE_AXIS, Ops.GATHER, Ops.SCATTER, Ops.LOOP, Ops.LOOP_OUT)  # worth handing over between stages


@attrs.frozen
class Stage:
    """The nodes one stage computes (a Traced over its own inputs, or None when it computes nothing), the env
    key of each input and output, and the collectives that run after it."""

    traced: Traced | None
    in_keys: tuple = ()
    out_keys: tuple = ()
    collectives: tuple = ()


def _children(node: UOp, sources: dict) -> list:
    kids = list(node.src)
    if node.op is Ops.LOOP:
        kids += list(node.arg.body_roots)
    if node in sources:
        kids.append(sources[node].source)
    return kids


def levels(traced: Traced, collectives: list) -> tuple[dict, list]:
    """(node -> level over the whole graph, the collectives the outputs reach, in trace order)."""
    sources = {c.result: c for c in collectives}
    roots = list(traced.outputs) + [f for f, _ in traced.flags]
    order = children_first(roots, lambda n: _children(n, sources))
    level = {}
    for node in order:
        if node in sources:
            level[node] = level[sources[node].source] + 1
        else:
            level[node] = max((level[c] for c in _children(node, sources)), default=0)
    reached = [c for c in collectives if c.result in level]
    for c in collectives:  # those the outputs do not reach too: a gradient through one would be silently zero
        if any(n.op is Ops.CARRY for n in c.source.toposort()):
            where = "a function pj.grad / pj.vjp differentiates" if any(
                n.op is Ops.CARRY and isinstance(n.arg[0], tuple) for n in c.source.toposort()) else \
                "the body of a loop (fori_loop, scan, while_loop) or a function pj.vmap maps"
            raise TraceError(f"pj.{c.kind} inside {where} is not supported: take the collective outside it (for "
                             "data-parallel training, take the gradient locally and pj.pmean the gradients)")
    return level, reached


def partition(traced: Traced, collectives: list, index: UOp | None = None) -> list[Stage]:
    """The stages of `traced` (its outputs and gather flags), cut at the collectives' results; `index` is
    device_index()'s leaf."""
    level, reached = levels(traced, collectives)
    sources = {c.result for c in reached}
    inputs = set(traced.inputs) | sources | {index}
    roots = list(traced.outputs) + [f for f, _ in traced.flags]
    last = max((level[r] for r in roots), default=0)
    wanted = [dict() for _ in range(last + 1)]  # per stage: the nodes it must output (ordered)
    for r in traced.outputs:
        wanted[level[r]][r] = None
    for c in reached:
        if c.source.op is not Ops.INPUT:
            wanted[level[c.source]][c.source] = None
    keep = _worth_keeping(level)
    stages = [None] * (last + 1)
    for t in range(last, -1, -1):
        flags = [(f, what) for f, what in traced.flags if level[f] == t]
        outs = list(wanted[t])
        if not outs and not flags:
            stages[t] = Stage(None)
            continue
        handed = {}  # an earlier stage's node -> the leaf standing for it here

        def children(n):
            if n.op is Ops.INPUT or n.op is Ops.LOOP:  # a loop at this level is computed whole (its body too)
                return [] if n.op is Ops.INPUT else list(n.src)
            kids = []
            for c in n.src:
                if level[c] < t and c.op is not Ops.INPUT and c in keep:
                    if c not in handed:
                        handed[c] = UOp(Ops.INPUT, c.dtype, (), (("stage", t, len(handed)), tuple(c.shape)))
                        wanted[level[c]][c] = None
                else:
                    kids.append(c)
            return kids
        children_first(outs + [f for f, _ in flags], children)
        sub = dict(handed)
        outputs = tuple(o.substitute(sub) for o in outs)
        flag_nodes = tuple((f.substitute(sub), what) for f, what in flags)
        leaves = [n for n in children_first(list(outputs) + [f for f, _ in flag_nodes],
                                        lambda n: _children(n, {})) if n.op is Ops.INPUT]
        back = {v: k for k, v in handed.items()}
        for leaf in leaves:
            if leaf not in back and leaf not in inputs:
                raise TraceError("a value of the traced function could not be placed before or after its "
                                 "collectives (an INPUT the stage cannot read); please report it")
        in_keys = tuple(back.get(leaf, leaf) for leaf in leaves)
        # every stage's bounds proof may assume the index constraints (each call checks them first)
        stages[t] = Stage(Traced(tuple(leaves), outputs, None, tuple(traced.constraints), flag_nodes), in_keys,
                          tuple(outs))
    return [attrs.evolve(s, collectives=tuple(c for c in reached if level[c.source] == t))
            for t, s in enumerate(stages)]


def _worth_keeping(level: dict) -> set:
    """The nodes whose subgraph holds work worth computing once (KEPT ops): handed over, not recomputed."""
    heavy = set()
    for node in level:  # in postorder: children first
        if node.op in KEPT or any(s in heavy for s in node.src):
            heavy.add(node)
    return heavy


def varying(traced: Traced, split_inputs: set, split_vars: set, index: UOp | None, collectives: list) -> list[bool]:
    """Per output: whether it differs across replicas: it reads a split input, device_index() or a var of a
    split dim (each replica's own size), or has such a var in its shape, other than through a collective's
    result. (The caller leaves out of `split_vars` the vars a collective's argument has in its shape: every
    call checks them equal on all replicas.)"""
    results = {c.result for c in collectives}

    def sized(node: UOp) -> bool:
        return any(v.arg[0] in split_vars for d in node.shape if isinstance(d, UOp) for v in d.variables())
    marks = {}
    for node in children_first(list(traced.outputs), lambda n: [] if n in results else _children(n, {})):
        if node in results:
            marks[node] = False
        elif node.op is Ops.INPUT:
            marks[node] = node in split_inputs or node is index
        elif node.op is Ops.DEFINE_VAR:
            marks[node] = node.arg[0] in split_vars
        else:
            marks[node] = sized(node) or any(marks[c] for c in _children(node, {}))
    return [marks[o] for o in traced.outputs]
