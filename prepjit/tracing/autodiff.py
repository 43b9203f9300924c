"""Reverse-mode autodiff of traced functions: `vjp` and `grad` on tracers, and the backward pass over UOps.

The backward pass walks the traced graph from the outputs back to the differentiated inputs, children after
parents, asking each node's primitive (prims/registry.py) for the cotangents of its operands and summing them
per node. Only floating-point nodes carry cotangents: integer and bool values, comparisons and rounding pass
none (their gradient is zero, as in JAX).

UOps are hash-consed, so an input's node may also stand for an equal value elsewhere (a closure reading the
same array, `x * 2` computed twice). Each differentiated input is therefore replaced by a fresh placeholder (a
CARRY leaf of its own) before the function is traced, and put back in the results afterwards.

`prepjit/transforms/autodiff.py` holds the public `pj.grad` / `pj.value_and_grad` / `pj.vjp`: on traced arguments they call
the functions here; on NumPy arguments they prepare a function that does.
"""
from __future__ import annotations

import itertools

import attrs

from ..errors import TraceError
from ..uop import Ops, UOp, as_int_if_const, dtypes, simplify
from ..uop.uop import _arg_uops, children_first
from . import checks, prims
from .constants import _active as _capture_state
from .prims.registry import rules
from .pytree import flatten
from .tracer import Tracer

_placeholder_ids = itertools.count()


def in_trace() -> bool:
    """Whether a trace is running on this thread (a NumPy array met now becomes a plan constant)."""
    return getattr(_capture_state, "captured", None) is not None


def placeholder(x: Tracer) -> Tracer:
    """A fresh leaf of `x`'s shape and dtype, equal to no other node."""
    return Tracer(UOp(Ops.CARRY, x.dtype, (), (("vjp", next(_placeholder_ids)), 0, tuple(x.uop.shape))), weak=x.weak)


def zeros_like(u: UOp) -> Tracer:
    return prims.broadcast_to(Tracer(UOp.const(0, u.dtype)), u.shape)


# ---------- graph walks ----------

def operands(node: UOp) -> tuple:
    return rules(node.op).operands(node)


def substitute(roots: list[UOp], mapping: dict) -> list[UOp]:
    """`roots` with every node in `mapping` replaced, through sources and the UOps inside args (symbolic shapes
    and slice starts, loop bodies). Rebuilt symbolic ints are simplified."""
    memo = dict(mapping)

    def children(node):
        return () if node in memo else (*node.src, *_arg_uops(node.arg))
    for node in children_first(list(roots), children):
        if node in memo:
            continue
        src = tuple(memo[s] for s in node.src)
        arg = _substitute_arg(node.arg, memo)
        if src == node.src and arg is node.arg:
            memo[node] = node
            continue
        new = UOp(node.op, node.dtype, src, arg)
        memo[node] = simplify(new) if new.dtype == dtypes.index else new
    return [memo[r] for r in roots]


def _substitute_arg(arg, memo: dict):
    if isinstance(arg, UOp):
        new = memo[arg]
        return arg if new is arg else as_int_if_const(new)
    if isinstance(arg, tuple):
        items = tuple(_substitute_arg(a, memo) for a in arg)
        return arg if all(a is b for a, b in zip(items, arg)) else items
    if attrs.has(type(arg)):
        changes = {}
        for f in attrs.fields(type(arg)):
            value = getattr(arg, f.name)
            new = _substitute_arg(value, memo)
            if new is not value:
                changes[f.name] = new
        return attrs.evolve(arg, **changes) if changes else arg
    return arg


# ---------- the backward pass ----------

def backward(outputs: list[UOp], cts: list[Tracer], wrt: list[UOp]) -> list[Tracer | None]:
    """The cotangents of `wrt` (None where no path leads) given the outputs' cotangents. The walk stops at `wrt`
    nodes: they need not be leaves (a loop body's backward pass stops at the values read from outside it)."""
    targets = set(wrt)
    order = children_first(list(outputs), lambda n: () if n in targets else operands(n))
    active: set = set()
    for node in order:
        if node in targets or any(o in active for o in operands(node)):
            if node.op is Ops.LOOP or node.dtype.is_float:
                active.add(node)
    acc: dict[UOp, object] = {}
    for out, ct in zip(outputs, cts):
        if out in active:
            _accumulate(acc, out, ct)
    for node in reversed(order):
        ct = acc.get(node)
        if ct is None or node in targets:
            continue
        if node.op is Ops.LOOP_OUT:  # one output of a multi-output LOOP: collected per carry index
            acc.setdefault(node.src[0], {})[node.arg] = ct
            continue
        p = rules(node.op)
        if p.vjp is None:
            continue
        ops = p.operands(node)
        found = p.vjp(ct, node, tuple(o in active for o in ops)) if p.selective else p.vjp(ct, node)
        for o, c in zip(ops, found):
            if c is not None and o in active:
                _accumulate(acc, o, c)
    return [acc.get(w) for w in wrt]


def _accumulate(acc: dict, node: UOp, ct: Tracer):
    ct = prims.cast(prims.to_tracer(ct), node.dtype)
    if tuple(ct.uop.shape) != tuple(node.shape):
        ct = prims.reshape(prims.broadcast_to(ct, node.shape), node.shape)
    ct = Tracer(ct.uop)
    old = acc.get(node)
    acc[node] = ct if old is None else prims.elementwise(Ops.ADD, old, ct)


# ---------- vjp and grad on tracers ----------

@attrs.frozen
class Linearized:
    """A traced function's outputs with what its backward pass needs: the placeholders it ran on, the values they
    stand for, the flat outputs and their structure."""

    placeholders: tuple   # per flat primal leaf: its placeholder UOp, or None (not differentiated)
    originals: tuple      # per flat primal leaf: the Tracer it stands for
    outputs: tuple        # flat output Tracers (on placeholders)
    out_tree: object

    def restore(self, nodes: list[UOp]) -> list[UOp]:
        """`nodes` on the original values: a differentiated loop by the version that keeps its carries (it then
        runs once for the value and the gradient, see autodiff_loop.py), then placeholders by their values."""
        from .autodiff_loop import with_history
        loops = {n: with_history(n)[0] for n in children_first(list(nodes), lambda n: (*n.src, *_arg_uops(n.arg)))
                 if n.op is Ops.LOOP and with_history(n, build=False) is not None}
        nodes = substitute(list(nodes), loops) if loops else list(nodes)
        back = {p: t.uop for p, t in zip(self.placeholders, self.originals) if p is not None}
        return substitute(nodes, back)

    def values(self) -> list[Tracer]:
        outs = self.restore([t.uop for t in self.outputs])
        return [Tracer(u, weak=t.weak) for u, t in zip(outs, self.outputs)]

    def cotangents(self, cts: list[Tracer]) -> list[Tracer]:
        """Per flat primal leaf: its cotangent (zeros where none flows; an integer or bool leaf gets zeros of its
        own dtype, JAX's float0 in spirit)."""
        floats = [o for o in self.outputs if o.dtype.is_float]
        found = backward([o.uop for o in floats], [c for o, c in zip(self.outputs, cts) if o.dtype.is_float],
                         [p for p in self.placeholders if p is not None])
        it = iter(found)
        grads = []
        for p, t in zip(self.placeholders, self.originals):
            g = next(it) if p is not None else None
            grads.append(zeros_like(t.uop).uop if g is None else g.uop)
        return [Tracer(u) for u in self.restore(grads)]


def linearize(fun, primals: tuple, has_aux: bool = False):
    """Trace `fun(*primals)` on placeholders for the primals' float leaves: (Linearized, per-primal treedefs, aux)."""
    leaves, trees = [], []
    for p in primals:
        ls, _, tree = flatten(p)
        leaves += ls
        trees.append(tree)
    originals = [prims.to_tracer(x) for x in leaves]
    stand_ins = [placeholder(t) if t.dtype.is_float else t for t in originals]
    it = iter(stand_ins)
    args = [tree.unflatten([next(it) for _ in range(tree.num_leaves)]) for tree in trees]
    with checks.loop_body() as recorded:  # a scope of its own for the gathers' range flags (put back below)
        result = fun(*args)
    aux = None
    if has_aux:
        if not (isinstance(result, tuple) and len(result) == 2):
            raise TraceError("a function differentiated with has_aux=True must return a pair (output, aux)")
        result, aux = result
    out_leaves, _, out_tree = flatten(result)
    outs = [prims.to_tracer(o) for o in out_leaves]
    lin = Linearized(tuple(s.uop if s.dtype.is_float else None for s in stand_ins), tuple(originals), tuple(outs),
                     out_tree)
    _keep_loop_carries([o.uop for o in outs], {p for p in lin.placeholders if p is not None})
    flags = lin.restore([prims.to_tracer(f).uop for f, _ in recorded.flags])
    for f, (_, what) in zip(flags, recorded.flags):
        checks.record_flag(Tracer(f), what)
    if aux is not None:
        aux_leaves, _, aux_tree = flatten(aux)
        traced = [i for i, a in enumerate(aux_leaves) if isinstance(a, Tracer)]
        restored = lin.restore([aux_leaves[i].uop for i in traced])
        for i, u in zip(traced, restored):
            aux_leaves[i] = Tracer(u, weak=aux_leaves[i].weak)
        aux = aux_tree.unflatten(aux_leaves)
    return lin, trees, aux


def _keep_loop_carries(outputs: list[UOp], placeholders: set):
    """Build, before the values are read, the carry-keeping version of each loop the differentiated inputs reach,
    so that the values (read now) and the backward pass (maybe later, pj.vjp's f_vjp) share one loop."""
    from .autodiff_loop import with_history
    for node in children_first(outputs, lambda n: (*n.src, *_arg_uops(n.arg))):
        if node.op is Ops.LOOP and node.depends_on(placeholders):
            try:
                with_history(node)
            except TraceError:  # a loop that cannot be differentiated: only an attempt to differentiate it says so
                pass


def vjp(fun, *primals, has_aux: bool = False):
    """(outputs, f_vjp[, aux]) as jax.vjp, on traced values: f_vjp(cotangent) -> one cotangent per primal."""
    lin, trees, aux = linearize(fun, primals, has_aux)
    out = lin.out_tree.unflatten(lin.values())

    def f_vjp(ct):
        ct_leaves, _, ct_tree = flatten(ct)
        if ct_tree != lin.out_tree:
            raise TraceError(f"the cotangent's structure {ct_tree.describe()} is not the output's "
                             f"{lin.out_tree.describe()}")
        cts = []
        for j, (c, o) in enumerate(zip(ct_leaves, lin.outputs)):
            c = prims.to_tracer(c)
            if c.ndim != o.ndim or not all(prims.dims_equal(a, b) for a, b in zip(c.uop.shape, o.uop.shape)):
                raise ValueError(f"cotangent {j} has shape {c.shape_str}, but output {j} has {o.shape_str}: f_vjp "
                                 "takes cotangents shaped as the outputs (as jax.vjp's does; none is broadcast)")
            cts.append(prims.cast(c, o.dtype))
        grads = iter(lin.cotangents(cts))
        return tuple(tree.unflatten([next(grads) for _ in range(tree.num_leaves)]) for tree in trees)
    return (out, f_vjp, aux) if has_aux else (out, f_vjp)


def value_and_grad(fun, args: tuple, kwargs: dict, argnums, has_aux: bool):
    """(value[, aux], grads) of `fun(*args, **kwargs)` with respect to `args[argnums]`, on traced values."""
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    for i in nums:
        if isinstance(i, bool) or not isinstance(i, int) or not -len(args) <= i < len(args):
            raise TraceError(f"argnums {argnums!r} does not name positional arguments of a call with {len(args)}")
    nums = tuple(i % len(args) for i in nums)

    def partial(*diff):
        full = list(args)
        for i, d in zip(nums, diff):
            full[i] = d
        return fun(*full, **kwargs)
    lin, trees, aux = linearize(partial, tuple(args[i] for i in nums), has_aux)
    if len(lin.outputs) != 1 or lin.outputs[0].ndim != 0 or not lin.outputs[0].dtype.is_float:
        what = ", ".join(f"{o.shape_str} {o.dtype.name}" for o in lin.outputs) or "nothing"
        raise TraceError(f"grad needs a function with one real scalar output (a 0-d float array), got {what}; "
                         "use pj.vjp for other outputs")
    (value,) = lin.values()
    one = prims.cast(prims.to_tracer(1.0), value.dtype)
    grads = iter(lin.cotangents([one]))
    per_arg = tuple(tree.unflatten([next(grads) for _ in range(tree.num_leaves)]) for tree in trees)
    return (value, aux), (per_arg[0] if isinstance(argnums, int) else per_arg)


from . import autodiff_loop  # noqa: E402,F401 - registers the LOOP rules (it builds on this module)
