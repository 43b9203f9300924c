"""`pj.random`: counter-based random numbers, reproducible on every device (JAX's Threefry-2x32 streams).

A key is a (2,) uint32 array: `key(seed)` makes one, `split(key, num)` and `fold_in(key, data)` derive new
ones. A sampler's values depend only on the key, the shape and the dtype, bit for bit as `jax.random`'s
(see docs/random.md). Inside a prepared function the key is an array argument, so each replay with a new key
draws new numbers from the same plan, and shapes may be symbolic (`normal(key, (x.shape[0], 64))`). Outside
one, the functions take NumPy keys and return NumPy arrays, computed by a prepared function per sampler
(one plan per sampler and dtype for every shape: the size is a var).
"""
from __future__ import annotations

import functools
import math

import numpy as np

from .tracing import random_bits as _bits
from .tracing import random_sample as _sample
from .tracing import core as _tracing
from .tracing.tracer import Tracer
from .uop import UOp, to_dtype
from .uop.var import Var

__all__ = ["key", "split", "fold_in", "bits", "uniform", "normal", "bernoulli", "randint"]

_UINT32_MASK = 0xFFFFFFFF


def _traced(*values) -> bool:
    """True inside a trace, or when a value (or a dim of a shape) is traced or symbolic."""
    if getattr(_tracing._active, "var_names", None) is not None:
        return True
    flat = [d for v in values for d in (v if isinstance(v, (tuple, list)) else (v,))]
    return any(isinstance(v, (Tracer, UOp, Var)) for v in flat)


def _host_key(k) -> np.ndarray:
    k = np.asarray(k)
    if k.dtype != np.uint32 or k.shape != (2,):
        raise TypeError(f"a pj.random key is a (2,) uint32 array (pj.random.key(seed), pj.random.split(key)), "
                        f"not {k.shape} {k.dtype}")
    return k


def _param(value, python) -> np.ndarray:
    """A sampler's bound or probability as the eager prepared function takes it: an array argument (0-d for a
    scalar), so new values replay the plan; Python numbers as the NumPy type `python` (one signature for all)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return np.asarray(value).astype(python)
    return np.asarray(value)


FLAT_MAX = 1 << 24  # eager draws of at most this many elements share one plan per sampler: the size is a var

_BODIES = {  # (key, shape, *params) -> the draw, for each eager call (a dtype comes by name: a static argument)
    "split": lambda k, shape: _bits.split(k, shape),
    "fold_in": lambda k, shape, data: _bits.fold_in(k, data),
    "bits": lambda k, shape, dtype: _bits.random_bits(k, to_dtype(dtype).bits, shape),
    "uniform": lambda k, shape, dtype, lo, hi: _sample.uniform(k, shape, dtype, lo, hi),
    "normal": lambda k, shape, dtype: _sample.normal(k, shape, dtype),
    "bernoulli": lambda k, shape, p: _sample.bernoulli(k, p, shape),
    "randint": lambda k, shape, lo, hi, dtype: _sample.randint(k, shape, lo, hi, dtype),
}


@functools.lru_cache(maxsize=None)
def _eager(name: str, flat: bool):
    """The prepared function of an eager call: with `flat`, of a flat draw whose size is a var (element i of a
    draw depends only on the key and i, so a draw of any shape is a flat one reshaped), else of static shapes."""
    from .jit.prepare import prepare
    body = _BODIES[name]
    if not flat:
        return prepare(body)

    def draw(k, size, params):
        return body(k, (size,), *params)
    draw.__name__ = f"random_{name}"
    return prepare(draw, vars={"size": (0, FLAT_MAX)})


def _run(name: str, k, shape: tuple, *params):
    """An eager draw on a NumPy key: NumPy arrays back. Scalar parameters and at most FLAT_MAX elements: one plan
    for every shape and value; array-valued parameters (they broadcast against the shape) or more elements: a
    plan per shape."""
    k, shape = _host_key(k), tuple(_dim(d) for d in shape)
    size = math.prod(shape)
    if size > FLAT_MAX or any(isinstance(p, np.ndarray) and p.ndim for p in params):
        return np.asarray(_eager(name, False)(k, shape, *params))
    out = np.asarray(_eager(name, True)(k, size, params))
    return out.reshape(shape + out.shape[1:])


def _dim(d) -> int:
    """A dimension of an eager draw's shape: an integer (TypeError otherwise, as JAX), not negative."""
    if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)):
        raise TypeError(f"shapes must be sequences of integers, got a dimension {d!r} ({type(d).__name__})")
    if d < 0:
        raise ValueError(f"negative dimensions are not allowed, got {d}")
    return int(d)


def _shape(shape) -> tuple:
    return tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)


def key(seed) -> np.ndarray | Tracer:
    """The key of an integer seed: its 64 bits as (high, low) uint32 words (a 32-bit seed: high word 0).

    Equals `jax.random.key_data(jax.random.key(seed))` for seeds in [0, 2**32), and for every int64 seed with
    jax_enable_x64 (JAX's default 32-bit mode drops a seed's high word; this keeps it, so seeds that differ by
    2**32 do not collide). A traced seed (a scalar var, a traced int) gives a traced key.
    """
    if _traced(seed):
        return _bits.seed_key(seed)
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) and not (
            isinstance(seed, np.ndarray) and seed.ndim == 0 and seed.dtype.kind in "iu"):
        raise TypeError(f"a seed is an integer scalar, not {type(seed).__name__} {seed!r}")
    bits = np.asarray(seed).dtype.itemsize * 8 if isinstance(seed, (np.integer, np.ndarray)) else 64
    value = int(seed)
    if bits == 64 and not -2 ** 63 <= value < 2 ** 64:
        raise OverflowError(f"seed {value} does not fit in 64 bits")
    return np.array([(value >> 32) & _UINT32_MASK if bits == 64 else 0, value & _UINT32_MASK], np.uint32)


def split(key, num=2):
    """`num` new keys, shape (num, 2) (or (*num, 2) for a shape), independent of `key` and of each other."""
    if _traced(key, num):
        return _bits.split(key, num)
    return _run("split", key, _shape(num))


def fold_in(key, data):
    """A new key from `key` and an integer (a step count, a layer number); a scalar var inside a prepared
    function, so one plan draws per-step keys."""
    if _traced(key, data):
        return _bits.fold_in(key, data)
    return np.asarray(_eager("fold_in", False)(_host_key(key), (), np.asarray(data, np.int64)))


def bits(key, shape=(), dtype=np.uint32):
    """Raw random bits in an unsigned dtype (uint8/16/32/64), as jax.random.bits."""
    dt = to_dtype(dtype)
    if dt.kind != "u":
        raise TypeError(f"bits gives unsigned integers, not {dt.name}")
    if _traced(key, shape):
        return _bits.random_bits(key, dt.bits, _shape(shape))
    return _run("bits", key, _shape(shape), dt.name)


def uniform(key, shape=(), dtype=np.float32, minval=0.0, maxval=1.0):
    """Floats uniform in [minval, maxval) (float16, float32 or float64); minval/maxval broadcast to shape."""
    if _traced(key, shape, minval, maxval):
        return _sample.uniform(key, _shape(shape), dtype, minval, maxval)
    bounds = _param(minval, np.float64), _param(maxval, np.float64)
    return _run("uniform", key, _shape(shape), to_dtype(dtype).name, *bounds)


def normal(key, shape=(), dtype=np.float32):
    """Standard normal floats (float16, float32 or float64)."""
    if _traced(key, shape):
        return _sample.normal(key, _shape(shape), dtype)
    return _run("normal", key, _shape(shape), to_dtype(dtype).name)


def bernoulli(key, p=0.5, shape=None):
    """Booleans, True with probability `p` (a float or a float array; shape defaults to p's)."""
    if _traced(key, p, *(() if shape is None else _shape(shape))):
        return _sample.bernoulli(key, p, None if shape is None else _shape(shape))
    return _run("bernoulli", key, np.shape(p) if shape is None else _shape(shape), _param(p, np.float32))


def randint(key, shape, minval, maxval, dtype=np.int32):
    """Integers uniform in [minval, maxval) (bounds clipped to the dtype; maxval <= minval gives minval)."""
    if _traced(key, shape, minval, maxval):
        return _sample.randint(key, _shape(shape), minval, maxval, dtype)
    bounds = _param(minval, np.int64), _param(maxval, np.int64)
    return _run("randint", key, _shape(shape), *bounds, to_dtype(dtype).name)
