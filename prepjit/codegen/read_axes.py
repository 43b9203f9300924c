"""What a kernel's index depends on where it reads a node: per axis of each node the kernel computing `root` reads
(inlining what is not stopped at), the output axes of `root` the node's index depends on (`read_axes`), besides
INNER_AXIS (a reduction's own axis) and UNKNOWN (what is not known: a gather's indices). fusion.py asks it whether a
kernel reads a value one element per row of its output (`per_row`: a decode batch's row's norm), which axes a
streaming kernel reads its loads along, and whether a value's index depends on none (`uniform`: a KV cache's row).
"""
from __future__ import annotations

import functools

from ..uop import Ops, UOp
from ..uop.ops import ELEMENTWISE

INNER_AXIS, UNKNOWN = frozenset((-1,)), frozenset((-2,))  # what an axis's index depends on (read_axes) besides
# the kernel's output axes: a reduction's own axis, or what is not known (a gather's indices)


def reads_with_axes(root: UOp, stop):
    """Each (node, axes) the kernel computing `root` reads where `stop(node)` (not walked below it), computing inline
    what is above: axes holds, per dim of the node, the output axes of `root` its index depends on (read_axes)."""
    stack, seen = [(root, tuple(frozenset((k,)) for k in range(len(root.shape))))], set()
    while stack:
        item = stack.pop()
        if item in seen:
            continue
        seen.add(item)
        n, axes = item
        if n is not root and stop(n):
            yield item
        else:
            stack.extend(zip(n.src, read_axes(n, axes)))


def walk_order(tops: list, expand, shared, memo: dict) -> dict:
    """The items reads_with_axes' depth-first walk yields, in its order, as a dict's keys, the walk's items its
    caller's: from a stack holding `tops` (popped last first), an item popped the first time yields if `expand(item)`'s
    first value says so, then pushes its second (its operands' items). What the walk from an item whose node is in
    `shared` yields is kept in `memo` (for the walks of one graph under one `expand`): a walk reaching that item
    appends what it does not hold yet, in that order, which is the plain walk's (below an item it first reaches, it
    yields what that item's own walk yields, less what it yielded before). So the kernels reading a residual stream
    no longer each walk its chain of adds through every block before them (time growing with the square of the
    layers). A walk needing an item's order that `memo` lacks hands it back here to walk first: no recursion,
    however long the chain."""
    walks = [(None, _walk(None, tops, expand, shared, memo))]
    while True:
        item, walk = walks[-1]
        try:
            needed = next(walk)
        except StopIteration as done:
            walks.pop()
            if item is None:
                return done.value
            memo[item] = done.value
            continue
        yields, below = expand(needed)
        walks.append((needed, _walk(needed if yields else None, below, expand, shared, memo)))


def _walk(first, tops, expand, shared, memo):
    """walk_order's walk from `tops`, `first` yielded before them (where not None); yields each shared item whose
    order it needs and `memo` lacks (walk_order puts it there), returns the order."""
    order, seen, stack = {} if first is None else {first: None}, set(), list(tops)
    while stack:
        item = stack.pop()
        if item in seen:
            continue
        seen.add(item)
        if item[0] in shared:
            if item not in memo:
                yield item
            order.update(memo[item])
            continue
        yields, below = expand(item)
        if yields:
            order[item] = None
        stack += below
    return order


def per_row(node: UOp, axes: tuple, root: UOp) -> bool:
    """Whether `node`, read with `axes` (per axis, what its index depends on: read_axes) by the kernel computing
    `root`, is read at an index that some leading output axes of the kernel alone give, not all (each of its
    elements is one row's value, read for each output of the row, computed where the row's loops are open)."""
    used = frozenset().union(*(a for a, d in zip(axes, node.shape) if not is_one(d)))
    outputs = [k for k, d in enumerate(root.shape) if not is_one(d)]
    return 0 < len(used) < len(outputs) and used == frozenset(outputs[:len(used)])  # leading axes: the row's loops


def uniform(node: UOp) -> bool:
    """Whether `node` has the same value at every index (a scalar broadcast, computed from scalars)."""
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        if n in seen or n.op in (Ops.CONST, Ops.DEFINE_VAR) or all(isinstance(d, int) and d == 1 for d in n.shape):
            continue
        seen.add(n)
        if n.op not in ELEMENTWISE and n.op not in (Ops.RESHAPE, Ops.EXPAND, Ops.PERMUTE, Ops.SHRINK):
            return False
        stack.extend(n.src)
    return True


@functools.lru_cache(maxsize=1 << 16)
def read_axes(n: UOp, axes: tuple) -> tuple[tuple, ...]:
    """Per operand of `n`, per axis of it, what its index depends on (the kernel's output axes by number,
    INNER_AXIS, UNKNOWN), `n`'s index depending on `axes` so: an elementwise op reads its operands at
    its own index, a broadcast reads its grown axes at 0, a reshape keeps the axes on either side of its
    unchanged leading ones or of its size-1 axes alone, a reduction's reduced axes are its own. Cached: every kernel
    reading a model's residual stream walks the stream's chain of adds through the blocks before it; schedule.py
    clears it once a graph's fusion is decided."""
    if n.op in ELEMENTWISE:  # (an operand of its rank is read at its index, one of another rank at unknown ones)
        rank = len(axes)
        return tuple([axes if len(s.shape) == rank else (UNKNOWN,) * len(s.shape) for s in n.src])
    src = n.src[0].shape if n.src else ()
    if n.op is Ops.REDUCE_AXIS:
        return (tuple(INNER_AXIS if k in n.arg[1] else a for k, a in enumerate(axes)),)
    if n.op is Ops.EXPAND:
        return (tuple(frozenset() if is_one(d) and not is_one(e) else a for d, e, a in zip(src, n.shape, axes)),)
    if n.op in (Ops.SHRINK, Ops.PAD):
        return (axes,)
    if n.op is Ops.PERMUTE:
        out = [None] * len(src)
        for a, k in zip(axes, n.arg):
            out[k] = a
        return (tuple(out),)
    if n.op is Ops.RESHAPE:
        kept = [k for k, d in enumerate(n.shape) if not is_one(d)]
        if [n.shape[k] for k in kept] == [d for d in src if not is_one(d)]:  # size-1 axes added or dropped
            moved = iter(axes[k] for k in kept)
            return (tuple(frozenset() if is_one(d) else next(moved) for d in src),)
        lead = 0
        while lead < min(len(src), len(n.shape)) and src[lead] == n.shape[lead]:
            lead += 1
        rest = frozenset().union(*axes[lead:])
        return (tuple(axes[:lead]) + (rest,) * (len(src) - lead),)
    return tuple((UNKNOWN,) * len(s.shape) for s in n.src)


def is_one(d) -> bool:
    return isinstance(d, int) and d == 1
