"""An MLP classifier: dense layers with ReLU, a softmax head; `forward(xp, params, x)` -> class probabilities."""
from __future__ import annotations

import functools

import numpy as np


def init_params(rng, sizes=(64, 256, 256, 10)) -> list[dict]:
    """He-initialised weights (in, out) and zero biases for each consecutive pair of sizes."""
    return [{"w": (rng.standard_normal((i, o)) * np.sqrt(2.0 / i)).astype(np.float32), "b": np.zeros(o, np.float32)}
            for i, o in zip(sizes, sizes[1:])]


def forward(xp, params, x):
    """x (batch, features) -> probabilities (batch, classes)."""
    h = x
    for layer in params[:-1]:
        h = xp.maximum(h @ layer["w"] + layer["b"], 0)
    logits = h @ params[-1]["w"] + params[-1]["b"]
    e = xp.exp(logits - xp.max(logits, axis=1, keepdims=True))
    return e / xp.sum(e, axis=1, keepdims=True)


def synthetic_data(rng, n: int, features: int, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """n points around `classes` random centres in `features` dims, and their labels."""
    centres = rng.standard_normal((classes, features)).astype(np.float32) * 2
    labels = rng.integers(0, classes, n)
    return (centres[labels] + rng.standard_normal((n, features)).astype(np.float32)), labels


def prepared_forward(max_batch: int, device: str | None = None):
    """`forward` prepared with a symbolic batch `n`."""
    import prepjit as pj
    import prepjit.numpy as pnp
    fn = functools.partial(forward, pnp)
    fn.__name__ = "mlp_forward"
    kwargs = {} if device is None else {"device": device}
    return pj.prepare(fn, vars={"n": (1, max_batch)}, shapes={"x": ("n", None)}, **kwargs)
