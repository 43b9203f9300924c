"""Training the MLP classifier of mlp.py: softmax cross-entropy, SGD and Adam, written against a NumPy-like
namespace `xp` (prepjit.numpy inside a prepared step, NumPy for the reference), and the cross-entropy's gradient
written out by hand in NumPy, the reference a prepared `pj.value_and_grad` step is checked against.

Parameters are mlp.py's: a list of {"w": (in, out), "b": (out,)} per layer. Labels are integer class ids.
"""
from __future__ import annotations

import numpy as np

from . import mlp
from .common import cast


def init_params(key, sizes) -> list[dict]:
    """He-initialised weights drawn with pj.random (one key per layer, split from `key`) and zero biases."""
    import prepjit as pj
    keys = pj.random.split(key, len(sizes) - 1)
    return [{"w": pj.random.normal(k, (i, o)) * np.float32(np.sqrt(2.0 / i)), "b": np.zeros(o, np.float32)}
            for k, i, o in zip(keys, sizes, sizes[1:])]


def logits(xp, params, x):
    return mlp.hidden(xp, params, x) @ params[-1]["w"] + params[-1]["b"]


def _log_softmax(xp, z):
    shifted = z - xp.max(z, axis=1, keepdims=True)
    return shifted - xp.log(xp.sum(xp.exp(shifted), axis=1, keepdims=True))


def one_hot(xp, labels, classes: int, dtype):
    return (labels[:, None] == xp.arange(classes)[None, :]).astype(dtype)


def loss(xp, params, x, labels):
    """Mean softmax cross-entropy of the batch (any batch size: the mean divides by the live size), in float32 whatever
    dtype the logits are computed in."""
    z = cast(logits(xp, params, x), np.float32)
    return -xp.sum(one_hot(xp, labels, z.shape[1], z.dtype) * _log_softmax(xp, z)) / x.shape[0]


def correct(xp, params, x, labels):
    """How many of the batch's predictions are right (an int)."""
    return xp.sum(xp.argmax(logits(xp, params, x), axis=1) == labels)


def numpy_value_and_grad(params, x, labels):
    """loss(np, ...) and its gradient by hand (backpropagation through ReLU layers and softmax cross-entropy)."""
    inputs, pre = [x], []
    h = x
    for layer in params[:-1]:
        z = h @ layer["w"] + layer["b"]
        pre.append(z)
        h = np.maximum(z, 0)
        inputs.append(h)
    z = h @ params[-1]["w"] + params[-1]["b"]
    logp = _log_softmax(np, z)
    target = one_hot(np, labels, z.shape[1], z.dtype)
    n = x.shape[0]
    value = -np.sum(target * logp) / n
    delta = (np.exp(logp) - target) / np.float32(n)
    grads = [None] * len(params)
    for i in reversed(range(len(params))):
        grads[i] = {"w": inputs[i].T @ delta, "b": delta.sum(axis=0)}
        if i:
            delta = (delta @ params[i]["w"].T) * (pre[i - 1] > 0)
    return value, grads


def tree_map(fn, *trees):
    """`fn` applied leaf by leaf to parameter-shaped trees (lists of dicts of arrays)."""
    return [{k: fn(*(t[i][k] for t in trees)) for k in layer} for i, layer in enumerate(trees[0])]


def sgd(xp, params, grads, lr: float):
    return tree_map(lambda p, g: p - lr * g, params, grads)


def adam_init(params) -> dict:
    zeros = tree_map(np.zeros_like, params)
    return {"m": zeros, "v": tree_map(np.zeros_like, params), "b1t": np.ones((), np.float32),
            "b2t": np.ones((), np.float32)}


def adam(xp, params, grads, state, lr: float, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8):
    """One Adam step (Kingma & Ba): the moments, their bias corrections b1**t and b2**t carried in the state."""
    b1t, b2t = state["b1t"] * b1, state["b2t"] * b2
    m = tree_map(lambda m, g: b1 * m + (1 - b1) * g, state["m"], grads)
    v = tree_map(lambda v, g: b2 * v + (1 - b2) * (g * g), state["v"], grads)
    new = tree_map(lambda p, m, v: p - lr * (m / (1 - b1t)) / (xp.sqrt(v / (1 - b2t)) + eps), params, m, v)
    return new, {"m": m, "v": v, "b1t": b1t, "b2t": b2t}


def clusters(key, n: int, centres) -> tuple[np.ndarray, np.ndarray]:
    """n points around the class centres (classes, features) and their labels, drawn with pj.random."""
    import prepjit as pj
    k_labels, k_noise = pj.random.split(key)
    labels = pj.random.randint(k_labels, (n,), 0, len(centres))
    return centres[labels] + pj.random.normal(k_noise, (n, centres.shape[1])), labels.astype(np.int64)
