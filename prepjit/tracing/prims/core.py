"""What every primitive family shares: converting values to tracers and symbolic ints, broadcasting shapes,
normalising axes, NumPy's promotion of operands."""
from __future__ import annotations

import numpy as np

from ...errors import TraceError
from ...uop import DType, Ops, UOp, as_int_if_const, dtypes, promote, simplify, sint, to_dtype
from ...uop.var import BoundVar, Var
from ..tracer import Tracer


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
        from ..constants import capture  # a captured array: a constant of the plan (constants.py)
        return capture(x)
    raise TraceError(f"cannot use a value of type {type(x).__name__} in a traced computation")


def to_sint(x, what: str = "value") -> sint:
    """An int or a symbolic int UOp from an int, Var, symbolic Tracer or integer NumPy scalar."""
    if type(x) is int:  # most dims: as they are
        return x
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
    return all(n.op in _SYMBOLIC_OPS and n.dtype.is_int for n in u.toposort())


_SYMBOLIC_OPS = frozenset({Ops.CONST, Ops.DEFINE_VAR, Ops.ADD, Ops.SUB, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.MIN,
                           Ops.CAST})


def _describe(x) -> str:
    if isinstance(x, Tracer):
        return f"a traced array of shape {x.shape_str} ({x.dtype.name}) that depends on data"
    return f"{type(x).__name__} {x!r}"


# ---------- shapes ----------

def dims_equal(a: sint, b: sint) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if a is b:  # one hash-consed expression (a symbolic dim passed along): no subtraction to simplify
        return True
    return as_int_if_const(simplify(UOp.const(0) + a - b)) == 0


def broadcast_shapes(*shapes: tuple) -> tuple:
    if all(s == shapes[0] for s in shapes[1:]):  # (mostly alike: an elementwise op's operands)
        return tuple(shapes[0])
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


# ---------- dtypes ----------

def result_dtype(*xs: Tracer) -> DType:
    return promote(*[(x.dtype, x.weak) for x in xs])


def python_int_fits(x: Tracer, dtype: DType) -> bool:
    """False for a Python int constant outside an integer dtype's range (NumPy 2 raises for those)."""
    if not (x.weak and x.uop.op is Ops.CONST and dtype.is_int and x.dtype.is_int):
        return True
    return dtype.min() <= x.uop.arg <= dtype.max()


def check_python_int_fits(x: Tracer, dtype: DType):
    if not python_int_fits(x, dtype):
        raise OverflowError(f"Python integer {x.uop.arg} out of bounds for {dtype.name}")
