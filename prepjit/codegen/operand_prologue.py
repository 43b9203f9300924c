"""The cpu's operand prologue: a contraction operand that some of its loops do not change, computed once per call.

fusion.py recomputes a cheap value that only streaming kernels read (a decode step's matvecs) in those kernels
instead of materialising it: RMSNorm's normalised row x * rsqrt(mean(x^2)) * gain in the projections reading
it, SiLU(gate) * up in the down projection, q's and k's RoPE in the attention scores (k's as the cache's new
row). A GPU's row kernel computes it next to each weight load. A cpu
matvec would compute it at every weight element in a vector loop bound by those ops, and its reduction would
not split at a quantized weight's blocks (block_split.py takes one sum of products). So on the cpu the kernel
computes such an operand first, into an array of its own (DEFINE_LOCAL, one per call: a thread's chunk of the
outputs), and the contraction reads it back:

    scratch[k'] = operand(k')             serial loops before the parallel loop: once per call
    out[j]      = sum_k scratch[k] * w[j, k]

An operand qualifies when it is a float computation (not a load as it is, nor a widened load) that does not
depend on some range the contraction's body runs in (so each value is used again along it: the output columns of
a matvec, the cache positions of attention scores) nor on the range the output is contiguous along, and the
ranges it depends on hold at most fusion.OPERAND_MAX elements at the vars' maxima (a decode batch's rows: the array
is laid out for the most rows, its loops run over the rows there are; a one-element reduction it reads, the norm's
mean of squares, is computed before it, and a row's reduction once per row: the renderer's prologue), and MAX_BYTES
hold every operand of the kernel (the arrays are on each calling thread's stack). The contraction without its
prologue is optimised as any kernel (matvec.py, optimize.py); the bounds proof sees the scratch's accesses against
the size its DEFINE_LOCAL names.
"""
from __future__ import annotations

from typing import Callable

from ..uop import Ops, UOp, dtypes, simplify
from ..uop.ops import ALU
from .fusion import OPERAND_MAX
from .lower import linear_index
from .optimize import stride_along

MAX_BYTES = 1 << 17  # a kernel's own arrays, in all, at most: they live on the stack of every thread calling it


def with_operand_prologue(ast: UOp, optimise: Callable[[UOp], UOp]) -> UOp:
    """`optimise(ast)`, or, where `ast` has operands to compute first (see the module docstring), their
    prologue stores followed by `optimise` of the kernel reading them back."""
    split = operand_prologue(ast)
    if split is None:
        return optimise(ast)
    prologue, main = split
    out = optimise(main)
    return UOp(Ops.SINK, out.dtype, (*_renumbered(prologue, 1 + _last_axis(out)), *out.src), out.arg)


def _last_axis(ast: UOp) -> int:
    return max((u.arg[0] for u in ast.toposort() if u.op is Ops.RANGE), default=-1)


def _renumbered(stores: tuple[UOp, ...], first: int) -> tuple[UOp, ...]:
    """`stores` with their ranges numbered from `first` on, in order: none is a range the optimised kernel made."""
    ranges = sorted({u for st in stores for u in st.toposort() if u.op is Ops.RANGE}, key=lambda r: r.arg[0])
    new = {r: UOp(Ops.RANGE, r.dtype, r.src, (first + k, r.arg[1])) for k, r in enumerate(ranges)}
    return tuple(st.substitute(new) for st in stores)


def operand_prologue(ast: UOp) -> tuple[tuple[UOp, ...], UOp] | None:
    """(the stores computing each qualifying operand into its DEFINE_LOCAL, `ast` reading them instead) or None."""
    if ast.op is not Ops.SINK or len(ast.src) != 1 or ast.src[0].op is not Ops.STORE:
        return None
    topo = ast.toposort()
    free = free_ranges_by_node(topo)
    store = ast.src[0]
    # an operand must not depend on the range the output is contiguous along: optimize.py blocks it and peels its
    # tail, and a select on it (a packed operand's, for the columns past the panels) may read past a buffer elsewhere
    kept = {r for r in free[store] if stride_along(store.src[1], r) == 1}
    found: dict[UOp, None] = {}
    for red in topo:
        if red.op is Ops.REDUCE and red.arg is Ops.ADD:
            found.update(dict.fromkeys(_operands(red, free, frozenset(kept))))
    room = MAX_BYTES
    for operand in list(found):  # as many as the stack takes, in order
        size = _product([_max_end(r) for r in free[operand]]) * operand.dtype.itemsize
        if size > room:
            del found[operand]
        else:
            room -= size
    if not found:
        return None
    axis = 1 + _last_axis(ast)
    stores, reads = [], {}
    for number, operand in enumerate(found):
        ranges = sorted(free[operand], key=lambda r: r.arg[0])
        extents = [_max_end(r) for r in ranges]  # (laid out at a var's maximum; its loop runs to its value)
        scratch = UOp(Ops.DEFINE_LOCAL, operand.dtype, (), (number, _product(extents)))
        serial = {r: UOp(Ops.RANGE, dtypes.index, r.src, (axis + k, "serial")) for k, r in enumerate(ranges)}
        axis += len(ranges)
        index = simplify(linear_index([serial[r] for r in ranges], extents))
        stores.append(UOp(Ops.STORE, dtypes.bool, (scratch, index, operand.substitute(serial))))
        reads[operand] = UOp(Ops.LOAD, operand.dtype, (scratch, simplify(linear_index(ranges, extents))))
    return tuple(stores), ast.substitute(reads)


def _product(extents: list[int]) -> int:
    size = 1
    for e in extents:
        size *= e
    return size


def free_ranges_by_node(topo: list[UOp]) -> dict[UOp, frozenset]:
    """Per node of a children-first order, the ranges its value depends on that no reduction inside it binds."""
    free: dict[UOp, frozenset] = {}
    for u in topo:
        out = frozenset((u,)) if u.op is Ops.RANGE else frozenset()
        for s in u.src:
            out |= free[s]
        free[u] = out - frozenset(u.src[1:]) if u.op is Ops.REDUCE else out
    return free


def _operands(red: UOp, free: dict, kept: frozenset) -> list[UOp]:
    """The largest float computations under REDUCE `red` that do not depend on some range its body runs in (each
    value is used again along it) nor on the `kept` ranges, OPERAND_MAX elements at most at the vars' maxima."""
    around = free[red] | frozenset(red.src[1:])
    out, stack, seen = [], [red.src[0]], set()
    while stack:
        n = stack.pop()
        if n in seen or not free[n]:
            continue
        seen.add(n)
        if free[n] < around and not free[n] & kept and n.dtype.is_float and _computes(n) and _fits(free[n]):
            out.append(n)
        elif n.op is not Ops.LOAD:  # a load's index is no operand
            stack.extend(n.src)
    return out


def _computes(n: UOp) -> bool:
    """Whether float value `n` is more than loads, widened or not: some float arithmetic outside index math."""
    stack, seen = [n], set()
    while stack:
        u = stack.pop()
        if u in seen or u.op is Ops.LOAD:
            continue
        seen.add(u)
        if u.op in ALU and u.dtype.is_float:
            return True
        stack.extend(u.src)
    return False


def _max_end(r: UOp) -> int:
    """The largest extent of range `r`: its end's, or a var's maximum (a decode batch's rows)."""
    return max(0, int(r.src[0].vmax))


def _fits(ranges: frozenset) -> bool:
    return _product([_max_end(r) for r in ranges]) <= OPERAND_MAX
