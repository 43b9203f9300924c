"""pj.fori_loop and pj.while_loop: loops whose body is traced once.

A fori_loop's body sees a symbolic loop var. With static int bounds the plan holds its kernels once per
iteration (fixedvars); with bounds that are var expressions (`fori_loop(0, n, ...)`) it is a loop the plan
runs natively, the count read off the call's var values. A while_loop runs its body while the predicate,
computed on the device from the carry, is true; a fori_loop whose bounds depend on array data is one.
"""
from __future__ import annotations

import inspect
import itertools

import attrs

from ..errors import TraceError
from ..uop import Ops, UOp, dtypes, sint
from . import checks, prims
from .pytree import flatten
from .tracer import Tracer
from .core import reserved_var_name

_loop_ids = itertools.count()


@attrs.frozen
class LoopInfo:
    """The arg of a LOOP node: a fori_loop's var and bounds (ints, or var expressions read per call), or a
    while_loop's predicate (a 0-d bool computed from the carries; var and bounds None), the carry placeholders
    and the body's results."""

    var: UOp | None
    lower: sint | None
    upper: sint | None
    carries: tuple
    body_outputs: tuple
    pred: UOp | None = None
    facts: tuple = ()  # index conditions on the loop var each call checks for its every value (bounds proof facts)

    @property
    def dynamic(self) -> bool:
        """Whether the plan runs it as a loop (its trip count known only at call time) rather than unrolled."""
        return self.pred is not None or not (isinstance(self.lower, int) and isinstance(self.upper, int))

    @property
    def body_roots(self) -> tuple:
        """What each iteration computes: the body's results, and a while_loop's predicate."""
        return self.body_outputs + ((self.pred,) if self.pred is not None else ())

    def __str__(self) -> str:
        head = "while pred" if self.var is None else f"{self.var.arg[0]} in range({_text(self.lower)}, " \
                                                    f"{_text(self.upper)})"
        return f"{head}, body -> {len(self.body_outputs)} carries"


def _text(d: sint) -> str:
    return d.render() if isinstance(d, UOp) else str(d)


def _loop_var_base(body) -> str:
    try:
        params = list(inspect.signature(body).parameters)
        return params[0] if params else "i"
    except (TypeError, ValueError):
        return "i"


def _bound(x, what: str):
    """A loop bound as an int or a symbolic int, or None when it depends on array data."""
    if isinstance(x, bool):
        raise TraceError(f"fori_loop {what} must be an int, a var or a symbolic int, not bool")
    if isinstance(x, Tracer) and x.ndim == 0 and x.dtype.is_int and not prims.is_symbolic(x.uop):
        return None
    return prims.to_sint(x, f"fori_loop {what}")


def _carry(carry) -> tuple[list, object]:
    """The carry's leaves as traced arrays (Python scalars become arrays of their default dtype), its structure."""
    leaves, _, treedef = flatten(carry)
    inits = [prims.to_tracer(x) for x in leaves]
    return [prims.cast(Tracer(x.uop), x.dtype) if x.weak else Tracer(x.uop) for x in inits], treedef


def _check_carry(what: str, inits: list, treedef, result) -> list[UOp]:
    """The body's results as UOps, checked against the carry: same structure, dtypes and shapes."""
    out_leaves, _, out_tree = flatten(result)
    if out_tree != treedef:
        raise TraceError(f"{what} body must return the carry's structure {treedef.describe()}, "
                         f"got {out_tree.describe()}")
    outs = []
    for j, (init, out) in enumerate(zip(inits, out_leaves)):
        out = prims.to_tracer(out)
        if out.weak and out.dtype != init.dtype and out.ndim == 0:  # a Python scalar takes the carry's dtype
            out = prims.cast(out, init.dtype)
        if out.dtype != init.dtype:
            raise TraceError(f"{what} carry {j}: body returns {out.dtype.name}, the initial carry is {init.dtype.name}")
        if len(out.uop.shape) != len(init.uop.shape) or not all(
                prims.dims_equal(a, b) for a, b in zip(out.uop.shape, init.uop.shape)):
            raise TraceError(f"{what} carry {j}: body returns shape {out.shape_str}, the initial carry has "
                             f"{init.shape_str}")
        outs.append(out.uop)
    return outs


def _loop(what: str, inits: list, treedef, carries: tuple, outs: list, recorded, var=None, lower=None, upper=None,
          pred=None, flag_extra=None, facts=()):
    """The LOOP node and its results (the carry's structure); the body's gather range flags (and `flag_extra`,
    0-d bools computed in the body) are or-ed over the iterations in an extra carry and recorded."""
    n = len(inits)
    flags = list(recorded.flags) + list(flag_extra or ())
    if flags:
        loop_id = carries[0].arg[0] if carries else next(_loop_ids)
        inits = inits + [prims.cast(Tracer(UOp.const(False, dtypes.bool)), dtypes.bool)]
        carries += (UOp(Ops.CARRY, dtypes.bool, (), (loop_id, n, ())),)
        flag = Tracer(carries[-1])
        for f, _ in flags:
            flag = prims.elementwise(Ops.OR, flag, f)
        outs = outs + [flag.uop]
    info = LoopInfo(var, lower, upper, carries, tuple(outs), pred, facts)
    loop = UOp(Ops.LOOP, inits[0].dtype if inits else dtypes.bool, tuple(x.uop for x in inits), info)
    if flags:
        checks.record_flag(Tracer(UOp(Ops.LOOP_OUT, dtypes.bool, (loop,), n)),
                           f"in a {what} body, " + "; ".join(what for _, what in flags))
    return treedef.unflatten([Tracer(UOp(Ops.LOOP_OUT, x.dtype, (loop,), j)) for j, x in enumerate(inits[:n])])


def _placeholders(inits: list) -> tuple:
    loop_id = next(_loop_ids)
    return tuple(UOp(Ops.CARRY, x.dtype, (), (loop_id, j, x.uop.shape)) for j, x in enumerate(inits))


def fori_loop(lower, upper, body, carry, *, unroll=None):
    """Run `carry = body(i, carry)` for i in range(lower, upper); `body` is traced once. (`unroll` is accepted
    for jax.lax.fori_loop's signature and ignored: static bounds give one kernel per iteration anyway.)

    The loop var is named after `body`'s first parameter. With static int bounds the prepared plan holds the
    body's kernels once per iteration with fixedvars {name: i}, all sharing one compilation. Bounds may also
    be vars or symbolic ints (`fori_loop(0, n, ...)`, `x.shape[0]`): the plan then runs the body natively
    for the call's count, compiled once for every count within the vars' bounds. Bounds computed from array
    data make it a while_loop whose `i` is a traced 0-d int64 array.
    """
    lo, hi = _bound(lower, "lower bound"), _bound(upper, "upper bound")
    if lo is None or hi is None:
        return _data_bounded(lower, upper, body, carry)
    inits, treedef = _carry(carry)
    static = isinstance(lo, int) and isinstance(hi, int)
    first, last = (lo, hi - 1) if static else (_vmin(lo), _vmax(hi) - 1)
    if last < first or static and hi <= lo:
        return treedef.unflatten(inits)
    carries = _placeholders(inits)
    taken = {v.arg[0] for x in inits for v in x.uop.variables()}
    with reserved_var_name(_loop_var_base(body), taken) as name:  # unique while the body (and nested loops) trace
        var = UOp.variable(name, first, last)
        with checks.loop_body(None if static else (var, lo, hi)) as recorded:
            before = len(recorded.constraints)
            result = body(Tracer(var, weak=True), treedef.unflatten([Tracer(c) for c in carries]))
    outs = _check_carry("fori_loop", inits, treedef, result)
    facts = () if static else tuple(c.cond for c in recorded.constraints[before:] if var in c.cond.variables()) + \
        tuple(checks.only_when_run(recorded, before, lo, hi))
    return _loop("fori_loop", inits, treedef, carries, outs, recorded, var, lo, hi, facts=facts)


def _vmin(d: sint) -> int:
    return d if isinstance(d, int) else int(d.vmin)


def _vmax(d: sint) -> int:
    return d if isinstance(d, int) else int(d.vmax)


def _data_bounded(lower, upper, body, carry):
    """fori_loop with a bound computed from array data: a while_loop over (i, carry), as JAX lowers it."""
    lo, hi = prims.to_tracer(lower), prims.to_tracer(upper)
    i0 = prims.cast(lo, prims.result_dtype(lo, hi))

    def step(state):
        i, c = state
        return i + 1, body(i, c)
    return while_loop(lambda state: state[0] < hi, step, (i0, carry))[1]


def _predicate(out) -> Tracer:
    try:
        pred = prims.to_tracer(out)
    except TraceError:
        pred = None
    if pred is None or pred.ndim != 0 or pred.dtype != dtypes.bool:
        got = f"shape {pred.shape_str}, {pred.dtype.name}" if pred is not None else type(out).__name__
        raise TraceError(f"while_loop cond_fun must return a boolean scalar (a 0-d bool array), got {got}")
    return pred


def while_loop(cond_fun, body_fun, init_val):
    """Run `val = body_fun(val)` while `cond_fun(val)` is true; both are traced once (as jax.lax.while_loop).

    The predicate is a 0-d bool computed on the device from the carry; the plan evaluates it before each
    iteration and stops when it is false, so the trip count depends on the data. Like JAX there is no
    iteration limit: a predicate that never becomes false never returns. Body and predicate must keep the
    carry's structure, shapes and dtypes; index constraints inside them are checked on every call, whether
    or not the body runs.
    """
    inits, treedef = _carry(init_val)
    carries = _placeholders(inits)
    tree = lambda: treedef.unflatten([Tracer(c) for c in carries])  # noqa: E731
    with checks.loop_body() as cond_recorded:
        pred = _predicate(cond_fun(tree()))
    if pred.uop.op is Ops.CONST:
        if pred.uop.arg:
            raise TraceError("while_loop cond_fun is always true: the loop would never end")
        return treedef.unflatten(inits)
    with checks.loop_body() as recorded:
        result = body_fun(tree())
    outs = _check_carry("while_loop", inits, treedef, result)
    out = _loop("while_loop", inits, treedef, carries, outs, recorded, pred=pred.uop, flag_extra=cond_recorded.flags)
    if cond_recorded.flags:  # the predicate's gathers also run once more, on the final carry
        with checks.loop_body() as final:
            cond_fun(out)
        for flag, what in final.flags:
            checks.record_flag(flag, "in a while_loop cond_fun, " + what)
    return out
