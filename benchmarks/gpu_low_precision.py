"""16-bit floats on a CUDA GPU (issue 22's GPU figures): prepjit against torch on the same GPU, in one process.

    python -m benchmarks.gpu_low_precision [--device cuda] [--quick] [--out FILE]

- matmul of square float32, bfloat16 and float16 matrices (4096, and 8192 unless --quick) against torch.matmul
  (cuBLAS; float32 with TF32 off, the exact product), in TFLOP/s;
- SmolLM2-135M's decode step (random weights of the real shapes, position 256 of a 512-token cache) and MiniLM's
  static batch of 32 x 128, each in float32 and bfloat16, against the same models in torch eager (transformers)
  cast to the same dtype, with the launches per call of prepjit's plan.

Inputs are resident on the device (pj.Arrays made by a prepared copy, torch CUDA tensors); every figure is the
median of synchronised calls after warm-up. Each matmul is checked against float64 NumPy on a corner of the
product before it is timed, each model against its torch twin (cosine of the outputs).
"""
from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np

import prepjit as pj
from examples.models import llama, minilm
from examples.models.common import DTYPES, tree_cast

from .gpu import Torch, median_us
from .gpu_models import CONTEXT, POS, SMOLLM2, _bert, _llama, cosine, to_device


def matmul_rows(device: str, t: Torch, sizes, reps: int):
    torch = t.torch   # Torch() turned TF32 off: float32 products are exact
    rng = np.random.default_rng(0)
    mm = pj.prepare(lambda a, b: a @ b, device=device)
    for size in sizes:
        for name, dtype in DTYPES.items():
            a = rng.standard_normal((size, size), np.float32).astype(dtype)
            b = rng.standard_normal((size, size), np.float32).astype(dtype)
            da, db = to_device(a, device), to_device(b, device)
            ta = torch.from_numpy(a.astype(np.float32)).cuda().to(getattr(torch, {"f32": "float32", "bf16":
                                                                                   "bfloat16", "f16": "float16"}[name]))
            tb = torch.from_numpy(b.astype(np.float32)).cuda().to(ta.dtype)
            out = np.asarray(mm(da, db))[:64, :64].astype(np.float64)
            ref = a[:64].astype(np.float64) @ b[:, :64].astype(np.float64)
            err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
            ours = median_us(lambda da=da, db=db: mm(da, db), reps)
            peer = median_us(t.sync(lambda ta=ta, tb=tb: ta @ tb), reps)
            flops = 2 * size ** 3
            yield {"case": f"matmul_{name}_{size}", "prepjit_tflops": flops / ours / 1e6,
                   "torch_tflops": flops / peer / 1e6, "ratio": ours / peer, "rel_error": err,
                   "kernels": len(mm.plan(da, db).kernels)}


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
        dparams, dk, dv = to_device(params, device), to_device(k, device), to_device(v, device)
        dcos, dsin, ids = to_device(cos, device), to_device(sin, device), np.array([42], np.int64)
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

    mparams32 = minilm.random_params(rng, layers=6, vocab=30522)
    b, tt = 32, 128
    lengths = rng.integers(8, tt + 1, b)
    mask = (np.arange(tt)[None, :] < lengths[:, None]).astype(np.float32)
    mids = np.where(mask > 0, rng.integers(1, 30522, (b, tt)), 0).astype(np.int64)
    bert = _bert(torch, mparams32)
    tids, tmask = torch.from_numpy(mids).cuda(), torch.from_numpy(mask).cuda()
    for name in ("f32", "bf16"):
        f = minilm.prepared_embed(b, tt, symbolic=False, device=device)
        dparams = to_device(tree_cast(mparams32, DTYPES[name]), device)
        tb = bert.to(torch.float32 if name == "f32" else torch.bfloat16)

        def peer(tb=tb):
            with torch.no_grad():
                tb(input_ids=tids, attention_mask=tmask.long())
            torch.cuda.synchronize()
        ours = median_us(lambda f=f, dparams=dparams: f(dparams, mids, mask), reps)
        yield {"case": f"minilm_b32_t128_{name}", "prepjit_ms": ours / 1e3,
               "torch_eager_ms": median_us(peer, reps) / 1e3, "kernels": len(f.plan(dparams, mids, mask).kernels)}


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", default="benchmarks/results/gpu-low-precision.json")
    args = parser.parse_args(argv)
    t = Torch()
    result = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "gpu": t.torch.cuda.get_device_name(),
              "platform": platform.platform(), "torch": t.torch.__version__, "rows": []}
    sizes = (4096,) if args.quick else (4096, 8192)
    for rows in (lambda: matmul_rows(args.device, t, sizes, args.reps), lambda: model_rows(args.device, t, args.reps)):
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
