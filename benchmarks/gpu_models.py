"""Model cases of the GPU benchmark (benchmarks/gpu.py --models): the example models on a GPU device against
transformers' own models in torch eager on the same GPU, loaded with the same weights.

- MiniLM (all-MiniLM-L6-v2's shapes) embedding a padded batch of 32 x 128 (static shapes), against
  transformers' BertModel + mean pooling + L2 normalisation;
- SmolLM2-135M one decode step at position 256 of a 512-token cache (scalar var `pos`), against
  LlamaForCausalLM with a DynamicCache of 256 tokens (cut back after every step).

The weights are random, of the real shapes (the weight files stay off the GPU machine); prepjit gets them, and
its KV caches, as arrays resident on the device. Each case first checks that both sides compute the same
thing (cosine of the outputs), then yields (name, prepjit call, {peer: call}).
"""
from __future__ import annotations

import numpy as np

from examples.engine import resident
from examples.models import llama, minilm

SMOLLM2 = llama.Config(layers=30, dim=576, ff=1536, heads=9, kv_heads=3, vocab=49152, context=8192,
                       rope_theta=1e5, eps=1e-5)
TINYLLAMA = llama.Config(layers=22, dim=2048, ff=5632, heads=32, kv_heads=4, vocab=32000, context=2048,
                         rope_theta=1e4, eps=1e-5)   # TinyLlama-1.1B's shapes: a decode its weights' bytes bound
CONTEXT, POS = 512, 256


def cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _bert(torch, params):
    from transformers import BertConfig, BertModel
    d, layers = params["word"].shape[1], params["layers"]
    cfg = BertConfig(vocab_size=params["word"].shape[0], hidden_size=d, num_hidden_layers=len(layers),
                     num_attention_heads=minilm.HEADS, intermediate_size=layers[0]["wup"].shape[1],
                     max_position_embeddings=params["pos"].shape[0], layer_norm_eps=minilm.LN_EPS, hidden_act="gelu")
    model = BertModel(cfg, add_pooling_layer=False).eval()
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    state = {"embeddings.word_embeddings.weight": t(params["word"]),
             "embeddings.position_embeddings.weight": t(params["pos"]),
             "embeddings.token_type_embeddings.weight": t(np.stack([params["type"]] * cfg.type_vocab_size)),
             "embeddings.LayerNorm.weight": t(params["ln_g"]), "embeddings.LayerNorm.bias": t(params["ln_b"])}
    names = {"o": "attention.output.dense", "up": "intermediate.dense", "down": "output.dense"}
    for i, lp in enumerate(layers):
        pre = f"encoder.layer.{i}."
        linears = {name: (lp["w" + w], lp["b" + w]) for w, name in names.items()}
        for name, w, b in zip(("query", "key", "value"), minilm.qkv_parts(lp["wqkv"]), minilm.qkv_parts(lp["bqkv"])):
            linears["attention.self." + name] = w, b
        for name, (w, b) in linears.items():
            state[pre + name + ".weight"], state[pre + name + ".bias"] = t(w.T), t(b)
        for ln, name in (("ln1", "attention.output.LayerNorm"), ("ln2", "output.LayerNorm")):
            state[pre + name + ".weight"], state[pre + name + ".bias"] = t(lp[ln + "_g"]), t(lp[ln + "_b"])
    model.load_state_dict(state, strict=False)
    return model.cuda()


def minilm_case(device: str, t, rng):
    torch = t.torch
    params = minilm.random_params(rng, layers=6, vocab=30522)
    b, tt = 32, 128
    lengths = rng.integers(8, tt + 1, b)
    lengths[0] = tt
    mask = (np.arange(tt)[None, :] < lengths[:, None]).astype(np.float32)
    ids = np.where(mask > 0, rng.integers(1, 30522, (b, tt)), 0).astype(np.int64)
    f = minilm.prepared_embed(b, tt, symbolic=False, device=device)
    dparams = resident(params, device)
    ours = np.asarray(f(dparams, ids, mask))
    model, tids, tmask = _bert(torch, params), torch.from_numpy(ids).cuda(), torch.from_numpy(mask).cuda()

    def peer():
        with torch.no_grad():
            h = model(input_ids=tids, attention_mask=tmask.long()).last_hidden_state
            pooled = (h * tmask[:, :, None]).sum(1) / tmask.sum(1, keepdim=True).clamp(min=1e-9)
            out = torch.nn.functional.normalize(pooled, dim=1)
        torch.cuda.synchronize()
        return out
    agree = min(cosine(o, p) for o, p in zip(ours, peer().cpu().numpy()))
    print(f"minilm: prepjit vs transformers, lowest cosine over the batch {agree:.7f}", flush=True)
    yield ("minilm_embed_b32_t128", lambda: f(dparams, ids, mask), {"transformers_eager": peer}, {"min_cosine": agree})


def _llama(torch, cfg: llama.Config, params):
    from transformers import LlamaConfig, LlamaForCausalLM
    hf = LlamaConfig(vocab_size=cfg.vocab, hidden_size=cfg.dim, intermediate_size=cfg.ff, num_hidden_layers=cfg.layers,
                     num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads, rms_norm_eps=cfg.eps,
                     rope_theta=cfg.rope_theta, max_position_embeddings=cfg.context, tie_word_embeddings=True)
    model = LlamaForCausalLM(hf).eval()
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    state = {"model.embed_tokens.weight": t(params["embed"]), "lm_head.weight": t(params["head"]),
             "model.norm.weight": t(params["norm"])}
    kv = cfg.kv_heads * cfg.head_dim
    for i, bp in enumerate(params["blocks"]):
        pre = f"model.layers.{i}."
        state.update({pre + "input_layernorm.weight": t(bp["attn_norm"]),
                      pre + "post_attention_layernorm.weight": t(bp["ffn_norm"]),
                      pre + "self_attn.q_proj.weight": t(bp["wqkv"][:cfg.dim]),
                      pre + "self_attn.k_proj.weight": t(bp["wqkv"][cfg.dim:cfg.dim + kv]),
                      pre + "self_attn.v_proj.weight": t(bp["wqkv"][cfg.dim + kv:]),
                      pre + "self_attn.o_proj.weight": t(bp["wo"]),
                      pre + "mlp.gate_proj.weight": t(bp["gate_up"][:cfg.ff]),
                      pre + "mlp.up_proj.weight": t(bp["gate_up"][cfg.ff:]),
                      pre + "mlp.down_proj.weight": t(bp["down"])})
    model.load_state_dict(state, strict=False)
    return model.cuda()


def smollm2_case(device: str, t, rng):
    torch, cfg = t.torch, SMOLLM2
    params = llama.random_params(rng, cfg)
    cos, sin = llama.rope_tables(cfg, CONTEXT)
    model = _llama(torch, cfg, params)
    prompt = rng.integers(0, cfg.vocab, POS)
    with torch.no_grad():
        out = model(torch.from_numpy(prompt)[None].cuda(), use_cache=True)
    cache = out.past_key_values
    shape = (cfg.layers, cfg.kv_heads, CONTEXT, cfg.head_dim)
    k, v = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
    for layer in range(cfg.layers):   # the cache transformers filled, as prepjit's (L, kv heads, context, head dim)
        keys, values = ((cache.layers[layer].keys, cache.layers[layer].values) if hasattr(cache, "layers")
                        else (cache.key_cache[layer], cache.value_cache[layer]))
        k[layer, :, :POS] = keys[0].cpu().numpy()
        v[layer, :, :POS] = values[0].cpu().numpy()
    _, decode = llama.prepared(cfg, CONTEXT, device=device)
    dparams, dk, dv = resident(params, device), resident(k, device), resident(v, device)
    dcos, dsin, ids = resident(cos, device), resident(sin, device), np.array([42], np.int64)
    ours = np.asarray(decode(dparams, ids, POS, dk, dv, dcos, dsin)[0])

    def peer():
        with torch.no_grad():
            logits = model(torch.from_numpy(ids)[None].cuda(), use_cache=True, past_key_values=cache).logits
        cache.crop(-1)  # drop the token just added
        torch.cuda.synchronize()
        return logits[0, -1]
    agree = cosine(ours, peer().cpu().numpy())
    print(f"smollm2: prepjit vs transformers, cosine of the logits {agree:.7f}", flush=True)
    yield ("smollm2_decode_pos256", lambda: decode(dparams, ids, POS, dk, dv, dcos, dsin),
           {"transformers_eager": peer}, {"cosine": agree})
