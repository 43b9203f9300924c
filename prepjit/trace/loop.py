"""pj.fori_loop: a bounded loop whose body is traced once with a symbolic loop var."""
from __future__ import annotations

import inspect
import itertools

import attrs

from ..errors import TraceError
from ..uop import Ops, UOp, dtypes
from . import checks, prims
from .pytree import flatten
from .tracer import Tracer
from .tracing import reserved_var_name

_loop_ids = itertools.count()


@attrs.frozen
class LoopInfo:
    """The arg of a LOOP node: loop var, static bounds, carry placeholders and the body's results."""

    var: UOp
    lower: int
    upper: int
    carries: tuple
    body_outputs: tuple


def _loop_var_base(body) -> str:
    try:
        params = list(inspect.signature(body).parameters)
        return params[0] if params else "i"
    except (TypeError, ValueError):
        return "i"


def fori_loop(lower: int, upper: int, body, carry):
    """Run `carry = body(i, carry)` for i in range(lower, upper); `body` is traced once.

    The loop var is named after `body`'s first parameter; the prepared plan holds the body's
    kernels once per iteration with fixedvars {name: i}, all sharing one compilation.
    """
    if any(isinstance(v, bool) or not isinstance(v, int) for v in (lower, upper)):
        raise TraceError("fori_loop bounds must be static Python ints")
    leaves, _, treedef = flatten(carry)
    inits = [prims.to_tracer(x) for x in leaves]
    inits = [Tracer(x.uop) if not x.weak else prims.cast(Tracer(x.uop), x.dtype) for x in inits]
    if upper <= lower:
        return treedef.unflatten(inits)
    taken = {v.arg[0] for x in inits for v in x.uop.variables()}
    loop_id = next(_loop_ids)
    carries = tuple(UOp(Ops.CARRY, x.dtype, (), (loop_id, j, x.uop.shape)) for j, x in enumerate(inits))
    with reserved_var_name(_loop_var_base(body), taken) as name:  # unique while the body (and nested loops) trace
        var = UOp.variable(name, lower, upper - 1)
        with checks.loop_body() as recorded:
            result = body(Tracer(var, weak=True), treedef.unflatten([Tracer(c) for c in carries]))
    out_leaves, _, out_tree = flatten(result)
    if out_tree != treedef:
        raise TraceError(f"fori_loop body must return the carry's structure {treedef.describe()}, "
                         f"got {out_tree.describe()}")
    outs = []
    for j, (init, out) in enumerate(zip(inits, out_leaves)):
        out = prims.to_tracer(out)
        if out.dtype != init.dtype:
            raise TraceError(f"fori_loop carry {j}: body returns {out.dtype.name}, the initial carry is {init.dtype.name}")
        if len(out.uop.shape) != len(init.uop.shape) or not all(
                prims.dims_equal(a, b) for a, b in zip(out.uop.shape, init.uop.shape)):
            raise TraceError(f"fori_loop carry {j}: body returns shape {out.shape_str}, the initial carry has "
                             f"{init.shape_str}")
        outs.append(out.uop)
    n = len(inits)
    if recorded.flags:  # the body's gather range flags, or-ed over the iterations in an extra carry
        inits = inits + [prims.cast(Tracer(UOp.const(False, dtypes.bool)), dtypes.bool)]
        carries += (UOp(Ops.CARRY, dtypes.bool, (), (loop_id, n, ())),)
        flag = Tracer(carries[-1])
        for f, _ in recorded.flags:
            flag = prims.elementwise(Ops.OR, flag, f)
        outs.append(flag.uop)
    info = LoopInfo(var, lower, upper, carries, tuple(outs))
    loop = UOp(Ops.LOOP, init.dtype, tuple(x.uop for x in inits), info)
    if recorded.flags:
        checks.record_flag(Tracer(UOp(Ops.LOOP_OUT, dtypes.bool, (loop,), n)),
                           "in a fori_loop body, " + "; ".join(what for _, what in recorded.flags))
    return treedef.unflatten([Tracer(UOp(Ops.LOOP_OUT, x.dtype, (loop,), j)) for j, x in enumerate(inits[:n])])
