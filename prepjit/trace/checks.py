"""What a trace records beside its graph: index constraints on the vars, and range flags of gathers.

`require(lhs, rhs, ...)` records `lhs < rhs` (or `<=`) for an index that depends on vars: dropped when
the var bounds prove it, an IndexBoundError at once when they refute it, else kept for the plan to check
on every call. A constraint on a fori_loop counter must hold for every iteration: it is checked at the
counter's first and last value (indices are linear in it), or at each value otherwise.

`flag(bad, what)` records a 0-d bool tracer that is true when a gather read an out-of-range id; the
trace returns it as an extra output and the plan raises IndexBoundError when a call sets it. Flags
raised inside a fori_loop body are carried out of the loop (see `loop_body`).
"""
from __future__ import annotations

import contextlib
import threading

from ..errors import IndexBoundError, TraceError
from ..uop import Ops, UOp, as_uop, simplify
from ..uop.constraint import IndexConstraint, constraint
from ..uop.symbolic import poly

MAX_ENUMERATED = 4096  # loop counter values a non-linear constraint is checked at, one by one

_local = threading.local()  # .scopes: the innermost recording scope last


class _Scope:
    def __init__(self, constraints: list):
        self.constraints = constraints          # shared with the enclosing scope: they all reach the plan
        self.flags: list[tuple[object, str]] = []


def _scopes() -> list:
    if not hasattr(_local, "scopes"):
        _local.scopes = []
    return _local.scopes


@contextlib.contextmanager
def recording(leaf_var_names: set):
    """Around a whole trace: yields the scope; on exit its constraints are made loop-counter free."""
    scope = _Scope([])
    _scopes().append(scope)
    try:
        yield scope
    finally:
        _scopes().pop()
    scope.constraints[:] = [c for raw in scope.constraints for c in _for_every_iteration(raw, leaf_var_names)]


@contextlib.contextmanager
def loop_body():
    """Around a fori_loop body: yields the scope whose `flags` the loop must carry out."""
    outer = _scopes()[-1] if _scopes() else _Scope([])
    scope = _Scope(outer.constraints)
    _scopes().append(scope)
    try:
        yield scope
    finally:
        _scopes().pop()


def record_flag(flag, what: str):
    """Record a 0-d bool tracer that is true when the call is out of range (`what` names the gather)."""
    if _scopes():
        _scopes()[-1].flags.append((flag, what))


def require(lhs, rhs, strict: bool, what: str, text: str | None = None, error_kind: str = "index"):
    """Record `lhs < rhs` (strict) or `lhs <= rhs` for an index that may depend on vars (`text` spells it;
    `error_kind` as IndexConstraint's)."""
    c = constraint(as_uop(lhs), as_uop(rhs), strict, what)
    c = IndexConstraint(c.cond, text or c.text, what, error_kind)
    cond = simplify(c.cond)
    if _decided(cond, c) or not _scopes():
        return
    _scopes()[-1].constraints.append(IndexConstraint(cond, c.text, what, error_kind))


def _decided(cond: UOp, c: IndexConstraint) -> bool:
    """True when the var bounds prove `cond`; raises when they refute it; False when calls must check it."""
    if cond.op is Ops.CONST and cond.arg or cond.vmin is True:
        return True
    if cond.op is Ops.CONST or cond.vmax is False:
        bounds = ", ".join(f"{v.arg[0]} in [{v.arg[1]}, {v.arg[2]}]" for v in c.cond.variables())
        if c.error_kind == "empty":
            raise ValueError(f"{c.what}: {c.text} never holds" + (f" ({bounds})" if bounds else ""))
        raise IndexBoundError(f"{c.what} is out of bounds: {c.text} never holds" + (f" ({bounds})" if bounds else ""))
    return False


def _for_every_iteration(c: IndexConstraint, leaf_var_names: set) -> list[IndexConstraint]:
    """`c` with each fori_loop counter (a var no argument gives) replaced by the values it takes."""
    out = [c]
    for v in c.cond.variables():
        name, lo, hi = v.arg
        if name in leaf_var_names:
            continue
        nxt = []
        for k in out:
            linear = k.cond.op is Ops.CMPLT and all(m == (v,) or v not in m
                                                    for m in poly(simplify(k.cond.src[1] - k.cond.src[0])))
            values = (lo, hi) if linear or hi == lo else range(lo, hi + 1)
            if len(values) > MAX_ENUMERATED:
                raise TraceError(f"{c.what}: the index is not linear in the loop counter {name}, and its "
                                 f"{hi - lo + 1} values are too many to check one by one")
            for value in values:
                cond = simplify(k.cond.substitute({v: UOp.const(value)}))
                each = IndexConstraint(cond, f"{k.text} for {name} = {value}", k.what, k.error_kind)
                if not _decided(cond, each):
                    nxt.append(each)
        out = list(dict.fromkeys(nxt))
    return out
