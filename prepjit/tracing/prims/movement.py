"""Movement primitives: reshape, permute, expand (broadcast_to), shrink (slices with steps, flips) and pad,
with their reverse-mode rules (each the adjoint index map: a sum over broadcast axes, a zero-padding of a
slice, a slice of a padding)."""
from __future__ import annotations

from ...errors import TraceError
from ...uop import Ops, UOp, as_int_if_const, as_uop, dtypes, simplify, sint, sym_prod
from ..tracer import Tracer
from .core import dims_equal, fmt_shape, normalize_axis, to_sint
from .registry import primitive


def broadcast_to(x: Tracer, shape: tuple) -> Tracer:
    shape = tuple(to_sint(d, "a dimension") for d in shape)
    if x.uop.shape == shape:
        return x
    if len(shape) < x.ndim:
        raise TraceError(f"cannot broadcast {fmt_shape(x.uop.shape)} to {fmt_shape(shape)}")
    lead = len(shape) - x.ndim
    padded = (1,) * lead + tuple(x.uop.shape)
    for have, want in zip(padded, shape):
        if not (isinstance(have, int) and have == 1) and not dims_equal(have, want):
            raise TraceError(f"cannot broadcast {fmt_shape(x.uop.shape)} to {fmt_shape(shape)}")
    y = reshape(x, padded) if lead else x
    return Tracer(UOp(Ops.EXPAND, y.dtype, (y.uop,), shape), weak=x.weak)


def reshape(x: Tracer, shape) -> Tracer:
    shape = tuple(shape)
    if any(isinstance(d, int) and d == -1 for d in shape):
        if sum(1 for d in shape if isinstance(d, int) and d == -1) > 1:
            raise ValueError("can only specify one unknown dimension")
        known = sym_prod(to_sint(d, "a dimension") for d in shape if not (isinstance(d, int) and d == -1))
        total = sym_prod(x.uop.shape)
        missing = _exact_div(total, known, x, shape)
        shape = tuple(missing if isinstance(d, int) and d == -1 else d for d in shape)
    shape = tuple(to_sint(d, "a dimension") for d in shape)
    if any(isinstance(d, int) and d < 0 for d in shape):
        raise ValueError(f"negative dimensions are not allowed: {fmt_shape(shape)}")
    if shape == tuple(x.uop.shape):  # the same dims: the same size, no product to simplify
        return x
    if not _same_size(shape, x.uop.shape):
        raise ValueError(f"cannot reshape array of shape {fmt_shape(x.uop.shape)} into shape {fmt_shape(shape)}")
    return Tracer(UOp(Ops.RESHAPE, x.dtype, (x.uop,), shape), weak=x.weak)


def _same_size(a: tuple, b: tuple) -> bool:
    """Whether shapes `a` and `b` have as many elements: at once when their int dims multiply alike and their
    symbolic dims are the same UOps (a KV cache's length moved between axes), else by the simplified products."""
    return _factors(a) == _factors(b) or dims_equal(sym_prod(a), sym_prod(b))


def _factors(shape: tuple) -> tuple[int, list]:
    """(the product of the int dims, the ids of the symbolic dims, sorted)."""
    size, symbolic = 1, []
    for d in shape:
        if isinstance(d, int):
            size *= d
        else:
            symbolic.append(id(d))
    return size, sorted(symbolic)


def _exact_div(total: sint, known: sint, x: Tracer, shape) -> sint:
    if isinstance(total, int) and isinstance(known, int):
        if known == 0 or total % known:
            raise ValueError(f"cannot reshape array of shape {fmt_shape(x.uop.shape)} into shape {shape}")
        return total // known
    q = as_int_if_const(simplify(UOp.const(0) + total) // known)
    if not dims_equal(sym_prod([q, known]), total):
        raise TraceError(f"cannot infer -1 in reshape of {fmt_shape(x.uop.shape)} to {shape}: not an exact division")
    return q


def permute(x: Tracer, order) -> Tracer:
    order = tuple(normalize_axis(a, x.ndim) for a in order)
    if sorted(order) != list(range(x.ndim)):
        raise ValueError(f"axes {order} don't match array of dimension {x.ndim}")
    if order == tuple(range(x.ndim)):
        return x
    return Tracer(UOp(Ops.PERMUTE, x.dtype, (x.uop,), order), weak=x.weak)


def shrink(x: Tracer, spec) -> Tracer:
    """spec: per dim (start, step, size); the view reads x[start + i*step] for i < size."""
    spec = tuple((as_int_if_const(simplify(UOp.const(0) + s)) if isinstance(s, UOp) else s, st,
                  as_int_if_const(simplify(UOp.const(0) + n)) if isinstance(n, UOp) else n) for s, st, n in spec)
    if all(s == 0 and st == 1 and dims_equal(n, d) for (s, st, n), d in zip(spec, x.uop.shape)):
        return x
    return Tracer(UOp(Ops.SHRINK, x.dtype, (x.uop,), spec), weak=x.weak)


def pad(x: Tracer, widths) -> Tracer:
    widths = tuple((to_sint(b, "a pad width"), to_sint(a, "a pad width")) for b, a in widths)
    for b, a in widths:
        for w in (b, a):
            if (w if isinstance(w, int) else w.vmin) < 0:
                raise ValueError("pad widths must be non-negative")
    if all(isinstance(b, int) and isinstance(a, int) and b == a == 0 for b, a in widths):
        return x
    return Tracer(UOp(Ops.PAD, x.dtype, (x.uop,), widths), weak=x.weak)



# ---------- reverse-mode rules ----------

def _src(node: UOp, i: int = 0) -> Tracer:
    return Tracer(node.src[i])


@primitive(Ops.RESHAPE).def_vjp
def _reshape_vjp(ct: Tracer, node: UOp):
    return (reshape(ct, node.src[0].shape),)


@primitive(Ops.PERMUTE).def_vjp
def _permute_vjp(ct: Tracer, node: UOp):
    inverse = [0] * len(node.arg)
    for i, a in enumerate(node.arg):
        inverse[a] = i
    return (permute(ct, inverse),)


@primitive(Ops.EXPAND).def_vjp
def _expand_vjp(ct: Tracer, node: UOp):
    """The sum over the broadcast axes (a unit dim of the source that the result widens)."""
    from .reduction import reduce
    src = node.src[0].shape
    axes = tuple(i for i, (s, o) in enumerate(zip(src, node.shape))
                 if isinstance(s, int) and s == 1 and not (isinstance(o, int) and o == 1))
    return (reshape(reduce(ct, Ops.ADD, axes, keepdims=True), src),)


@primitive(Ops.PAD).def_vjp
def _pad_vjp(ct: Tracer, node: UOp):
    return (shrink(ct, [(b, 1, d) for (b, _), d in zip(node.arg, node.src[0].shape)]),)


@primitive(Ops.SHRINK).def_vjp
def _shrink_vjp(ct: Tracer, node: UOp):
    """Each axis's read positions start + i*step filled from the cotangent, zeros elsewhere."""
    for axis, ((start, step, size), dim) in enumerate(zip(node.arg, node.src[0].shape)):
        ct = _unshrink_axis(ct, axis, start, step, size, dim)
    return (ct,)


def _unshrink_axis(ct: Tracer, axis: int, start: sint, step: int, size: sint, dim: sint) -> Tracer:
    if step == 1 and dims_equal(size, dim):
        return ct
    shape = tuple(ct.uop.shape)
    if step < 0:  # a reversed read: flip the cotangent, then it is a forward read from its last position
        ct = shrink(ct, [(_sym(UOp.const(0) + size - 1), -1, size) if a == axis else (0, 1, d)
                         for a, d in enumerate(shape)])
        start, step = _sym(UOp.const(0) + start + (UOp.const(0) + size - 1) * step), -step
    if step > 1:  # every step-th position: a scatter (a view would interleave zeros)
        from ..scatter import scatter
        from .pointwise import elementwise
        at = elementwise(Ops.ADD, elementwise(Ops.MUL, Tracer(UOp(Ops.IOTA, dtypes.int64, (), (shape, axis))), step),
                         Tracer(as_uop(start), weak=True))
        zeros = broadcast_to(Tracer(UOp.const(0.0, ct.dtype)), shape[:axis] + (dim,) + shape[axis + 1:])
        return scatter(zeros, [at], [("index", 0) if a == axis else ("dim", a) for a in range(len(shape))], ct)
    after = _sym(UOp.const(0) + dim - start - size)
    return _pad_unchecked(ct, [(start, after) if a == axis else (0, 0) for a in range(ct.ndim)])


def _sym(x: sint) -> sint:
    return as_int_if_const(simplify(x)) if isinstance(x, UOp) else x


def _pad_unchecked(x: Tracer, widths) -> Tracer:
    """`pad` for widths a rule derived (nonnegative for every var value, though not always provably so by bounds)."""
    if all(isinstance(b, int) and isinstance(a, int) and b == a == 0 for b, a in widths):
        return x
    return Tracer(UOp(Ops.PAD, x.dtype, (x.uop,), tuple(widths)))
