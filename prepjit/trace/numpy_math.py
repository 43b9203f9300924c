"""NumPy-named elementwise math and reductions on traced arrays, with NumPy's dtype rules."""
from __future__ import annotations

import functools

import numpy as np

from ..errors import TraceError
from ..uop import DType, Ops, dtypes, sym_prod, to_dtype
from . import prims
from .prims import elementwise, to_tracer
from .tracer import Tracer


@functools.lru_cache(maxsize=None)
def _ufunc_dtype_cached(name: str, operands: tuple) -> DType:
    args = [({"b": True, "i": 1, "u": 1, "f": 1.0}[dt.kind] if weak else np.ones((), dt.np)) for dt, weak in operands]
    try:
        with np.errstate(all="ignore"):
            out = getattr(np, name)(*args)
    except TypeError as e:
        kinds = ", ".join(dt.name for dt, _ in operands)
        raise TraceError(f"{name} is not supported for {kinds} (NumPy: {e})") from None
    return to_dtype(np.asarray(out).dtype)


def ufunc_dtype(name: str, *xs: Tracer) -> DType:
    """The result dtype NumPy's ufunc `name` gives for these operands (Python scalars weakly typed)."""
    return _ufunc_dtype_cached(name, tuple((x.dtype, x.weak) for x in xs))


def _binary(name: str, op: Ops):
    def fn(a, b):
        a, b = to_tracer(a), to_tracer(b)
        dt = ufunc_dtype(name, a, b)
        return elementwise(op, a, b, dtype=dt)
    fn.__name__ = name
    fn.__doc__ = f"NumPy's `{name}` on traced arrays."
    return fn


def _compare(name: str, op: Ops, swap=False, negate=False):
    def fn(a, b):
        a, b = to_tracer(a), to_tracer(b)
        dt = prims.result_dtype(a, b)
        out = elementwise(op, *((b, a) if swap else (a, b)), dtype=dt)
        return logical_not(out) if negate else out
    fn.__name__ = name
    fn.__doc__ = f"NumPy's `{name}` on traced arrays."
    return fn


def _unary(name: str, op: Ops):
    def fn(x):
        x = to_tracer(x)
        return elementwise(op, x, dtype=ufunc_dtype(name, x))
    fn.__name__ = name
    fn.__doc__ = f"NumPy's `{name}` on traced arrays."
    return fn


def _bool_or_int(name: str, op: Ops, bool_op: Ops):
    base = _binary(name, op)

    def fn(a, b):
        a, b = to_tracer(a), to_tracer(b)
        if ufunc_dtype(name, a, b) == dtypes.bool:
            return elementwise(bool_op, a, b, dtype=dtypes.bool)
        return base(a, b)
    fn.__name__ = name
    return fn


add = _bool_or_int("add", Ops.ADD, Ops.OR)
multiply = _bool_or_int("multiply", Ops.MUL, Ops.AND)
subtract = _binary("subtract", Ops.SUB)
true_divide = _binary("true_divide", Ops.FDIV)
divide = true_divide
floor_divide_int = _binary("floor_divide", Ops.IDIV)
mod_ = _binary("mod", Ops.MOD)
power = _binary("power", Ops.POW)
maximum = _binary("maximum", Ops.MAX)
minimum = _binary("minimum", Ops.MIN)
bitwise_and = _binary("bitwise_and", Ops.AND)
bitwise_or = _binary("bitwise_or", Ops.OR)
bitwise_xor = _binary("bitwise_xor", Ops.XOR)
left_shift = _binary("left_shift", Ops.SHL)
right_shift = _binary("right_shift", Ops.SHR)
less = _compare("less", Ops.CMPLT)
greater = _compare("greater", Ops.CMPLT, swap=True)
less_equal = _compare("less_equal", Ops.CMPLT, swap=True, negate=True)
greater_equal = _compare("greater_equal", Ops.CMPLT, negate=True)
equal = _compare("equal", Ops.CMPEQ)
not_equal = _compare("not_equal", Ops.CMPNE)
exp = _unary("exp", Ops.EXP)
exp2 = _unary("exp2", Ops.EXP2)
log = _unary("log", Ops.LOG)
log2 = _unary("log2", Ops.LOG2)
sqrt = _unary("sqrt", Ops.SQRT)
sin = _unary("sin", Ops.SIN)
cos = _unary("cos", Ops.COS)
tanh = _unary("tanh", Ops.TANH)
floor = _unary("floor", Ops.FLOOR)
ceil = _unary("ceil", Ops.CEIL)
rint = _unary("rint", Ops.RINT)
absolute = _unary("absolute", Ops.ABS)
abs = absolute  # noqa: A001 - NumPy's name
sign = _unary("sign", Ops.SIGN)


def negative(x):
    x = to_tracer(x)
    return elementwise(Ops.NEG, x, dtype=ufunc_dtype("negative", x))


def invert(x):
    x = to_tracer(x)
    dt = ufunc_dtype("invert", x)
    return elementwise(Ops.NOT, x, dtype=dt)


def logical_not(x):
    return elementwise(Ops.NOT, prims.cast(to_tracer(x), dtypes.bool), dtype=dtypes.bool)


def logical_and(a, b):
    return elementwise(Ops.AND, prims.cast(to_tracer(a), dtypes.bool), prims.cast(to_tracer(b), dtypes.bool))


def logical_or(a, b):
    return elementwise(Ops.OR, prims.cast(to_tracer(a), dtypes.bool), prims.cast(to_tracer(b), dtypes.bool))


def floor_divide(a, b):
    a, b = to_tracer(a), to_tracer(b)
    dt = ufunc_dtype("floor_divide", a, b)
    return floor(true_divide(a, b)) if dt.is_float else floor_divide_int(a, b)


def mod(a, b):
    return mod_(a, b)


remainder = mod


def square(x):
    x = to_tracer(x)
    return multiply(x, x)


def reciprocal(x):
    x = to_tracer(x)
    return true_divide(prims.cast(to_tracer(1), x.dtype) if x.dtype.is_float else 1, x)


def clip(x, a_min=None, a_max=None):
    x = to_tracer(x)
    if a_min is not None:
        x = maximum(x, a_min)
    if a_max is not None:
        x = minimum(x, a_max)
    return x


def where(cond, a, b):
    cond = prims.cast(to_tracer(cond), dtypes.bool)
    return elementwise(Ops.WHERE, cond, a, b)


def astype(x, dtype) -> Tracer:
    return prims.cast(to_tracer(x), to_dtype(dtype))


# ---------- reductions ----------

def _reduction_dtype(name: str, x: Tracer, dtype) -> DType:
    if dtype is not None:
        return to_dtype(dtype)
    with np.errstate(all="ignore"):
        return to_dtype(getattr(np, name)(np.ones(1, x.dtype.np)).dtype)


def sum(x, axis=None, keepdims=False, dtype=None):  # noqa: A001 - NumPy's name
    x = to_tracer(x)
    dt = _reduction_dtype("sum", x, dtype)
    if dt == dtypes.bool:
        return prims.reduce(prims.cast(x, dt), Ops.OR, axis, keepdims)
    return prims.reduce(prims.cast(x, dt), Ops.ADD, axis, keepdims)


def prod(x, axis=None, keepdims=False, dtype=None):
    x = to_tracer(x)
    dt = _reduction_dtype("prod", x, dtype)
    return prims.reduce(prims.cast(x, dt), Ops.AND if dt == dtypes.bool else Ops.MUL, axis, keepdims)


def max(x, axis=None, keepdims=False):  # noqa: A001 - NumPy's name
    x = to_tracer(x)
    return prims.reduce(x, Ops.OR if x.dtype == dtypes.bool else Ops.MAX, axis, keepdims)


def min(x, axis=None, keepdims=False):  # noqa: A001 - NumPy's name
    x = to_tracer(x)
    return prims.reduce(x, Ops.AND if x.dtype == dtypes.bool else Ops.MIN, axis, keepdims)


amax, amin = max, min


def mean(x, axis=None, keepdims=False):
    x = to_tracer(x)
    dt = _reduction_dtype("mean", x, None)
    acc = dtypes.float32 if dt == dtypes.float16 else dt
    axes = prims.normalize_axes(axis, x.ndim)
    count = sym_prod(x.uop.shape[a] for a in axes)
    total = sum(prims.cast(x, acc), axis=axes, keepdims=keepdims)
    return prims.cast(true_divide(total, prims.cast(to_tracer(count), acc)), dt)


def all(x, axis=None, keepdims=False):  # noqa: A001 - NumPy's name
    return prims.reduce(prims.cast(to_tracer(x), dtypes.bool), Ops.AND, axis, keepdims)


def any(x, axis=None, keepdims=False):  # noqa: A001 - NumPy's name
    return prims.reduce(prims.cast(to_tracer(x), dtypes.bool), Ops.OR, axis, keepdims)
