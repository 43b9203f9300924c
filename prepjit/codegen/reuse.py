"""A value a kernel would compute twice, stored once and read back: softmax's exp.

`e / sum(e)` over a row, fused into one kernel (fused_reductions.py), computes `e = exp(x - max)` once inside the sum's
loop and again for each output element. When a kernel's one store writes a value that contains a sum over a
reduce range `k` whose operand, with `k` renamed to the store's innermost loop `j` (same extent), is also a
costly part of the stored value, the kernel is rewritten into two stores over the row:

    out[row, j'] = e(row, j')                          (a loop of its own, j' over j's extent)
    out[row, j]  = f(out[row, j], sum_k out[row, k])   (the sum reads the stored values back)

so `e` is computed once per element. The sum reads a buffer its kernel writes: the renderer computes it only
after the first store (render_llvm.py). Threads split the outer loops, which both stores share.
"""
from __future__ import annotations

from ..uop import Ops, UOp
from .fusion import OP_COST

MIN_COST = 4  # ops-equivalents of the value, at least: a cheaper one is recomputed


def _cost(u: UOp) -> int:
    return sum(OP_COST.get(x.op, 1) for x in u.toposort() if x.op not in (Ops.CONST, Ops.RANGE, Ops.DEFINE_GLOBAL))


def store_shared_value(ast: UOp) -> UOp:
    """`ast` with a twice-computed value of its one store computed once (see the module docstring), or as is."""
    if ast.op is not Ops.SINK or len(ast.src) != 1 or len(ast.src[0].src) != 3 or ast.src[0].arg is not None:
        return ast
    store = ast.src[0]
    out, index, value = store.src
    loops = sorted({u for u in store.toposort() if u.op is Ops.RANGE and u.arg[1] == "loop"}, key=lambda r: r.arg[0])
    if len(loops) < 2 or out.dtype != value.dtype:
        return ast
    j = loops[-1]
    inside = set(value.toposort())
    for red in value.toposort():
        if red.op is not Ops.REDUCE or red.arg is not Ops.ADD or len(red.src) != 2:
            continue
        k = red.src[1]
        if k.src[0] is not j.src[0] or j in red.toposort():
            continue
        shared = red.src[0].substitute({k: j})
        if shared not in inside or shared.dtype != out.dtype or _cost(shared) < MIN_COST:
            continue
        axis = max(r.arg[0] for r in ast.toposort() if r.op is Ops.RANGE) + 1
        j2 = UOp(Ops.RANGE, j.dtype, j.src, (axis, "loop"))
        first = UOp(Ops.STORE, store.dtype, (out, index.substitute({j: j2}), shared.substitute({j: j2})))
        read_back = UOp(Ops.REDUCE, red.dtype, (UOp(Ops.LOAD, out.dtype, (out, index.substitute({j: k}))), k), red.arg)
        second = UOp(Ops.STORE, store.dtype, (out, index, value.substitute(
            {red: read_back, shared: UOp(Ops.LOAD, out.dtype, (out, index))})))
        return UOp(Ops.SINK, ast.dtype, (first, second), ast.arg)
    return ast
