"""vmap: a function of one example traced once, its graph rewritten to compute a whole batch.

`vmap(fun, args, in_axes, out_axes)` gives each mapped argument a placeholder of one example's shape, traces
`fun` on them, then rewrites the traced graph bottom-up: every node that reads a placeholder gets a leading
batch axis through its op's batching rule (`Primitive.batch` in the primitive table, registered here), the
placeholders become the arguments with their mapped axis moved to the front, and nodes that read none stay
as they are. The batch size may be symbolic (a var dim). Nested vmaps compose: the inner one's graph is in
terms of the outer one's placeholders, which the outer rewrite batches in turn.

A rule is `rule(batcher, node, srcs, batched) -> (UOp, is_batched)`: `srcs` are the rewritten sources,
`batched` says which carry the batch axis (at 0). Loops batch their carries to a fixed point (a carry
becomes batched when its initial value or its body's result is); a while_loop whose predicate is batched
runs while any example's is true, each example's carry frozen once its own predicate is false (as JAX).
"""
from __future__ import annotations

import itertools

import attrs

from ..errors import TraceError
from ..uop import Ops, UOp, dtypes, sint
from ..uop.ops import ELEMENTWISE
from . import checks, prims
from .loop import _loop_ids
from .prims import primitive, rules
from .pytree import flatten
from .tracer import Tracer

_placeholder_ids = itertools.count(1)


def _expand(u: UOp, size: sint) -> UOp:
    """`u` with a leading batch axis of `size` (a broadcast)."""
    shape = tuple(u.shape)
    return UOp(Ops.EXPAND, u.dtype, (UOp(Ops.RESHAPE, u.dtype, (u,), (1, *shape)),), (size, *shape))


class Batcher:
    """The rewrite of one vmap: memo node -> (rewritten node, whether it has the batch axis at 0)."""

    def __init__(self, memo: dict, size: sint):
        self.memo, self.size = memo, size

    def child(self, extra: dict) -> "Batcher":
        """A batcher for a loop body: this one's rewrites and `extra` (the body's carries)."""
        return Batcher({**self.memo, **extra}, self.size)

    def get(self, root: UOp) -> tuple[UOp, bool]:
        memo = self.memo
        for node in root.toposort():
            if node in memo:
                continue
            srcs = [memo[s] for s in node.src]
            reads = node.op is Ops.LOOP and _reads_any(node, memo)
            if not reads and not any(b for _, b in srcs) and all(u is s for (u, _), s in zip(srcs, node.src)):
                memo[node] = (node, False)
                continue
            rule = rules(node.op).batch
            if rule is None:
                raise TraceError(f"pj.vmap has no batching rule for {node.op.name} yet")
            memo[node] = rule(self, node, [u for u, _ in srcs], [b for _, b in srcs])
        return memo[root]

    def batched(self, u: UOp, b: bool) -> UOp:
        return u if b else _expand(u, self.size)


def _reads_any(loop: UOp, memo: dict) -> bool:
    """Whether a loop's body reads a node the rewrite changed (a placeholder, or something computed from one)."""
    changed = {n for n, (u, b) in memo.items() if b or u is not n}
    return any(o.depends_on(changed) for o in loop.arg.body_roots) if changed else False


def vmap(fun, args: tuple, in_axes, out_axes):
    """`fun` mapped over the `in_axes` of `args` (traced values), results' batch axis at `out_axes`."""
    leaves, _, tree = flatten(args)
    axes = _per_leaf(in_axes, args, "in_axes")
    memo, size, per_example = {}, None, []
    for x, ax in zip(leaves, axes):
        if ax is None:
            per_example.append(x)
            continue
        t = prims.to_tracer(x)
        if t.ndim == 0:
            raise ValueError(f"vmap was asked to map axis {ax} of a 0-d value (in_axes says so)")
        ax = prims.normalize_axis(ax, t.ndim)
        d = t.uop.shape[ax]
        if size is None:
            size = d
        elif not prims.dims_equal(size, d):
            raise ValueError(f"vmap got inconsistent sizes for the mapped axes: {prims.fmt_shape((size, d))}")
        order = (ax,) + tuple(i for i in range(t.ndim) if i != ax)
        moved = prims.permute(t, order)
        ph = UOp(Ops.CARRY, t.dtype, (), (-next(_placeholder_ids), 0, tuple(moved.uop.shape[1:])))
        memo[ph] = (moved.uop, True)
        per_example.append(Tracer(ph, weak=t.weak))
    if size is None:
        raise ValueError("vmap needs at least one argument with a mapped axis (in_axes all None)")
    batcher = Batcher(memo, size)
    with checks.loop_body() as recorded:
        out = fun(*tree.unflatten(per_example))
    out_leaves, _, out_tree = flatten(out)
    results = []
    for leaf, oax in zip(out_leaves, _per_leaf(out_axes, out, "out_axes")):
        t = prims.to_tracer(leaf)
        u, b = batcher.get(t.uop)
        if oax is None:
            if b:
                raise ValueError("vmap: an output with out_axes None depends on the mapped inputs")
            results.append(Tracer(u, weak=t.weak))
            continue
        u = batcher.batched(u, b)
        oax = prims.normalize_axis(oax, t.ndim + 1)
        order = tuple(range(1, oax + 1)) + (0,) + tuple(range(oax + 1, t.ndim + 1))
        results.append(prims.permute(Tracer(u, weak=t.weak), order))
    for flag, what in recorded.flags:  # a gather flag of any example fails the call
        u, b = batcher.get(prims.to_tracer(flag).uop)
        f = Tracer(u)
        if b:
            f = prims.reduce(f, Ops.OR, axis=0)
        checks.record_flag(f, what)
    return out_tree.unflatten(results)


def _per_leaf(axes, tree, what: str) -> list:
    """in_axes/out_axes as one entry per leaf of `tree`: an int or None for all, or a prefix tree of them."""
    leaves, _, treedef = flatten(tree)
    if axes is None or isinstance(axes, int) and not isinstance(axes, bool):
        return [axes] * len(leaves)
    if isinstance(axes, list):
        axes = tuple(axes)
    out = []

    def walk(spec, sub):
        if spec is None or isinstance(spec, int) and not isinstance(spec, bool):
            out.extend([spec] * len(flatten(sub)[0]))
            return
        if isinstance(spec, (tuple, list)) and isinstance(sub, (tuple, list)) and len(spec) == len(sub):
            for s, x in zip(spec, sub):
                walk(s, x)
            return
        if isinstance(spec, dict) and isinstance(sub, dict) and set(spec) == set(sub):
            for k in sub:
                walk(spec[k], sub[k])
            return
        raise ValueError(f"vmap {what} {axes!r} does not match the structure {treedef.describe()}")
    walk(axes, tree)
    return out


# ---------- batching rules ----------

def _elementwise(bt: Batcher, node: UOp, srcs, batched):
    return UOp(node.op, node.dtype, tuple(bt.batched(u, b) for u, b in zip(srcs, batched)), node.arg), True


def _reduce(bt, node, srcs, batched):
    op, axes = node.arg
    return UOp(node.op, node.dtype, (srcs[0],), (op, tuple(a + 1 for a in axes))), True


def _shape_arg(bt, node, srcs, batched):  # RESHAPE and EXPAND: the new shape
    return UOp(node.op, node.dtype, (srcs[0],), (bt.size, *node.arg)), True


def _permute(bt, node, srcs, batched):
    return UOp(node.op, node.dtype, (srcs[0],), (0, *(a + 1 for a in node.arg))), True


def _shrink(bt, node, srcs, batched):
    return UOp(node.op, node.dtype, (srcs[0],), ((0, 1, bt.size), *node.arg)), True


def _pad(bt, node, srcs, batched):
    return UOp(node.op, node.dtype, (srcs[0],), ((0, 0), *node.arg)), True


def _indexed_dims(dims) -> tuple:
    return (("dim", 0),) + tuple((kind, n + 1) if kind == "dim" else (kind, n) for kind, n in dims)


def _gather(bt, node, srcs, batched):
    x, *indices = (bt.batched(u, b) for u, b in zip(srcs, batched))
    return UOp(node.op, node.dtype, (x, *indices), _indexed_dims(node.arg)), True


def _scatter(bt, node, srcs, batched):
    dims, combine = node.arg
    return UOp(node.op, node.dtype, tuple(bt.batched(u, b) for u, b in zip(srcs, batched)),
               (_indexed_dims(dims), combine)), True


def _loop(bt: Batcher, node: UOp, srcs, batched):
    """A loop with its carries batched to a fixed point; the result is (the new LOOP, which carries are)."""
    info = node.arg
    which = list(batched)
    while True:
        loop_id = next(_loop_ids)
        carries = tuple(UOp(Ops.CARRY, c.dtype, (), (loop_id, j, ((bt.size, *c.arg[-1]) if b else c.arg[-1])))
                        for j, (c, b) in enumerate(zip(info.carries, which)))
        body = bt.child({c: (n, b) for c, n, b in zip(info.carries, carries, which)})
        outs = [body.get(o) for o in info.body_outputs]
        pred = body.get(info.pred) if info.pred is not None else None
        grown = [b or ob or (pred is not None and pred[1]) for b, (_, ob) in zip(which, outs)]
        if grown == which:
            break
        which = grown
    new_outs = [body.batched(u, ob) if b else u for (u, ob), b in zip(outs, which)]
    new_pred = None
    if pred is not None:
        new_pred, pb = pred
        if pb:  # run while any example's predicate holds; an example whose predicate is false keeps its carry
            new_outs = [UOp(Ops.WHERE, o.dtype, (_broadcast_pred(new_pred, o), o, c), None)
                        for o, c in zip(new_outs, carries)]
            red = UOp(Ops.REDUCE_AXIS, dtypes.bool, (new_pred,), (Ops.OR, (0,)))
            new_pred = UOp(Ops.RESHAPE, dtypes.bool, (red,), ())
    inits = tuple(bt.batched(u, b) if w else u for u, b, w in zip(srcs, batched, which))
    new = attrs.evolve(info, carries=carries, body_outputs=tuple(new_outs), pred=new_pred)
    return (UOp(Ops.LOOP, node.dtype, inits, new), tuple(which))


def _broadcast_pred(pred: UOp, like: UOp) -> UOp:
    """A (batch,) predicate broadcast to `like`'s (batch, ...) shape."""
    rest = tuple(like.shape[1:])
    if not rest:
        return pred
    column = UOp(Ops.RESHAPE, dtypes.bool, (pred,), (pred.shape[0], *(1,) * len(rest)))
    return UOp(Ops.EXPAND, dtypes.bool, (column,), tuple(like.shape))


def _loop_out(bt, node, srcs, batched):
    loop, which = bt.memo[node.src[0]]
    return UOp(Ops.LOOP_OUT, node.dtype, (loop,), node.arg), which[node.arg]


def _register():
    for op in ELEMENTWISE:
        primitive(op).batch = _elementwise
    for op, rule in ((Ops.REDUCE_AXIS, _reduce), (Ops.RESHAPE, _shape_arg), (Ops.EXPAND, _shape_arg),
                     (Ops.PERMUTE, _permute), (Ops.SHRINK, _shrink), (Ops.PAD, _pad), (Ops.GATHER, _gather),
                     (Ops.SCATTER, _scatter), (Ops.LOOP, _loop), (Ops.LOOP_OUT, _loop_out)):
        primitive(op).batch = rule


_register()
