"""Data-parallel throughput: a function replicated over several devices against the same work on the first device
alone, in one process (docs/devices.md).

    python -m benchmarks.multi_device --devices cuda:0,cuda:1 [--reps 10] [--small] [--only train] [--out r.json]

Cases: MiniLM (random weights of the real shapes, 6 layers) embedding B x T tokens, the batch split over the
replicas; the example MLP's Adam training step (examples/train_mlp.py: gradients pmean-ed across replicas) on a
large batch. Each figure is the median wall time of whole calls, results read back to the host, given as items
per second; the ratio is the replicated throughput over one device's (the goal on two GPUs: >= 1.8). Weights
and optimizer state live on the devices (`f.replicate`, and one upload for the single device); the inputs come
from the host on every call, on both sides. `--small` shrinks every case to a smoke test.
"""
from __future__ import annotations

import argparse
import functools
import json

import numpy as np

import prepjit as pj
import prepjit.numpy as pnp
from examples import train_mlp
from examples.models import minilm, mlp_train
from prepjit.runtime.collectives import to_device
from prepjit.runtime.devices import get_device

from .gpu import median_us


def on_device(tree, name: str):
    device = get_device(name)
    if isinstance(tree, dict):
        return {k: on_device(v, name) for k, v in tree.items()}
    if isinstance(tree, list):
        return [on_device(v, name) for v in tree]
    return to_device(device, np.ascontiguousarray(np.asarray(tree)))


def minilm_case(devices: list, small: bool, rng):
    b, t, layers, vocab = (8, 16, 1, 1000) if small else (512, 128, 6, 30522)
    params = minilm.random_params(rng, layers=layers, vocab=vocab)
    mask = (np.arange(t)[None, :] < rng.integers(t // 2, t + 1, b)[:, None]).astype(np.float32)
    ids = np.where(mask > 0, rng.integers(1, vocab, (b, t)), 0).astype(np.int64)
    fn = functools.partial(minilm.embed, pnp)
    fn.__name__ = "minilm_embed"
    spec = dict(vars={"B": (1, b), "T": (1, t)}, shapes={"ids": ("B", "T"), "mask": ("B", "T")})
    single = pj.prepare(fn, device=devices[0], **spec)
    multi = pj.prepare(fn, devices=devices, split={"ids": 0, "mask": 0}, **spec)
    one_params, many_params = on_device(params, devices[0]), multi.replicate(params)
    diff = float(np.max(np.abs(np.asarray(multi(many_params, ids, mask)) - np.asarray(single(one_params, ids, mask)))))
    return (f"minilm_embed_b{b}_t{t}", b, "sentences", lambda: np.asarray(single(one_params, ids, mask)),
            lambda: np.asarray(multi(many_params, ids, mask)), diff)


def train_case(devices: list, small: bool, rng):
    sizes, batch = ((16, 32, 4), 64) if small else ((512, 2048, 2048, 16), 16384)
    params = [{k: np.asarray(v) for k, v in layer.items()} for layer in mlp_train.init_params(pj.random.key(0), sizes)]
    state = mlp_train.adam_init(params)
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    labels = rng.integers(0, sizes[-1], batch).astype(np.int64)
    single = train_mlp.prepared_step("adam", 1e-3, batch, device=devices[0])
    multi = train_mlp.prepared_step("adam", 1e-3, batch, devices=devices)
    one = (on_device(params, devices[0]), on_device(state, devices[0]))
    many = (multi.replicate(params), multi.replicate(state))
    a = single(*one, x, labels)
    b = multi(*many, x, labels)
    diff = max(float(np.max(np.abs(np.asarray(p[k]) - np.asarray(q[k])))) for p, q in zip(a[1], b[1]) for k in p)
    return (f"mlp_train_step_b{batch}", batch, "rows", lambda: np.asarray(single(*one, x, labels)[0]),
            lambda: np.asarray(multi(*many, x, labels)[0]), diff)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", default="cuda:0,cuda:1", help="the replicas' devices, comma-separated")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--small", action="store_true", help="tiny sizes: a smoke test")
    parser.add_argument("--only", default=None, help="run the cases whose names contain this (minilm, train)")
    parser.add_argument("--out", default=None, help="write the figures as JSON")
    args = parser.parse_args(argv)
    devices = args.devices.split(",")
    rng = np.random.default_rng(0)
    rows = []
    print(f"replicas on {devices} against {devices[0]} alone, median of {args.reps} calls")
    for case in (minilm_case, train_case):
        if args.only and args.only not in case.__name__:
            continue
        name, items, unit, single, multi, diff = case(devices, args.small, rng)
        one, many = median_us(single, args.reps) / 1e6, median_us(multi, args.reps) / 1e6
        rows.append({"case": name, "one_device_per_s": items / one, "replicated_per_s": items / many,
                     "speedup": one / many, "max_abs_diff": diff})
        print(f"  {name:28s} one device {items / one:12.1f} {unit}/s   {len(devices)} replicas "
              f"{items / many:12.1f} {unit}/s   {one / many:5.2f}x   (results differ by {diff:.2e})", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"devices": devices, "reps": args.reps, "small": args.small, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
