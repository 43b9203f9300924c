"""The Llama passes of llama.py over a paged KV cache, for serving many sequences at once (vLLM's PagedAttention):
the cache is a pool of fixed-size blocks, (L, num_blocks, KV heads, block_size, head dim), and each sequence owns
the blocks its block table lists; position p of a sequence lives in block `table[p // block_size]` at row
`p % block_size`.

- `decode_batch`: one token for each of B sequences, each at its own position: a var batch B and a var table width
  NB, so one plan serves every batch composition of its range (`prepared`: on a GPU with tensor cores two ranges,
  two plans, `BatchRanges`). Attention reads each sequence's blocks through its table (a
  gather fused into the scores and context kernels, no padded copy of the cache), masked at positions >= pos[b]
  (each adding its sums' identities, whatever its slot holds: `_attend`), plus the token's own key/value.
- `prefill_batch`: prompt chunks of several sequences in one call (T tokens in all, var), each token attending to
  its sequence's cached blocks and causally within its chunk, so waiting prompts are prefilled together, a long
  one a chunk per step.

Both return the new keys and values for the host to write into the pool (the pool is an input: the plan reads it
in place and never writes it), each stacked over the layers, (L, B, KV, hd): one kernel for the keys and one for the
values, not one a layer (a stack's pieces are specialised to their layer: codegen/stack_pieces.py). Block tables
are data: a table entry outside the pool raises pj.IndexBoundError (the gather's per-call check) and the bounds proof
covers every read.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from .common import cast
from .llama import Config, _qkv, embedding, linear, rms_norm, rope, swiglu

def _cached_scores(xp, q, keys, visible, hd):
    """Scores of queries q (..., KV, group, Q, hd) against gathered blocks keys (..., NB, KV, block, hd), -inf
    where `visible` (..., 1, NB, block) is False -> (..., KV, group, Q, NB, block) in float32."""
    s = xp.einsum("...kgqd,...nksd->...kgqns", q, keys) * (1 / math.sqrt(hd))
    return xp.where(visible[..., None, None, :, :, :], cast(s, np.float32), -np.inf)


def _attend(xp, cached, own, values, own_values, visible, dtype, own_seen=None):
    """Softmax over every key, the cached ones' scores (..., KV, group, Q, NB, block) and the new ones' (..., KV,
    group, Q, J), in float32 rounded to dtype (llama.softmax's rounding points, one max and one sum over both
    parts: no concatenated copy), then the context: against the gathered values (..., NB, KV, block, hd) and the
    new ones (..., KV, J, hd).

    A cached position a row does not see (`visible` (..., 1, NB, block) False), and a new one (`own_seen`, (..., 1,
    1, 1, J), a prefill chunk's later tokens and the window's positions before its chunk), adds each sum's identity:
    its score is -inf (the max's), its exponential, probability and value 0 (the sum's and p @ V's), the same
    values as computing it (exp gives 0, and the own key keeps the max finite); so whatever a slot past a
    sequence's length or another chunk's row holds never reaches its result, and a GPU row kernel stops at a row's
    last visible block and its last token of the window (row_bounds.py)."""
    seen = visible[..., None, None, :, :, :]
    if own_seen is not None:
        own = xp.where(own_seen, own, -np.inf)
    top = xp.maximum(xp.max(cached, axis=(-2, -1)), xp.max(own, axis=-1))[..., None]
    e_cached, e_own = xp.where(seen, xp.exp(cached - top[..., None]), 0), _masked(xp, xp.exp(own - top), own_seen)
    total = (xp.sum(e_cached, axis=(-2, -1)) + xp.sum(e_own, axis=-1))[..., None]
    p_cached = xp.where(seen, cast(e_cached / total[..., None], dtype), 0)
    p_own = _masked(xp, cast(e_own / total, dtype), own_seen)
    values = xp.where(visible[..., 0, :, None, :, None], values, 0)   # (a stale slot's NaN times 0 is no 0)
    if own_seen is not None:
        own_values = xp.where(own_seen[..., 0, 0, :, None], own_values, 0)
    return (xp.einsum("...kgqns,...nksd->...kgqd", p_cached, values)
            + xp.einsum("...kgqj,...kjd->...kgqd", p_own, own_values))


def _masked(xp, x, seen):
    """x where `seen` (all of it where None), else 0."""
    return x if seen is None else xp.where(seen, x, 0)


def chunk_keys(xp, q, k, v, offset, window, hd):
    """A prefill chunk's own part of attention: each token t (q (T, KV, group, 1, hd)) against the keys k and values
    v (T, KV, hd) of the `window` rows back from its own, t - w (clipped at row 0) -> (scores (T, KV, group, 1, W)
    in float32, values (T, KV, W, hd), where they are its chunk's up to itself (T, 1, 1, 1, W): w < offset[t] + 1,
    a bound of the row's window that row_bounds.py reads)."""
    back = xp.arange(window)
    earlier = xp.maximum(xp.arange(q.shape[0])[:, None] - back[None, :], 0)  # (T, W): the chunk's earlier rows
    k_own = xp.take(k, earlier, axis=0, mode="clip")  # (T, W, KV, hd)
    v_own = xp.swapaxes(xp.take(v, earlier, axis=0, mode="clip"), 1, 2)  # (T, KV, W, hd)
    own = cast(xp.einsum("tkgqd,twkd->tkgqw", q, k_own) * (1 / math.sqrt(hd)), np.float32)
    return own, v_own, (back[None, :] < (offset + 1)[:, None])[:, None, None, None]


def decode_batch(xp, cfg: Config, params, ids, pos, block_table, k_pool, v_pool, cos, sin, dtype=np.float32,
                 rounded: bool = False):
    """ids (B,) at positions pos (B,), sequence b's positions < pos[b] cached in blocks block_table[b] (B, NB) of
    the pools (L, blocks, KV, block, hd) -> (logits (B, vocab), the tokens' keys and values (L, B, KV, hd)) in
    `dtype`, for the caller to store at (block_table[b, pos[b] // block], pos[b] % block).
    `rounded` (llama.linear's): a GPU may multiply a batch's quantized weights rounded to bfloat16 on tensor cores
    (`prepared`'s tensor_core_batches); False keeps them exact, so a sequence's logits are the same whatever batch
    it is in."""
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
        q, k, v = _qkv(xp, bp, x, cfg, dtype, rounded)
        q = rope(xp, q.reshape(b, heads, hd), cos_p, sin_p)
        k = rope(xp, k.reshape(b, kv_heads, hd), cos_p, sin_p)
        v = v.reshape(b, kv_heads, hd)
        keys.append(k)
        values.append(v)
        q = q.reshape(b, kv_heads, group, 1, hd)
        k_blocks, v_blocks = k_pool[layer][block_table], v_pool[layer][block_table]  # (B, NB, KV, block, hd)
        own = cast(xp.einsum("bkgqd,bkd->bkgq", q, k) * (1 / math.sqrt(hd)), np.float32)[..., None]
        ctx = _attend(xp, _cached_scores(xp, q, k_blocks, visible, hd), own, v_blocks, v[:, :, None], visible, dtype)
        ctx = ctx.reshape(b, heads * hd)
        h = h + linear(xp, ctx, bp["wo"], dtype, rounded)
        h = h + swiglu(xp, bp, rms_norm(xp, h, bp["ffn_norm"], eps), cfg.ff, rounded)
    out = rms_norm(xp, h, params["norm"], eps)
    return _logits(xp, params, out, dtype, rounded), xp.stack(keys), xp.stack(values)


def prefill_batch(xp, cfg: Config, params, ids, pos, offset, block_table, last, window, k_pool, v_pool, cos, sin,
                  dtype=np.float32):
    """Prompt chunks of several sequences side by side (vLLM's var-length prefill): ids (T,), each chunk's tokens
    consecutive and in order, token t at position pos[t], the offset[t]-th of its chunk, its sequence's positions
    < pos[t] - offset[t] cached in blocks block_table[t] (T, NB); `window` (var) is at least the longest chunk
    -> (logits (S, vocab) of the tokens `last` (S,), the tokens' keys and values (L, T, KV, hd)).

    A token attends to its cached blocks (as in decode_batch) and to the tokens of its chunk up to itself, read
    back from its own row (t - w for w < window, masked where w > offset[t]): a sequence's sums are the same
    whatever else is in the batch (other chunks and a wider table or window only add exact zeros)."""
    heads, kv_heads, hd, eps = cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.eps
    group = heads // kv_heads
    t, nb = block_table.shape
    block = k_pool.shape[3]
    cos_p, sin_p = cos[pos][:, None], sin[pos][:, None]  # (T, 1, hd)
    slots = xp.arange(nb)[:, None] * block + xp.arange(block)[None, :]  # (NB, block) positions
    visible = (slots[None] < (pos - offset)[:, None, None])[:, None]  # (T, 1, NB, block)
    h = embedding(params["embed"], ids, dtype)  # (T, dim)
    keys, values = [], []
    for layer, bp in enumerate(params["blocks"]):
        x = rms_norm(xp, h, bp["attn_norm"], eps)
        q, k, v = _qkv(xp, bp, x, cfg, dtype)
        q = rope(xp, q.reshape(t, heads, hd), cos_p, sin_p)
        k = rope(xp, k.reshape(t, kv_heads, hd), cos_p, sin_p)
        v = v.reshape(t, kv_heads, hd)
        keys.append(k)
        values.append(v)
        q = q.reshape(t, kv_heads, group, 1, hd)
        k_blocks, v_blocks = k_pool[layer][block_table], v_pool[layer][block_table]  # (T, NB, KV, block, hd)
        own, v_own, in_chunk = chunk_keys(xp, q, k, v, offset, window, hd)
        ctx = _attend(xp, _cached_scores(xp, q, k_blocks, visible, hd), own, v_blocks, v_own, visible, dtype, in_chunk)
        h = h + linear(xp, ctx.reshape(t, heads * hd), bp["wo"], dtype)
        h = h + swiglu(xp, bp, rms_norm(xp, h, bp["ffn_norm"], eps), cfg.ff)
    out = rms_norm(xp, h[last], params["norm"], eps)
    return _logits(xp, params, out, dtype), xp.stack(keys), xp.stack(values)


def _logits(xp, params, x, dtype, rounded: bool = True):
    """The output head applied to rows x (B, dim) -> (B, vocab) (`rounded`: llama.linear's)."""
    return linear(xp, x, params["head"], dtype, rounded)


def with_greedy(xp, pass_fn):
    """`pass_fn` (decode_batch or prefill_batch, its namespace and config bound) returning (logits, greedy tokens,
    keys, values): each logits row's np.argmax (the first of equal maxima, the first NaN), computed where the logits
    are, so that a caller whose rows are all greedy reads a few ints rather than every row's logits."""
    @functools.wraps(pass_fn)  # (its signature: prepare reads the parameters' names)
    def step(*args, **kwargs):
        logits, keys, values = pass_fn(*args, **kwargs)
        return logits, xp.argmax(logits, axis=-1), keys, values
    step.__name__ = pass_fn.__name__ + "_greedy"
    return step


class BatchRanges:
    """The decode step prepared over consecutive ranges of its batch B (`prepared`), one plan each, called like one
    prepared function: a call replays the plan of the range its batch (len(ids)) is in: no padding, no recompiles
    once each range has been traced. `stats` sums the ranges'."""

    def __init__(self, parts: dict):
        self.parts = parts   # (least, most) -> the step prepared with B in that range

    def of(self, ids):
        """The prepared step of the range holding a batch of len(ids) rows (the last's where none does: it raises the
        var's error)."""
        n = ids.shape[0]
        for (_, most), step in self.parts.items():
            if n <= most:
                return step
        return step

    def __call__(self, params, ids, *args, **kwargs):
        return self.of(ids)(params, ids, *args, **kwargs)

    def plan(self, params, ids, *args, **kwargs):
        return self.of(ids).plan(params, ids, *args, **kwargs)

    @property
    def device_name(self):
        return next(iter(self.parts.values())).device_name

    @property
    def stats(self) -> dict:
        every = [f.stats for f in self.parts.values()]
        return {key: sum(s[key] for s in every) for key in every[0]}


def prepared(cfg: Config, *, context: int, block_size: int, max_batch: int, max_chunk: int,
             max_tokens: int | None = None, device: str | None = None, dtype=np.float32, greedy: bool = False,
             tensor_core_batches: bool = False):
    """(decode_batch, prefill_batch) prepared with prepjit: vars B (1, max_batch), NB (1, context // block_size)
    for the decode step; T (1, max_tokens: default max_chunk) tokens of S (1, max_batch) sequences, chunks of at
    most `window` (1, max_chunk) tokens, and NB for a prefill call. One plan each serves every batch composition
    and every chunk, except where the device's kernels of a batch differ from its target's tensor_batch_rows (T:
    a GPU with tensor cores, its projections on them from T rows, a kernel serving its var's whole range): there
    with max_batch >= T the decode step is two plans, B in (1, T - 1) and (T, max_batch) (`BatchRanges`), each
    serving every batch composition of its range, so one sequence keeps the one-row kernels (on an H100 the
    tensor-core tiles took a batch of one 2x as long: the head 25.8 -> 84.0 us; the attention's query heads folded
    from T rows). The upper range multiplies its quantized weights on tensor cores, rounded to bfloat16, only with
    `tensor_core_batches` (decode_batch's `rounded`): a sequence's greedy tokens may then depend on how many others
    run with it; by default its logits are the same bits in any batch. With `greedy`, each returns its rows' greedy
    tokens after the logits (`with_greedy`)."""
    import prepjit as pj
    import prepjit.numpy as pnp
    from prepjit.codegen.targets import target_for
    kwargs = {} if device is None else {"device": device}
    tables = -(-context // block_size)
    dec = functools.partial(decode_batch, pnp, cfg, dtype=dtype, rounded=tensor_core_batches)
    dec.__name__ = "llama_decode_batch"
    pre = functools.partial(prefill_batch, pnp, cfg, dtype=dtype)
    pre.__name__ = "llama_prefill_batch"
    if greedy:
        dec, pre = with_greedy(pnp, dec), with_greedy(pnp, pre)

    def decode(least, most):
        return pj.prepare(dec, vars={"B": (least, most), "NB": (1, tables)},
                          shapes={"ids": ("B",), "pos": ("B",), "block_table": ("B", "NB")}, **kwargs)
    step = decode(1, max_batch)
    split = target_for(step.device).tensor_batch_rows
    if split is not None and max_batch >= split:
        step = BatchRanges({(1, split - 1): decode(1, split - 1), (split, max_batch): decode(split, max_batch)})
    return (step,
            pj.prepare(pre, vars={"T": (1, max_tokens or max_chunk), "S": (1, max_batch), "NB": (1, tables),
                                  "window": (1, max_chunk)},
                       shapes={"ids": ("T",), "pos": ("T",), "offset": ("T",), "block_table": ("T", "NB"),
                               "last": ("S",)}, **kwargs))
