"""An MLP classifier's forward pass with a symbolic batch `n`, on synthetic data: prepared once, replayed at
every batch size.

    python examples/mlp.py                 # batches of several sizes: shapes, error vs NumPy, stats
    python examples/mlp.py --check         # every batch compared with NumPy (and torch when installed)
    python examples/mlp.py --bench         # samples/s vs NumPy (and torch), prepare time, top kernels
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import mlp  # noqa: E402
from models.common import numpy_namespace, top_kernels  # noqa: E402


def torch_forward(params):
    """The same forward pass in torch (None when torch is not installed)."""
    try:
        import torch
    except ImportError:
        return None
    ws = [(torch.from_numpy(p["w"]), torch.from_numpy(p["b"])) for p in params]

    def run(x):
        with torch.no_grad():
            h = torch.from_numpy(x)
            for w, b in ws[:-1]:
                h = torch.relu(h @ w + b)
            return torch.softmax(h @ ws[-1][0] + ws[-1][1], dim=1).numpy()
    return run


def per_call(fn, *args, rounds: int = 7) -> float:
    fn(*args)
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn(*args)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="64,256,256,10", help="layer widths, input first (64,256,256,10)")
    parser.add_argument("--batches", default="1,7,64,1000", help="batch sizes to run (1,7,64,1000)")
    parser.add_argument("--max-batch", type=int, default=4096, help="the bound of the symbolic batch n")
    parser.add_argument("--device", default=None, help="prepjit device (cpu, opencl, cuda)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--check", action="store_true", help="compare every batch with NumPy (and torch)")
    parser.add_argument("--bench", action="store_true", help="time prepjit against NumPy (and torch)")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    rng = np.random.default_rng(args.seed)
    centres = rng.standard_normal((sizes[-1], sizes[0])).astype(np.float32) * 0.6
    params = mlp.fit_output_layer(mlp.init_params(rng, sizes), *mlp.synthetic_data(rng, 4096, centres), sizes[-1])
    f = mlp.prepared_forward(args.max_batch, device=args.device)
    xp = numpy_namespace()
    ref_torch = torch_forward(params) if args.check else None
    print(f"MLP {' -> '.join(map(str, sizes))} (ReLU, softmax head fitted to {sizes[-1]} synthetic clusters) "
          f"prepared with a symbolic batch n <= {args.max_batch}")
    ok = True
    for n in batches:
        x, labels = mlp.synthetic_data(rng, n, centres)
        start = time.perf_counter()
        probs = np.asarray(f(params, x))
        seconds = time.perf_counter() - start
        err = np.abs(probs - mlp.forward(xp, params, x)).max()
        what = "first call (trace + compile)" if f.stats["traces"] == 1 and f.stats["replays"] == 1 else "replay"
        line = (f"batch {n:>5}: probabilities {probs.shape}, accuracy {np.mean(probs.argmax(1) == labels):.3f}, "
                f"max |err| vs NumPy {err:.1e}, {what} {seconds * 1e3:.2f} ms")
        if ref_torch is not None:
            line += f", vs torch {np.abs(probs - ref_torch(x)).max():.1e}"
        ok &= bool(err < 1e-5)
        print(line)
    print(f"stats: {f.stats} (one trace for every batch size)")
    if args.check:
        print(f"check vs NumPy{' and torch' if ref_torch else ''}: {'OK' if ok else 'FAILED'} (max |err| < 1e-5)")
    if args.bench:
        n = max(batches)
        x, _ = mlp.synthetic_data(rng, n, centres)
        ours = per_call(lambda: f(params, x))
        print(f"bench at batch {n}: prepjit {ours * 1e3:.3f} ms ({n / ours:,.0f} samples/s)")
        for name, fn in (("NumPy", lambda: mlp.forward(xp, params, x)), ("torch", torch_forward(params))):
            if fn is None:
                print(f"  {name}: not installed")
                continue
            theirs = per_call(fn if name == "NumPy" else lambda: fn(x))
            print(f"  {name:<6} {theirs * 1e3:.3f} ms ({n / theirs:,.0f} samples/s): prepjit at {ours / theirs:.2f}x "
                  f"its time")
        print(top_kernels(f, params, x))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
