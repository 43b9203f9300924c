"""Primitive graph builders (our `lax`): elementwise, cast, reduce and movement ops on traced arrays.

Each takes and returns `Tracer`s, checks shapes and dtypes, and emits one traced-graph UOp.
The NumPy layer (`numpy_*.py`) is written on top of these and never builds UOps itself.
"""
from __future__ import annotations

import numpy as np

from ..errors import TraceError
from ..uop import DType, Ops, UOp, as_int_if_const, dtypes, promote, simplify, sint, sym_prod, to_dtype
from ..uop.var import BoundVar, Var
from .tracer import Tracer


# ---------- conversion ----------

def to_tracer(x, dtype: DType | None = None) -> Tracer:
    """A Tracer from a Tracer, Python scalar (weakly typed), NumPy scalar, Var or symbolic int."""
    if isinstance(x, Tracer):
        return x
    if isinstance(x, Var):
        return Tracer(x.uop, weak=True)
    if isinstance(x, UOp):
        return Tracer(x, weak=True)
    if isinstance(x, (bool, int, float)) and not isinstance(x, np.generic):
        kind = dtypes.bool if isinstance(x, bool) else dtypes.int64 if isinstance(x, int) else dtypes.float64
        target = dtype if dtype is not None else kind
        if isinstance(x, int) and not isinstance(x, bool) and target.is_int and not target.min() <= x <= target.max():
            raise TraceError(f"Python int {x} is out of bounds for {target.name}")
        return Tracer(UOp.const(x, target), weak=True)
    if isinstance(x, np.generic) or isinstance(x, np.ndarray) and x.ndim == 0:
        dt = to_dtype(x.dtype)
        return Tracer(UOp.const(x.item(), dt))
    if isinstance(x, BoundVar):
        raise TraceError("a BoundVar is an argument value; pass it to the prepared function, not inside it")
    if isinstance(x, np.ndarray) or hasattr(x, "__array__"):
        from .constants import capture  # a captured array: a constant of the plan (constants.py)
        return capture(x)
    raise TraceError(f"cannot use a value of type {type(x).__name__} in a traced computation")


def to_sint(x, what: str = "value") -> sint:
    """An int or a symbolic int UOp from an int, Var, symbolic Tracer or integer NumPy scalar."""
    if isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)):
        return int(x)
    if isinstance(x, Var):
        return x.uop
    u = x.uop if isinstance(x, Tracer) else x if isinstance(x, UOp) else None
    if u is None or not u.dtype.is_int or u.shape != () or not is_symbolic(u):
        raise TraceError(f"{what} must be an int or a symbolic int (a var or an expression of vars), "
                         f"not {_describe(x)}")
    return as_int_if_const(simplify(u))


def is_symbolic(u: UOp) -> bool:
    """True for integer expressions of constants and vars only (no array data)."""
    allowed = {Ops.CONST, Ops.DEFINE_VAR, Ops.ADD, Ops.SUB, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.MIN, Ops.CAST}
    return all(n.op in allowed and n.dtype.is_int for n in u.toposort())


def _describe(x) -> str:
    if isinstance(x, Tracer):
        return f"a traced array of shape {x.shape_str} ({x.dtype.name}) that depends on data"
    return f"{type(x).__name__} {x!r}"


# ---------- shapes ----------

def dims_equal(a: sint, b: sint) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return as_int_if_const(simplify(UOp.const(0) + a - b)) == 0


def broadcast_shapes(*shapes: tuple) -> tuple:
    ndim = max(len(s) for s in shapes)
    out = []
    for dims in zip(*[(1,) * (ndim - len(s)) + tuple(s) for s in shapes]):
        real = [d for d in dims if not (isinstance(d, int) and d == 1)]
        d = real[0] if real else 1
        for other in real[1:]:
            if not dims_equal(d, other):
                raise TraceError(f"shapes {' and '.join(fmt_shape(s) for s in shapes)} cannot be broadcast together")
        out.append(d)
    return tuple(out)


def fmt_shape(shape) -> str:
    return "(" + ", ".join(d.render() if isinstance(d, UOp) else str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def normalize_axis(axis: int, ndim: int) -> int:
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TraceError(f"axis must be an int, got {axis!r}")
    if not -ndim <= axis < max(ndim, 1):
        raise np.exceptions.AxisError(f"axis {axis} is out of bounds for array of dimension {ndim}")
    return int(axis) % max(ndim, 1)


def normalize_axes(axis, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = tuple(normalize_axis(a, ndim) for a in (axis if isinstance(axis, (tuple, list)) else (axis,)))
    if len(set(axes)) != len(axes):
        raise ValueError("duplicate value in 'axis'")
    return axes


# ---------- elementwise ----------

def cast(x: Tracer, dtype) -> Tracer:
    dtype = to_dtype(dtype)
    if x.dtype == dtype:
        return x
    if x.uop.op is Ops.CONST:  # fold now, with NumPy's conversion
        with np.errstate(all="ignore"):
            value = np.array(x.uop.arg, x.dtype.np).astype(dtype.np).item()
        return Tracer(UOp.const(value, dtype), weak=x.weak)
    return Tracer(UOp(Ops.CAST, dtype, (x.uop,)))


def python_int_fits(x: Tracer, dtype: DType) -> bool:
    """False for a Python int constant outside an integer dtype's range (NumPy 2 raises for those)."""
    if not (x.weak and x.uop.op is Ops.CONST and dtype.is_int and x.dtype.is_int):
        return True
    return dtype.min() <= x.uop.arg <= dtype.max()


def check_python_int_fits(x: Tracer, dtype: DType):
    if not python_int_fits(x, dtype):
        raise OverflowError(f"Python integer {x.uop.arg} out of bounds for {dtype.name}")


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


def result_dtype(*xs: Tracer) -> DType:
    return promote(*[(x.dtype, x.weak) for x in xs])


def elementwise(op: Ops, *operands, dtype: DType | None = None, out_dtype: DType | None = None) -> Tracer:
    """Apply `op` to broadcast operands promoted to `dtype` (default: NumPy promotion)."""
    xs = [to_tracer(o) for o in operands]
    compute = dtype or result_dtype(*xs[-2:] if op is Ops.WHERE else xs)
    shape = broadcast_shapes(*[x.uop.shape for x in xs])
    srcs = []
    for i, x in enumerate(xs):
        if not (op is Ops.WHERE and i == 0):
            check_python_int_fits(x, compute)
            x = cast(x, compute)
        srcs.append(broadcast_to(x, shape).uop)
    out = out_dtype or (dtypes.bool if op in (Ops.CMPLT, Ops.CMPEQ, Ops.CMPNE) else compute)
    weak = all(x.weak for x in (xs[1:] if op is Ops.WHERE else xs))
    return Tracer(UOp(op, out, tuple(srcs)), weak=weak)


# ---------- reductions ----------

def reduce(x: Tracer, op: Ops, axis=None, keepdims: bool = False) -> Tracer:
    axes = normalize_axes(axis, x.ndim)
    shape = x.uop.shape
    if not axes:
        return x
    red = Tracer(UOp(Ops.REDUCE_AXIS, x.dtype, (x.uop,), (op, axes)))
    if keepdims:
        return red
    return reshape(red, tuple(d for i, d in enumerate(shape) if i not in axes))


def materialize(x: Tracer) -> Tracer:
    """`x` computed once into a buffer of its own rather than inlined into its readers (for values a kernel
    would read at several indices, like a scan's steps): a reduction over an added unit axis, which the
    scheduler always realizes."""
    column = reshape(x, tuple(x.uop.shape) + (1,))
    op = Ops.OR if x.dtype == dtypes.bool else Ops.ADD
    return reshape(Tracer(UOp(Ops.REDUCE_AXIS, x.dtype, (column.uop,), (op, (x.ndim,)))), x.uop.shape)


# ---------- movement ----------

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
    if not dims_equal(sym_prod(shape), sym_prod(x.uop.shape)):
        raise ValueError(f"cannot reshape array of shape {fmt_shape(x.uop.shape)} into shape {fmt_shape(shape)}")
    if shape == tuple(x.uop.shape):
        return x
    return Tracer(UOp(Ops.RESHAPE, x.dtype, (x.uop,), shape), weak=x.weak)


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


def gather(x: Tracer, indices, dims) -> Tracer:
    """out[i] = x[j] where, per x dim m, j[m] = i[n] for dims[m] == ("dim", n) or the value of indices[k][i]
    for dims[m] == ("index", k). Every index array has the output's shape; negative values wrap once and
    out-of-range values clamp (so no read is out of bounds)."""
    indices = [to_tracer(t) for t in indices]
    out_shape = indices[0].uop.shape
    for t in indices:
        if not t.dtype.is_int:
            raise TraceError(f"gather indices must be integers, not {t.dtype.name}")
        if t.uop.shape != out_shape:
            raise TraceError("gather index arrays must share one shape")
    dims = tuple((kind, int(n)) for kind, n in dims)
    if len(dims) != x.ndim:
        raise TraceError(f"gather needs one spec per dim of {fmt_shape(x.uop.shape)}, got {len(dims)}")
    for (kind, n), d in zip(dims, x.uop.shape):
        if kind == "dim" and not dims_equal(out_shape[n], d) and not (isinstance(d, int) and d == 1):
            raise TraceError(f"gather: output dim {n} does not match {fmt_shape(x.uop.shape)}")
    x = broadcast_to(x, tuple(out_shape[n] if kind == "dim" else d for (kind, n), d in zip(dims, x.uop.shape)))
    return Tracer(UOp(Ops.GATHER, x.dtype, (x.uop, *(t.uop for t in indices)), dims))
