"""Training-step cases: one SGD step of the MLP benchmark model (x @ w1 + b1, ReLU, @ w2 + b2; softmax
cross-entropy over its outputs): forward, backward and update.

prepjit runs it as one prepared function with a symbolic batch (`pj.value_and_grad` inside); NumPy with the
gradient written out by hand (examples/models/mlp_train.py, the reference every result is checked against);
JAX as `jax.jit` of `value_and_grad` plus the update; torch eager with autograd (`loss.backward()`) and the
update under `no_grad`, on its default CPU threads. Every peer gets the same NumPy arrays and returns the loss
and the updated weights as NumPy arrays.
"""
from __future__ import annotations

import numpy as np

from examples.models import mlp_train

from .case import Case

LR = 0.05


def _params(w1, b1, w2, b2):
    return [{"w": w1, "b": b1}, {"w": w2, "b": b2}]


def train_step(xp, x, labels, w1, b1, w2, b2):
    """(loss, w1, b1, w2, b2) after one SGD step; NumPy by the hand-written gradient, prepjit by pj.value_and_grad."""
    params = _params(w1, b1, w2, b2)
    if xp is np:
        value, grads = mlp_train.numpy_value_and_grad(params, x, labels)
    else:
        import prepjit as pj
        value, grads = pj.value_and_grad(lambda p: mlp_train.loss(xp, p, x, labels))(params)
    new = mlp_train.sgd(xp, params, grads, LR)
    return value, new[0]["w"], new[0]["b"], new[1]["w"], new[1]["b"]


def _inputs(rng, smoke):
    n, d, h = (6, 8, 16) if smoke else (256, 512, 1024)
    f32 = np.float32
    return [rng.standard_normal((n, d)).astype(f32), rng.integers(0, d, n).astype(np.int64),
            (rng.standard_normal((d, h)) / np.sqrt(d)).astype(f32), np.zeros(h, f32),
            (rng.standard_normal((h, d)) / np.sqrt(h)).astype(f32), np.zeros(d, f32)]


def _jax_step(arrays):
    import jax
    import jax.numpy as jnp
    value_and_grad = jax.value_and_grad(lambda p, x, labels: mlp_train.loss(jnp, p, x, labels))

    @jax.jit
    def step(x, labels, w1, b1, w2, b2):
        params = _params(w1, b1, w2, b2)
        value, grads = value_and_grad(params, x, labels)
        new = mlp_train.sgd(jnp, params, grads, LR)
        return value, new[0]["w"], new[0]["b"], new[1]["w"], new[1]["b"]

    def call(*args):
        return [np.asarray(o) for o in step(*args)]
    return call


def _torch_step(arrays):
    import torch

    def call(x, labels, *weights):
        w1, b1, w2, b2 = (torch.from_numpy(w).requires_grad_() for w in weights)
        logits = torch.relu(torch.from_numpy(x) @ w1 + b1) @ w2 + b2
        loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(labels))
        loss.backward()
        with torch.no_grad():
            new = [(w - LR * w.grad).numpy() for w in (w1, b1, w2, b2)]
        return [loss.detach().numpy()] + new
    return call


TRAIN_CASES = (
    Case("train_step_mlp_symbolic_batch", train_step, _inputs,
         prepare_kwargs={"vars": {"n": (1, 1024)}, "shapes": {"x": ("n", None), "labels": ("n",)}},
         goal=("torch", 1.0), rtol=1e-3, atol=1e-5, peers=("numpy",),
         peer_fns={"jax": _jax_step, "torch": _torch_step}),
)
