"""pj.cond, pj.switch and pj.scan: JAX's structured control flow on traced values.

cond and switch trace every branch once, on the same operands; the branches must return the same structure,
shapes and dtypes (a Python scalar takes the other branch's dtype). A predicate or index known while tracing
(a Python or NumPy scalar) picks its branch then. One that is traced (array data, or a var expression)
selects between the branches' results elementwise, as `jax.vmap` of a cond does: every branch is computed
and the one chosen is kept, which is right for pure branches (a branch's NaN or inf does not leak into the
other's result) and costs the work of all of them. A branch's gather range flags count only when it is
chosen; its index constraints are checked on every call (as for a while_loop body).

scan is a fori_loop over the leading axis of `xs` (a var or symbolic size too: a loop the plan runs
natively), writing the body's per-step results into row t of the stacked `ys` (`ys.at[t].set(y)`, which the
plan does in place: one row per step, not a copy of `ys`).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import TraceError
from ..uop import Ops, UOp, dtypes
from . import checks, prims
from .loop import _carry, _check_carry, fori_loop
from .pytree import flatten
from .tracer import Tracer


def _static(x):
    """The Python value of a predicate or index known while tracing, else None."""
    if isinstance(x, (bool, int, np.bool_, np.integer, float, np.floating)):
        return x
    if isinstance(x, np.ndarray) and x.ndim == 0:
        return x.item()
    return None


def _scalar(x, what: str) -> Tracer:
    t = prims.to_tracer(x)
    if t.ndim != 0:
        raise TraceError(f"{what} must be a scalar (a 0-d array), got shape {t.shape_str}")
    return t


def _trace_branch(fun, operands, keep: bool):
    """(result leaves as Tracers, structure, the gather flags it recorded); a branch not kept records nothing."""
    with checks.loop_body() if keep else checks.discarded() as recorded:
        result = fun(*operands)
    leaves, _, tree = flatten(result)
    return [prims.to_tracer(x) for x in leaves], tree, recorded.flags


def _match(name: str, branches: list) -> list[list[Tracer]]:
    """The branches' results with the same structure, shapes and dtypes (weak scalars cast to the others')."""
    first, tree0 = branches[0][0], branches[0][1]
    for k, (leaves, tree, _) in enumerate(branches[1:], 1):
        if tree != tree0:
            raise TraceError(f"{name}: branch {k} returns the structure {tree.describe()}, branch 0 "
                             f"{tree0.describe()}; every branch must return the same structure")
    out = [list(b[0]) for b in branches]
    for j in range(len(first)):
        column = [leaves[j] for leaves in out]
        strong = {x.dtype for x in column if not x.weak}
        target = strong.pop() if len(strong) == 1 else None if strong else prims.result_dtype(*column)
        for b, x in enumerate(column):
            if target is not None and x.dtype != target and (x.weak or not strong):
                out[b][j] = x = prims.cast(x, target)
            ref = out[0][j]
            if x.dtype != ref.dtype:
                raise TraceError(f"{name}: output {j} is {x.dtype.name} in branch {b} and {ref.dtype.name} in "
                                 "branch 0; every branch must return the same dtypes")
            if len(x.uop.shape) != len(ref.uop.shape) or not all(
                    prims.dims_equal(p, q) for p, q in zip(x.uop.shape, ref.uop.shape)):
                raise TraceError(f"{name}: output {j} has shape {x.shape_str} in branch {b} and {ref.shape_str} "
                                 "in branch 0; every branch must return the same shapes")
    return out


def _select(name: str, choose: list[Tracer], branches: list):
    """The branches' results chosen elementwise: `choose[k]` (a 0-d bool) picks branch k, the last one otherwise;
    each branch's gather flags are recorded and-ed with its choice."""
    results = _match(name, branches)
    out = list(results[-1])
    for k in range(len(branches) - 2, -1, -1):
        out = [prims.elementwise(Ops.WHERE, choose[k], a, b) for a, b in zip(results[k], out)]
    for k, (_, _, flags) in enumerate(branches):
        taken = choose[k] if k < len(choose) else _none_of(choose)
        for flag, what in flags:
            checks.record_flag(prims.elementwise(Ops.AND, flag, taken), f"in {name} branch {k}, {what}")
    return branches[0][1].unflatten(out)


def _none_of(choose: list[Tracer]) -> Tracer:
    out = Tracer(UOp.const(True, dtypes.bool))
    for c in choose:
        out = prims.elementwise(Ops.AND, out, prims.elementwise(Ops.NOT, c))
    return out


def cond(pred, true_fun, false_fun, *operands):
    """`true_fun(*operands)` if `pred` else `false_fun(*operands)` (as jax.lax.cond); `pred` is a scalar (bool,
    or a number: nonzero is true). Both branches are traced; see the module docstring for how they run."""
    value = _static(pred)
    if value is not None:
        taken = bool(value)
        branches = [_trace_branch(fun, operands, keep=fun_taken) for fun, fun_taken in
                    ((true_fun, taken), (false_fun, not taken))]
        results = _match("cond", branches)
        return branches[0][1].unflatten(results[0 if taken else 1])
    p = _scalar(pred, "cond's predicate")
    if p.dtype != dtypes.bool:
        p = prims.elementwise(Ops.CMPNE, p, 0)
    return _select("cond", [p], [_trace_branch(fun, operands, True) for fun in (true_fun, false_fun)])


def switch(index, branches: Sequence, *operands):
    """`branches[index](*operands)` (as jax.lax.switch): `index` is clamped into [0, len(branches) - 1]. Every
    branch is traced; see the module docstring for how they run."""
    branches = list(branches)
    if not branches:
        raise ValueError("switch needs at least one branch")
    value = _static(index)
    if value is not None:
        if isinstance(value, (float, np.floating)):
            raise TraceError(f"switch's index must be an integer, got {value!r}")
        chosen = min(max(int(value), 0), len(branches) - 1)
        traced = [_trace_branch(fun, operands, keep=k == chosen) for k, fun in enumerate(branches)]
        return traced[0][1].unflatten(_match("switch", traced)[chosen])
    i = _scalar(index, "switch's index")
    if not (i.dtype.is_int or i.dtype == dtypes.bool):
        raise TraceError(f"switch's index must be an integer, got {i.dtype.name}")
    if len(branches) == 1:
        return branches[0](*operands)
    i = prims.elementwise(Ops.MIN, prims.elementwise(Ops.MAX, prims.cast(i, dtypes.int64), 0), len(branches) - 1)
    choose = [prims.elementwise(Ops.CMPEQ, i, k) for k in range(len(branches) - 1)]
    return _select("switch", choose, [_trace_branch(fun, operands, True) for fun in branches])


def scan(f, init, xs=None, length=None, reverse=False, unroll=1):
    """`(carry, ys)` of `carry, y = f(carry, x)` over the leading axis of `xs` (as jax.lax.scan): `ys` stacks
    the `y`s. `xs` is a pytree of arrays sharing their leading size (or None, with `length`); the size may
    be a var or symbolic, and so may `length`. `reverse` scans from the end (ys keep xs' order). `unroll` is
    accepted for JAX's signature and ignored (a static-length scan's plan holds one kernel per step anyway)."""
    x_leaves, _, x_tree = flatten(xs)
    x_leaves = [prims.to_tracer(x) for x in x_leaves]
    for x in x_leaves:
        if x.ndim == 0:
            raise TraceError("scan's xs must be arrays with a leading axis to scan over, got a 0-d value")
    sizes = [x.uop.shape[0] for x in x_leaves]
    if length is not None:
        sizes.insert(0, prims.to_sint(length, "scan length"))
    if not sizes:
        raise TraceError("scan got no xs to scan over and no length")
    n = sizes[0]
    if not all(prims.dims_equal(n, s) for s in sizes[1:]):
        shown = ", ".join(prims.fmt_shape((s,))[1:-2] for s in sizes)
        raise TraceError(f"scan got xs with different leading sizes (and length): {shown}")
    init_leaves, _, init_tree = flatten(init)

    def probe_step(carry):  # the body's y structure, shapes and dtypes, from placeholders (nothing recorded)
        x_probe = [Tracer(UOp(Ops.CARRY, x.dtype, (), (-1, j, tuple(x.uop.shape[1:])))) for j, x in enumerate(x_leaves)]
        return _pair(f(carry, x_tree.unflatten(x_probe)))
    with checks.discarded():
        probe = [prims.to_tracer(x) for x in init_leaves]
        c, y = probe_step(init_tree.unflatten([Tracer(UOp(Ops.CARRY, t.dtype, (), (-1, 100 + j, t.uop.shape)))
                                               for j, t in enumerate(probe)]))
        _check_carry("scan", *_carry(init), c)  # named as scan's (the fori_loop below would say fori_loop)
        y_leaves, _, y_tree = flatten(y)
        y_leaves = [prims.to_tracer(v) for v in y_leaves]
        y_specs = [(v.dtype if not v.weak else prims.cast(Tracer(v.uop), v.dtype).dtype, tuple(v.uop.shape))
                   for v in y_leaves]
    from .numpy_create import zeros
    ys0 = [zeros((n,) + shape, dtype) for dtype, shape in y_specs]

    def body(i, state):
        carry, ys = state
        t = (n - 1 - i) if reverse else i
        c, y = _pair(f(carry, x_tree.unflatten([x[t] for x in x_leaves])))
        y_out, _, tree = flatten(y)
        if tree != y_tree:
            raise TraceError(f"scan body returns y with the structure {tree.describe()} at one step and "
                             f"{y_tree.describe()} at another")
        return c, [old.at[t].set(prims.cast(prims.to_tracer(v), old.dtype)) for old, v in zip(ys, y_out)]
    carry, ys = fori_loop(0, n, body, (init, ys0))
    return carry, y_tree.unflatten(ys)


def scan_map(f, xs):
    """`f` applied to each slice of `xs` along its leading axis, stacked (jax.lax.map; `pj.lax.map`)."""
    return scan(lambda carry, x: (carry, f(x)), None, xs)[1]


def _pair(out):
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        got = f"an array of shape {out.shape_str}" if isinstance(out, Tracer) else type(out).__name__
        raise TraceError(f"scan's f must return a pair (carry, y), got {got}")
    return out
