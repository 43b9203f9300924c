"""Lowering: one kernel's traced subgraph -> a kernel AST of ranges, loads, ALU ops, a reduce and a store.

Movement ops are index maps: each one rewrites the index tuple on its way to the load that
reads a realized buffer, so views cost no copies. Index expressions and gates are simplified
with the symbolic rules, which folds static-shape indexing to affine forms.
"""
from __future__ import annotations

import functools
import re

from ..uop import Ops, UOp, as_uop, dtypes, simplify, sint, sym_prod
from ..uop.ops import ELEMENTWISE
from .stack_pieces import specialised_pieces

REALIZED = {Ops.INPUT, Ops.CARRY, Ops.REDUCE_AXIS, Ops.LOOP_OUT, Ops.SCATTER}


def strides_of(shape: tuple[sint, ...]) -> list[UOp]:
    out, acc = [], UOp.const(1)
    for d in reversed(shape):
        out.append(acc)
        acc = acc * d
    return out[::-1]


def linear_index(idx, shape) -> UOp:
    total = UOp.const(0)
    for i, st in zip(idx, strides_of(shape)):
        total = UOp(Ops.ADD, dtypes.index, (total, UOp(Ops.MUL, dtypes.index, (i, st))))
    return total


@functools.lru_cache(maxsize=4096)
def flat_index(idx: tuple, shape: tuple) -> UOp:
    """The simplified row-major offset of index `idx` into `shape` (memoised, as reshape_index: the kernels of a
    model's layers read their buffers at the same indices)."""
    return simplify(linear_index(idx, shape))


def _same_size(a: sint, b: sint) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    d = simplify(as_uop(a) - b)
    return d.op is Ops.CONST and d.arg == 0


def _dim_groups(out_shape: tuple, src_shape: tuple) -> list[tuple[list[int], list[int]]]:
    """Runs of non-unit output and source dims with equal products, from the right (the whole shapes
    as one run where no shorter runs match)."""
    outs = [k for k, d in enumerate(out_shape) if not (isinstance(d, int) and d == 1)]
    srcs = [k for k, d in enumerate(src_shape) if not (isinstance(d, int) and d == 1)]
    groups, o, s = [], len(outs), len(srcs)
    while o > 0 and s > 0:
        cut = None
        for width in range(2, o + s + 1):  # the shortest pair of runs ending at (o, s) with equal products
            for wo in range(max(1, width - s), min(o, width - 1) + 1):
                ws = width - wo
                if _same_size(sym_prod(out_shape[k] for k in outs[o - wo:o]),
                              sym_prod(src_shape[k] for k in srcs[s - ws:s])):
                    cut = (wo, ws)
                    break
            if cut:
                break
        if cut is None:
            break
        groups.append((outs[o - cut[0]:o], srcs[s - cut[1]:s]))
        o, s = o - cut[0], s - cut[1]
    if o or s:
        groups.append((outs[:o], srcs[:s]))
    return groups


@functools.lru_cache(maxsize=4096)
def reshape_index(idx: tuple, out_shape: tuple, src_shape: tuple) -> tuple:
    """The source index of a reshape's output index `idx`: dims are matched in runs of equal size, so a
    reshape that only adds or drops unit dims, or merges or splits some dims, divides only within a run."""
    new = [UOp.const(0)] * len(src_shape)
    for outs, srcs in _dim_groups(out_shape, src_shape):
        if len(outs) == 1 and len(srcs) == 1:
            new[srcs[0]] = idx[outs[0]]
            continue
        flat = linear_index([idx[k] for k in outs], [out_shape[k] for k in outs])
        for n, (k, st) in enumerate(zip(srcs, strides_of([src_shape[k] for k in srcs]))):
            x = flat if n == len(srcs) - 1 else UOp(Ops.IDIV, dtypes.index, (flat, st))
            new[k] = simplify(x if n == 0 else UOp(Ops.MOD, dtypes.index, (x, as_uop(src_shape[k]))))
    return tuple(new)


class _Lowerer:
    def __init__(self, is_buffer):
        self.is_buffer = is_buffer
        self.buffers: list[UOp] = []
        self.memo: dict = {}
        self.next_axis = 0  # the axis number of the next reduce range

    def global_of(self, node: UOp) -> UOp:
        if node not in self.buffers:
            self.buffers.append(node)
        return UOp(Ops.DEFINE_GLOBAL, node.dtype, (), self.buffers.index(node) + 1)

    def build(self, node: UOp, idx: tuple, gate: UOp | None) -> UOp:
        """The lowered value of `node` at `idx`. `_build` is a generator that yields each (node, idx, gate) it
        needs; this loop feeds them from an explicit stack, so a chain of thousands of ops does not recurse."""
        key = (node, idx, gate)
        if key in self.memo:
            return self.memo[key]
        stack, value = [(key, self._build(*key))], None
        while stack:
            key, steps = stack[-1]
            try:
                need = steps.send(value)
            except StopIteration as done:
                stack.pop()
                value = self.memo[key] = done.value
                continue
            value = self.memo.get(need)
            if value is None:
                stack.append((need, self._build(*need)))
        return value

    def _build(self, node: UOp, idx: tuple, gate: UOp | None):
        """Lower one node (a generator: yields the (node, idx, gate) values it reads, returns its value)."""
        op = node.op
        if self.is_buffer(node):
            index = flat_index(idx, node.shape)
            src = (self.global_of(node), index) + (() if gate is None else (gate,))
            return UOp(Ops.LOAD, node.dtype, src)
        if op in (Ops.CONST, Ops.DEFINE_VAR):
            return node
        if op is Ops.IOTA:
            return idx[node.arg[1]]
        if op in ELEMENTWISE:
            srcs = []
            for s in node.src:
                srcs.append((yield (s, idx, gate)))
            return UOp(op, node.dtype, tuple(srcs), node.arg)
        if op is Ops.SCATTER:  # inlined into its reader (fusion.py: inlined_scatters)
            return (yield from self.scattered(node, idx, gate))
        src = node.src[0]
        if op is Ops.REDUCE_AXIS:  # the kernel's root, or a reduction fused into the kernel that reads it
            red_op, axes = node.arg
            red_ranges = {}
            for a in axes:
                red_ranges[a] = _range(src.shape[a], self.next_axis, "reduce")
                self.next_axis += 1
            value = yield (src, tuple(red_ranges.get(k, i) for k, i in enumerate(idx)), gate)
            ranges = tuple(r for r in red_ranges.values() if r.op is Ops.RANGE)
            return UOp(Ops.REDUCE, node.dtype, (value, *ranges), red_op) if ranges else value
        if op is Ops.RESHAPE:
            return (yield (src, reshape_index(idx, node.shape, src.shape), gate))
        if op is Ops.PERMUTE:
            new = [None] * len(idx)
            for i, o in enumerate(node.arg):
                new[o] = idx[i]
            return (yield (src, tuple(new), gate))
        if op is Ops.EXPAND:
            new = tuple(UOp.const(0) if isinstance(sd, int) and sd == 1 else i for i, sd in zip(idx, src.shape))
            return (yield (src, new, gate))
        if op is Ops.SHRINK:
            new = tuple(i if step == 1 and isinstance(start, int) and start == 0 else  # (idx is simplified)
                        simplify(as_uop(start) + i * step) for i, (start, step, _) in zip(idx, node.arg))
            return (yield (src, new, gate))
        if op is Ops.PAD:
            valid, new = UOp.const(True, dtypes.bool), []
            for i, d, (before, _) in zip(idx, src.shape, node.arg):
                inside = UOp(Ops.AND, dtypes.bool, (UOp(Ops.CMPLT, dtypes.bool, (as_uop(before) - 1, i)),
                                                     UOp(Ops.CMPLT, dtypes.bool, (i, as_uop(before) + d))))
                valid = UOp(Ops.AND, dtypes.bool, (valid, inside))
                new.append(simplify(i - before) if isinstance(before, UOp) or before else i)
            valid = simplify(valid)
            if valid.op is Ops.CONST and valid.arg:
                return (yield (src, tuple(new), gate))
            inner_gate = valid if gate is None else simplify(UOp(Ops.AND, dtypes.bool, (gate, valid)))
            value = yield (src, tuple(new), inner_gate)
            return UOp(Ops.WHERE, node.dtype, (valid, value, UOp.const(0, node.dtype)))
        if op is Ops.GATHER:
            new, inner_gate, selected = [], gate, None
            for (kind, n), d in zip(node.arg, src.shape):
                if kind == "dim":
                    new.append(idx[n])
                    continue
                at, inside = yield from self.gather_index(node.src[1 + n], idx, gate, d)
                if as_uop(d).vmin >= 1 and self.views_a_buffer(src):   # clamped, its value selected: _clamped
                    new.append(_clamped(at, d))
                    selected = inside if selected is None else UOp(Ops.AND, dtypes.bool, (selected, inside))
                    continue
                new.append(at)
                inner_gate = inside if inner_gate is None else simplify(UOp(Ops.AND, dtypes.bool, (inner_gate, inside)))
            value = yield (src, tuple(new), inner_gate)
            return value if selected is None else UOp(Ops.WHERE, node.dtype, (simplify(selected), value,
                                                                                UOp.const(0, node.dtype)))
        raise NotImplementedError(f"cannot lower {op} inside a kernel")

    def scattered(self, node: UOp, idx: tuple, gate: UOp | None):
        """(A generator step of `_build`.) SCATTER `node` read at target index `idx`: the update whose indices
        point here (the update index maps the target's dims back; the indices are uniform, so they are read at
        it too), combined with or replacing the target's value, else the target's value."""
        target, updates, *indices = node.src
        dims, combine = node.arg
        at = [UOp.const(0)] * len(updates.shape)
        for (kind, n), i in zip(dims, idx):
            if kind == "dim":
                at[n] = i
        at = tuple(at)
        old = yield (target, idx, gate)
        new = yield (updates, at, gate)
        hit = UOp.const(True, dtypes.bool)
        for (kind, n), i, d in zip(dims, idx, target.shape):
            if kind == "index":
                where, _ = yield from self.gather_index(indices[n], at, gate, d)
                hit = UOp(Ops.AND, dtypes.bool, (hit, UOp(Ops.CMPEQ, dtypes.bool, (where, i))))
        new = new if combine is None else UOp(combine, node.dtype, (old, new))
        return UOp(Ops.WHERE, node.dtype, (simplify(hit), new, old))

    def views_a_buffer(self, node: UOp) -> bool:
        """Whether `node` is a realized buffer or a view of one that adds no gate of its own (no pad): an index
        clamped into its dims reads inside the buffer, as the bounds proof sees it."""
        while not self.is_buffer(node):
            if node.op not in (Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.SHRINK):
                return False
            node = node.src[0]
        return True

    def gather_index(self, indices: UOp, idx: tuple, gate: UOp | None, dim: sint):
        """(A generator step of `_build`.) A loaded index, negatives wrapped once (NumPy), and whether it lies in
        [0, dim): an out-of-range id (flagged by the trace, see tracing/numpy_index.py) yields 0, its read clamped
        into the dim (`_clamped`), or, where the dim may be empty, gated off (reading nothing)."""
        return wrapped_index((yield (indices, idx, gate)), dim)


def _clamped(at: UOp, dim: sint) -> UOp:
    """A gathered index `at` clamped into [0, dim) for its read (a dim of at least one element), whose value the
    gather then selects where the id is in range (0 elsewhere: the same values as a read gated on it). Ungated, the
    reads of a run of consecutive elements at one id are consecutive addresses, which a GPU compiler turns into
    vector loads (a paged cache's key row of 64 bfloat16: 16 loads a lane of a score's team -> two); gated, each
    element's address was `in range ? index : 0`, a load of its own (the paged attention kernel took twice the time
    on an H100, 127 -> 56 us at 64 sequences of 1024 positions)."""
    return simplify(at.smax(0).smin(as_uop(dim) - 1))


def wrapped_index(v: UOp, dim: sint) -> tuple[UOp, UOp]:
    """(`v` as an index with negatives wrapped once, whether that lies in [0, dim))."""
    v = v if v.dtype == dtypes.index else UOp(Ops.CAST, dtypes.index, (v,))
    d = as_uop(dim)
    at = simplify(UOp(Ops.WHERE, dtypes.index, (UOp(Ops.CMPLT, dtypes.bool, (v, UOp.const(0))), v + d, v)))
    inside = UOp(Ops.AND, dtypes.bool, (UOp(Ops.CMPLT, dtypes.bool, (UOp.const(-1), at)),
                                        UOp(Ops.CMPLT, dtypes.bool, (at, d))))
    return at, simplify(inside)


def _range(end: sint, axis: int, kind: str) -> UOp:
    """The range of `end` iterations, or index 0 where `end` is 1 at every value of its vars (a static 1, or a var
    whose bounds are (1, 1): a decode plan's batch of one), so the kernel's outermost loop, which threads split, is
    a range with more than one iteration."""
    end = simplify(as_uop(end))
    if end.vmin == end.vmax == 1:
        return UOp.const(0)
    return UOp(Ops.RANGE, dtypes.index, (end,), (axis, kind))


def kernel_name(prefix: str, shape) -> str:
    dims = "_".join(re.sub(r"\W+", "", d.render() if isinstance(d, UOp) else str(d)) or "x" for d in shape)
    return prefix + (dims or "1")


def lower_kernel(root: UOp, is_buffer) -> tuple[UOp, list[UOp]]:
    """The kernel AST computing `root` into slot 0, and the realized nodes it reads (slots 1..)."""
    low = _Lowerer(lambda n: is_buffer(n) and (n is not root or n.op in (Ops.INPUT, Ops.CARRY, Ops.LOOP_OUT)))
    shape = root.shape
    idx = tuple(_range(d, i, "loop") for i, d in enumerate(shape))
    low.next_axis = len(shape)
    value = specialised_pieces(low.build(root, idx, None))
    out = UOp(Ops.DEFINE_GLOBAL, root.dtype, (), 0)
    store = UOp(Ops.STORE, dtypes.bool, (out, flat_index(idx, shape), value))
    reduces = root.op is Ops.REDUCE_AXIS or any(u.op is Ops.REDUCE for u in value.toposort())
    return UOp(Ops.SINK, dtypes.bool, (store,), kernel_name("r_" if reduces else "E_", shape)), low.buffers


def lower_copy(node: UOp, is_buffer) -> tuple[UOp, list[UOp]]:
    """The kernel copying realized `node` into slot 0 (a scatter's buffer starts as a copy of its target)."""
    return lower_kernel(UOp(Ops.RESHAPE, node.dtype, (node,), node.shape), is_buffer)


def lower_scatter(root: UOp, is_buffer) -> tuple[UOp, list[UOp]]:
    """The kernel writing SCATTER `root`'s updates into slot 0 (which already holds the target's value), and
    the realized nodes it reads (slots 1..). One store over the updates' index space, gated on the ids being
    in range; a combining scatter reads, combines and writes back (STORE's arg). Its loops are serial (never
    split over CPU threads) unless updates dim 0 is a dim of the target: then threads own distinct rows."""
    target, updates, *indices = root.src
    dims, combine = root.arg
    kind = "loop" if ("dim", 0) in dims else "serial"
    shape = updates.shape
    idx = tuple(_range(d, i, kind) for i, d in enumerate(shape))
    low = _Lowerer(is_buffer)
    low.next_axis = len(shape)
    value = low.build(updates, idx, None)
    at, gate = [], UOp.const(True, dtypes.bool)
    for (k, n), d in zip(dims, target.shape):
        if k == "dim":
            at.append(idx[n])
            continue
        i, inside = wrapped_index(low.build(indices[n], idx, None), d)
        at.append(i)
        gate = UOp(Ops.AND, dtypes.bool, (gate, inside))
    gate = simplify(gate)
    out = UOp(Ops.DEFINE_GLOBAL, root.dtype, (), 0)
    always = gate.op is Ops.CONST and gate.arg
    src = (out, flat_index(tuple(at), target.shape), value) + (() if always else (gate,))
    store = UOp(Ops.STORE, dtypes.bool, src, combine)
    return UOp(Ops.SINK, dtypes.bool, (store,), kernel_name("S_", shape)), low.buffers
