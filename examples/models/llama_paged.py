"""The Llama passes of llama.py over a paged KV cache, for serving many sequences at once (vLLM's PagedAttention):
the cache is a pool of fixed-size blocks, (L, num_blocks, KV heads, block_size, head dim), and each sequence owns
the blocks its block table lists; position p of a sequence lives in block `table[p // block_size]` at row
`p % block_size`.

- `decode_batch`: one token for each of B sequences, each at its own position: a var batch B and a var table width
  NB, so one plan serves every batch composition. Attention reads each sequence's blocks through its table (a
  gather fused into the scores and context kernels, no padded copy of the cache), masked at positions >= pos[b],
  plus the token's own key/value.
- `prefill_chunk`: C tokens (var) of one sequence starting at position `start` (var), attending to its cached
  blocks (positions < start) and causally within the chunk, so a long prompt is prefilled a chunk per step.

Both return the new keys/values for the host to write into the pool (the pool is an input: the plan reads it in
place and never writes it). Block tables are data: a table entry outside the pool raises pj.IndexBoundError (the
gather's per-call check) and the bounds proof covers every read.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from .common import cast
from .llama import Config, _qkv, embedding, linear, logits, rms_norm, rope, swiglu

MASKED = -1e30  # the score of a position a sequence does not have (exp gives 0)


def _cached_scores(xp, q, keys, visible, hd):
    """Scores of queries q (..., KV, group, Q, hd) against gathered blocks keys (..., NB, KV, block, hd), masked
    where `visible` (..., Q or 1, NB, block) is False -> (..., KV, group, Q, NB, block) in float32."""
    s = xp.einsum("...kgqd,...nksd->...kgqns", q, keys) * (1 / math.sqrt(hd))
    return xp.where(visible[..., None, None, :, :, :], cast(s, np.float32), MASKED)


def _attend(xp, cached, own, values, own_values, dtype):
    """Softmax over every key, the cached ones' scores (..., KV, group, Q, NB, block) and the new ones' (..., KV,
    group, Q, J), in float32 rounded to dtype (llama.softmax's rounding points, one max and one sum over both
    parts: no concatenated copy), then the context: against the gathered values (..., NB, KV, block, hd) and the
    new ones (..., KV, J, hd)."""
    top = xp.maximum(xp.max(cached, axis=(-2, -1)), xp.max(own, axis=-1))[..., None]
    e_cached, e_own = xp.exp(cached - top[..., None]), xp.exp(own - top)
    total = (xp.sum(e_cached, axis=(-2, -1)) + xp.sum(e_own, axis=-1))[..., None]
    p_cached, p_own = cast(e_cached / total[..., None], dtype), cast(e_own / total, dtype)
    return (xp.einsum("...kgqns,...nksd->...kgqd", p_cached, values)
            + xp.einsum("...kgqj,...kjd->...kgqd", p_own, own_values))


def decode_batch(xp, cfg: Config, params, ids, pos, block_table, k_pool, v_pool, cos, sin, dtype=np.float32):
    """ids (B,) at positions pos (B,), sequence b's positions < pos[b] cached in blocks block_table[b] (B, NB) of
    the pools (L, blocks, KV, block, hd) -> (logits (B, vocab), the tokens' keys and values (L, B, KV, hd)) in
    `dtype`, for the caller to store at (block_table[b, pos[b] // block], pos[b] % block)."""
    heads, kv_heads, hd, eps = cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.eps
    group = heads // kv_heads
    b, nb = block_table.shape
    block = k_pool.shape[3]
    cos_p, sin_p = cos[pos][:, None], sin[pos][:, None]  # (B, 1, hd)
    slots = xp.arange(nb)[:, None] * block + xp.arange(block)[None, :]  # (NB, block) positions
    visible = (slots[None] < pos[:, None, None])[:, None]  # (B, 1, NB, block)
    h = embedding(params["embed"], ids, dtype)  # (B, dim)
    keys, values = [], []
    for layer, bp in enumerate(params["blocks"]):
        x = rms_norm(xp, h, bp["attn_norm"], eps)
        q, k, v = _qkv(xp, bp, x, cfg, dtype)
        q = rope(xp, q.reshape(b, heads, hd), cos_p, sin_p)
        k = rope(xp, k.reshape(b, kv_heads, hd), cos_p, sin_p)
        v = v.reshape(b, kv_heads, hd)
        keys.append(k)
        values.append(v)
        q = q.reshape(b, kv_heads, group, 1, hd)
        k_blocks, v_blocks = k_pool[layer][block_table], v_pool[layer][block_table]  # (B, NB, KV, block, hd)
        own = cast(xp.einsum("bkgqd,bkd->bkgq", q, k) * (1 / math.sqrt(hd)), np.float32)[..., None]
        ctx = _attend(xp, _cached_scores(xp, q, k_blocks, visible, hd), own, v_blocks, v[:, :, None], dtype)
        ctx = ctx.reshape(b, heads * hd)
        h = h + linear(xp, ctx, bp["wo"], dtype)
        h = h + swiglu(xp, bp, rms_norm(xp, h, bp["ffn_norm"], eps), cfg.ff)
    out = rms_norm(xp, h, params["norm"], eps)
    return _logits(xp, params, out, dtype), xp.stack(keys), xp.stack(values)


def prefill_chunk(xp, cfg: Config, params, ids, start, block_table, k_pool, v_pool, cos, sin, dtype=np.float32):
    """ids (C,) at positions start .. start + C - 1 of one sequence whose positions < start are cached in blocks
    block_table (NB,) -> (logits (vocab,) of the chunk's last token, its keys and values (L, KV, C, hd))."""
    heads, kv_heads, hd, eps = cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.eps
    group = heads // kv_heads
    c = ids.shape[0]
    nb, block = block_table.shape[0], k_pool.shape[3]
    steps = xp.arange(c)
    cos_c, sin_c = cos[start + steps], sin[start + steps]  # a gather: start + C <= context is checked per call
    causal = steps[:, None] >= steps[None, :]  # (C, C)
    slots = xp.arange(nb)[:, None] * block + xp.arange(block)[None, :]
    visible = (slots < start)[None]  # (1, NB, block): the same for every query of the chunk
    h = embedding(params["embed"], ids, dtype)
    keys, values = [], []
    for layer, bp in enumerate(params["blocks"]):
        x = rms_norm(xp, h, bp["attn_norm"], eps)
        q, k, v = _qkv(xp, bp, x, cfg, dtype)
        q = rope(xp, xp.swapaxes(q.reshape(c, heads, hd), 0, 1), cos_c, sin_c)  # (H, C, hd)
        k = rope(xp, xp.swapaxes(k.reshape(c, kv_heads, hd), 0, 1), cos_c, sin_c)  # (KV, C, hd)
        v = xp.swapaxes(v.reshape(c, kv_heads, hd), 0, 1)
        keys.append(k)
        values.append(v)
        q = q.reshape(kv_heads, group, c, hd)
        k_blocks, v_blocks = k_pool[layer][block_table], v_pool[layer][block_table]  # (NB, KV, block, hd)
        own = cast(q @ xp.swapaxes(k, 1, 2)[:, None] * (1 / math.sqrt(hd)), np.float32)  # (KV, group, C, C)
        own = xp.where(causal, own, MASKED)
        ctx = _attend(xp, _cached_scores(xp, q, k_blocks, visible, hd), own, v_blocks, v, dtype).reshape(heads, c, hd)
        h = h + linear(xp, xp.swapaxes(ctx, 0, 1).reshape(c, heads * hd), bp["wo"], dtype)
        h = h + swiglu(xp, bp, rms_norm(xp, h, bp["ffn_norm"], eps), cfg.ff)
    last = rms_norm(xp, h[c - 1], params["norm"], eps)
    return logits(xp, params, last, dtype), xp.stack(keys), xp.stack(values)


def _logits(xp, params, x, dtype):
    """The output head applied to rows x (B, dim) -> (B, vocab)."""
    head = params["head"]
    return linear(xp, x, head, dtype) if isinstance(head, dict) else x @ cast(head, dtype).T


def prepared(cfg: Config, *, context: int, block_size: int, max_batch: int, max_chunk: int,
             device: str | None = None, dtype=np.float32):
    """(decode_batch, prefill_chunk) prepared with prepjit: vars B (1, max_batch), NB (1, context // block_size)
    for the decode step; C (1, max_chunk), start and NB for a prefill chunk. One plan each serves every batch
    composition and every chunk."""
    import prepjit as pj
    import prepjit.numpy as pnp
    kwargs = {} if device is None else {"device": device}
    tables = -(-context // block_size)
    dec = functools.partial(decode_batch, pnp, cfg, dtype=dtype)
    dec.__name__ = "llama_decode_batch"
    pre = functools.partial(prefill_chunk, pnp, cfg, dtype=dtype)
    pre.__name__ = "llama_prefill_chunk"
    return (pj.prepare(dec, vars={"B": (1, max_batch), "NB": (1, tables)},
                       shapes={"ids": ("B",), "pos": ("B",), "block_table": ("B", "NB")}, **kwargs),
            pj.prepare(pre, vars={"C": (1, max_chunk), "start": (0, context - 1), "NB": (1, tables)},
                       shapes={"ids": ("C",), "block_table": ("NB",)}, **kwargs))
