"""Matrix-vector products over weights in llama.cpp's block formats (pj.quant), a decode step's contractions: one
row of activations against a weight stored as q8_0, q4_1 or q6_k blocks, dequantized inside the kernel that reads
them. The peers compute the same product over the dequantized float32 weight: prepjit ("prepjit-args": its float32
matvec) and NumPy. Decode reads each weight byte once, so a bandwidth-bound matvec over blocks should take about
the float32 time x the blocks' bytes per weight / 4 (q8_0 34/128, q4_1 20/128, q6_k 210/1024); the goals ask for
less than the float32 matvec's time at least. The rates count the bytes of the blocks read.

The batched cases take x of B rows, B a var (1..64 for a decode batch, 1..512 for a prefill), as a serving
engine's decode step and a prompt's prefill do: `batched_*` times B = 16 against the same prepared function at
B = 1 (peer "prepjit-args"), whose goal is issue 24's (16 sequences at 3x the tokens/s of one: 16/3 the time at
most); `prefill_*` times 128 rows against NumPy's float32 matmul of the dequantized weight (goal: its time). Both
read the blocks as they are: their plans hold no float32 copy of the weight (the record's plan memory)."""
from __future__ import annotations

import numpy as np

from .case import Case

KINDS = ("q8_0", "q4_1", "q6_k")


def _blocks(rng, kind, n, k):
    """`kind` blocks of a random (n, k) weight: quantized where pj.quant can, else random bytes whose float16
    scales are kept small and finite (the top bits of each scale's high byte cleared)."""
    import prepjit as pj
    if kind in pj.quant.QUANTIZABLE:
        return pj.quant.quantize(rng.standard_normal((n, k)).astype(np.float32), kind)
    size = pj.quant.block_bytes(kind)
    blocks = rng.integers(0, 256, (n, k // pj.quant.block_size(kind), size), dtype=np.uint8)
    blocks[..., size - 1] &= 0x17  # q6_k's d is its last two bytes: an exponent of at most 2^-8
    return blocks.reshape(n, -1)


def _matvec(kind):
    def matvec(xp, x, blocks):
        import prepjit as pj
        return x @ pj.quant.dequantize(blocks, kind).T
    matvec.__name__ = f"matvec_{kind}"
    return matvec


def _float32_peers(kind):
    """The peers' calls: the same product over the float32 weight dequantized ahead, by NumPy and by prepjit."""
    import prepjit as pj

    def dequantized(call):
        def peer(arrays):
            w = pj.quant.dequantize(arrays[1], kind)
            return lambda x, blocks: call(x, w)
        return peer
    return {"numpy": dequantized(lambda x, w: x @ w.T),
            "prepjit-args": lambda arrays: dequantized(pj.prepare(lambda x, w: x @ w.T))(arrays)}


def _inputs(kind, shape, smoke_shape):
    def make(rng, smoke):
        n, k = smoke_shape if smoke else shape
        return [rng.standard_normal((1, k)).astype(np.float32), _blocks(rng, kind, n, k)]
    return make


def _bytes(arrays):
    return arrays[1].nbytes, "GB/s"


def _case(n, k, kind):
    # q6_k's blocks are 256 weights: its reduction lengths are multiples of 256 (576 is not)
    k = k if kind != "q6_k" or k % 256 == 0 else k // 256 * 256
    return Case(f"matvec_{kind}_{n}x{k}", _matvec(kind), _inputs(kind, (n, k), (64, 256 if kind == "q6_k" else 64)),
                work=_bytes, peers=(), peer_fns=_float32_peers(kind), goal=("prepjit-args", 1.0), rtol=1e-4,
                atol=1e-3)


def _rows_inputs(kind, shape, rows):
    def make(rng, smoke):
        n, k = (64, 64) if smoke else shape
        return [rng.standard_normal((rows, k)).astype(np.float32), _blocks(rng, kind, n, k)]
    return make


def _one_row_peer(kind, most):
    """The same prepared function (B a var) on the first row alone."""
    def peer(arrays):
        import prepjit as pj
        f = pj.prepare(lambda x, b: x @ pj.quant.dequantize(b, kind).T, vars={"B": (1, most)},
                       shapes={"x": ("B", arrays[0].shape[1])})
        return lambda x, blocks: f(x[:1], blocks)
    return peer


def _batched_case(n, k, kind, rows=16, most=64):
    return Case(f"batched_{kind}_{rows}_vs_1_{n}x{k}", _matvec(kind), _rows_inputs(kind, (n, k), rows),
                prepare_kwargs={"vars": {"B": (1, most)}, "shapes": {"x": ("B", None)}}, work=_bytes, peers=(),
                peer_fns={"prepjit-args": _one_row_peer(kind, most)}, goal=("prepjit-args", rows / 3),
                rtol=1e-4, atol=1e-3)


def _prefill_case(n, k, kind, rows=128, most=512):
    return Case(f"prefill_{kind}_{rows}_{n}x{k}", _matvec(kind), _rows_inputs(kind, (n, k), rows),
                prepare_kwargs={"vars": {"B": (1, most)}, "shapes": {"x": ("B", None)}}, work=_bytes, peers=(),
                peer_fns={"numpy": _float32_peers(kind)["numpy"]}, goal=("numpy", 1.0), rtol=1e-4, atol=1e-3)


SHAPES = ((1536, 576), (576, 1536), (49152, 576))
QUANT_CASES = tuple(_case(n, k, kind) for n, k in SHAPES for kind in KINDS) + \
    tuple(make(n, k, kind) for make in (_batched_case, _prefill_case) for n, k in SHAPES for kind in ("q8_0", "q4_1"))
