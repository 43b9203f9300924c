"""Samplers on traced arrays, built on random_bits.py as `jax.random` builds them (same values for the same key).

- uniform: the top `nmant` random bits as a mantissa, m * 2**-nmant in [0, 1) (exactly the float JAX gets by
  setting the exponent of 1.0 and subtracting 1), scaled to [minval, maxval).
- normal: sqrt(2) * erfinv(u) for u uniform in (-1, 1), with XLA's erfinv (xla_math.py: M. Giles'
  approximations, rounded as XLA's CPU code rounds them): float16 and bfloat16 computed in float32.
- bernoulli: uniform(p's dtype) < p.
- randint: two words of random bits reduced modulo the span (2**nbits % span folded in), as JAX does.
"""
from __future__ import annotations

import numpy as np

from ..uop import dtypes, to_dtype
from . import prims
from .numpy_math import (add, equal, greater, less, less_equal, logical_and, maximum, minimum, mod, multiply,
                         right_shift, subtract, where)
from .fused import multiply_add
from .prims import to_sint, to_tracer
from .random_bits import random_bits, split
from .tracer import Tracer
from .xla_math import erfinv


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
    nmant = dt.finfo.nmant  # bfloat16 has 7 bits of mantissa where float16 has 10
    nbits = dt.bits if nmant >= 8 else 8  # as JAX: a dtype of fewer mantissa bits draws one byte
    bits = random_bits(key, nbits, shape)
    mantissa = prims.cast(right_shift(bits, nbits - nmant), dt)
    floats = multiply(mantissa, _const(2.0 ** -nmant, dt))  # exact: m < 2**nmant
    lo, span = _bounds(minval, maxval, dt)
    return prims.broadcast_to(maximum(lo, multiply_add(floats, span, lo, dt)), shape)


def normal(key, shape=(), dtype=dtypes.float32) -> Tracer:
    """Standard normal floats (jax.random.normal): sqrt(2) * erfinv(u), u uniform in (-1, 1)."""
    dt = _float_dtype(dtype, "normal")
    work = dtypes.float64 if dt == dtypes.float64 else dtypes.float32
    lo = np.nextafter(np.array(-1.0, dt.np), np.array(0.0, dt.np))
    u = prims.cast(uniform(key, shape, dt, lo, np.array(1.0, dt.np)), work)
    z = erfinv(u)
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
