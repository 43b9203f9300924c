"""The primitive table: per traced-graph op, the rules that transformations read (our `lax` primitives).

A traced graph is UOps; each op that can appear in one has a `Primitive` here, registered by the family module
that builds it (pointwise.py, reduction.py, movement.py, gathering.py), beside its builder; SCATTER's rule sits
beside GATHER's in gathering.py (each is the other's transpose), the LOOP's in autodiff_loop.py, and the batching
rules in batching.py. Transformations are lookups in this table, never rewrites keyed on ops elsewhere:

- `vjp(ct, node) -> tuple`: reverse mode (autodiff.py). `ct` is the cotangent of `node` (a Tracer of its shape
  and dtype; for LOOP, whose results are its LOOP_OUTs, a dict carry index -> cotangent); the result has one
  cotangent (a Tracer, or None for none) per operand of `node`.
- `operands(node) -> tuple[UOp, ...]`: what `vjp`'s results are for; `node.src` unless the op reads values its
  sources do not show (a loop body reads arrays from outside the loop).
- `selective`: True when `vjp` takes a third argument, per operand whether its cotangent is wanted (for rules
  whose cost grows with every operand: a loop's backward loop computes only the wanted ones).
- `batch`: the slot for vmap's batching rule (filled by the batching transformation; None until then).

An op with no `vjp` (comparisons, integer arithmetic, rounding, leaves) passes no cotangent on: its result is
piecewise constant or not a real number, as in JAX.
"""
from __future__ import annotations

from typing import Callable

import attrs

from ...errors import TraceError
from ...uop import Ops, UOp


@attrs.define
class Primitive:
    """The rules of one traced-graph op."""

    op: Ops
    vjp: Callable | None = None
    operands: Callable[[UOp], tuple] = lambda node: node.src
    selective: bool = False
    batch: Callable | None = None

    def def_vjp(self, rule: Callable) -> Callable:
        """Decorator: register `rule(ct, node) -> cotangents per operand` as this op's reverse-mode rule."""
        self.vjp = rule
        return rule


_table: dict[Ops, Primitive] = {}


def primitive(op: Ops) -> Primitive:
    """The (one) Primitive of `op`, created empty on first use so that a family module can fill it."""
    p = _table.get(op)
    if p is None:
        p = _table[op] = Primitive(op)
    return p


def rules(op: Ops) -> Primitive:
    """The registered Primitive of `op`; an op no family registered is a bug in the tracer, said plainly."""
    p = _table.get(op)
    if p is None:
        raise TraceError(f"no primitive rules are registered for {op.name}: it cannot be differentiated")
    return p
