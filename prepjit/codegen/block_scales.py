"""A quantized weight's block scales factored out of its block's sum, where the target's vectors are narrower than
the block's lane range (AVX2: 8 float32 lanes against a q8_0 block's 32, q4_1's 2 x 16).

block_split.py makes a matvec over blocks a sum over (blocks kb, in-block steps, lanes) of x * w, w rebuilt from
the block's scales for every weight: q4_1's x * (d * q + m) and q8_0's x * (q * d) take a multiply (and an add) a
weight besides the product's FMA. With a lane range wider than the vectors (LLVM splits it into registers: AVX2's
8 lanes) the block's products can be summed before the scales touch them:

    sum_kb sum_in-block x * (d * q + m)  =  sum_kb,l  d * sum_c x * q  +  sum_kb  m * sum_in-block x

the lane range split at the vector (lane = c * 8 + l), each term's factors that depend on no in-block range (the
scales) times a sum over the in-block ranges and c of the rest, each term a lane sum of its own (a vector
accumulator across the blocks, one FMA a block). A term whose rest reads no output column (x's block sums, the
same for every row of the weight) is summed over the whole block once per call into an array of the kernel's own
(operand_prologue.py's serial loops before the parallel loop), one float a block, and becomes a scalar sum over
the blocks, which the lane sum's loop carries (llvm_reductions.lane_sum): one scalar FMA a block, its scale not
broadcast to a vector. q4_1's 32 weights then take 4 conversions and 4 FMAs (x * q), a vector FMA and a scalar
one, not 4 multiplies, 4 adds and 4 FMAs; q8_0's 4 FMAs and 1, not 4 multiplies and 4 FMAs. (m's term as a lane
sum of x's 8-lane block sums, a broadcast and a vector FMA a block: AVX2 code on the AMD EPYC (Zen 3), one
thread, x (576) @ W.T (3072, 576) q4_1 in cache, 148 -> 136 us.) The float32 activations are those of the weights'
float32 model; the sum is reassociated (and distributed over the scales), so it differs from the sequential one by
rounding only. A decode batch's kernels (block_matmul.py) factor their sums so too, x's block totals computed once
per call for every row (an array laid out for the most rows); within a plan a row has the same bits in any batch
(a one-row plan's and a batch plan's may differ by rounding). A 4- or 8-bit value
read as an integer lane is widened to int32 before its shift and mask (the same values: every intermediate's bounds
fit its type), so x86 widens 8 bytes with one vpmovzxbd a vector and splits a q4_1 byte's nibbles at 32 bits (vpand,
vpsrld), not in bytes with a shuffle a vector per half. One thread, x (576) @ W.T (1536, 576), weights in L2, AVX2
code on a Xeon (model 167), fastest of 7 x 20 calls: q4_1 92 -> 72 us, q8_0 102 -> 64 us.

AVX-512 keeps its one-vector-a-half sums: a q4 block's w is there one permute of a 16-entry table a half
(llvm_reductions.lookup_tables), cheaper than these sums.
"""
from __future__ import annotations

from ..uop import Ops, UOp, dtypes, simplify
from .lower import linear_index
from .target import CPUTarget

MAX_TERMS = 4      # terms of a distributed product (q4_1: d * x * q and m * x), at most
HOISTED_MAX = 4096  # elements of a hoisted block totals' array (x (1536)'s q4_1 block sums: 48)
TABLE_LANES = 16   # float32 lanes of a target whose q4 blocks are looked up in tables (llvm_reductions.py)
WIDENED = (dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16)


def factored_scales(ast: UOp, target: CPUTarget, rows: tuple[UOp, ...] = ()) -> UOp:
    """`ast` (a matvec's one float32 sum over block ranges and a lane range, block_split.py) with its block scales
    factored out of the in-block sums (see the module docstring); `ast` itself where the target's vectors hold the
    lane range, or use tables, or no factor of the product is a block constant. `rows`: loop ranges x's block
    totals may depend on (a batch's rows, block_matmul.py), hoisted for each of their steps (at their maxima)."""
    lanes = target.lanes(4)
    reduces = [u for u in ast.toposort() if u.op is Ops.REDUCE]
    if lanes >= TABLE_LANES or len(reduces) != 1 or reduces[0].dtype != dtypes.float32 \
            or reduces[0].arg is not Ops.ADD:
        return ast
    red = reduces[0]
    *ranges, lane = red.src[1:]
    width = lane.src[0].arg if lane.arg[1] == "lane" and lane.src[0].op is Ops.CONST else 0
    if width <= lanes or width % lanes or not ranges:
        return ast
    split = _factored(red.src[0], ranges, lane)
    if split is None:
        return ast
    outer, inner, terms = split
    axis = max(u.arg[0] for u in ast.toposort() if u.op is Ops.RANGE) + 1
    c = UOp(Ops.RANGE, dtypes.index, (UOp.const(width // lanes),), (axis, "reduce"))
    l = UOp(Ops.RANGE, dtypes.index, (UOp.const(lanes),), (axis + 1, "lane"))
    at = {lane: c * lanes + l}
    locals_ = [u.arg[0] for u in ast.toposort() if u.op is Ops.DEFINE_LOCAL]
    number, prologue, laned, scalar = 1 + max(locals_, default=-1), [], [], []
    free_axis = axis + 2
    for coef, rest in terms:
        whole = UOp(Ops.RANGE, dtypes.index, lane.src, (free_axis, "reduce"))
        totals = UOp(Ops.REDUCE, dtypes.float32, (widened(rest).substitute({lane: whole}), *inner, whole), Ops.ADD)
        hoisted = _hoisted(totals, [*rows, *outer], number, free_axis + 1)
        if hoisted is not None:  # x's block totals: one float a block, and a scalar sum over the blocks
            store, totals = hoisted
            prologue.append(store)
            number, free_axis = number + 1, free_axis + 1 + len(rows) + len(outer)
            scalar.append(UOp(Ops.REDUCE, dtypes.float32, (coef * totals, *outer), Ops.ADD))
            continue
        block = UOp(Ops.REDUCE, dtypes.float32, (widened(rest).substitute(at), *inner, c), Ops.ADD)
        laned.append(UOp(Ops.REDUCE, dtypes.float32, (coef * block, *outer, l), Ops.ADD))
    sums = laned + scalar  # the lane sums first: the first one rendered carries the scalar sums in its loop
    total = sums[0]
    for more in sums[1:]:
        total = total + more
    out = ast.substitute({red: total})
    return UOp(Ops.SINK, out.dtype, (*prologue, *out.src), out.arg) if prologue else out


def _hoisted(block: UOp, ranges: list[UOp], number: int, axis: int) -> tuple[UOp, UOp] | None:
    """(a store of the block total `block` for every step of `ranges` (the blocks) into an array of the kernel's own,
    in serial loops before the parallel loop (operand_prologue.py's), and its read), where `block` depends on no loop
    range but those of `ranges` (the activations' block sums, the same for every output column; a batch's rows) and
    the array is at most HOISTED_MAX elements, laid out for the ranges' maxima; else None."""
    if any(r.op is Ops.RANGE and r.arg[1] in ("loop", "serial") and r not in ranges for r in block.toposort()):
        return None
    extents = [int(r.src[0].vmax) for r in ranges]
    size = 1
    for e in extents:
        size *= e
    if not 0 < size <= HOISTED_MAX:
        return None
    scratch = UOp(Ops.DEFINE_LOCAL, dtypes.float32, (), (number, size))
    serial = {r: UOp(Ops.RANGE, dtypes.index, r.src, (axis + k, "serial")) for k, r in enumerate(ranges)}
    store = UOp(Ops.STORE, dtypes.bool, (scratch, simplify(linear_index([serial[r] for r in ranges], extents)),
                                         block.substitute(serial)))
    return store, UOp(Ops.LOAD, dtypes.float32, (scratch, simplify(linear_index(ranges, extents))))


def _factored(body: UOp, ranges: list[UOp], lane: UOp):
    """(outer ranges, in-block ranges, [(block constant, in-block product)]) of the sum of `body` over
    `ranges` and `lane`: the in-block ranges the longest run of the last ranges (at least one kept outside; none:
    the lanes alone) of which every term of the distributed product has a factor independent (a scale), or None."""
    for cut in range(1, len(ranges) + 1):
        inner = set(ranges[cut:]) | {lane}
        terms = _terms(body, inner)
        if terms is None or len(terms) > MAX_TERMS or \
                not all(any(f.op is not Ops.CONST for f in c) for c, _ in terms):
            continue
        out = []
        for consts, parts in terms:
            coef = _product([f for f in consts if not (f.op is Ops.CONST and f.arg == 1)])
            out.append((coef, _product(parts) if parts else UOp.const(1.0, dtypes.float32)))
        return ranges[:cut], ranges[cut:], out
    return None


def _terms(u: UOp, inner: set) -> list[tuple[list[UOp], list[UOp]]] | None:
    """`u` distributed over its float32 sums: [(factors independent of `inner`, factors depending on it)] per
    term, or None for an expression of another kind (a product carrying a precision, a cast float)."""
    if not u.depends_on(inner):
        return [([u], [])]
    if u.dtype != dtypes.float32 or u.op not in (Ops.ADD, Ops.MUL):
        return [([], [u])]
    if u.op is Ops.MUL and u.arg is not None:
        return None
    parts = [_terms(s, inner) for s in u.src]
    if any(p is None for p in parts):
        return None
    a, b = parts
    if u.op is Ops.ADD:
        return a + b
    return [(ca + cb, ia + ib) for ca, ia in a for cb, ib in b]


def _product(factors: list[UOp]) -> UOp | None:
    if not factors:
        return None
    out = factors[0]
    for f in factors[1:]:
        out = out * f
    return out


def widened(u: UOp) -> UOp:
    """`u` with each float cast of a narrow integer expression (a quant's shifted and masked byte) computed in int32
    from its loads on, where every intermediate value's exact bounds fit its own type (so nothing wraps either way)."""
    casts = {c: c.src[0] for c in u.toposort() if c.op is Ops.CAST and c.dtype.is_float and c.src[0].dtype in WIDENED}
    out = {c: UOp(Ops.CAST, c.dtype, (w[0],)) for c, x in casts.items() if (w := _in_int32(x)) is not None}
    return u.substitute(out) if out else u


def _in_int32(x: UOp) -> tuple[UOp, int, int] | None:
    """(the narrow integer expression `x` computed in int32, its exact bounds), or None where it is of another
    kind or some value of it does not fit its type. Its kinds: loads and constants, a range cast (a shift amount),
    casts between narrow types, adds, subtracts and multiplies, shifts and masks of nonnegative values."""
    if x.dtype not in WIDENED:
        return None
    if x.op is Ops.CONST:
        out, lo, hi = UOp.const(x.arg, dtypes.int32), x.arg, x.arg
    elif x.op is Ops.LOAD:
        out, lo, hi = UOp(Ops.CAST, dtypes.int32, (x,)), x.dtype.min(), x.dtype.max()
    elif x.op is Ops.CAST and x.src[0].dtype in (dtypes.index, dtypes.int32, dtypes.int64):
        out, lo, hi = UOp(Ops.CAST, dtypes.int32, x.src), x.src[0].vmin, x.src[0].vmax
    elif x.op is Ops.CAST:  # between narrow types (q4_0's masked nibble as int8)
        inner = _in_int32(x.src[0])
        if inner is None:
            return None
        out, lo, hi = inner
    elif x.op in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.SHR, Ops.SHL, Ops.AND, Ops.OR):
        srcs = [_in_int32(s) for s in x.src]
        if any(s is None for s in srcs):
            return None
        (a, a0, a1), (b, b0, b1) = srcs
        if x.op in (Ops.ADD, Ops.SUB, Ops.MUL):
            ends = {Ops.ADD: (a0 + b0, a1 + b1), Ops.SUB: (a0 - b1, a1 - b0)}.get(x.op) or \
                [p * q for p in (a0, a1) for q in (b0, b1)]
            lo, hi = min(ends), max(ends)
        elif min(a0, b0) < 0 or (x.op in (Ops.SHR, Ops.SHL) and b1 >= 32):
            return None
        elif x.op is Ops.SHR:
            lo, hi = a0 >> b1, a1 >> b0
        elif x.op is Ops.SHL:
            lo, hi = a0 << b0, a1 << b1
        elif x.op is Ops.AND:
            lo, hi = 0, min(a1, b1)
        else:
            lo, hi = max(a0, b0), (1 << max(a1, b1).bit_length()) - 1
        out = UOp(x.op, dtypes.int32, (a, b))
    else:
        return None
    return (out, lo, hi) if x.dtype.min() <= lo <= hi <= x.dtype.max() else None
