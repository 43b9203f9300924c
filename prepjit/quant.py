"""`pj.quant`: weights in llama.cpp's block formats (GGUF's Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K).

`dequantize(blocks, kind)` reads the uint8 blocks a GGUF file stores for a tensor, (rows, bytes per row) as
gguf.GGUFReader returns them, and gives the float32 (rows, weights per row) weights. Outside a prepared function it
takes NumPy and returns NumPy, equal to `gguf.quants.dequantize` bit for bit. Inside one (the blocks an argument
or a capture) it is an ordinary traced expression, bit unpacking and the float16 scales as a bitcast view, fused
into whatever reads it: `x @ pj.quant.dequantize(b, "q4_1").T` reads the blocks, never a float32 copy.
`quantize(w, kind)` stores float weights as q8_0, q4_0 or q4_1 blocks (NumPy, equal to gguf.quants.quantize).
See docs/quant.md.
"""
from __future__ import annotations

import numpy as np

from . import numpy as _pnp
from .errors import TraceError
from .tracing import core as _tracing
from .tracing.quant_formats import FORMATS, Format, traced_dequantize
from .tracing.tracer import Tracer

__all__ = ["dequantize", "quantize", "KINDS", "QUANTIZABLE", "block_size", "block_bytes"]

KINDS = tuple(FORMATS)
QUANTIZABLE = tuple(name for name, f in FORMATS.items() if f.quantize is not None)


def _format(kind, among=KINDS) -> Format:
    """The format named `kind` (case-insensitive, or a gguf.GGMLQuantizationType), one of `among`."""
    name = str(getattr(kind, "name", kind)).lower()
    if name not in among:
        raise ValueError(f"unknown quantization kind {kind!r}: expected one of {', '.join(among)}")
    return FORMATS[name]


def block_size(kind) -> int:
    """Weights per block of `kind` (32, or 256 for the k-quants)."""
    return _format(kind).block


def block_bytes(kind) -> int:
    """Bytes per block of `kind`."""
    return _format(kind).nbytes


def _traced(blocks) -> bool:
    return isinstance(blocks, Tracer) or getattr(_tracing._active, "var_names", None) is not None


def dequantize(blocks, kind):
    """float32 weights (..., weights per row) of uint8 `blocks` (..., bytes per row) of the block format `kind`."""
    f = _format(kind)
    traced = _traced(blocks)
    xp = _pnp if traced else np
    blocks = xp.asarray(blocks)
    if blocks.dtype != np.uint8 or blocks.ndim < 1:
        raise ValueError(f"{f.name} blocks are a uint8 array of rows of bytes, not {blocks.dtype} of shape "
                         f"{tuple(blocks.shape)}")
    row = blocks.shape[-1]
    if not isinstance(row, int) or row % f.nbytes:
        raise ValueError(f"{f.name} blocks: a row of {row} bytes is not whole blocks of {f.nbytes} bytes "
                         f"({f.block} weights each)")
    lead, n = tuple(blocks.shape[:-1]), row // f.nbytes
    blocks = blocks.reshape(*lead, n, f.nbytes)
    weights = traced_dequantize(f, blocks, xp) if traced else f.dequantize(blocks, xp)
    return weights.reshape(*lead, n * f.block)


def quantize(w, kind) -> np.ndarray:
    """uint8 blocks (..., bytes per row) of float weights `w` (..., weights per row) stored as `kind` (q8_0, q4_0
    or q4_1), as llama.cpp's reference quantizers round; NumPy only (weights are quantized when loaded)."""
    f = _format(kind, QUANTIZABLE)
    if _traced(w):
        raise TraceError("pj.quant.quantize runs on NumPy arrays, outside prepared functions (quantize weights "
                         "when loading them, then pass the blocks in)")
    w = np.asarray(w)
    if w.ndim < 1 or w.shape[-1] % f.block or not (w.dtype.kind == "f" or w.dtype.name == "bfloat16"):
        raise ValueError(f"{f.name} quantizes float rows of whole blocks of {f.block} weights, not {w.dtype} of "
                         f"shape {w.shape}")
    x = w.astype(np.float32).reshape(-1, f.block)
    return f.quantize(x).reshape(*w.shape[:-1], w.shape[-1] // f.block * f.nbytes)
