"""What a trace records beside its graph: index constraints on the vars, and range flags of gathers.

`require(lhs, rhs, ...)` records `lhs < rhs` (or `<=`) for an index that depends on vars: dropped when
the var bounds prove it, an IndexBoundError at once when they refute it, else kept for the plan to check
on every call. A constraint on a fori_loop counter must hold for every iteration: it is checked at the
counter's first and last value (indices are linear in it), or at each value otherwise. A loop whose bounds
are var expressions checks it at those expressions (`i < n` in `fori_loop(0, n, ...)` holds for i = n - 1),
unless the call's count is 0.

`flag(bad, what)` records a 0-d bool tracer that is true when a gather read an out-of-range id; the
trace returns it as an extra output and the plan raises IndexBoundError when a call sets it. Flags
raised inside a fori_loop body are carried out of the loop (see `loop_body`).
"""
from __future__ import annotations

import contextlib
import threading

from ..errors import IndexBoundError, TraceError
from ..uop import Ops, UOp, as_uop, dtypes, simplify
from ..uop.constraint import IndexConstraint, constraint
from ..uop.symbolic import poly

MAX_ENUMERATED = 4096  # loop counter values a non-linear constraint is checked at, one by one

_local = threading.local()  # .scopes: the innermost recording scope last


class _Scope:
    def __init__(self, constraints: list, counters: dict, leaf_names=frozenset()):
        self.constraints = constraints          # shared with the enclosing scope: they all reach the plan
        self.counters = counters                # loop var -> (lower, upper) of loops with var bounds (shared)
        self.leaf_names = leaf_names            # the vars calls give (not loop counters)
        self.flags: list[tuple[object, str]] = []


def _scopes() -> list:
    if not hasattr(_local, "scopes"):
        _local.scopes = []
    return _local.scopes


@contextlib.contextmanager
def recording(leaf_var_names: set):
    """Around a whole trace: yields the scope; on exit its constraints are made loop-counter free."""
    scope = _Scope([], {}, frozenset(leaf_var_names))
    _scopes().append(scope)
    try:
        yield scope
    finally:
        _scopes().pop()
    scope.constraints[:] = [c for raw in scope.constraints
                            for c in for_every_iteration(raw, leaf_var_names, scope.counters)]


@contextlib.contextmanager
def loop_body(counter=None):
    """Around a loop body: yields the scope whose `flags` the loop must carry out. `counter`: (loop var, lower,
    upper) of a fori_loop whose bounds are var expressions."""
    outer = _scopes()[-1] if _scopes() else _Scope([], {})
    scope = _Scope(outer.constraints, outer.counters, outer.leaf_names)
    if counter is not None:
        scope.counters[counter[0]] = counter[1:]
    _scopes().append(scope)
    try:
        yield scope
    finally:
        _scopes().pop()


@contextlib.contextmanager
def discarded():
    """Around a trace whose graph is dropped (a branch a static predicate does not take, a probe of a body's
    result shapes): what it records is dropped too."""
    outer = _scopes()[-1] if _scopes() else _Scope([], {})
    scope = _Scope([], outer.counters, outer.leaf_names)
    _scopes().append(scope)
    try:
        yield scope
    finally:
        _scopes().pop()


def only_when_run(scope, start: int, lower, upper) -> list[UOp]:
    """The constraints `scope` recorded from `start` on that name only the call's vars (an index in a body of a
    loop over var bounds [lower, upper) that does not depend on its counter), made to hold only when the loop
    runs at all (`when_run`); returns their conditions, which the loop's kernels may assume."""
    facts, kept = [], []
    for c in scope.constraints[start:]:
        if all(v.arg[0] in scope.leaf_names for v in c.cond.variables()):
            facts.append(c.cond)
            c = IndexConstraint(when_run(c.cond, lower, upper), f"{c.text} (when the loop runs)", c.what, c.error_kind)
        kept.append(c)
    scope.constraints[start:] = kept
    return facts


def when_run(cond: UOp, lower, upper) -> UOp:
    """`cond`, or a loop over [lower, upper) that does not run."""
    return simplify(UOp(Ops.OR, dtypes.bool, (_empty(as_uop(lower), as_uop(upper)), cond)))


def _empty(lower: UOp, upper: UOp) -> UOp:
    return UOp(Ops.CMPLT, dtypes.bool, (upper, lower + 1))


def record_flag(flag, what: str):
    """Record a 0-d bool tracer that is true when the call is out of range (`what` names the gather)."""
    if _scopes():
        _scopes()[-1].flags.append((flag, what))


def require(lhs, rhs, strict: bool, what: str, text: str | None = None, error_kind: str = "index"):
    """Record `lhs < rhs` (strict) or `lhs <= rhs` for an index that may depend on vars (`text` spells it;
    `error_kind` as IndexConstraint's)."""
    c = constraint(as_uop(lhs), as_uop(rhs), strict, what)
    require_cond(c.cond, what, text or c.text, error_kind)


def require_cond(cond: UOp, what: str, text: str, error_kind: str = "index"):
    """Record a bool expression over vars that every call must meet (one `require` cannot spell: a disjunction)."""
    c = IndexConstraint(cond, text, what, error_kind)
    cond = simplify(cond)
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


def for_every_iteration(c: IndexConstraint, leaf_var_names: set, counters: dict) -> list[IndexConstraint]:
    """`c` with each fori_loop counter (a var no argument gives) replaced by the values it takes (bounds of a
    loop over var expressions may name an outer loop's counter: replaced until none is left)."""
    out = [c]
    while True:
        pending = [v for k in out for v in k.cond.variables() if v.arg[0] not in leaf_var_names]
        if not pending:
            return out
        v = pending[0]
        out = list(dict.fromkeys(e for k in out for e in (_each_value(k, v, counters.get(v))
                                                           if v in k.cond.variables() else [k])))


def _linear(cond: UOp, v: UOp) -> bool:
    """True when `cond` holds for every value of v in an interval iff it holds at both ends: a bound linear in v,
    an `and` of such, or an `or` of one with a part free of v."""
    if cond.op is Ops.AND:
        return all(_linear(s, v) for s in cond.src)
    if cond.op is Ops.OR:
        a, b = cond.src
        return _linear(a, v) and v not in b.variables() or _linear(b, v) and v not in a.variables()
    return cond.op is Ops.CMPLT and all(m == (v,) or v not in m for m in poly(simplify(cond.src[1] - cond.src[0])))


def _each_value(k: IndexConstraint, v: UOp, bounds) -> list[IndexConstraint]:
    name, lo, hi = v.arg
    linear = _linear(k.cond, v)
    if bounds is None:
        values, guards = ((lo, hi) if linear or hi == lo else range(lo, hi + 1)), None
    else:  # var bounds: at their expressions (or, enumerated, where the value is inside them); none when empty
        lower, upper = (as_uop(b) for b in bounds)
        values = (lower, upper - 1) if linear else range(lo, hi + 1)
        guards = [_empty(lower, upper) if linear else
                  UOp(Ops.OR, dtypes.bool, (UOp(Ops.CMPLT, dtypes.bool, (as_uop(x), lower)),
                                             UOp(Ops.CMPLT, dtypes.bool, (upper - 1, as_uop(x))))) for x in values]
    if len(values) > MAX_ENUMERATED:
        raise TraceError(f"{k.what}: the index is not linear in the loop counter {name}, and its "
                         f"{hi - lo + 1} values are too many to check one by one")
    out = []
    for j, value in enumerate(values):
        cond = simplify(k.cond.substitute({v: as_uop(value)}))
        text = f"{k.text} for {name} = {value.render() if isinstance(value, UOp) else value}"
        if guards is not None and not (cond.op is Ops.CONST and cond.arg):
            cond = simplify(UOp(Ops.OR, dtypes.bool, (guards[j], cond)))
        each = IndexConstraint(cond, text, k.what, k.error_kind)
        if not _decided(cond, each):
            out.append(each)
    return out
