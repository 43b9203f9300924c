"""16-bit floats on a CUDA GPU (issue 22's GPU figures): prepjit against torch on the same GPU, in one process.

    python -m benchmarks.gpu_low_precision [--device cuda] [--quick] [--out FILE]

- matmul of square float32, bfloat16 and float16 matrices (4096, and 8192 unless --quick) against torch.matmul
  (cuBLAS; float32 with TF32 off, the exact product), in TFLOP/s; and float32 under precision="tf32" (prepjit's
  tensor-core tiles) against torch with torch.backends.cuda.matmul.allow_tf32 = True (cuBLAS TF32; issue 22's goal
  0.7x of it), as a @ b and as a @ b.T (both operands contiguous along k: wgmma on sm_90);
- SmolLM2-135M's decode step (random weights of the real shapes, position 256 of a 512-token cache) and MiniLM's
  static batch of 32 x 128, each in float32 and bfloat16, against the same models in torch eager (transformers)
  cast to the same dtype, with the launches per call of prepjit's plan; in bfloat16 also against
  torch.compile(mode="reduce-overhead") (CUDA graphs): MiniLM the transformers model compiled, SmolLM2 a torch
  decode step over a static cache (`torch_static_decode`: fixed shapes, the position a device tensor, keys and values
  written in place), as transformers' StaticCache does. A peer that fails to compile is reported with its reason.
- with --sass DIR: each 16-bit and tf32 matmul kernel's machine code (cuobjdump -sass of the cubin prepjit loaded) and the
  count of its tensor-core (HMMA, HGMMA), matrix-load (LDSM) and async-copy (LDGSTS) instructions in the row.

Inputs are resident on the device (pj.Arrays made by a prepared copy, torch CUDA tensors); every figure is the
median of synchronised calls after warm-up. Each matmul is checked against float64 NumPy on a corner of the
product before it is timed, each model against its torch twin (cosine of the outputs).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import subprocess
import time

import numpy as np

import prepjit as pj
import prepjit.numpy as pnp
from examples.engine import resident
from examples.models import llama, minilm
from examples.models.common import DTYPES, tree_cast

from .gpu import Torch, median_us
from .gpu_models import CONTEXT, POS, SMOLLM2, _bert, _llama, cosine


SASS_OPS = ("HMMA", "HGMMA", "LDSM", "LDGSTS")   # tensor-core products, matrix loads, async global->shared copies


def sass_counts(binary: bytes, path: str) -> dict:
    """The count of each of SASS_OPS in a cubin's machine code (cuobjdump -sass), the listing kept at `path`."""
    if shutil.which("cuobjdump") is None:
        return {"error": "no cuobjdump"}
    with open(path + ".cubin", "wb") as f:
        f.write(binary)
    listing = subprocess.run(["cuobjdump", "-sass", path + ".cubin"], capture_output=True, text=True).stdout
    with open(path + ".sass", "w") as f:
        f.write(listing)
    return {op: len(re.findall(rf"\b{op}\b", listing)) for op in SASS_OPS}


# (case name, operands' dtype, prepjit's precision=, torch's allow_tf32, b transposed: a @ b.T)
MATMULS = (("f32", "f32", "highest", False, False), ("tf32", "f32", "tf32", True, False),
           ("tf32_bt", "f32", "tf32", True, True), ("bf16", "bf16", "highest", False, False),
           ("f16", "f16", "highest", False, False))
TORCH_DTYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}


@contextlib.contextmanager
def torch_tf32(torch, allow: bool):
    """torch.backends.cuda.matmul.allow_tf32 set to `allow` inside (Torch() turns it off: exact float32)."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = allow
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def matmul_rows(device: str, t: Torch, sizes, reps: int, sass: str | None = None):
    torch = t.torch
    rng = np.random.default_rng(0)
    prepared = {(p, t): pj.prepare(lambda a, b, p=p, t=t: pnp.matmul(a, b.T if t else b, precision=p), device=device)
                for _, _, p, _, t in MATMULS}
    for size in sizes:
        for name, dtype_name, precision, allow_tf32, transposed in MATMULS:
            mm, dtype = prepared[precision, transposed], DTYPES[dtype_name]
            a = rng.standard_normal((size, size), np.float32).astype(dtype)
            b = rng.standard_normal((size, size), np.float32).astype(dtype)
            da, db = resident(a, device), resident(b, device)
            ta = torch.from_numpy(a.astype(np.float32)).cuda().to(getattr(torch, TORCH_DTYPES[dtype_name]))
            tb = torch.from_numpy(b.astype(np.float32)).cuda().to(ta.dtype)
            out = np.asarray(mm(da, db))[:64, :64].astype(np.float64)
            ref = a[:64].astype(np.float64) @ (b.T if transposed else b)[:, :64].astype(np.float64)
            err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
            ours = median_us(lambda da=da, db=db, mm=mm: mm(da, db), reps)
            with torch_tf32(torch, allow_tf32):
                peer = median_us(t.sync(lambda ta=ta, tb=tb.T if transposed else tb: ta @ tb), reps)
            flops = 2 * size ** 3
            kernels = mm.plan(da, db).kernels
            row = {"case": f"matmul_{name}_{size}", "prepjit_tflops": flops / ours / 1e6,
                   "torch_tflops": flops / peer / 1e6, "of_torch": peer / ours, "rel_error": err, "kernels": len(kernels)}
            if sass and name != "f32" and size == sizes[0]:
                os.makedirs(sass, exist_ok=True)
                row["sass"] = sass_counts(kernels[0].kernel.binary, os.path.join(sass, f"matmul_{name}"))
                with open(os.path.join(sass, f"matmul_{name}.cu"), "w") as f:
                    f.write(kernels[0].kernel.source)
            yield row


def model_rows(device: str, t: Torch, reps: int):
    torch = t.torch
    rng = np.random.default_rng(0)
    cfg = SMOLLM2
    params32 = llama.random_params(rng, cfg)
    for name in ("f32", "bf16"):
        dtype = DTYPES[name]
        params = tree_cast(params32, dtype)
        cos, sin = llama.rope_tables(cfg, CONTEXT, dtype)
        shape = (cfg.layers, cfg.kv_heads, CONTEXT, cfg.head_dim)
        k = (rng.standard_normal(shape, np.float32) * 0.5).astype(dtype)
        v = (rng.standard_normal(shape, np.float32) * 0.5).astype(dtype)
        _, decode = llama.prepared(cfg, CONTEXT, device=device, dtype=dtype)
        dparams, dk, dv = resident(params, device), resident(k, device), resident(v, device)
        dcos, dsin, ids = resident(cos, device), resident(sin, device), np.array([42], np.int64)
        args = (dparams, ids, POS, dk, dv, dcos, dsin)
        ours = np.asarray(decode(*args)[0]).astype(np.float32)
        ref = np.asarray(llama.decode(np, cfg, params32, ids, POS, k.astype(np.float32), v.astype(np.float32),
                                      *llama.rope_tables(cfg, CONTEXT))[0])
        yield {"case": f"smollm2_decode_{name}", "prepjit_ms": median_us(lambda decode=decode, args=args: decode(*args), reps) / 1e3,
               "kernels": len(decode.plan(*args).kernels), "cosine_vs_numpy_f32": cosine(ours, ref)}
    model = _llama(torch, cfg, params32).to(torch.bfloat16)
    prompt = torch.from_numpy(rng.integers(0, cfg.vocab, POS)).cuda()[None]
    with torch.no_grad():
        cache = model(prompt, use_cache=True).past_key_values
    tid = torch.tensor([[42]]).cuda()

    def peer():
        with torch.no_grad():
            model(tid, use_cache=True, past_key_values=cache)
        cache.crop(-1)
        torch.cuda.synchronize()
    yield {"case": "smollm2_decode_bf16_torch_eager", "torch_ms": median_us(peer, reps) / 1e3}
    yield compiled_row("smollm2_decode_bf16_torch_compile", lambda: _static_decode_peer(torch, cfg, params32, k, v), reps)

    mparams32 = minilm.random_params(rng, layers=6, vocab=30522)
    b, tt = 32, 128
    lengths = rng.integers(8, tt + 1, b)
    mask = (np.arange(tt)[None, :] < lengths[:, None]).astype(np.float32)
    mids = np.where(mask > 0, rng.integers(1, 30522, (b, tt)), 0).astype(np.int64)
    bert = _bert(torch, mparams32)
    tids, tmask = torch.from_numpy(mids).cuda(), torch.from_numpy(mask).cuda()
    for name in ("f32", "bf16"):
        f = minilm.prepared_embed(b, tt, symbolic=False, device=device)
        dparams = resident(tree_cast(mparams32, DTYPES[name]), device)
        tb = bert.to(torch.float32 if name == "f32" else torch.bfloat16)

        def peer(tb=tb):
            with torch.no_grad():
                tb(input_ids=tids, attention_mask=tmask.long())
            torch.cuda.synchronize()
        ours = median_us(lambda f=f, dparams=dparams: f(dparams, mids, mask), reps)
        yield {"case": f"minilm_b32_t128_{name}", "prepjit_ms": ours / 1e3,
               "torch_eager_ms": median_us(peer, reps) / 1e3, "kernels": len(f.plan(dparams, mids, mask).kernels)}

    def compiled_bert():
        tb = torch.compile(bert.to(torch.bfloat16), mode="reduce-overhead")

        def call():
            with torch.no_grad():
                tb(input_ids=tids, attention_mask=tmask.long())
            torch.cuda.synchronize()
        return call
    yield compiled_row("minilm_b32_t128_bf16_torch_compile", compiled_bert, reps)


def compiled_row(case: str, make, reps: int) -> dict:
    """The timing of the call `make()` returns (built and compiled, warm-up included, inside the guard), or the
    reason it failed: a peer that cannot compile costs its row only."""
    try:
        call = make()
        start = time.perf_counter()
        call()
        first = time.perf_counter() - start
        return {"case": case, "torch_ms": median_us(call, reps, warmup=5) / 1e3, "first_call_s": first}
    except Exception as e:  # noqa: BLE001  (torch.compile's failures are of many kinds: report, go on)
        return {"case": case, "error": f"{type(e).__name__}: {e}"[:2000]}


def torch_static_decode(torch, cfg, params, k, v):
    """One SmolLM2 decode step in torch over a static cache, as torch.compile wants it: params a tree of tensors
    (prepjit's layout: x @ w), k and v (L, kv heads, context, head dim) the cache; returns step(ids (1,), pos (1,)
    device tensors) -> (logits (vocab,), the token's keys and values (L, kv heads, head dim)), the new key and value
    taking the position's slot out of place (as prepjit's decode: the caller stores them; an in-place write into
    the cache made torch.compile skip its CUDA graphs, "mutated inputs"). RMSNorm, rotate-half RoPE and softmax as
    examples/models/llama.py computes them (float32 inside, rounded to the activations' dtype)."""
    heads, kv_heads, hd, dim, ff = cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.dim, cfg.ff
    kv, group, context = kv_heads * hd, heads // kv_heads, k.shape[2]
    inv = 1.0 / cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64, device=k.device) / hd)
    angles = torch.arange(context, dtype=torch.float64, device=k.device)[:, None] * inv[None]
    angles = torch.cat([angles, angles], -1)
    cos, sin = angles.cos().float().to(k.dtype), angles.sin().float().to(k.dtype)
    slots = torch.arange(context, device=k.device)

    def rms(x, gain):
        w = x.float()
        return (w * torch.rsqrt(w.pow(2).mean(-1, keepdim=True) + cfg.eps)).to(x.dtype) * gain

    def rope(x, c, s):
        return x * c + torch.cat([-x[..., hd // 2:], x[..., :hd // 2]], -1) * s

    def step(ids, pos):
        h = params["embed"][ids]
        c, s = cos[pos], sin[pos]
        here = (slots == pos)[:, None]
        keys, values = [], []
        for layer, bp in enumerate(params["blocks"]):
            q, kk, vv = (rms(h, bp["attn_norm"]) @ bp["wqkv"].T).split([dim, kv, kv], -1)
            q, kk, vv = rope(q.view(heads, hd), c, s), rope(kk.view(kv_heads, hd), c, s), vv.view(kv_heads, hd)
            keys.append(kk)
            values.append(vv)
            k_all = torch.where(here, kk[:, None], k[layer])
            v_all = torch.where(here, vv[:, None], v[layer])
            scores = (q.view(kv_heads, group, hd) @ k_all.transpose(-1, -2)).float() / hd ** 0.5
            probs = scores.masked_fill(slots > pos, float("-inf")).softmax(-1).to(h.dtype)
            h = h + (probs @ v_all).reshape(1, dim) @ bp["wo"].T
            gate, up = (rms(h, bp["ffn_norm"]) @ bp["gate_up"].T).split(ff, -1)
            h = h + (torch.nn.functional.silu(gate) * up) @ bp["down"].T
        return (rms(h, params["norm"]) @ params["head"].T)[0], torch.stack(keys), torch.stack(values)
    return step


def _static_decode_peer(torch, cfg, params32, k, v):
    """torch_static_decode in bfloat16 on the GPU, compiled with mode="reduce-overhead", at position POS."""
    def tensor(x):
        return torch.from_numpy(np.ascontiguousarray(np.asarray(x, np.float32))).cuda().to(torch.bfloat16)
    params = {key: [{n: tensor(w) for n, w in bp.items()} for bp in value] if key == "blocks" else tensor(value)
              for key, value in params32.items()}
    step = torch.compile(torch_static_decode(torch, cfg, params, tensor(k), tensor(v)), mode="reduce-overhead")
    ids, pos = torch.tensor([42], device="cuda"), torch.tensor([POS], device="cuda")

    def call():
        with torch.no_grad():
            step(ids, pos)
        torch.cuda.synchronize()
    return call


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", default="benchmarks/results/gpu-low-precision.json")
    parser.add_argument("--sass", default=None, help="a folder for the 16-bit matmul kernels' source and SASS")
    parser.add_argument("--only", choices=("matmul", "models"), default=None)
    args = parser.parse_args(argv)
    t = Torch()
    result = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "gpu": t.torch.cuda.get_device_name(),
              "platform": platform.platform(), "torch": t.torch.__version__, "rows": []}
    sizes = (4096,) if args.quick else (4096, 8192)
    groups = {"matmul": lambda: matmul_rows(args.device, t, sizes, args.reps, args.sass),
              "models": lambda: model_rows(args.device, t, args.reps)}
    for rows in [g for name, g in groups.items() if args.only in (None, name)]:
        try:
            for row in rows():
                print(json.dumps(row), flush=True)
                result["rows"].append(row)
        except Exception as e:  # noqa: BLE001  (record the failure, run the other group)
            result["rows"].append({"error": f"{type(e).__name__}: {e}"[:2000]})
            print("failed:", type(e).__name__, str(e)[:2000], flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
