"""Reverse mode through pj.fori_loop: the LOOP primitive's rules.

A differentiated loop is replaced (in the value and the gradient alike, so it runs once) by a version that also
keeps its carries per iteration: one more carry per carry the body reads, of shape (trip count, *carry shape),
whose row k - lower is set at iteration k. The backward pass is a second loop, over the iterations in reverse:
at iteration k it recomputes the body from the kept carries, runs the body's own backward pass on the cotangent
carries and adds the cotangents of the values the body reads from outside the loop (weights, data) into
accumulator carries. Its var counts up, as every loop's does, and iteration k is `lower + upper - 1 - var`; like
the forward loop its kernels compile once and the plan holds them once per iteration.

The carries kept cost (trip count x carry size) memory; each iteration writes its row of the history in place
(`history.at[k - lower].set(carry)`, a scatter the schedule runs on the carry's one buffer).
"""
from __future__ import annotations

import itertools
import weakref

import attrs

from ..errors import TraceError
from ..uop import Ops, UOp, simplify
from ..uop.uop import _arg_uops
from . import prims
from .autodiff import backward, operands, placeholder, substitute, zeros_like
from .loop import LoopInfo
from .prims.registry import primitive
from .tracer import Tracer
from .core import reserved_var_name

_ids = itertools.count()
_histories: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # LOOP -> (its history version, rows)
_frontiers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # LOOP -> frontier (see loop_frontier)


def loop_frontier(loop: UOp) -> tuple:
    """The values from outside the loop its body reads: the loop-invariant nodes nearest the body's outputs
    (found through the operands of nested loops too)."""
    hit = _frontiers.get(loop)
    if hit is not None:
        return hit
    info = loop.arg
    inner = set(info.carries) | {info.var}
    variant: dict = {}

    def is_variant(node: UOp) -> bool:
        stack = [node]
        while stack:
            n = stack[-1]
            if n in variant:
                stack.pop()
                continue
            kids = [k for k in (*n.src, *_arg_uops(n.arg)) if k not in variant]
            if n in inner:
                variant[n] = True
            elif kids:
                stack.extend(kids)
                continue
            else:
                variant[n] = any(variant[k] for k in (*n.src, *_arg_uops(n.arg)))
            stack.pop()
        return variant[node]

    found, seen, stack = [], set(), list(info.body_outputs)
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if not is_variant(n):
            found.append(n)
        elif n not in inner:
            stack.extend(operands(n))
    _frontiers[loop] = out = tuple(found)
    return out


def _read_carries(info: LoopInfo) -> list[int]:
    """The carries the float results of the body read (those the backward pass needs per iteration)."""
    floats = [o for o, c in zip(info.body_outputs, info.carries) if c.dtype.is_float]
    reached = set()
    stack, seen = list(floats), set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op is Ops.CARRY:
            reached.add(n)
        stack.extend((*n.src, *_arg_uops(n.arg)))
    return [j for j, c in enumerate(info.carries) if c in reached]


def with_history(loop: UOp, build: bool = True):
    """(the version of `loop` that keeps its carries, {carry index: its history's carry index}), built once."""
    hit = _histories.get(loop)
    if hit is not None or not build:
        return hit
    info = loop.arg
    if info.dynamic:  # as in JAX: reverse mode needs a trip count known while tracing
        raise TraceError("pj.grad through a pj.while_loop, or a pj.fori_loop / pj.scan whose bounds are vars, is "
                         "not supported: reverse mode needs a trip count known while tracing (use static bounds)")
    trips = info.upper - info.lower
    row = simplify(info.var - info.lower)
    hid = ("vjp-history", next(_ids))
    carries, outs, inits, rows = list(info.carries), list(info.body_outputs), list(loop.src), {}
    for j in _read_carries(info):
        c = info.carries[j]
        shape = (trips, *c.shape)
        h = UOp(Ops.CARRY, c.dtype, (), (hid, j, shape))
        new = Tracer(h).at[row].set(Tracer(c))  # a row written in place (the schedule keeps one buffer)
        rows[j] = len(carries)
        carries.append(h)
        outs.append(new.uop)
        inits.append(zeros_like(h).uop)
    kept = UOp(Ops.LOOP, loop.dtype, tuple(inits), attrs.evolve(info, carries=tuple(carries), body_outputs=tuple(outs)))
    _histories[loop] = out = (kept, rows)
    return out


def _carry_at(kept: UOp, row_index: int, carry: UOp, row: UOp) -> Tracer:
    """The value `carry` had at the iteration whose history row is `row` (symbolic)."""
    history = Tracer(UOp(Ops.LOOP_OUT, carry.dtype, (kept,), row_index))
    spec = [(row, 1, 1)] + [(0, 1, d) for d in carry.shape]
    return prims.reshape(prims.shrink(history, spec), carry.shape)


def _loop_vjp(cts: dict, loop: UOp, wanted: tuple):
    info = loop.arg
    n = len(info.carries)
    frontier = loop_frontier(loop)
    kept, rows = with_history(loop)
    floats = [j for j, c in enumerate(info.carries) if c.dtype.is_float]
    reads = [f for f, w in zip(frontier, wanted[n:]) if w]
    taken = {v.arg[0] for u in (*info.body_outputs, *frontier) for v in u.variables()} | {info.var.arg[0]}
    with reserved_var_name(f"{info.var.arg[0]}_vjp", taken) as name:
        var = UOp.variable(name, info.lower, info.upper - 1)
    step = simplify(UOp.const(info.lower + info.upper - 1) - var)  # the forward iteration this one undoes
    row = simplify(UOp.const(info.upper - 1) - var)
    bid = ("vjp-loop", next(_ids))
    ct_carries = [UOp(Ops.CARRY, info.carries[j].dtype, (), (bid, i, info.carries[j].shape))
                  for i, j in enumerate(floats)]
    acc_carries = [UOp(Ops.CARRY, f.dtype, (), (bid, len(floats) + i, f.shape)) for i, f in enumerate(reads)]
    stand_ins = {info.carries[j]: placeholder(Tracer(info.carries[j])).uop for j in rows}
    body = substitute([info.body_outputs[j] for j in floats], {**stand_ins, info.var: step})
    targets = [stand_ins[info.carries[j]] for j in floats if info.carries[j] in stand_ins] + list(reads)
    found = dict(zip(targets, backward(body, [Tracer(c) for c in ct_carries], targets)))
    outs = []
    for j, c in zip(floats, ct_carries):
        g = found.get(stand_ins.get(info.carries[j]))
        outs.append((g if g is not None else zeros_like(c)).uop)
    for f, acc in zip(reads, acc_carries):
        g = found.get(f)
        outs.append(acc if g is None else prims.elementwise(Ops.ADD, Tracer(acc), g).uop)
    at = {s: _carry_at(kept, rows[j], info.carries[j], row).uop for j, s in
          ((j, stand_ins[info.carries[j]]) for j in rows)}
    outs = substitute(outs, at)
    inits = [prims.cast(cts[j], info.carries[j].dtype).uop if j in cts else zeros_like(info.carries[j]).uop
             for j in floats] + [zeros_like(f).uop for f in reads]
    back = UOp(Ops.LOOP, inits[0].dtype, tuple(inits), LoopInfo(var, info.lower, info.upper,
                                                                tuple(ct_carries + acc_carries), tuple(outs)))
    result = [None] * (n + len(frontier))
    for i, j in enumerate(floats):
        result[j] = Tracer(UOp(Ops.LOOP_OUT, info.carries[j].dtype, (back,), i))
    at_read = {f: i for i, f in enumerate(reads)}
    for m, f in enumerate(frontier):
        if f in at_read:
            result[n + m] = Tracer(UOp(Ops.LOOP_OUT, f.dtype, (back,), len(floats) + at_read[f]))
    return tuple(result)


_loop = primitive(Ops.LOOP)
_loop.operands = lambda node: (*node.src, *loop_frontier(node))
_loop.selective = True
_loop.def_vjp(_loop_vjp)
primitive(Ops.LOOP_OUT)  # one output of a LOOP: the backward pass collects its cotangent for the LOOP's rule
