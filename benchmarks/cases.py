"""The benchmark cases: what each computes, its inputs at full and smoke size, and the goal it tracks.

A case's `fn(xp, *arrays)` is written once against a NumPy-like namespace `xp` (prepjit.numpy,
numpy, jax.numpy, or the torch/tinygrad adapters in peers.py), so every framework runs the same
computation. `goal` is (peer, the largest allowed prepjit/peer time ratio) where the issue sets one.
The training step (train_cases.py), the example models' cases (model_cases.py), the matvecs over quantized
weights (quant_cases.py) and the models in 16-bit floats against llama.cpp (low_precision_models.py) join them in
CASES.
"""
from __future__ import annotations

import numpy as np

from .case import Case
from .low_precision_cases import LOW_PRECISION_CASES
from .low_precision_models import LOW_PRECISION_MODEL_CASES
from .model_cases import MODEL_CASES
from .quant_cases import QUANT_CASES
from .serving_cases import ENGINE_CASES
from .serving_load import SERVING_CASES
from .train_cases import TRAIN_CASES


def _f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def elementwise_small(xp, a, b):
    return a * b + 1


def reduction_chain(xp, a, b):
    for _ in range(10):
        a = a - xp.sum(a) * 0.01 + b
    return a


def fused_elementwise(xp, a, b, c):
    return (a * b + c * 2 - 1) * 0.5


def row_sum(xp, x):
    return xp.sum(x, axis=1)


def softmax(xp, x):
    e = xp.exp(x - xp.max(x, axis=1, keepdims=True))
    return e / xp.sum(e, axis=1, keepdims=True)


def layernorm(xp, x, gain, bias):
    mean = xp.mean(x, axis=1, keepdims=True)
    centered = x - mean
    var = xp.mean(centered * centered, axis=1, keepdims=True)
    return centered / xp.sqrt(var + 1e-5) * gain + bias


def matmul(xp, a, b):
    return a @ b


def mlp(xp, x, w1, b1, w2, b2):
    return xp.maximum(x @ w1 + b1, 0) @ w2 + b2


def model(xp, x, w1, w2, w3, w4):
    """A mid-size model for prepare time: four layers with layernorm, tanh and a softmax head."""
    h = x
    for w in (w1, w2, w3):
        h = h @ w
        mean = xp.mean(h, axis=1, keepdims=True)
        h = xp.tanh((h - mean) / xp.sqrt(xp.mean((h - mean) * (h - mean), axis=1, keepdims=True) + 1e-5))
    return softmax(xp, h @ w4)


def sort_values(xp, x):
    return xp.sort(x)


def weight_chain(xp, x, *weights):
    """x through many small weight arrays: a replay whose cost is reaching its inputs."""
    for w in weights:
        x = x * w + 1
    return x


class _Weights:
    """A model object holding its weight arrays as attributes."""

    def __init__(self, arrays):
        for i, a in enumerate(arrays):
            setattr(self, f"w{i}", a)


def _weights_in_closure(arrays):
    """weight_chain with its weights read from an object the function closes over (captured arrays,
    tracing/constants.py), x the only argument; the "prepjit-args" peer passes the same weights as arguments."""
    import prepjit as pj
    import prepjit.numpy as pnp
    model = _Weights(arrays[1:])

    def weights_in_closure(x):
        return weight_chain(pnp, x, *vars(model).values())
    return pj.prepare(weights_in_closure), arrays[:1]


def _weights_as_arguments(arrays):
    """weight_chain with x and the weights (one list) as arguments, called as `call(*arrays)`."""
    import prepjit as pj
    import prepjit.numpy as pnp
    prepared = pj.prepare(lambda x, weights: weight_chain(pnp, x, *weights))
    return lambda x, *weights: prepared(x, weights)


def _bytes(*arrays_extra):
    def work(arrays):
        return sum(a.nbytes for a in arrays) + sum(arrays[i].nbytes for i in arrays_extra), "GB/s"
    return work


def _matmul_flops(arrays):
    a, b = arrays[:2]
    return 2 * a.shape[0] * a.shape[1] * b.shape[1], "GFLOP/s"


def _matmul_case(n: int) -> Case:
    """matmul_1024's goal: at least 0.8x the GFLOP/s of NumPy's own BLAS kernel (benchmarks run unpinned: blas.py)."""
    return Case(f"matmul_{n}", matmul,
                lambda rng, smoke, n=n: [_f32(rng, 8, 8), _f32(rng, 8, 8)] if smoke else [_f32(rng, n, n), _f32(rng, n, n)],
                work=_matmul_flops, goal=("numpy", 1.25) if n == 1024 else None, rtol=1e-3, atol=1e-3)


def _mlp_inputs(rng, smoke):
    n, d, h = (4, 8, 16) if smoke else (256, 512, 1024)
    return [_f32(rng, n, d), _f32(rng, d, h) / np.float32(np.sqrt(d)), _f32(rng, h), _f32(rng, h, d) / np.float32(np.sqrt(h)),
            _f32(rng, d)]


def _model_inputs(rng, smoke):
    n, d = (4, 8) if smoke else (64, 256)
    return [_f32(rng, n, d)] + [_f32(rng, d, d) / np.float32(np.sqrt(d)) for _ in range(4)]


KERNEL_CASES = (
    Case("replay_elementwise_16", elementwise_small, lambda rng, smoke: [_f32(rng, 16), _f32(rng, 16)],
         goal=("jax", 0.5)),
    Case("replay_closure_25_weights", weight_chain,
         lambda rng, smoke: [_f32(rng, 16)] + [rng.uniform(0.5, 1.5, 16).astype(np.float32) for _ in range(25)],
         prepjit=_weights_in_closure, peers=(), peer_fns={"prepjit-args": _weights_as_arguments},
         goal=("prepjit-args", 1.1), rtol=1e-4),
    Case("replay_reduction_chain_10", reduction_chain, lambda rng, smoke: [_f32(rng, 16), _f32(rng, 16)],
         goal=("jax", 0.3), rtol=1e-4),
    Case("fused_elementwise_16M", fused_elementwise,
         lambda rng, smoke: [_f32(rng, 1 << (10 if smoke else 24)) for _ in range(3)],
         work=_bytes(0), goal=("numpy", 0.2)),
    Case("row_sum_4096x4096", row_sum, lambda rng, smoke: [_f32(rng, *((8, 8) if smoke else (4096, 4096)))],
         work=_bytes(), goal=("numpy", 1.5), rtol=1e-4, atol=1e-3),
    Case("softmax_2048x1024", softmax, lambda rng, smoke: [_f32(rng, *((8, 8) if smoke else (2048, 1024)))],
         work=_bytes(0), goal=("numpy", 1.5), rtol=1e-4, atol=1e-6),
    Case("layernorm_2048x1024", layernorm,
         lambda rng, smoke: [_f32(rng, *((8, 8) if smoke else (2048, 1024))), _f32(rng, 8 if smoke else 1024),
                             _f32(rng, 8 if smoke else 1024)],
         work=_bytes(0), goal=("numpy", 1.5), rtol=1e-4, atol=1e-4),
    _matmul_case(128),
    _matmul_case(512),
    _matmul_case(1024),
    # decode-step matrix-vector products (codegen/matvec.py): the tied-embedding head, weight rows along the
    # reduction, and a feed-forward projection, weight rows along the outputs; bound by memory bandwidth
    Case("matvec_head_49152x576", matmul,
         lambda rng, smoke: [_f32(rng, *((40, 24) if smoke else (49152, 576))), _f32(rng, 24 if smoke else 576)],
         work=_bytes(), rtol=1e-4, atol=1e-3),
    Case("matvec_576x3072", matmul,
         lambda rng, smoke: [_f32(rng, 24 if smoke else 576), _f32(rng, *((24, 64) if smoke else (576, 3072)))],
         work=_bytes(), rtol=1e-4, atol=1e-3),
    Case("sort_49152", sort_values, lambda rng, smoke: [_f32(rng, 64 if smoke else 49152)], peers=("numpy", "jax"),
         smoke=False),
    Case("mlp_forward_symbolic_batch", mlp, _mlp_inputs,
         prepare_kwargs={"vars": {"n": (1, 1024)}, "shapes": {"x": ("n", None)}}, rtol=1e-3, atol=1e-3),
    Case("mlp_forward_static_batch", mlp, _mlp_inputs, rtol=1e-3, atol=1e-3),
    Case("prepare_time_model", model, _model_inputs, kind="prepare", rtol=1e-3, atol=1e-4),
)

CASES = KERNEL_CASES + LOW_PRECISION_CASES + QUANT_CASES + TRAIN_CASES + MODEL_CASES + LOW_PRECISION_MODEL_CASES + SERVING_CASES + \
    ENGINE_CASES
