"""GPU benchmarks: prepjit's cuda and opencl devices against torch on the same GPU, in the same process.

    python -m benchmarks.gpu [--devices cuda,opencl] [--models] [--out benchmarks/results/gpu-latest.json]

Every figure is the median of synchronised calls (a prepared call returns after its stream finishes;
torch calls are followed by torch.cuda.synchronize()). Inputs are device-resident (a pj.Array made by a
prepared copy, a torch CUDA tensor) except in the per-call floor case, which takes NumPy in and out on
both sides. Ratios are prepjit time / torch time (below 1 is faster than torch). `--models` adds the example
models against transformers in torch eager (benchmarks/gpu_models.py), `--models-only` runs only those;
`--only` times only the cases whose names contain one of its comma-separated words.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import numpy as np

import prepjit as pj
import prepjit.numpy as pnp


def median_us(fn, reps: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e6 * statistics.median(times)


class Torch:
    def __init__(self):
        import torch
        self.torch = torch
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    def sync(self, fn):
        def run():
            fn()
            self.torch.cuda.synchronize()
        return run

    def tensor(self, x):
        return self.torch.from_numpy(x).cuda()

    def graph(self, fn):
        """fn replayed from a CUDA graph captured once."""
        torch = self.torch
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return self.sync(graph.replay)


def cases(device: str, t: Torch, quick: bool):
    """(name, bytes or flops of one call, unit, prepjit fn, {peer: fn})."""
    torch, rng = t.torch, np.random.default_rng(0)
    to_device = pj.prepare(lambda x: x + 0, device=device)

    n = 1 << 26 if not quick else 1 << 20
    a, b, c = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    da, db, dc = to_device(a), to_device(b), to_device(c)
    fused = pj.prepare(lambda a, b, c: a * b + c, device=device)
    ta, tb, tc = t.tensor(a), t.tensor(b), t.tensor(c)
    compiled = torch.compile(lambda a, b, c: a * b + c)
    np.testing.assert_allclose(fused(da, db, dc).numpy()[:1000], (a * b + c)[:1000], rtol=1e-5)  # opencl may fuse to fma
    yield (f"elementwise_fma_{n}", 16 * n, "bytes", lambda: fused(da, db, dc),
           {"torch_eager": t.sync(lambda: ta * tb + tc), "torch_compile": t.sync(lambda: compiled(ta, tb, tc))})

    for size in ((1024, 2048, 4096) if not quick else (256,)):
        x, w = (rng.standard_normal((size, size)).astype(np.float32) for _ in range(2))
        mm = pj.prepare(lambda x, w: x @ w, device=device)
        dx, dw, tx, tw = to_device(x), to_device(w), t.tensor(x), t.tensor(w)
        np.testing.assert_allclose(mm(dx, dw).numpy(), x @ w, rtol=1e-3, atol=1e-3)
        yield (f"matmul_f32_{size}", 2 * size ** 3, "flops", lambda mm=mm, dx=dx, dw=dw: mm(dx, dw),
               {"torch_cublas": t.sync(lambda tx=tx, tw=tw: tx @ tw)})

    rows = 4096 if not quick else 256
    x = rng.standard_normal((rows, rows)).astype(np.float32)
    dx, tx = to_device(x), t.tensor(x)

    def softmax(x):
        e = pnp.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    def layernorm(x):
        mu = x.mean(axis=1, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=1, keepdims=True)
        return (x - mu) / pnp.sqrt(var + 1e-5)
    sm, ln = pj.prepare(softmax, device=device), pj.prepare(layernorm, device=device)
    yield (f"softmax_{rows}x{rows}", 8 * rows * rows, "bytes", lambda: sm(dx),
           {"torch_fused": t.sync(lambda: torch.softmax(tx, dim=1))})
    yield (f"layernorm_{rows}x{rows}", 8 * rows * rows, "bytes", lambda: ln(dx),
           {"torch_fused": t.sync(lambda: torch.nn.functional.layer_norm(tx, (rows,)))})

    small_a, small_b = rng.standard_normal(16).astype(np.float32), rng.standard_normal(16).astype(np.float32)
    floor = pj.prepare(lambda a, b: a * b + 1, device=device)
    yield ("floor_a_mul_b_plus_1_numpy_io_16", 0, "-", lambda: np.asarray(floor(small_a, small_b)),
           {"torch_eager": lambda: (t.tensor(small_a) * t.tensor(small_b) + 1).cpu().numpy()})

    v = rng.standard_normal((64, 64)).astype(np.float32)
    dv, tv = to_device(v), t.tensor(v)

    def chain(x):
        for _ in range(10):
            x = x - x.max(axis=1, keepdims=True) * 0.5
        return x

    def torch_chain(x):
        for _ in range(10):
            x = x - torch.amax(x, dim=1, keepdim=True) * 0.5
        return x
    ch = pj.prepare(chain, device=device)
    np.testing.assert_allclose(ch(dv).numpy(), torch_chain(tv).cpu().numpy(), rtol=1e-5, atol=1e-5)
    yield ("reduction_chain_10_64x64", 0, "-", lambda: ch(dv),
           {"torch_eager": t.sync(lambda: torch_chain(tv)), "torch_cuda_graph": t.graph(lambda: torch_chain(tv))})


def model_cases(device: str, t: Torch, result: dict):
    """The model cases that could be set up (a failure is recorded in `result` and the others still run)."""
    from .gpu_models import minilm_case, smollm2_case
    out = []
    for case in (minilm_case, smollm2_case):
        try:
            out += [(name, 0, "-", fn, peers, info) for name, fn, peers, info in
                    case(device, t, np.random.default_rng(0))]
        except Exception as e:  # noqa: BLE001
            result["cases"].append({"device": device, "case": case.__name__, "error": f"{type(e).__name__}: {e}"[:2000]})
            print(device, case.__name__, "failed:", e, flush=True)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", default="cuda,opencl")
    parser.add_argument("--out", default="benchmarks/results/gpu-latest.json")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--models", action="store_true")
    parser.add_argument("--models-only", action="store_true")
    parser.add_argument("--only", default="")
    args = parser.parse_args(argv)
    t = Torch()
    result = {"command": "python -m benchmarks.gpu " + " ".join(argv if argv is not None else sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d %H:%M:%S"),
              "machine": {"gpu": t.torch.cuda.get_device_name(), "platform": platform.platform(),
                          "python": platform.python_version(), "torch": t.torch.__version__},
              "cases": []}
    peers_done = {}
    for device in args.devices.split(","):
        try:
            items = [] if args.models_only else [(*case, {}) for case in cases(device, t, args.quick)]
            if args.models or args.models_only:
                items += model_cases(device, t, result)
        except Exception as e:  # noqa: BLE001  (report a device that cannot run, measure the others)
            result["cases"].append({"device": device, "error": f"{type(e).__name__}: {e}"[:2000]})
            print(device, "failed:", e, flush=True)
            continue
        words = [w for w in args.only.split(",") if w]
        for name, amount, unit, fn, peers, info in items:
            if words and not any(w in name for w in words):
                continue
            try:
                ours = median_us(fn, args.reps)
            except Exception as e:  # noqa: BLE001
                result["cases"].append({"device": device, "case": name, "error": f"{type(e).__name__}: {e}"[:2000]})
                print(device, name, "failed:", e, flush=True)
                continue
            row = {"device": device, "case": name, "median_us": round(ours, 2), "peers_us": {}, **info}
            for peer, peer_fn in peers.items():
                if (name, peer) not in peers_done:
                    peers_done[(name, peer)] = round(median_us(peer_fn, args.reps), 2)
                row["peers_us"][peer] = peers_done[(name, peer)]
                row[f"ratio_vs_{peer}"] = round(ours / peers_done[(name, peer)], 3)
            if unit == "bytes":
                row["gb_per_s"] = round(amount / ours / 1e3, 1)
            elif unit == "flops":
                row["tflop_per_s"] = round(amount / ours / 1e6, 3)
            result["cases"].append(row)
            print(json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
