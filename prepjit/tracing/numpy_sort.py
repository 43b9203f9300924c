"""Sorting on traced arrays: sort, argsort, partition, argpartition, top_k (for `prepjit.lax`).

Every sort is one bitonic network over the sorted axis padded to a power of two N (at the dim's maximum
when it is a var), built from existing primitives only (gathers, comparisons, where) so that it runs on
every device with no code of its own. The network's L(L + 1) / 2 stages (L = log2 N) are one
`pj.fori_loop`: the stage's distances are computed from the loop counter, so the plan compiles a single
stage kernel and replays it once per stage (O(N log^2 N) work, no O(N^2) step).

What the network moves, for keys of at most 32 bits, is one int64 per element, (band, key, position):
the key an integer in the sort's order (for floats the IEEE bits of |x|, signed, from exact float32
arithmetic: -0.0 and 0.0 are equal), band 0 for ordinary values, 1 for NaNs (NumPy sorts them last), 2
for the padding, and the position in the low bits; elements are distinct, so one comparison orders a
pair, and equal keys keep their positions' order: every sort is stable, whatever `kind=` asks for.
64-bit keys move a code `position + N * band` and compare the keys read through the codes, then the
codes. A descending sort (top_k) reverses the keys and puts NaNs first, as jax.lax.top_k does.
"""
from __future__ import annotations

import functools

import numpy as np

from ..errors import TraceError
from ..uop import DType, Ops, UOp, as_uop, dtypes, sym_prod
from . import checks, prims
from .indexing import _text
from .loop import fori_loop
from .numpy_create import iota
from .numpy_shape import moveaxis, ravel
from .prims import normalize_axis, to_tracer
from .tracer import Tracer

KINDS = (None, "quicksort", "mergesort", "heapsort", "stable")


def _elementwise(op: Ops, *xs, dtype: DType | None = None) -> Tracer:
    return prims.elementwise(op, *xs, dtype=dtype)


def _gather_last(x: Tracer, index: Tracer) -> Tracer:
    """x[..., index[..., i]] along the last axis (index in range by construction: no range flag)."""
    return prims.gather(x, [index], [("dim", d) for d in range(x.ndim - 1)] + [("index", 0)])


def _max_len(n) -> int:
    return n if isinstance(n, int) else n.vmax


def _stage_distances(t: Tracer, stages: int, dt: DType) -> tuple[Tracer, Tracer]:
    """(j, k) of bitonic stage t: phase p (1-based) sorts blocks of k = 2**p and its stages compare elements
    j = 2**(p-1), ..., 1 apart; phase p starts at stage p(p-1)/2. Both are sums of comparisons of t (no
    products, which the simplifier would expand)."""
    one = prims.cast(to_tracer(1), dt)
    p, start, phase = one, prims.cast(to_tracer(0), dt), 2
    while phase * (phase - 1) // 2 < stages:
        reached = prims.cast(_elementwise(Ops.CMPLT, phase * (phase - 1) // 2 - 1, t), dt)
        p = _elementwise(Ops.ADD, p, reached)
        start = _elementwise(Ops.ADD, start, _elementwise(Ops.MUL, reached, phase - 1))
        phase += 1
    q = _elementwise(Ops.SUB, _elementwise(Ops.SUB, p, one), _elementwise(Ops.SUB, prims.cast(t, dt), start))
    return _elementwise(Ops.SHL, one, q), _elementwise(Ops.SHL, one, p)


def _keys(x: Tracer, descending: bool) -> tuple[Tracer, Tracer]:
    """(key, band) per element: keys compare as the sort orders; NaNs get an infinite key and their band."""
    if x.dtype == dtypes.bool:
        x = prims.cast(x, dtypes.int8)
    zero_band = prims.cast(to_tracer(0), dtypes.int8)
    if not x.dtype.is_float:
        return (_elementwise(Ops.NOT, x) if descending else x), prims.broadcast_to(zero_band, x.uop.shape)
    nan = _elementwise(Ops.CMPNE, x, x)
    inf = prims.cast(to_tracer(float("-inf") if descending else float("inf")), x.dtype)
    key = _elementwise(Ops.WHERE, nan, inf, _elementwise(Ops.NEG, x) if descending else x)
    band = prims.cast(_elementwise(Ops.NOT, nan) if descending else nan, dtypes.int8)
    return key, band


PACKED_BITS = 29  # a packed code keeps the position in its low bits: axes of up to 2**29 entries


def _float_bits(f: Tracer) -> Tracer:
    """The IEEE bit pattern of |f| (float32) as an int64, for finite f, from exact float32 arithmetic only (no
    bitcast, no log2: every device computes it exactly): the exponent is counted by comparisons with powers of
    two, 16 at a time then one at a time, and scaling by the matching power of two leaves the mantissa in
    [1, 2); a subnormal is |f| * 2**149. The counts are flat sums of comparisons (no long chain of selects
    on one value, which the fusion cost model would cut into many kernels)."""
    f32 = dtypes.float32

    def count(value: Tracer, thresholds) -> Tracer:  # how many of the thresholds value reaches
        total = prims.cast(to_tracer(0), dtypes.int64)
        for t in thresholds:
            total = _elementwise(Ops.ADD, total, prims.cast(_elementwise(Ops.CMPLT, t, value), dtypes.int64))
        return total

    def power(index: Tracer, exponents) -> Tracer:  # 2 ** exponents[index], by selection
        out = prims.cast(to_tracer(0.0), f32)
        for i, e in enumerate(exponents):
            out = _elementwise(Ops.WHERE, _elementwise(Ops.CMPEQ, index, i), prims.cast(to_tracer(2.0 ** e), f32), out)
        return out

    magnitude = _elementwise(Ops.ABS, f)
    start = _elementwise(Ops.WHERE, _elementwise(Ops.CMPLT, magnitude, float("inf")), magnitude,
                         prims.cast(to_tracer(0.0), f32))
    tiny = _elementwise(Ops.CMPLT, start, 2.0 ** -64)  # brought up first, so every scale below is a float32
    lifted = _elementwise(Ops.WHERE, tiny, _elementwise(Ops.MUL, start, 2.0 ** 64), start)
    coarse = count(lifted, [2.0 ** (16 * k) * (1 - 2.0 ** -24) for k in range(-4, 8)])  # (just below: >=)
    scaled = _elementwise(Ops.MUL, lifted, power(coarse, [-16 * (g - 5) if g else 0 for g in range(13)]))
    fine = count(scaled, [2.0 ** i * (1 - 2.0 ** -24) for i in range(1, 16)])  # scaled in [1, 2**16)
    mantissa = _elementwise(Ops.MUL, scaled, power(fine, [-i for i in range(16)]))  # [1, 2)
    exponent = _elementwise(Ops.ADD, _elementwise(Ops.ADD, _elementwise(Ops.MUL, coarse, 16), fine),
                            _elementwise(Ops.SUB, 127 - 80, _elementwise(Ops.MUL, prims.cast(tiny, dtypes.int64), 64)))
    one = prims.cast(to_tracer(1.0), f32)
    fraction = prims.cast(_elementwise(Ops.MUL, _elementwise(Ops.SUB, _elementwise(Ops.MAX, mantissa, one), one),
                                       2.0 ** 23), dtypes.int64)
    normal = _elementwise(Ops.ADD, _elementwise(Ops.MUL, exponent, 1 << 23), fraction)
    subnormal = prims.cast(_elementwise(Ops.MUL, _elementwise(Ops.MUL, start, 2.0 ** 126), 2.0 ** 23), dtypes.int64)
    bits = _elementwise(Ops.WHERE, _elementwise(Ops.CMPLT, start, 2.0 ** -126), subnormal, normal)
    return _elementwise(Ops.WHERE, _elementwise(Ops.CMPEQ, magnitude, float("inf")), 0x7F800000, bits)


def _ordinals(x: Tracer, descending: bool) -> Tracer | None:
    """Per element an int64 in [0, 2**32) ordered as the sort orders the keys (equal keys equal, -0.0 and 0.0
    too), for keys of at most 32 bits (float16/32, ints, bool); None for 64-bit ones."""
    dt = dtypes.int8 if x.dtype == dtypes.bool else x.dtype
    if dt.bits > 32:
        return None
    if dt.is_int:
        k = prims.cast(x, dtypes.int64)
        return _elementwise(Ops.SUB, dt.max(), k) if descending else _elementwise(Ops.SUB, k, dt.min())
    bits = _float_bits(prims.cast(x, dtypes.float32))
    signed = _elementwise(Ops.WHERE, _elementwise(Ops.CMPLT, x, 0), _elementwise(Ops.NEG, bits), bits)
    return _elementwise(Ops.SUB, 1 << 31, signed) if descending else _elementwise(Ops.ADD, signed, 1 << 31)


def sort_order(x: Tracer, descending: bool = False, valid: Tracer | None = None) -> Tracer:
    """The stable sorting permutation of `x` along its last axis (int64), ascending or descending; entries
    where `valid` (bool, x's shape) is False go last."""
    n = x.uop.shape[-1]
    longest = _max_len(n)
    if longest <= 1:
        return iota(x.uop.shape, x.ndim - 1)
    size = 1 << (longest - 1).bit_length()
    tail = [(0, 0)] * (x.ndim - 1) + [(0, UOp.const(0) + size - n if not isinstance(n, int) else size - n)]
    # (computed over the padded axis, where the network reads them: the same elements, so nothing is cut out)
    ordinals = _ordinals(prims.pad(x, tail), descending) if size <= 1 << PACKED_BITS else None
    code_dtype = dtypes.int64 if ordinals is not None or 3 * size >= 2 ** 31 else dtypes.int32
    key, band = _keys(x, descending)
    if valid is not None:
        band = _elementwise(Ops.WHERE, valid, band, prims.cast(to_tracer(2), dtypes.int8))
    shape = tuple(x.uop.shape[:-1]) + (size,)
    position = iota(shape, x.ndim - 1, code_dtype)
    padding = _elementwise(Ops.CMPLT, position, prims.cast(to_tracer(n), code_dtype) if not isinstance(n, int) else n)
    padding = _elementwise(Ops.NOT, padding)
    band = prims.cast(_elementwise(Ops.WHERE, padding, prims.cast(to_tracer(2), dtypes.int8), prims.pad(band, tail)),
                      code_dtype)
    if ordinals is not None:  # one int64 per element, (band, ordinal, position): compared in one instruction
        ordinal = _elementwise(Ops.ADD, _elementwise(Ops.MUL, band, 1 << 32), ordinals)
        codes = _elementwise(Ops.ADD, _elementwise(Ops.MUL, ordinal, 1 << PACKED_BITS), position)
        mask = prims.cast(to_tracer((1 << PACKED_BITS) - 1), code_dtype)

        def before(mine: Tracer, other: Tracer) -> Tracer:
            return _elementwise(Ops.CMPLT, mine, other)
    else:  # 64-bit keys: the network moves codes and reads each one's key
        top = prims.cast(to_tracer(float("inf") if key.dtype.is_float else key.dtype.max(), key.dtype), key.dtype)
        key = prims.materialize(_elementwise(Ops.WHERE, padding, top, prims.pad(key, tail)))
        codes = _elementwise(Ops.ADD, position, _elementwise(Ops.MUL, band, size))
        mask = prims.cast(to_tracer(size - 1), code_dtype)

        def before(mine: Tracer, other: Tracer) -> Tracer:
            mine_key = _gather_last(key, _elementwise(Ops.AND, mine, mask))
            other_key = _gather_last(key, _elementwise(Ops.AND, other, mask))
            return _elementwise(Ops.OR, _elementwise(Ops.CMPLT, mine_key, other_key),
                                _elementwise(Ops.AND, _elementwise(Ops.CMPEQ, mine_key, other_key),
                                             _elementwise(Ops.CMPLT, mine, other)))

    levels = size.bit_length() - 1
    stages = levels * (levels + 1) // 2
    def stage(t, codes):
        j, k = _stage_distances(t, stages, code_dtype)
        other = _gather_last(codes, _elementwise(Ops.XOR, position, j))
        lower = _elementwise(Ops.CMPEQ, _elementwise(Ops.AND, position, j), 0)
        ascending = _elementwise(Ops.CMPEQ, _elementwise(Ops.AND, position, k), 0)
        keep = _elementwise(Ops.CMPEQ, before(codes, other), _elementwise(Ops.CMPEQ, lower, ascending))
        return _elementwise(Ops.WHERE, keep, codes, other)

    codes = fori_loop(0, stages, stage, codes)
    codes = prims.shrink(codes, [(0, 1, d) for d in x.uop.shape])
    return prims.cast(_elementwise(Ops.AND, codes, mask), dtypes.int64)


def _check_kind(kind, order_arg=None):
    """Every kind (and stable=True or False) gives the stable sort, which is a valid order for each."""
    if kind not in KINDS:
        raise ValueError(f"sort kind must be one of 'quicksort', 'mergesort', 'heapsort' or 'stable' (got {kind!r})")
    if order_arg is not None:
        raise TraceError("sort order= (fields of structured arrays) is not supported on traced arrays")


def _along(x, axis):
    """(x with `axis` last, the axis) ; axis=None flattens, as NumPy's sort does."""
    x = to_tracer(x)
    if axis is None:
        return ravel(x), None
    if x.ndim == 0:
        raise np.exceptions.AxisError(f"axis {axis} is out of bounds for array of dimension 0")
    axis = normalize_axis(axis, x.ndim)
    return moveaxis(x, axis, -1), axis


def argsort(a, axis=-1, kind=None, order=None, *, stable=None) -> Tracer:
    """NumPy's argsort (int64 indices), always stable; NaNs last."""
    _check_kind(kind, order)
    x, ax = _along(a, axis)
    out = sort_order(x)
    return out if ax is None else moveaxis(out, -1, ax)


def sort(a, axis=-1, kind=None, order=None, *, stable=None) -> Tracer:
    """NumPy's sort (a new array), NaNs last."""
    _check_kind(kind, order)
    x, ax = _along(a, axis)
    out = _gather_last(x, sort_order(x))
    return out if ax is None else moveaxis(out, -1, ax)


def _check_kth(kth, x: Tracer, name: str):
    """NumPy's partition checks each kth against the length of the (last) axis of `x`, unless `x` holds no
    element (any kth then gives the empty result); a shape that depends on vars is checked on every call."""
    n, size = x.uop.shape[-1], sym_prod(x.uop.shape)
    for k in np.atleast_1d(np.asarray(kth)).tolist():
        if isinstance(k, bool) or not isinstance(k, int):
            raise TypeError(f"{name}: kth must be an int or a sequence of ints, not {k!r}")
        if isinstance(size, int):
            if size and not -n <= k < n:
                raise ValueError(f"kth(={k}) out of bounds ({n})")
            continue
        inside, text = (UOp.const(k) < n, f"{k} < {_text(n)}") if k >= 0 else \
            (UOp.const(-k - 1) < n, f"{-k} <= {_text(n)}")
        checks.require_cond(UOp(Ops.OR, dtypes.bool, (inside, as_uop(size) < 1)), f"{name} kth={k}",
                            f"{text} (or {_text(size)} == 0: no element)")


def partition(a, kth, axis=-1, kind="introselect", order=None) -> Tracer:
    """NumPy's partition. The result is fully sorted along the axis, one of the orders NumPy allows (the
    kth element in place, none larger before it, none smaller after it)."""
    x, ax = _along(a, axis)
    _check_kth(kth, x, "partition")
    return sort(a, axis, None, order)


def argpartition(a, kth, axis=-1, kind="introselect", order=None) -> Tracer:
    """NumPy's argpartition: the stable argsort, one of the permutations NumPy allows."""
    x, ax = _along(a, axis)
    _check_kth(kth, x, "argpartition")
    return argsort(a, axis, None, order)


def top_k(operand, k: int, *, axis: int = -1) -> tuple[Tracer, Tracer]:
    """jax.lax.top_k: the k largest entries along `axis` (last by default) in descending order and their
    int32 indices; equal values keep index order, NaNs count as the largest."""
    x = to_tracer(operand)
    if x.ndim == 0:
        raise TraceError("top_k needs an array of at least one dimension")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
        raise TraceError(f"top_k: k must be a static non-negative int, got {k!r}")
    k = int(k)
    axis = normalize_axis(axis, x.ndim)
    x = moveaxis(x, axis, -1)
    n = x.uop.shape[-1]
    if isinstance(n, int):
        if k > n:
            raise ValueError(f"top_k: k={k} is larger than the axis ({n})")
    else:
        checks.require(UOp.const(k), n, False, f"top_k with k={k}", f"{k} <= {n.render()}")
    if k == 0:
        empty = [(0, 1, d) for d in x.uop.shape[:-1]] + [(0, 1, 0)]
        values, indices = prims.shrink(x, empty), prims.shrink(iota(x.uop.shape, x.ndim - 1), empty)
    else:
        values, indices = _top(x, None, k)
    return moveaxis(values, -1, axis), moveaxis(prims.cast(indices, dtypes.int32), -1, axis)


def _stage_work(length: int) -> int:
    """Element-stages of a bitonic sort of `length` entries (padded to a power of two)."""
    size = 1 << max(length - 1, 0).bit_length()
    levels = size.bit_length() - 1
    return size * levels * (levels + 1) // 2


LEVEL_COST = 1 << 16  # element-stages one more network (one more compiled kernel) must save to be worth it


@functools.lru_cache(maxsize=None)
def _top_plan(length: int, k: int) -> tuple[int, ...]:
    """The block sizes of the cheapest way to the k largest of `length` entries: each level sorts blocks of the
    given size and keeps k of each, the last level sorts what is left (); work in element-stages."""
    best, plan = _stage_work(length), ()
    block = 1 << max(2 * k - 1, 1).bit_length()
    while block < length:
        blocks = -(-length // block)
        rest = _top_plan(blocks * k, k)
        work = blocks * _stage_work(block) + _top_work(blocks * k, k, rest) + LEVEL_COST
        if work < best:
            best, plan = work, (block, *rest)
        block *= 2
    return plan


def _top_work(length: int, k: int, plan: tuple[int, ...]) -> int:
    if not plan:
        return _stage_work(length)
    blocks = -(-length // plan[0])
    return blocks * _stage_work(plan[0]) + _top_work(blocks * k, k, plan[1:]) + LEVEL_COST


def _top(x: Tracer, index: Tracer | None, k: int) -> tuple[Tracer, Tracer]:
    """The k largest entries of `x` along its last axis, in top_k's order, and their positions: among all
    of them, or among the candidates `index` lists (positions into x's last axis, -1 for none). Over a long
    axis, blocks are sorted first and the positions of the k largest of each kept (_top_plan), so the work is
    far below a full sort's; ties stay in position order since candidates keep the blocks' order."""
    batch, n = tuple(x.uop.shape[:-1]), x.uop.shape[-1]
    length = n if index is None else index.uop.shape[-1]
    plan = _top_plan(_max_len(length), k)
    if not plan and index is None:
        perm = prims.shrink(sort_order(x, True), [(0, 1, d) for d in batch] + [(0, 1, k)])
        return _gather_last(x, perm), perm
    if not plan:
        perm = prims.shrink(sort_order(_read(x, index, n), True, _elementwise(Ops.CMPLT, -1, index)),
                            [(0, 1, d) for d in batch] + [(0, 1, k)])
        best = _gather_last(index, perm)
        return _read(x, best, n), best
    blocks = -(-_max_len(length) // plan[0])
    position = iota(batch + (blocks * plan[0],), len(batch))
    inside = _elementwise(Ops.CMPLT, position, to_tracer(length))
    if index is not None:  # (clamped: a read the bounds proof sees)
        position = _gather_last(index, _elementwise(Ops.MIN, position, _elementwise(Ops.SUB, to_tracer(length), 1)))
    candidates = _elementwise(Ops.WHERE, inside, position, -1)
    valid = _elementwise(Ops.CMPLT, -1, candidates)

    def blocked(t: Tracer) -> Tracer:
        return prims.reshape(t, batch + (blocks, plan[0]))

    perm = prims.shrink(sort_order(blocked(_read(x, candidates, n)), True, blocked(valid)),
                        [(0, 1, d) for d in batch] + [(0, 1, blocks), (0, 1, k)])
    kept = prims.materialize(prims.reshape(_gather_last(blocked(candidates), perm), batch + (blocks * k,)))
    return _top(x, kept, k)


def _read(x: Tracer, positions: Tracer, n) -> Tracer:
    """x[..., positions] along the last axis, positions clamped into it (-1 reads entry 0)."""
    return _gather_last(x, _elementwise(Ops.MIN, _elementwise(Ops.MAX, positions, 0),
                                        _elementwise(Ops.SUB, to_tracer(n), 1)))
