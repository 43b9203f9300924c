"""Counter-based random bits on traced arrays: the Threefry-2x32 hash keyed by a uint32 pair.

This is the generator `jax.random` uses by default, in its "partitionable" layout: element `i` (row-major
flat index) of an array of random bits is `threefry2x32(key, (i >> 32, i & 0xffffffff))`, its two output
words xor-ed (32 bits) or joined (64 bits). Each element depends only on the key and its own index, so
the counters are index arithmetic (`iota`) over any shape, symbolic dims included, the whole draw is one
elementwise kernel, and every device computes the same bits. A key is a (2,) uint32 array; `split` and
`fold_in` derive new keys by hashing counters, as JAX does, so equal keys give equal bits everywhere and
the streams match `jax.random.key_data` / `jax.random.bits` bit for bit.
"""
from __future__ import annotations

import numpy as np

from ..uop import dtypes, sym_prod
from . import prims
from .numpy_create import iota, zeros
from .numpy_math import add, bitwise_or, bitwise_xor, equal, left_shift, right_shift, where
from .numpy_shape import stack
from .prims import to_sint, to_tracer
from .tracer import Tracer

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))  # Threefry-2x32's rotation constants, alternating per 4 rounds
_PARITY = 0x1BD11BDA                             # Threefish's key-schedule parity constant
_UINT = {8: dtypes.uint8, 16: dtypes.uint16, 32: dtypes.uint32, 64: dtypes.uint64}


def _u32(x) -> Tracer:
    return prims.cast(to_tracer(x), dtypes.uint32)


def _rotate_left(x: Tracer, r: int) -> Tracer:
    return bitwise_or(left_shift(x, r), right_shift(x, 32 - r))


def threefry2x32(k1: Tracer, k2: Tracer, x1: Tracer, x2: Tracer) -> tuple[Tracer, Tracer]:
    """The Threefry-2x32 block (20 rounds) of the counter pair (x1, x2) under the key (k1, k2), all uint32."""
    ks = (k1, k2, bitwise_xor(bitwise_xor(k1, k2), np.uint32(_PARITY)))
    x1, x2 = add(x1, ks[0]), add(x2, ks[1])
    for block in range(5):
        for r in _ROTATIONS[block % 2]:
            x1 = add(x1, x2)
            x2 = bitwise_xor(x1, _rotate_left(x2, r))
        x1 = add(x1, ks[(block + 1) % 3])
        x2 = add(x2, add(ks[(block + 2) % 3], np.uint32(block + 1)))  # a scalar: the key word plus the block
    return x1, x2


def counters(shape: tuple) -> tuple[Tracer, Tracer]:
    """(high, low) uint32 words of each element's row-major flat index, over a shape of ints and vars."""
    shape = tuple(to_sint(d, "a dimension") for d in shape)
    if not shape:
        return zeros((), dtypes.uint32), zeros((), dtypes.uint32)
    flat, stride = None, 1
    for axis in reversed(range(len(shape))):
        term = iota(shape, axis)
        if not (isinstance(stride, int) and stride == 1):
            term = term * to_tracer(stride)
        flat = term if flat is None else add(flat, term)
        stride = sym_prod([stride, shape[axis]])
    size = sym_prod(shape)
    high = right_shift(flat, 32) if (size if isinstance(size, int) else size.vmax) > 2 ** 32 else zeros(shape, "int64")
    return _u32(high), _u32(flat)


def check_key(key) -> Tracer:
    key = to_tracer(key)
    if key.dtype != dtypes.uint32 or key.uop.shape != (2,):
        raise TypeError(f"a pj.random key is a (2,) uint32 array (pj.random.key(seed), pj.random.split(key)), "
                        f"not {key.shape_str} {key.dtype.name}")
    return key


def _words(key: Tracer) -> tuple[Tracer, Tracer]:
    key = check_key(key)
    return key[0], key[1]


def random_bits(key, bit_width: int, shape: tuple) -> Tracer:
    """Uniform random bits of `bit_width` (8, 16, 32, 64) in an unsigned array of `shape` (jax.random.bits)."""
    if bit_width not in _UINT:
        raise ValueError(f"random bits come in 8, 16, 32 or 64 bits, not {bit_width}")
    b1, b2 = threefry2x32(*_words(key), *counters(shape))
    if bit_width == 64:
        return bitwise_or(left_shift(prims.cast(b1, dtypes.uint64), 32), prims.cast(b2, dtypes.uint64))
    return prims.cast(bitwise_xor(b1, b2), _UINT[bit_width])


def seed_key(seed) -> Tracer:
    """The key of an integer seed: its 64 bits as (high, low) words (32-bit and narrower seeds: high word 0)."""
    seed = to_tracer(seed)
    if not seed.dtype.is_int or seed.ndim:
        raise TypeError(f"a seed is an integer scalar, not {seed.shape_str} {seed.dtype.name}")
    high = _u32(right_shift(seed, 32)) if seed.dtype.bits == 64 else zeros((), dtypes.uint32)
    return stack([high, _u32(seed)])


def _key_pairs(key: Tracer, high: Tracer, low: Tracer) -> Tracer:
    """Keys of the counters' shape + (2,): both words of threefry2x32(key, (high, low)), word j at [..., j].
    Each element hashes its own counters and keeps one word: the hash runs twice per key, in one kernel (a
    stack of the two words reads the shared hash through two index maps, which costs a kernel per round)."""
    shape = tuple(high.uop.shape)
    pairs = shape + (2,)
    high, low = (prims.broadcast_to(prims.reshape(c, shape + (1,)), pairs) for c in (high, low))
    b1, b2 = threefry2x32(*_words(key), high, low)
    return where(equal(iota(pairs, len(shape)), 0), b1, b2)


def split(key, num=2) -> Tracer:
    """`num` new keys (an int, a var or a shape: keys of shape (*num, 2)) hashed from `key`'s counters."""
    shape = tuple(to_sint(d, "a dimension") for d in (num if isinstance(num, (tuple, list)) else (num,)))
    return _key_pairs(key, *counters(shape))


def fold_in(key, data) -> Tracer:
    """A new key from `key` and an integer (a var such as a step counter, or a traced scalar): JAX's fold_in."""
    data = to_tracer(data)
    if not data.dtype.is_int or data.ndim:
        raise TypeError(f"fold_in data is an integer scalar, not {data.shape_str} {data.dtype.name}")
    return _key_pairs(key, zeros((), dtypes.uint32), _u32(data))
