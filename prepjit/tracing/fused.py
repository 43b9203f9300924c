"""`a * b + c` on traced floats as XLA's CPU code computes it, so samplers built as `jax.random` builds them
match it bit for bit: for float16, float32 and float64 a fused multiply-add, rounded once (XLA contracts the
pair into one FMA instruction); for bfloat16 rounded after each op (XLA does not contract it).

float32 and float64 use the FMA primitive (every backend's correctly rounded FMA). float16 is computed in
float32 and rounded after each op, so its FMA is built exactly from plain float32 ops: the product is exact
(22 significant bits) and TwoSum gives the sum's error, so s + e == a * b + c exactly; rounding s to float16
is then right unless s lies exactly halfway between two float16 values while e != 0, and then s is first
moved off that midpoint toward e.
"""
from __future__ import annotations

from ..uop import DType, dtypes
from ..uop.ops import FMA_DTYPES
from . import prims
from .numpy_math import absolute, add, equal, greater, logical_and, multiply, not_equal, subtract, where
from .tracer import Tracer


def _precision(dt: DType) -> int:
    return dt.finfo.nmant + 1


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
    if dt in FMA_DTYPES:
        return prims.fma(*(prims.cast(prims.to_tracer(v), dt) for v in (a, b, c)))
    wide = dtypes.float32
    a, b, c = (prims.cast(prims.to_tracer(v), wide) for v in (a, b, c))
    s, error = _two_sum(multiply(a, b), c)
    halfway = logical_and(equal(_rounded_to_bits(s, _precision(dt) + 1), s),
                          not_equal(prims.cast(prims.cast(s, dt), wide), s))
    step = multiply(absolute(s), _const(2.0 ** -((_precision(wide) + _precision(dt)) // 2 + 1), wide))
    moved = where(greater(error, 0), add(s, step), subtract(s, step))
    return prims.cast(where(logical_and(halfway, not_equal(error, 0)), moved, s), dt)
