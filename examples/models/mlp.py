"""An MLP classifier: dense layers with ReLU, a softmax head; `forward(xp, params, x)` -> class probabilities.
Synthetic data: Gaussian clusters, one per class, and an output layer fitted to them by least squares."""
from __future__ import annotations

import functools

import numpy as np


def init_params(rng, sizes=(64, 256, 256, 10)) -> list[dict]:
    """He-initialised weights (in, out) and zero biases for each consecutive pair of sizes."""
    return [{"w": (rng.standard_normal((i, o)) * np.sqrt(2.0 / i)).astype(np.float32), "b": np.zeros(o, np.float32)}
            for i, o in zip(sizes, sizes[1:])]


def hidden(xp, params, x):
    """The ReLU layers' output for x (batch, features)."""
    for layer in params[:-1]:
        x = xp.maximum(x @ layer["w"] + layer["b"], 0)
    return x


def forward(xp, params, x):
    """x (batch, features) -> probabilities (batch, classes)."""
    logits = hidden(xp, params, x) @ params[-1]["w"] + params[-1]["b"]
    e = xp.exp(logits - xp.max(logits, axis=1, keepdims=True))
    return e / xp.sum(e, axis=1, keepdims=True)


def fit_output_layer(params, x, labels, classes: int, scale: float = 10.0) -> list[dict]:
    """The parameters with the output layer fitted by least squares (NumPy) to `scale` * one-hot labels on the
    random hidden features: a classifier without a training loop."""
    h = hidden(np, params, x)
    design = np.concatenate([h, np.ones((len(h), 1), h.dtype)], axis=1)
    solution = np.linalg.lstsq(design.astype(np.float64), scale * np.eye(classes)[labels], rcond=None)[0]
    return params[:-1] + [{"w": solution[:-1].astype(np.float32), "b": solution[-1].astype(np.float32)}]


def synthetic_data(rng, n: int, centres: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """n points around the class centres (classes, features), and their labels."""
    labels = rng.integers(0, len(centres), n)
    return centres[labels] + rng.standard_normal((n, centres.shape[1])).astype(np.float32), labels


def prepared_forward(max_batch: int, device: str | None = None):
    """`forward` prepared with a symbolic batch `n`."""
    import prepjit as pj
    import prepjit.numpy as pnp
    fn = functools.partial(forward, pnp)
    fn.__name__ = "mlp_forward"
    kwargs = {} if device is None else {"device": device}
    return pj.prepare(fn, vars={"n": (1, max_batch)}, shapes={"x": ("n", None)}, **kwargs)
