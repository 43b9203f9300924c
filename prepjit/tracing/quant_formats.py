"""llama.cpp's block formats (ggml-common.h's block_q8_0, block_q4_K, ...): each kind's block layout and its
dequantization, written once as array operations that NumPy arrays and traced arrays share (reshape, slices,
shifts and masks, astype, and a bitcast view for the float16 scales), so that eagerly the result is
`gguf.quants.dequantize`'s bit for bit (the same float32 operations in the same order) and traced it is an
ordinary expression that fusion inlines into whatever reads it. Quantization (q8_0, q4_0, q4_1) is NumPy: it runs
at load time, as llama.cpp's reference quantizers (quantize_row_*_ref) do.

Every dequantizer takes the blocks as (..., blocks, bytes per block) uint8 and returns (..., blocks, weights per
block) float32; `xp` is the namespace of its arrays (numpy, or prepjit.numpy inside a trace).
"""
from __future__ import annotations

import functools
from typing import Callable

import attrs
import numpy as np

from ..uop import Ops, UOp
from .tracer import Tracer


@attrs.frozen
class Format:
    """One block format: `block` weights stored in `nbytes` bytes."""

    name: str
    block: int
    nbytes: int
    dequantize: Callable            # (blocks, xp) -> weights, as the module docstring says
    quantize: Callable | None = None   # NumPy (n, block) float32 -> (n, nbytes) uint8, or None


def _half(b, xp):
    """Little-endian float16 bytes (..., 2) as float32 (...): a bitcast view of the two bytes."""
    bits = b[..., 0].astype(xp.uint16) | (b[..., 1].astype(xp.uint16) << 8)
    return bits.view(xp.float16).astype(xp.float32)


def _fields(b, xp, *sizes):
    """The consecutive byte fields of each block, of `sizes` bytes, a scale (2 bytes) as float32 (..., 1)."""
    out, at = [], 0
    for size in sizes:
        field = b[..., at:at + size]
        out.append(_half(field, xp)[..., None] if size == 2 else field)
        at += size
    return out


def _shifted(b, xp, bits: int):
    """Each byte's `8 // bits` fields of `bits` bits, lowest first, as a new axis before the last:
    (..., n) -> (..., 8 // bits, n)."""
    shifts = (xp.arange(8 // bits, dtype=xp.uint8) * bits)[:, None]
    return (b[..., None, :] >> shifts) & ((1 << bits) - 1)


def _nibbles(qs, xp):
    """(..., 16) bytes -> their 32 4-bit values: the low nibbles, then the high ones."""
    return _shifted(qs, xp, 4).reshape(*qs.shape[:-1], 2 * qs.shape[-1])


def _high_bits(qh, xp):
    """(..., 4) bytes -> the 32 bits of their little-endian uint32, lowest first."""
    return _shifted(qh, xp, 1).swapaxes(-1, -2).reshape(*qh.shape[:-1], 32)


def _q8_0(b, xp):
    d, qs = _fields(b, xp, 2, 32)
    return qs.view(xp.int8).astype(xp.float32) * d


def _q4_0(b, xp):
    d, qs = _fields(b, xp, 2, 16)
    return d * (_nibbles(qs, xp).astype(xp.int8) - 8).astype(xp.float32)


def _q4_1(b, xp):
    d, m, qs = _fields(b, xp, 2, 2, 16)
    return d * _nibbles(qs, xp).astype(xp.float32) + m


def _q5_0(b, xp):
    d, qh, qs = _fields(b, xp, 2, 4, 16)
    q = (_nibbles(qs, xp) | (_high_bits(qh, xp) << 4)).astype(xp.int8) - 16
    return d * q.astype(xp.float32)


def _q5_1(b, xp):
    d, m, qh, qs = _fields(b, xp, 2, 2, 4, 16)
    return d * (_nibbles(qs, xp) | (_high_bits(qh, xp) << 4)).astype(xp.float32) + m


def _k_scales(scales, xp):
    """Q4_K's 12 bytes of eight 6-bit scales and eight 6-bit mins -> (scales, mins), each (..., 8) uint8:
    bytes 0-3 hold scales 0-3 (low 6 bits) and the top 2 bits of scales 4-7, bytes 4-7 the same for the mins,
    bytes 8-11 the low 4 bits of scales 4-7 (low nibble) and mins 4-7 (high nibble)."""
    d, m, md = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = xp.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = xp.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def _q4_k(b, xp):
    """256 weights: 8 sub-blocks of 32, each with a 6-bit scale and min (times the block's d and dmin); the
    4-bit values of sub-blocks 2i and 2i+1 share bytes 32i..32i+31 (low and high nibbles)."""
    d, dmin, scales, qs = _fields(b, xp, 2, 2, 12, 128)
    sc, mn = _k_scales(scales, xp)
    lead = b.shape[:-1]
    scale = (d * sc.astype(xp.float32))[..., None]
    low = (dmin * mn.astype(xp.float32))[..., None]
    q = _shifted(qs.reshape(*lead, 4, 32), xp, 4).reshape(*lead, 8, 32).astype(xp.float32)
    return (scale * q - low).reshape(*lead, 256)


def _q6_k(b, xp):
    """256 weights: 16 sub-blocks of 16 with an int8 scale each (times d); a weight's low 4 bits are in ql (the
    halves of 128 weights share 64 bytes as low and high nibbles), its high 2 bits in qh (4 per byte)."""
    ql, qh, scales, d = _fields(b, xp, 128, 64, 16, 2)
    lead = b.shape[:-1]
    low = _shifted(ql.reshape(*lead, 2, 64), xp, 4).reshape(*lead, 8, 32)
    high = _shifted(qh.reshape(*lead, 2, 32), xp, 2).reshape(*lead, 8, 32)
    q = ((low | (high << 4)).astype(xp.int8) - 32).reshape(*lead, 16, 16).astype(xp.float32)
    scale = (d * scales.view(xp.int8).astype(xp.float32))[..., None]
    return (scale * q).reshape(*lead, 256)


# ---------- quantization (NumPy, at load time) ----------

def _round_away(x: np.ndarray) -> np.ndarray:
    """C's roundf: to nearest, halves away from zero (exact: the fraction x - trunc(x) is exact in float)."""
    t = np.trunc(x)
    return np.where(np.abs(x - t) >= 0.5, t + np.sign(x), t)


def _scale_bytes(s: np.ndarray) -> np.ndarray:
    return s.astype(np.float16).view(np.uint8)


def _reciprocal(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(n, 32) values in [0, 16) -> (n, 16) bytes: value j in the low nibble of byte j, j + 16 in its high one."""
    return q[:, :16] | (q[:, 16:] << 4)


def _quantize_q8_0(x: np.ndarray) -> np.ndarray:
    d = np.abs(x).max(axis=-1, keepdims=True) / np.float32(127)
    q = _round_away(x * _reciprocal(d)).astype(np.int8)
    return np.concatenate([_scale_bytes(d), q.view(np.uint8)], axis=-1)


def _quantize_q4_0(x: np.ndarray) -> np.ndarray:
    signed_max = np.take_along_axis(x, np.abs(x).argmax(axis=-1, keepdims=True), axis=-1)
    d = signed_max / np.float32(-8)
    q = np.minimum(np.trunc(x * _reciprocal(d) + np.float32(8.5)), 15).astype(np.uint8)
    return np.concatenate([_scale_bytes(d), _pack_nibbles(q)], axis=-1)


def _quantize_q4_1(x: np.ndarray) -> np.ndarray:
    lo, hi = x.min(axis=-1, keepdims=True), x.max(axis=-1, keepdims=True)
    d = (hi - lo) / np.float32(15)
    q = np.minimum(np.trunc((x - lo) * _reciprocal(d) + np.float32(0.5)), 15).astype(np.uint8)
    return np.concatenate([_scale_bytes(d), _scale_bytes(lo), _pack_nibbles(q)], axis=-1)


FORMATS = {f.name: f for f in (
    Format("q8_0", 32, 2 + 32, _q8_0, _quantize_q8_0),
    Format("q4_0", 32, 2 + 16, _q4_0, _quantize_q4_0),
    Format("q4_1", 32, 2 + 2 + 16, _q4_1, _quantize_q4_1),
    Format("q5_0", 32, 2 + 4 + 16, _q5_0),
    Format("q5_1", 32, 2 + 2 + 4 + 16, _q5_1),
    Format("q4_k", 256, 2 + 2 + 12 + 128, _q4_k),
    Format("q6_k", 256, 128 + 64 + 16 + 2, _q6_k),
)}


def traced_dequantize(f: Format, blocks: Tracer, xp) -> Tracer:
    """`f.dequantize(blocks, xp)` of traced blocks: with static dims, the expression is traced once per format,
    dtype and shape over a placeholder input and put over `blocks` by substitution, which builds the very nodes
    tracing it again would (UOps are hash-consed, and the expression reads only its input's dtype and shape: it
    captures nothing and checks nothing per call). A model's weights of one shape (SmolLM2's 30 layers) then cost
    one trace of the ~60 ops of their dequantization, not one each."""
    shape = blocks.uop.shape
    if blocks.weak or blocks.uop.op is Ops.CONST or not all(type(d) is int for d in shape):
        return f.dequantize(blocks, xp)
    placeholder, out = _template(f, xp, blocks.dtype, shape)
    return Tracer(out.uop.substitute({placeholder: blocks.uop}), weak=out.weak)


@functools.lru_cache(maxsize=64)
def _template(f: Format, xp, dtype, shape: tuple) -> tuple[UOp, Tracer]:
    """(a placeholder input of `dtype` and `shape`, `f.dequantize`'s traced expression of it)."""
    placeholder = UOp(Ops.INPUT, dtype, (), (("dequantize", f.name), shape))
    return placeholder, f.dequantize(Tracer(placeholder), xp)
