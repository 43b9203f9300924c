"""`a * b + c` on traced floats as XLA's CPU code computes it, so samplers built as `jax.random` builds them
match it bit for bit: for float16, float32 and float64 a fused multiply-add, rounded once (XLA contracts the
pair into one FMA instruction); for bfloat16 rounded after each op (XLA does not contract it).

The FMA is built from plain ops (no renderer has an FMA op, and they keep NumPy's separate roundings): for
float16 and float32 in the next wider float, where the product is exact and TwoSum gives the sum's error,
so s + e == a * b + c exactly; rounding s to the narrow dtype is then right unless s lies exactly halfway
between two of its values while e != 0, and then s is first moved off that midpoint toward e. For float64,
Boldo and Melquiond's emulation ("Emulation of FMA and correctly rounded sums: proved algorithms using
rounding to odd", IEEE Trans. Computers 57(4), 2008): the exact product as two doubles (Dekker), TwoSum with
c, the two low parts added rounded to odd, then one rounding to nearest. Exact for finite results away from
overflow and the subnormal range.
"""
from __future__ import annotations

import numpy as np

from ..uop import DType, dtypes
from . import prims
from .numpy_math import (absolute, add, equal, floor, greater, logical_and, multiply, not_equal, subtract,
                         true_divide, where)
from .tracer import Tracer

_WIDER = {dtypes.float16: dtypes.float32, dtypes.float32: dtypes.float64}


def _precision(dt: DType) -> int:
    return np.finfo(dt.np).nmant + 1


def _const(value: float, dt: DType) -> Tracer:
    return Tracer(prims.cast(prims.to_tracer(value), dt).uop)


def _rounded_to_bits(x: Tracer, bits: int) -> Tracer:
    """x rounded to `bits` significant bits (Veltkamp's splitting, exact in x's dtype for finite x)."""
    scaled = multiply(x, _const(2.0 ** (_precision(x.dtype) - bits) + 1, x.dtype))
    return subtract(scaled, subtract(scaled, x))


def _two_sum(x: Tracer, y: Tracer) -> tuple[Tracer, Tracer]:
    """(s, e): s = x + y rounded, e its error (Knuth's TwoSum: s + e == x + y exactly)."""
    s = add(x, y)
    back = subtract(s, x)
    return s, add(subtract(x, subtract(s, back)), subtract(y, back))


def multiply_add(a, b, c, dt: DType) -> Tracer:
    """a * b + c in float dtype `dt` as XLA's CPU code computes it (see the module)."""
    if dt == dtypes.bfloat16:
        return add(multiply(prims.cast(prims.to_tracer(a), dt), prims.cast(prims.to_tracer(b), dt)),
                   prims.cast(prims.to_tracer(c), dt))
    return fma(a, b, c, dt)


def fma(a, b, c, dt: DType) -> Tracer:
    """a * b + c in float dtype `dt` (float16, float32 or float64), rounded once."""
    if dt == dtypes.float64:
        return _fma64(*(prims.cast(prims.to_tracer(v), dt) for v in (a, b, c)))
    wide = _WIDER[dt]
    a, b, c = (prims.cast(prims.to_tracer(v), wide) for v in (a, b, c))
    s, error = _two_sum(multiply(a, b), c)  # the product is exact: wide has twice dt's precision and more
    halfway = logical_and(equal(_rounded_to_bits(s, _precision(dt) + 1), s),
                          not_equal(prims.cast(prims.cast(s, dt), wide), s))
    step = multiply(absolute(s), _const(2.0 ** -((_precision(wide) + _precision(dt)) // 2 + 1), wide))
    moved = where(greater(error, 0), add(s, step), subtract(s, step))
    return prims.cast(where(logical_and(halfway, not_equal(error, 0)), moved, s), dt)


def _fma64(a: Tracer, b: Tracer, c: Tracer) -> Tracer:
    high = multiply(a, b)
    a_high, b_high = _rounded_to_bits(a, 26), _rounded_to_bits(b, 26)
    a_low, b_low = subtract(a, a_high), subtract(b, b_high)
    low = add(add(add(subtract(multiply(a_high, b_high), high), multiply(a_high, b_low)), multiply(a_low, b_high)),
              multiply(a_low, b_low))  # Dekker: high + low == a * b exactly
    s, s_low = _two_sum(c, high)
    return add(s, _add_rounded_to_odd(s_low, low))


def _add_rounded_to_odd(x: Tracer, y: Tracer) -> Tracer:
    """x + y rounded to odd: the rounded sum, or when inexact and its last significand bit is 0, its neighbour
    toward the exact sum (Rump, Zimmermann, Boldo and Melquiond's successor: v + (2**-53 + 2**-105) * |v|)."""
    v, error = _two_sum(x, y)
    step = multiply(absolute(v), _const(2.0 ** -53 + 2.0 ** -105, v.dtype))
    ulp = subtract(add(absolute(v), step), absolute(v))
    half_significand = true_divide(absolute(v), multiply(ulp, _const(2.0, v.dtype)))  # exact: a power-of-2 scale
    even = equal(floor(half_significand), half_significand)
    toward = where(greater(error, 0), add(v, step), subtract(v, step))
    return where(logical_and(even, not_equal(error, 0)), toward, v)
