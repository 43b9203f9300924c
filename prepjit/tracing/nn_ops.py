"""Neural-network helpers on traced arrays (re-exported as `prepjit.nn`): activations, softmax, logsumexp."""
from __future__ import annotations

import math

from .numpy_math import (add, erf, exp, isfinite, log, maximum, multiply, negative, reciprocal, subtract, tanh,
                         true_divide, where)
from .numpy_reduce import max, sum
from .numpy_shape import squeeze
from .prims import normalize_axes, to_tracer
from .tracer import Tracer


def relu(x) -> Tracer:
    x = to_tracer(x)
    return maximum(x, 0)


def sigmoid(x) -> Tracer:
    """1 / (1 + exp(-x))."""
    return reciprocal(add(exp(negative(to_tracer(x))), 1))


def silu(x) -> Tracer:
    x = to_tracer(x)
    return multiply(x, sigmoid(x))


def gelu(x, approximate: bool = True) -> Tracer:
    """GELU as in JAX: the tanh approximation by default, the exact erf form with approximate=False."""
    x = to_tracer(x)
    if approximate:
        inner = multiply(math.sqrt(2 / math.pi), add(x, multiply(0.044715, multiply(x, multiply(x, x)))))
        return multiply(multiply(x, 0.5), add(tanh(inner), 1))
    return multiply(multiply(x, 0.5), add(erf(multiply(x, 1 / math.sqrt(2))), 1))


def _stable_max(x: Tracer, axis) -> Tracer:
    """The max along `axis` (kept dims), 0 where it is not finite, so shifting by it never makes NaN from inf - inf."""
    m = max(x, axis=axis, keepdims=True)
    return where(isfinite(m), m, 0)


def softmax(x, axis=-1) -> Tracer:
    x = to_tracer(x)
    e = exp(subtract(x, _stable_max(x, axis)))
    return true_divide(e, sum(e, axis=axis, keepdims=True))


def log_softmax(x, axis=-1) -> Tracer:
    x = to_tracer(x)
    shifted = subtract(x, _stable_max(x, axis))
    return subtract(shifted, log(sum(exp(shifted), axis=axis, keepdims=True)))


def logsumexp(x, axis=None, keepdims: bool = False) -> Tracer:
    """log(sum(exp(x))) computed stably, like scipy.special.logsumexp."""
    x = to_tracer(x)
    m = _stable_max(x, axis)
    out = add(log(sum(exp(subtract(x, m)), axis=axis, keepdims=True)), m)
    return out if keepdims else squeeze(out, normalize_axes(axis, x.ndim))


__all__ = ["relu", "sigmoid", "silu", "gelu", "softmax", "log_softmax", "logsumexp"]
