"""NumPy-named elementwise math on traced arrays, with NumPy's dtype rules (reductions: numpy_reduce.py)."""
from __future__ import annotations

import builtins
import functools
import logging
import threading

import numpy as np

from ..errors import TraceError
from ..uop import DType, Ops, dtypes, promote, to_dtype
from . import prims
from .prims import elementwise, to_tracer
from .tracer import Tracer

builtins_abs = builtins.abs
_logger = logging.getLogger("prepjit")  # (`log` is the ufunc)
_last_widening = threading.local()


@functools.lru_cache(maxsize=None)
def _ufunc_dtype_cached(name: str, operands: tuple) -> DType:
    if any(dt == dtypes.bfloat16 and not weak for dt, weak in operands):  # JAX's lattice, which NumPy lacks
        operands = ((promote(*operands), False),) * len(operands)
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
    out = _ufunc_dtype_cached(name, tuple((x.dtype, x.weak) for x in xs))
    if out == dtypes.float64 and len(xs) > 1:
        _log_widening(name, xs)
    return out


def _log_widening(name: str, xs: tuple):
    """PREPJIT_LOG=compiles: a 0-d float64 operand that is not a Python float (a NumPy float64 scalar such as
    np.sqrt(d), or a 0-d float64 array) widens a float32/float16 array to float64, as NumPy 2 promotes."""
    narrow = [x for x in xs if x.dtype.is_float and x.dtype.bits < 64 and x.ndim]
    wide = [x for x in xs if x.dtype == dtypes.float64 and not x.weak and not x.ndim]
    key = (name, narrow[0].uop, wide[0].uop) if narrow and wide else None
    if key is None or getattr(_last_widening, "key", None) == key:  # (an operator may ask twice in a row)
        return
    _last_widening.key = key
    narrow, wide = key[1:]
    const = f" ({wide.arg!r})" if wide.op is Ops.CONST else ""
    _logger.info("warning: %s of a %s array of shape %s and a float64 scalar%s gives float64 (NumPy 2's promotion): "
                 "the plan computes in float64 from here; use a Python float or np.float32(...) to stay in %s",
                 name, narrow.dtype.name, prims.fmt_shape(narrow.shape), const, narrow.dtype.name)


def _binary(name: str, op: Ops):
    def fn(a, b):
        a, b = to_tracer(a), to_tracer(b)
        dt = ufunc_dtype(name, a, b)
        return elementwise(op, a, b, dtype=dt)
    fn.__name__ = name
    fn.__doc__ = f"NumPy's `{name}` on traced arrays."
    return fn


def _compare(name: str, op: Ops, swap=False, or_equal=False):
    def fn(a, b):
        a, b = to_tracer(a), to_tracer(b)
        dt = prims.result_dtype(a, b)
        if not (prims.python_int_fits(a, dt) and prims.python_int_fits(b, dt)):
            dt = dtypes.int64  # NumPy 2 compares out-of-range Python ints by value (uint64 not covered)
        out = elementwise(op, *((b, a) if swap else (a, b)), dtype=dt)
        return elementwise(Ops.OR, out, elementwise(Ops.CMPEQ, a, b, dtype=dt)) if or_equal else out
    fn.__name__ = name
    fn.__doc__ = f"NumPy's `{name}` on traced arrays."
    return fn


def _unary(name: str, op: Ops):
    def fn(x):
        x = to_tracer(x)
        dt = ufunc_dtype(name, x)
        if op in (Ops.FLOOR, Ops.CEIL, Ops.RINT) and not dt.is_float:
            return prims.cast(x, dt)  # NumPy 2 rounds integers to themselves
        return elementwise(op, x, dtype=dt)
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
mod_int = _binary("remainder", Ops.MOD)
maximum = _binary("maximum", Ops.MAX)
minimum = _binary("minimum", Ops.MIN)
bitwise_and = _binary("bitwise_and", Ops.AND)
bitwise_or = _binary("bitwise_or", Ops.OR)
bitwise_xor = _binary("bitwise_xor", Ops.XOR)
left_shift = _binary("left_shift", Ops.SHL)
right_shift = _binary("right_shift", Ops.SHR)
less = _compare("less", Ops.CMPLT)
greater = _compare("greater", Ops.CMPLT, swap=True)
less_equal = _compare("less_equal", Ops.CMPLT, or_equal=True)
greater_equal = _compare("greater_equal", Ops.CMPLT, swap=True, or_equal=True)
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
erf = _unary("exp", Ops.ERF)  # NumPy has no erf: it takes exp's dtypes (ints -> float)
erf.__name__, erf.__doc__ = "erf", "The error function (math.erf) on traced arrays."
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


def logical_xor(a, b):
    return elementwise(Ops.XOR, prims.cast(to_tracer(a), dtypes.bool), prims.cast(to_tracer(b), dtypes.bool))


def floor_divide(a, b):
    a, b = to_tracer(a), to_tracer(b)
    dt = ufunc_dtype("floor_divide", a, b)
    return _float_divmod(a, b, dt)[0] if dt.is_float else floor_divide_int(a, b)


def mod(a, b):
    a, b = to_tracer(a), to_tracer(b)
    dt = ufunc_dtype("remainder", a, b)
    return _float_divmod(a, b, dt)[1] if dt.is_float else mod_int(a, b)


remainder = mod


def _float_divmod(a: Tracer, b: Tracer, dt: DType) -> tuple[Tracer, Tracer]:
    """NumPy's npy_divmod step by step (16-bit floats computed in float32, as NumPy does): C fmod, then the
    floor correction, the quotient rounded to an integer, and the signs of zero results."""
    work = dt.compute
    a, b = prims.cast(a, work), prims.cast(b, work)
    magnitude = elementwise(Ops.MOD, absolute(a), absolute(b))  # operands >= 0: the MOD op is plain fmod
    fmod = where(signbit(a), negative(magnitude), magnitude)
    div = true_divide(subtract(a, fmod), b)
    nonzero = not_equal(fmod, 0)
    adjust = logical_and(nonzero, not_equal(less(b, 0), less(fmod, 0)))
    modulus = where(adjust, add(fmod, b), where(nonzero, fmod, _signed_zero(b)))
    div = where(adjust, subtract(div, 1), div)
    floored = floor(div)
    floored = where(greater(subtract(div, floored), 0.5), add(floored, 1), floored)
    quotient = true_divide(a, b)
    floored = where(not_equal(div, 0), floored, _signed_zero(quotient))
    by_zero = equal(b, 0)
    floored, modulus = where(by_zero, quotient, floored), where(by_zero, fmod, modulus)
    return prims.cast(floored, dt), prims.cast(modulus, dt)


def signbit(x):
    """True where the sign bit is set (-0.0 included); NaN's sign is not tracked (False)."""
    x = to_tracer(x)
    if not x.dtype.is_float:
        return less(x, 0)
    return logical_or(less(x, 0), logical_and(equal(x, 0), less(true_divide(1, x), 0)))


def _signed_zero(like: Tracer) -> Tracer:
    return where(signbit(like), -0.0, 0.0)


def power(a, b):
    """NumPy's power; integer powers by repeated squaring (wrapping like NumPy), floats through pow."""
    a, b = to_tracer(a), to_tracer(b)
    dt = ufunc_dtype("power", a, b)
    if dt.is_float:
        return elementwise(Ops.POW, a, b, dtype=dt)
    if b.uop.op is Ops.CONST and b.weak:
        if b.uop.arg < 0:
            raise ValueError("Integers to negative integer powers are not allowed.")
        base = prims.cast(a, dt)
        return prims.broadcast_to(_int_power_static(base, int(b.uop.arg), dt), base.uop.shape)
    base, exponent = prims.cast(a, dt), prims.cast(b, dt)
    result = prims.cast(to_tracer(1), dt)
    for _ in range(dt.bits):
        result = where(not_equal(bitwise_and(exponent, 1), 0), multiply(result, base), result)
        base, exponent = multiply(base, base), right_shift(exponent, 1)
    return result


def _int_power_static(base: Tracer, exponent: int, dt: DType) -> Tracer:
    result = None
    while exponent:
        if exponent & 1:
            result = base if result is None else multiply(result, base)
        exponent >>= 1
        if exponent:
            base = multiply(base, base)
    return prims.cast(to_tracer(1), dt) if result is None else result


def rsqrt(x):
    """1 / sqrt(x) (an extension: NumPy has no rsqrt), with sqrt's dtypes."""
    root = sqrt(x)
    return true_divide(prims.cast(to_tracer(1), root.dtype), root)


def round(x, decimals: int = 0):  # noqa: A001 - NumPy's name
    """NumPy's round: half to even, at `decimals` places (scale, rint, unscale, as NumPy does; integers to
    negative decimals in float64 and back; bool only to 0 decimals, as float16)."""
    x = to_tracer(x)
    if decimals == 0 and x.dtype == dtypes.bool:
        return rint(x)
    if x.dtype == dtypes.bool:
        raise TraceError(f"round of a bool array to {decimals} decimals: NumPy cannot cast the scaled float64 "
                         "back to bool either")
    if not x.dtype.is_float:
        if decimals >= 0:
            return x
        return prims.cast(round(prims.cast(x, dtypes.float64), decimals), x.dtype)
    if decimals == 0:
        return rint(x)
    scale = prims.cast(to_tracer(10.0 ** builtins_abs(decimals)), x.dtype)
    if decimals > 0:
        return true_divide(rint(multiply(x, scale)), scale)
    return multiply(rint(true_divide(x, scale)), scale)


around = round


def isnan(x):
    x = to_tracer(x)
    return not_equal(x, x) if x.dtype.is_float else full_bool(x, False)


def isinf(x):
    x = to_tracer(x)
    return equal(absolute(x), float("inf")) if x.dtype.is_float else full_bool(x, False)


def isfinite(x):
    x = to_tracer(x)
    return less(absolute(x), float("inf")) if x.dtype.is_float else full_bool(x, True)


def full_bool(x: Tracer, value: bool) -> Tracer:
    return prims.broadcast_to(Tracer(prims.cast(to_tracer(value), dtypes.bool).uop), x.uop.shape)


def square(x):
    x = to_tracer(x)
    return elementwise(Ops.MUL, x, x, dtype=ufunc_dtype("square", x))  # bool squares to int8, like NumPy


def reciprocal(x):
    """1 / x; integers as NumPy computes them, (int)(1.0 / x): 1 and -1 keep, others truncate to 0, and 0
    gives the float-to-int conversion of inf (the dtype's minimum for 32- and 64-bit signed ints, else 0)."""
    x = to_tracer(x)
    dt = ufunc_dtype("reciprocal", x)
    if dt.is_float:
        return true_divide(prims.cast(to_tracer(1), dt), x)
    x = prims.cast(x, dt)

    def const(v) -> Tracer:
        return Tracer(prims.cast(to_tracer(v), dt).uop)
    out = where(equal(x, 1), const(1), const(0))
    if dt.kind == "i":
        out = where(equal(x, -1), const(-1), out)
    return where(equal(x, 0), const(dt.min() if dt.kind == "i" and dt.bits >= 32 else 0), out)


def clip(x, a_min=None, a_max=None):
    x = to_tracer(x)
    if x.dtype.is_int:  # NumPy drops Python-int bounds beyond the dtype's range
        if type(a_min) is int and a_min <= x.dtype.min():
            a_min = None
        if type(a_max) is int and a_max >= x.dtype.max():
            a_max = None
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
