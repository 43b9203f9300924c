"""Samplers on traced arrays, built on random_bits.py as `jax.random` builds them (same values for the same key).

- uniform: the top `nmant` random bits as a mantissa, m * 2**-nmant in [0, 1) (exactly the float JAX gets by
  setting the exponent of 1.0 and subtracting 1), scaled to [minval, maxval).
- normal: sqrt(2) * erfinv(u) for u uniform in (-1, 1), with M. Giles' erfinv approximations ("Approximating
  the erfinv function", GPU Computing Gems, 2011): the single-precision one for float16/float32 (computed in
  float32), the double-precision one for float64.
- bernoulli: uniform(p's dtype) < p.
- randint: two words of random bits reduced modulo the span (2**nbits % span folded in), as JAX does.
"""
from __future__ import annotations

import numpy as np

from ..uop import dtypes, to_dtype
from . import prims
from .numpy_math import (absolute, add, equal, greater, less, less_equal, logical_and, maximum, minimum, mod, multiply,
                         right_shift, sqrt, subtract, where)
from .fused import multiply_add
from .numpy_transcend import log1p
from .prims import to_sint, to_tracer
from .random_bits import random_bits, split
from .tracer import Tracer

# Giles' erfinv: per branch, polynomial coefficients (highest power first) in w - centre or sqrt(w) - centre
_ERFINV32 = ((5.0, 2.5, (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                         -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)),
             (None, 3.0, (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                          -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)))
_ERFINV64 = ((6.25, 3.125, (-3.6444120640178196996e-21, -1.685059138182016589e-19, 1.2858480715256400167e-18,
                            1.115787767802518096e-17, -1.333171662854620906e-16, 2.0972767875968561637e-17,
                            6.6376381343583238325e-15, -4.0545662729752068639e-14, -8.1519341976054721522e-14,
                            2.6335093153082322977e-12, -1.2975133253453532498e-11, -5.4154120542946279317e-11,
                            1.051212273321532285e-09, -4.1126339803469836976e-09, -2.9070369957882005086e-08,
                            4.2347877827932403518e-07, -1.3654692000834678645e-06, -1.3882523362786468719e-05,
                            0.0001867342080340571352, -0.00074070253416626697512, -0.0060336708714301490533,
                            0.24015818242558961693, 1.6536545626831027356)),
             (16.0, 3.25, (2.2137376921775787049e-09, 9.0756561938885390979e-08, -2.7517406297064545428e-07,
                           1.8239629214389227755e-08, 1.5027403968909827627e-06, -4.013867526981545969e-06,
                           2.9234449089955446044e-06, 1.2475304481671778723e-05, -4.7318229009055733981e-05,
                           6.8284851459573175448e-05, 2.4031110387097893999e-05, -0.0003550375203628474796,
                           0.00095328937973738049703, -0.0016882755560235047313, 0.0024914420961078508066,
                           -0.0037512085075692412107, 0.005370914553590063617, 1.0052589676941592334,
                           3.0838856104922207635)),
             (None, 5.0, (-2.7109920616438573243e-11, -2.5556418169965252055e-10, 1.5076572693500548083e-09,
                          -3.7894654401267369937e-09, 7.6157012080783393804e-09, -1.4960026627149240478e-08,
                          2.9147953450901080826e-08, -6.7711997758452339498e-08, 2.2900482228026654717e-07,
                          -9.9298272942317002539e-07, 4.5260625972231537039e-06, -1.9681778105531670567e-05,
                          7.5995277030017761139e-05, -0.00021503011930044477347, -0.00013871931833623122026,
                          1.0103004648645343977, 4.8499064014085844221)))


def _shape(shape) -> tuple:
    return tuple(to_sint(d, "a dimension") for d in (shape if isinstance(shape, (tuple, list)) else (shape,)))


def _float_dtype(dtype, what: str):
    dt = to_dtype(dtype)
    if not dt.is_float:
        raise ValueError(f"dtype argument to `{what}` must be a float dtype, got {dt.name}")
    return dt


def _const(value, dt) -> Tracer:
    return Tracer(prims.cast(to_tracer(value), dt).uop)


def _bounds(minval, maxval, dt) -> tuple[Tracer, Tracer]:
    """minval and maxval - minval in `dt` (folded with NumPy's arithmetic in `dt` when both are scalars)."""
    if all(isinstance(v, (int, float, np.number)) for v in (minval, maxval)):
        lo, hi = np.asarray(minval, dt.np), np.asarray(maxval, dt.np)
        return _const(lo.item(), dt), _const((hi - lo).item(), dt)
    lo, hi = prims.cast(to_tracer(minval), dt), prims.cast(to_tracer(maxval), dt)
    return lo, subtract(hi, lo)


def uniform(key, shape=(), dtype=dtypes.float32, minval=0.0, maxval=1.0) -> Tracer:
    """Floats in [minval, maxval) (jax.random.uniform): float16, bfloat16, float32 or float64."""
    dt, shape = _float_dtype(dtype, "uniform"), _shape(shape)
    nmant = np.finfo(dt.np).nmant  # bfloat16 has 7 bits of mantissa where float16 has 10
    nbits = dt.bits if nmant >= 8 else 8  # as JAX: a dtype of fewer mantissa bits draws one byte
    bits = random_bits(key, nbits, shape)
    mantissa = prims.cast(right_shift(bits, nbits - nmant), dt)
    floats = multiply(mantissa, _const(2.0 ** -nmant, dt))  # exact: m < 2**nmant
    lo, span = _bounds(minval, maxval, dt)
    return prims.broadcast_to(maximum(lo, multiply_add(floats, span, lo, dt)), shape)


def _erfinv(x: Tracer, table) -> Tracer:
    """Giles' erfinv of x in (-1, 1) in x's dtype: branches on w = -log1p(-x*x), +-inf at +-1."""
    w = -log1p(-(x * x))
    (split_w, centre, coefficients), *rest = table
    branches = [(less(w, split_w), subtract(w, centre), coefficients)]
    root = sqrt(w)
    for limit, centre, coefficients in rest:
        branches.append((None if limit is None else less(w, limit), subtract(root, centre), coefficients))
    # every branch's polynomial, then the first whose condition holds (XLA evaluates them selected per term)
    result = None
    for cond, t, coefficients in reversed(branches):
        p = _const(coefficients[0], x.dtype)
        for c in coefficients[1:]:
            p = add(_const(c, x.dtype), multiply(p, t))
        result = p if result is None else where(cond, p, result)
    finite = multiply(result, x)
    return where(equal(absolute(x), 1), multiply(x, _const(float(np.finfo(x.dtype.np).max), x.dtype)), finite)


def normal(key, shape=(), dtype=dtypes.float32) -> Tracer:
    """Standard normal floats (jax.random.normal): sqrt(2) * erfinv(u), u uniform in (-1, 1)."""
    dt = _float_dtype(dtype, "normal")
    work = dtypes.float64 if dt == dtypes.float64 else dtypes.float32
    lo = np.nextafter(np.array(-1.0, dt.np), np.array(0.0, dt.np))
    u = prims.cast(uniform(key, shape, dt, lo, np.array(1.0, dt.np)), work)
    z = _erfinv(u, _ERFINV64 if work == dtypes.float64 else _ERFINV32)
    return multiply(_const(np.sqrt(2.0), dt), prims.cast(z, dt))


def bernoulli(key, p=0.5, shape=None) -> Tracer:
    """Booleans that are True with probability p (jax.random.bernoulli); p a float or a traced float array
    (a Python float draws in float32, as JAX does)."""
    p = to_tracer(p)
    if not p.dtype.is_float:
        raise TypeError(f"bernoulli probability `p` must have a floating dtype, got {p.dtype.name}")
    dt = dtypes.float32 if p.weak else p.dtype
    p = prims.cast(p, dt)
    return less(uniform(key, p.uop.shape if shape is None else shape, dt), p)


def _rem(x: Tracer, span: Tracer) -> Tracer:
    """x % span with XLA's x % 0 == x (a span of 2**nbits wraps to 0 and must leave the bits whole)."""
    return where(equal(span, 0), x, mod(x, span))


def randint(key, shape, minval, maxval, dtype=dtypes.int32) -> Tracer:
    """Integers in [minval, maxval) (jax.random.randint): minval/maxval clipped to the dtype, and a span that
    needs one more than the dtype's maximum (randint(k, s, 0, 256, uint8)) handled as JAX does."""
    dt, shape = to_dtype(dtype), _shape(shape)
    if not dt.is_int or dt == dtypes.bool:
        raise TypeError(f"randint only accepts integer dtypes, got {dt.name}")
    if dt.bits < 32:  # as JAX: sampled in int32 (less bias), bounds clipped to the dtype (maxval to max + 1), cast
        lo, hi = (prims.cast(to_tracer(v), dtypes.int32) for v in (minval, maxval))
        lo = minimum(maximum(lo, dt.min()), dt.max())
        hi = minimum(maximum(hi, dt.min()), dt.max() + 1)
        return prims.cast(randint(key, shape, lo, hi, dtypes.int32), dt)
    lo, hi = (prims.cast(to_tracer(v), dtypes.int64) for v in (minval, maxval))  # floats truncate, as astype(int)
    maxval_out_of_range = greater(hi, dt.max())
    lo, hi = (prims.cast(minimum(maximum(v, dt.min()), dt.max()), dt) for v in (lo, hi))
    unsigned = {8: dtypes.uint8, 16: dtypes.uint16, 32: dtypes.uint32, 64: dtypes.uint64}[dt.bits]
    keys = split(key)
    higher, lower = random_bits(keys[0], dt.bits, shape), random_bits(keys[1], dt.bits, shape)
    span = prims.cast(subtract(hi, lo), unsigned)
    span = where(less_equal(hi, lo), _const(1, unsigned), span)
    span = where(logical_and(maxval_out_of_range, greater(hi, lo)), add(span, _const(1, unsigned)), span)
    multiplier = _rem(_const(2 ** (dt.bits // 2), unsigned), span)
    multiplier = _rem(multiply(multiplier, multiplier), span)
    offset = _rem(add(multiply(_rem(higher, span), multiplier), _rem(lower, span)), span)
    return prims.broadcast_to(add(lo, prims.cast(offset, dt)), shape)
