"""Kernels that differ only in where they start in their buffers share one AST: the start is a fixedvar.

A model's layers read their slice of one stacked array (a KV cache `k[layer]`): the kernels of the 30
layers are the same loop nest with the layer's constant offset in one buffer's indices, so each would be
optimised, proven and compiled on its own. Here every access's index is split into its constant term and
the rest; kernels with the same rest (and the same buffer shapes) whose constants differ get one AST in
which the varying per-buffer offset is a var (bounded by the offsets seen), each launch fixing its value
as a fori_loop iteration fixes its counter. The bounds proof covers every offset in those bounds, so each
launch's own offset is proven too.

The scheduler's side of the same fact (`without_starts`, `shifted`): such kernels are one lowering too. A
kernel reading its slice of a stacked buffer (SHRINK of constant starts straight over the buffer) is lowered
from the slice at start 0, then each access of that buffer moves by the start's flat offset: the start
enters only that buffer's index, linearly, so the moved AST is the one the kernel's own graph lowers to
(tests/codegen/test_offsets.py compares them).
"""
from __future__ import annotations

from ..uop import Ops, UOp
from ..uop.symbolic import from_poly, poly

_ACCESS = (Ops.LOAD, Ops.STORE)


def _slot_offsets(ast: UOp) -> dict[int, int]:
    """Per buffer slot, the smallest constant term of its accesses' indices."""
    consts: dict[int, int] = {}
    for u in ast.toposort():
        if u.op in _ACCESS:
            slot = u.src[0].arg
            c = poly(u.src[1]).get((), 0)
            consts[slot] = min(c, consts.get(slot, c))
    return consts


def without_starts(graph: UOp, readers: dict[UOp, set[UOp]]) -> tuple[UOp, dict[UOp, int]]:
    """`graph` with each buffer (a leaf; `readers`: the nodes of `graph` reading each) that only one SHRINK reads,
    at constant starts not all 0 and a static shape, read at starts 0 instead; and each such buffer's flat offset
    (its starts' offset)."""
    swap, offsets = {}, {}
    for buf, (r, *more) in readers.items():
        if more or r.op is not Ops.SHRINK or not all(type(d) is int for d in buf.shape):
            continue
        starts = [start for start, _, _ in r.arg]
        if not all(type(s) is int for s in starts) or not any(starts):
            continue
        offset, stride = 0, 1
        for start, d in zip(reversed(starts), reversed(buf.shape)):
            offset, stride = offset + start * stride, stride * d
        swap[r] = UOp(Ops.SHRINK, r.dtype, r.src, tuple((0, step, size) for _, step, size in r.arg))
        offsets[buf] = offset
    return (graph.substitute(swap), offsets) if swap else (graph, offsets)


def shifted(ast: UOp, offsets: dict[int, int]) -> UOp | None:
    """`ast` with each access of slot s indexed offsets[s] further on, in the form simplify gives the index
    with that constant added (its polynomial's canonical form); None where an index is a min or max (a sum
    pushed into one, whose form with the constant takes it inside). A min or max within the sum's terms (a
    gathered id clamped into its dim: the paged KV cache's k_pool[layer]) keeps its form with any constant
    added (symbolic._push_into_minmax does not count constants merging)."""
    for u in ast.toposort():
        if u.op in _ACCESS and u.src[0].arg in offsets and u.src[1].op in (Ops.MAX, Ops.MIN):
            return None
    return _rebuild(ast, {s: (-c, None) for s, c in offsets.items()})


def _rebuild(ast: UOp, shift: dict[int, tuple[int, UOp | None]]) -> UOp:
    """`ast` with each access of slot s indexed by (index - c) [+ var] for shift[s] = (c, var)."""
    new: dict = {}
    for u in ast.toposort():
        src = tuple(new[s] for s in u.src)
        if u.op in _ACCESS and u.src[0].arg in shift:
            c, var = shift[u.src[0].arg]
            p = dict(poly(src[1]))  # the rebuilt index: a load inside it (a gathered id) read at its own shift
            rest = p.pop((), 0) - c
            if rest:
                p[()] = rest
            index = from_poly(p, u.src[1].dtype)
            src = (src[0], index if var is None else UOp(Ops.ADD, index.dtype, (index, var)), *src[2:])
        new[u] = u if src == u.src else UOp(u.op, u.dtype, src, u.arg)
    return new[ast]


def share_offsets(kernels: list, shapes_of, taken: set[str]) -> list:
    """`kernels` (ScheduledKernels) with those that differ only in constant buffer offsets rewritten to one
    AST each (the offsets as fixedvars named apart from `taken`); `shapes_of(kernel)` is the tuple of its
    buffers' shapes. Kernels that share nothing are returned as they are."""
    candidates: dict = {}
    for i, k in enumerate(kernels):
        candidates.setdefault((k.ast.arg, len(k.buffers), shapes_of(k)), {}).setdefault(k.ast, []).append(i)
    out = list(kernels)
    for (_, _, shapes), by_ast in candidates.items():
        if len(by_ast) < 2:
            continue
        groups: dict = {}
        for ast, users in by_ast.items():
            offsets = _slot_offsets(ast)
            key = _rebuild(ast, {s: (c, None) for s, c in offsets.items()})
            groups.setdefault(key, []).append((ast, offsets, users))
        for members in groups.values():
            if len(members) < 2:
                continue
            slots = sorted(members[0][1])
            varying = [s for s in slots if len({m[1][s] for m in members}) > 1]
            names = {}
            for s in varying:
                name, n = f"offset{s}", 0
                while name in taken:
                    n += 1
                    name = f"offset{s}_{n}"
                names[s] = name
            values = {s: [m[1][s] for m in members] for s in varying}
            shared = _rebuild(members[0][0], {s: (members[0][1][s], UOp.variable(names[s], min(values[s]),
                                                                                   max(values[s])))
                                              for s in varying})
            for ast, offsets, users in members:
                fixed = tuple((names[s], offsets[s]) for s in varying)
                for i in users:
                    out[i] = type(kernels[i])(shared, kernels[i].buffers, kernels[i].fixedvars + fixed)
    return out
