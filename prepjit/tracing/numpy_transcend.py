"""NumPy's transcendental ufuncs beyond the primitive ones (log1p, expm1, hyperbolic, inverse trig, hypot,
logaddexp, nan_to_num), composed from primitives with accurate formulas (a few ulp, not the naive ones).

Each takes NumPy's result dtype (ints -> float64, int8 -> float16, ...); 16-bit floats are computed in float32 and
rounded once at the end, as NumPy does.
"""
from __future__ import annotations

import math

from ..uop import DType, Ops, dtypes
from . import prims
from .numpy_math import (absolute, add, cos, equal, exp, greater, isinf, isnan, less, log, logical_or, maximum, minimum,
                         multiply, negative, signbit, sin, sqrt, subtract, true_divide, ufunc_dtype, where)
from .prims import elementwise, to_tracer
from .tracer import Tracer


def _work(name: str, *xs) -> tuple[list[Tracer], DType, DType]:
    """Operands cast to the dtype the formula runs in, that dtype and NumPy's result dtype."""
    xs = [to_tracer(x) for x in xs]
    dt = ufunc_dtype(name, *xs)
    work = dt.compute
    return [prims.cast(x, work) for x in xs], work, dt


def _c(value: float, dt: DType) -> Tracer:
    return Tracer(prims.cast(to_tracer(value), dt).uop, weak=True)


def _large(dt: DType) -> float:
    """Above this |x|, x*x + 1 == x*x in dt: 1 / sqrt(eps)."""
    return float(2 ** 26) if dt == dtypes.float64 else float(2 ** 12)


def _log1p(x: Tracer, dt: DType) -> Tracer:
    u = add(x, 1)  # log(u) is off by the rounding of 1 + x; (u - 1 - x) / u corrects it to first order
    value = subtract(log(u), true_divide(subtract(subtract(u, 1), x), u))
    value = where(equal(u, 1), x, value)
    value = where(equal(u, 0), _c(-math.inf, dt), value)
    return where(equal(x, math.inf), x, value)


def _expm1(x: Tracer, dt: DType) -> Tracer:
    u = exp(x)  # Kahan: (u - 1) * x / log(u) cancels the rounding of exp
    um1 = subtract(u, 1)
    value = multiply(um1, true_divide(x, log(u)))  # not (u - 1) * x first: it overflows near the top
    value = where(equal(um1, -1), _c(-1.0, dt), value)
    value = where(equal(u, 1), x, value)
    return where(equal(u, math.inf), u, value)


def _with_sign_of(value: Tracer, x: Tracer) -> Tracer:
    return where(signbit(x), negative(value), value)


def _half_square_exp(a: Tracer) -> Tracer:
    """exp(a) / 2 without overflowing before the result does."""
    t = exp(multiply(a, 0.5))
    return multiply(multiply(t, 0.5), t)


def log1p(x):
    (x,), work, dt = _work("log1p", x)
    return prims.cast(_log1p(x, work), dt)


def expm1(x):
    (x,), work, dt = _work("expm1", x)
    return prims.cast(_expm1(x, work), dt)


def sinh(x):
    (x,), work, dt = _work("sinh", x)
    a = absolute(x)
    u = _expm1(a, work)
    small = multiply(add(u, true_divide(u, add(u, 1))), 0.5)
    return prims.cast(_with_sign_of(where(greater(a, 20.0), _half_square_exp(a), small), x), dt)


def cosh(x):
    (x,), work, dt = _work("cosh", x)
    a = absolute(x)
    e = exp(a)
    small = multiply(add(e, true_divide(1, e)), 0.5)
    return prims.cast(where(greater(a, 20.0), _half_square_exp(a), small), dt)


def tan(x):
    (x,), work, dt = _work("tan", x)
    return prims.cast(true_divide(sin(x), cos(x)), dt)


def arctan2(y, x):
    (y, x), work, dt = _work("arctan2", y, x)
    return prims.cast(elementwise(Ops.ATAN2, y, x, dtype=work), dt)


def arctan(x):
    (x,), work, dt = _work("arctan", x)
    return prims.cast(elementwise(Ops.ATAN2, x, _c(1.0, work), dtype=work), dt)


def _cos_of_asin(x: Tracer) -> Tracer:
    return sqrt(multiply(subtract(1, x), add(1, x)))  # sqrt(1 - x^2) without cancelling near |x| = 1


def arcsin(x):
    (x,), work, dt = _work("arcsin", x)
    return prims.cast(elementwise(Ops.ATAN2, x, _cos_of_asin(x), dtype=work), dt)


def arccos(x):
    (x,), work, dt = _work("arccos", x)
    return prims.cast(elementwise(Ops.ATAN2, _cos_of_asin(x), x, dtype=work), dt)


def arcsinh(x):
    (x,), work, dt = _work("arcsinh", x)
    a = absolute(x)
    small = _log1p(add(a, true_divide(multiply(a, a), add(1, sqrt(add(1, multiply(a, a)))))), work)
    large = add(log(a), _c(math.log(2), work))
    return prims.cast(_with_sign_of(where(greater(a, _large(work)), large, small), x), dt)


def arccosh(x):
    (x,), work, dt = _work("arccosh", x)
    t = subtract(x, 1)
    small = _log1p(add(t, sqrt(add(multiply(t, 2), multiply(t, t)))), work)
    large = add(log(x), _c(math.log(2), work))
    value = where(greater(x, _large(work)), large, small)
    return prims.cast(where(less(x, 1), _c(math.nan, work), value), dt)  # t * t would hide a huge negative x


def arctanh(x):
    (x,), work, dt = _work("arctanh", x)
    a = absolute(x)
    value = multiply(_log1p(true_divide(multiply(a, 2), subtract(1, a)), work), 0.5)
    return prims.cast(_with_sign_of(value, x), dt)


def hypot(x, y):
    (x, y), work, dt = _work("hypot", x, y)
    a, b = absolute(x), absolute(y)
    big, small = maximum(a, b), minimum(a, b)
    r = true_divide(small, big)
    value = multiply(big, sqrt(add(1, multiply(r, r))))
    value = where(equal(big, 0), _c(0.0, work), value)
    return prims.cast(where(logical_or(isinf(a), isinf(b)), _c(math.inf, work), value), dt)


def logaddexp(x, y):
    (x, y), work, dt = _work("logaddexp", x, y)
    big = maximum(x, y)
    value = add(big, _log1p(exp(negative(absolute(subtract(x, y)))), work))
    return prims.cast(where(equal(x, y), add(x, _c(math.log(2), work)), value), dt)


def nan_to_num(x, copy: bool = True, nan: float = 0.0, posinf=None, neginf=None):
    """NumPy's nan_to_num (no complex dtypes): NaN -> nan, +-inf -> posinf / neginf (default: the dtype's
    largest / most negative finite value); other dtypes pass through."""
    x = to_tracer(x)
    if not x.dtype.is_float:
        return x
    info = x.dtype.finfo
    hi = float(info.max) if posinf is None else posinf
    lo = float(info.min) if neginf is None else neginf
    x = where(isnan(x), _c(nan, x.dtype), x)
    x = where(equal(x, math.inf), _c(hi, x.dtype), x)
    return where(equal(x, -math.inf), _c(lo, x.dtype), x)
