"""Fusion decisions, the reductions' part: which reductions to compute inside the one kernel that reads them
(fusion.py decides which elementwise values are materialised and which scatters are inlined).

A reduction read by exactly one kernel, element for element (through elementwise ops and reshapes
only: a bias and an activation after a matmul, a reshape of a sum), is computed inside that kernel:
its reader stores `f(reduce(...))` directly, without a buffer and a pass of its own. Where kernels are
loop nests (llvm), so is a row reduction its reader broadcasts along trailing axes: the renderer
computes it once per row, where the row's loops are open, before the loops it is broadcast along. A one-element
reduction (RMSNorm's mean of squares) its small reader reads at every element is computed once per kernel as its
prologue (PROLOGUE_MAX), before the reader's loops; one element per row that its reader's leading output axes alone
index (a decode batch's rows: each row's mean of squares read by the row's projection) once per row, as the row's
prologue, so each row of a batch fuses as a single row does.

On the work-group targets a softmax that only a contraction over its axis reads (decode attention) is computed inside
the contraction's kernel, its scores and row reductions too (softmax_contraction.py).
"""
from __future__ import annotations

from ..uop import Ops, UOp, dtypes
from ..uop.ops import ELEMENTWISE
from .fusion import _elements, _one_element, kernel_roots
from .lower import REALIZED
from .read_axes import is_one, per_row, read_axes

FEW_VAR_ROWS = 64      # a var batch of at most this many rows over quantized blocks is a GPU's batch row kernel
# (gpu_launch.few_var_rows, few_var_batch), which computes several sums over one batch row side by side (_batch_stream)
PROLOGUE_MAX = 1 << 14  # a one-element reduction of at most this many elements is computed as a prologue of its
# reader when that kernel has at most this many outputs too (each CPU thread and each GPU work-group of the reader
# computes it; a C-style kernel that reads one is a row kernel of one row, a single work-group)


def fused_reductions(outputs: list[UOp], materialized: set[UOp], rows: bool = False,
                     one_contraction: bool = False, inlined: frozenset = frozenset(),
                     walk: tuple | None = None, row_prologues: bool = False,
                     in_contractions: frozenset = frozenset()) -> set[UOp]:
    """The reductions computed inside their only reader's kernel (see the module docstring); with `rows`
    (kernels that are loop nests, which compute a value where its loops are open), also those it reads
    broadcast along trailing axes only (a row's max or sum in softmax, layernorm's mean and variance). With
    `one_contraction` (kernels that register-block one contraction: llvm), a kernel computes at most one
    contraction inside it: SwiGLU's silu(x @ Wg) * (x @ Wu) computes x @ Wg in a kernel of its own, and the
    other with the product as its epilogue, each blocked, instead of both unblocked in one kernel. The `inlined`
    scatters have no kernel of their own (inlined_scatters): a reduction they read is computed into a buffer.
    A reduction read once per call is a prologue of its reader's kernel; one read once per row of it only with
    `row_prologues` (kernels that compute it once per row: the cpu's; a GPU's kernel of many rows would compute it
    again at every element that reads it). The reductions among `in_contractions` (a softmax's row reductions and
    scores, computed inside its contraction's kernel: softmax_contraction.py) are fused there. `walk`: as
    choose_materialized's."""
    graph, roots = walk or kernel_roots(outputs)
    roots = [r for r in roots if r not in inlined]
    explicit = set(roots) - {n for n in roots if n.op is Ops.REDUCE_AXIS} | set(outputs)
    in_loops = {n for node in graph if node.op is Ops.LOOP
                for n in UOp(Ops.SINK, node.dtype, node.arg.body_roots).toposort()}
    ok = {_DIRECT, _RESHAPED, _ROW} if rows else {_DIRECT, _RESHAPED}
    prologues = _PROLOGUES if row_prologues else (_UNIFORM,)
    fused: set[UOp] = {n for n in in_contractions if n.op is Ops.REDUCE_AXIS}
    holds: dict[UOp, UOp] = {}  # a kernel's root -> the contraction fused into it (one_contraction)
    position = {n: k for k, n in enumerate(graph)}
    by_position = sorted(materialized, key=position.__getitem__)
    expands = _under(graph, Ops.EXPAND) if one_contraction else {}
    reductions_under = _under(graph, Ops.REDUCE_AXIS)  # (what _reductions_read's walks need not enter)
    walks: dict[UOp, list] = {}  # root -> _reductions_read: it changes only when a reduction in it fuses
    fresh: set[UOp] = set()  # the reductions fused by the last round
    while True:  # a fused reduction's reads become its reader's: the reductions it read may fuse next
        reads: dict[UOp, list] = {}  # reduction -> [(reader root, how it reads it)]
        inside = fused | inlined
        for root in dict.fromkeys([r for r in roots if r not in fused] + by_position):
            if root not in walks or any(red in fresh for red, _ in walks[root]):
                walks[root] = _reductions_read(root, materialized, inside, reductions_under)
            for red, how in walks[root]:
                reads.setdefault(red, []).append((root, how))
        more = set()
        for red, readers in reads.items():
            root = readers[0][0]
            if red in explicit or red in in_loops or root in in_loops or \
                    root.op is Ops.REDUCE_AXIS and any(how not in prologues for _, how in readers):
                continue  # a reduction's kernel computes another inside it only as its prologue
            if all(r is root and (how in ok or how in prologues and _small_prologue(red, root) or
                                  how == _SLICED and not one_contraction and _in_slices(red, root, inside) and
                                  _batch_stream(red, materialized)) for r, how in readers):
                if one_contraction and red not in fused and _is_contraction(red, expands):
                    if holds.setdefault(root, red) is not red:
                        continue
                more.add(red)
        if more <= fused:
            return fused
        fresh = more - fused
        fused |= more


def _in_slices(red: UOp, root: UOp, inside: set[UOp]) -> bool:
    """Whether the kernel computing `root` reads reduction `red` only through slices of one node that do not overlap
    (each reached element for element, through elementwise ops, reshapes and other slices: `_SLICED`), so it reads
    each of `red`'s elements at most once and can compute it where it reads it (SwiGLU's silu(h[:, :ff]) * h[:, ff:]
    of one contraction h: each output computes its gate and its up sum). `inside`: the reductions and scatters
    already computed in that kernel (walked through)."""
    found, seen, stack = [], set(), [(root, None)]
    while stack:
        item = stack.pop()
        n, cut = item
        if item in seen:
            continue
        seen.add(item)
        if n is red:
            found.append(cut)
            continue
        if n is not root and n.op in REALIZED and n not in inside:
            continue
        if n.op not in ELEMENTWISE and n.op not in (Ops.RESHAPE, Ops.SHRINK):
            cut = _MANY   # (read through a broadcast, another view or a reduction: maybe more than once an element)
        for s in n.src:
            stack.append((s, n if n.op is Ops.SHRINK and cut is None else cut))
    if any(c is None or c is _MANY for c in found) or len({c.src[0] for c in found}) != 1:
        return False
    boxes = [[(start, start + size) if step == 1 and isinstance(start, int) and isinstance(size, int) else None
              for start, step, size in c.arg] for c in dict.fromkeys(found)]
    return all(any(a is not None and b is not None and (a[0] >= b[1] or b[0] >= a[1]) for a, b in zip(x, y))
               for i, x in enumerate(boxes) for y in boxes[i + 1:])


_MANY = UOp(Ops.CONST, dtypes.int64, (), 0)   # (_in_slices: a path that reaches a reduction through a broadcast)


def _batch_stream(red: UOp, materialized: set[UOp]) -> bool:
    """Whether reduction `red` is a sum of products over quantized blocks (integer data its expression reads) whose
    output has one var axis of at most FEW_VAR_ROWS (a decode batch's rows): a GPU computes it as a batch row kernel
    (gpu_launch.few_var_batch), which computes several such sums side by side, each weight held in registers."""
    var = [d for d in red.shape if not isinstance(d, int)]
    if red.arg[0] is not Ops.ADD or red.src[0].op is not Ops.MUL or len(var) != 1 or var[0].vmax > FEW_VAR_ROWS:
        return False
    stack, seen = [red.src[0]], set()
    while stack:
        n = stack.pop()
        if n in seen or n in materialized:
            continue
        seen.add(n)
        if n.op is Ops.INPUT and n.dtype.is_int:
            return True
        if n.op not in REALIZED:
            stack.extend(n.src)
    return False


def _under(graph: list[UOp], op: Ops) -> dict[UOp, bool]:
    """Per node of a parents-first graph (kernel_roots'), whether a node of `op` is under it (itself included)."""
    below: dict[UOp, bool] = {}
    for n in reversed(graph):
        below[n] = n.op is op or any(map(below.__getitem__, n.src))
    return below


def _is_contraction(red: UOp, expands: dict[UOp, bool]) -> bool:
    """Whether a reduction is a sum of products with a broadcast operand (a matmul, a matvec, an einsum); a sum over
    axes of one element (an einsum's axis of size 1: decode attention's own token, p_own * v) is one product, an
    elementwise value, not a contraction. `expands`: _under(graph, Ops.EXPAND)."""
    x = red.src[0]
    return red.arg[0] is Ops.ADD and x.op is Ops.MUL and any(expands[s] for s in x.src) and \
        not all(is_one(x.shape[a]) for a in red.arg[1])


_DIRECT, _RESHAPED, _ROW, _INNER, _OTHER, _UNIFORM, _PER_ROW, _SLICED = range(8)  # how a kernel's index reaches a
# node: element for element, through reshapes too, broadcast along trailing axes (each value read for a run of the
# innermost loops), inside a fused row reduction (only a broadcast along its trailing axes is read once per row
# there), otherwise, at one element whatever the index (a one-element node: the same value everywhere), at an
# index that only the kernel's output axes give, where the index of a reduction or of a broadcast reaches it
# otherwise (a decode batch's row: the row's mean of squares read by every product of the row's projection), or
# element for element within a slice (SwiGLU's gate and up halves of one contraction: _in_slices)
_PROLOGUES = (_UNIFORM, _PER_ROW)  # reads a kernel serves from a prologue: once per call, once per row


def _small_prologue(red: UOp, root: UOp) -> bool:
    """Whether reduction `red`, one element per call or per row of `root` (`_PROLOGUES`), is small enough to compute
    as a prologue of `root`'s kernel: a row's part of it and of `root` at most PROLOGUE_MAX elements each."""
    rows = _elements(red)
    return _elements(red.src[0]) <= PROLOGUE_MAX * rows and _elements(root) <= PROLOGUE_MAX * rows


def _step(how: int, n: UOp) -> int:
    """How the kernel's index reaches the operands of `n`, reaching `n` itself `how`."""
    if n.op is Ops.REDUCE_AXIS:  # a fused one: its operands are read inside it
        return _INNER if how in (_DIRECT, _ROW, _UNIFORM) else _OTHER
    if how == _UNIFORM:  # what a one-element value reads is read at one index
        return _UNIFORM
    if n.op is Ops.EXPAND and _one_element(n.src[0]):  # whatever index reaches it, it reads its one element
        return _UNIFORM
    if n.op in ELEMENTWISE:
        return how
    if n.op is Ops.SHRINK and how in (_DIRECT, _RESHAPED, _SLICED):
        return _SLICED
    if n.op is Ops.RESHAPE:
        return how if how in (_RESHAPED, _SLICED) else _RESHAPED if how == _DIRECT else _OTHER
    if n.op is Ops.EXPAND and how in (_DIRECT, _ROW, _INNER):
        src = n.src[0].shape
        grown = [k for k, (a, b) in enumerate(zip(src, n.shape)) if isinstance(a, int) and a == 1 and not (
            isinstance(b, int) and b == 1)]
        varying = [k for k, a in enumerate(src) if not (isinstance(a, int) and a == 1)]
        if grown and varying and min(grown) > max(varying):
            return _ROW
    return _OTHER


def _reductions_read(root: UOp, materialized: set[UOp], fused: set[UOp],
                     under: dict[UOp, bool]) -> list[tuple[UOp, int]]:
    """The reductions the kernel computing `root` reads, each with how its index reaches it (`_step`); the walk
    goes on into the `fused` ones (reductions and inlined scatters: their kernel is this one) and into `root`'s own
    operands (a reduction's read `_INNER`, inside it), not into what has no reduction under it (`under`:
    _under(graph, Ops.REDUCE_AXIS); a quantized weight's unpacking, 3/4 of SmolLM2's walks): the same reductions
    in the same order."""
    out, seen, stack = [], set(), [(root, _DIRECT, tuple(frozenset((k,)) for k in range(len(root.shape))))]
    while stack:
        item = stack.pop()
        if item in seen:
            continue
        seen.add(item)
        n, how, axes = item
        if n is not root and n.op is Ops.REDUCE_AXIS and n not in fused:
            out.append((n, _PER_ROW if how in (_INNER, _OTHER) and per_row(n, axes, root) else how))
        if n is root or n in fused or not (n.op in REALIZED or n in materialized):
            reaches = _step(how, n)  # (the same for each operand)
            stack += [(s, reaches, a) for s, a in zip(n.src, read_axes(n, axes)) if under.get(s, True)]
    return out
