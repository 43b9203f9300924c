"""Row kernels that stop each row's reductions where the rest of the row adds only identities (a paged cache's
blocks past a sequence's length), decided on the launched AST of the work-group targets.

A decode batch's attention row (softmax_contraction.py: a work-group per (sequence, query head)) runs over the
table width NB x block positions, the width of the batch's longest sequence; a shorter sequence's row is masked past
its length (llama_paged: where(position < pos[b], x, identity), the max's -inf and the sums' 0, the probabilities
and the values both, so a product is 0 too). Such a reduction's terms past the row's bound L change nothing: its
range over blocks may end at ceil(L / block) instead, and the row kernel then neither loads nor computes a masked
block (at 64 sequences of ragged lengths the kernel computed about twice the positions the rows see). The values
are the same, bit for bit: a work-item's share of each pass is fixed by the positions, not by where the row ends,
and what is skipped adds identities (x + 0 is x for an accumulator that starts at +0, max(x, -inf) is x).

`bounded_rows(ast)`: the launched kernel with such a range's end `min(end, ceil(L / stride))` (L read by the
row's work-group, uniform across it: a bound every work-item shares), where every reduction over the range is
masked by the same condition `index < L` with `index` = stride * range + (terms in [0, stride) without it) and L
a value of the row (of its ranges alone); the bounds proof sees the bound's largest value, the
range's old end. A work-group per row only ("rows" launches of one row a group; or of rows a work-group folds,
row_plan.Rows.fold, where L reads no fold range): a tile's rows share their loops.
Never a range of the kernel's loops (a row's passes sharing the columns' range, row_plan.share_passes): the row
stores every column, and the renderer takes that range's static runs.
"""
from __future__ import annotations

from ..uop import Ops, UOp, simplify
from .gpu_launch import launch_of
from .row_plan import rows_of


def bounded_rows(ast: UOp) -> UOp:
    """`ast` (a launched kernel) with the ranges its row reductions may stop early bounded (see the module)."""
    launch = launch_of(ast)
    if launch is None or launch[0] != "rows" or launch[2] != 1:
        return ast
    plan = rows_of(ast, *launch[1:])
    rows, loops = set(plan.rows) - {plan.fold}, {*plan.rows, *plan.cols}   # (a fold's rows share the bound)
    by_range: dict[UOp, list[UOp]] = {}
    for u in ast.toposort():
        if u.op is Ops.REDUCE:
            for r in u.src[1:]:
                if r not in loops:   # (a row's passes over the columns' own range: share_passes)
                    by_range.setdefault(r, []).append(u)
    bounded = {}
    for r, reductions in by_range.items():
        bounds = {_bound(u, r, rows) for u in reductions}
        if len(bounds) == 1 and None not in bounds:
            (end,) = bounds
            bounded[r] = UOp(Ops.RANGE, r.dtype, (simplify(r.src[0].smin(end)),), r.arg)
    return ast.substitute(bounded) if bounded else ast


def _bound(u: UOp, r: UOp, rows: set) -> UOp | None:
    """The end range `r` of reduction `u` may take, or None: where u's operand is its identity at every index
    past it (a condition `index < L` it is masked by, index = stride * r + terms in [0, stride), L read at the
    row: of no range but the `rows` ranges)."""
    cond = _mask(u.src[0], u.arg)
    if cond is None or cond.op is not Ops.CMPLT:
        return None
    index, limit = cond.src
    if any(x.op is Ops.RANGE and x not in rows for x in limit.toposort()):
        return None
    stride, rest = _split(simplify(index), r)
    if stride is None or rest is not None and not 0 <= rest.vmin <= rest.vmax < stride:
        return None   # (a range bounded is the index's leading digit: a paged row's blocks, not their rows)
    return (limit.smax(0) + (stride - 1)) // stride


def _mask(x: UOp, op: Ops) -> UOp | None:
    """The condition where `x` is the identity of `op` when False (where(c, v, identity); for sums, products and
    roundings of such values too, all masked by the same c), or None."""
    if x.op is Ops.WHERE and _identity(x.src[2], op):
        return x.src[0]
    if op is Ops.ADD and x.op is Ops.CAST:
        return _mask(x.src[0], op)
    if op is Ops.ADD and x.op in (Ops.MUL, Ops.ADD):
        conds = {_mask(s, op) for s in x.src}
        return conds.pop() if len(conds) == 1 else None
    return None


def _identity(c: UOp, op: Ops) -> bool:
    if c.op is not Ops.CONST:
        return False
    return c.arg == 0 if op is Ops.ADD else c.arg == float("-inf") if op is Ops.MAX else False


def _split(index: UOp, r: UOp) -> tuple[int | None, UOp | None]:
    """(stride, the other terms) where `index` = stride * r + other terms free of r (a constant stride of at least
    1), else (None, None)."""
    terms = _terms(index)
    mine = [t for t in terms if r in t.toposort()]
    if len(mine) != 1:
        return None, None
    (t,) = mine
    if t is r:
        stride = 1
    elif t.op is Ops.MUL and r in t.src and (c := t.src[1] if t.src[0] is r else t.src[0]).op is Ops.CONST:
        stride = c.arg
    else:
        return None, None
    if not isinstance(stride, int) or stride < 1:
        return None, None
    rest = [x for x in terms if x is not t]
    total = rest[0] if rest else None
    for x in rest[1:]:
        total = total + x
    return stride, total


def _terms(x: UOp) -> list[UOp]:
    return [t for s in x.src for t in _terms(s)] if x.op is Ops.ADD else [x]
