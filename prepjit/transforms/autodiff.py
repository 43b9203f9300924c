"""pj.grad, pj.value_and_grad and pj.vjp: reverse-mode autodiff, traced (tracing/autodiff.py) or eager.

Inside a traced function (a prepared function's body, a loop body) they trace the backward pass into the same
graph, so the gradient is part of the plan and replays on new shapes. Called on NumPy arguments they prepare a
function computing the same (one plan per signature, kept by the transformed function), run it and return
pj.Arrays.
"""
from __future__ import annotations

import functools
import types

import numpy as np

from ..jit.function import PreparedFunction
from ..tracing import autodiff as traced
from ..tracing.pytree import flatten
from ..tracing.tracer import Tracer


def _traced_call(args, kwargs) -> bool:
    """Whether a transformed function is called on traced values (or inside a trace, on constants)."""
    leaves, _, _ = flatten((args, kwargs))
    return traced.in_trace() or any(isinstance(x, Tracer) for x in leaves)


class _Transformed:
    """A transformed function: callable on traced values, and eagerly on NumPy values through a prepared
    function built on first eager use. Users get it as a function (`_as_function`)."""

    def __init__(self, fun, argnums, has_aux: bool, with_value: bool):
        self.fun, self.argnums, self.has_aux, self.with_value = fun, argnums, has_aux, with_value
        self.prepared = None

    def __call__(self, *args, **kwargs):
        if not _traced_call(args, kwargs):
            return self._eager(args, kwargs)
        (value, aux), grads = traced.value_and_grad(self.fun, args, kwargs, self.argnums, self.has_aux)
        if self.with_value:
            return ((value, aux) if self.has_aux else value), grads
        return (grads, aux) if self.has_aux else grads

    def _eager(self, args, kwargs):
        if self.prepared is None:
            self.prepared = PreparedFunction(_as_function(self, self.fun))
        nums = (self.argnums,) if isinstance(self.argnums, int) else tuple(self.argnums)
        diff = {i % len(args) for i in nums if isinstance(i, int) and -len(args) <= i < len(args)}
        args = tuple(_as_array_leaves(a) if i in diff else a for i, a in enumerate(args))
        return self.prepared(*args, **kwargs)


def _as_array_leaves(tree):
    """A differentiated argument's Python-number leaves as float64 0-d arrays (prepared functions take Python
    numbers as static values, which have no gradient; a Python int too: as an int64 array its gradient would be
    the integers' zeros, so pj.grad(f)(3) would silently give 0)."""
    leaves, _, treedef = flatten(tree)
    return treedef.unflatten([np.asarray(x, np.float64) if isinstance(x, (int, float)) and not isinstance(x, bool)
                              else x for x in leaves])


def _as_function(call, fun, same_signature: bool = True):
    """`call` as a plain function with the globals of `fun` (and, with `same_signature`, its name and signature,
    through `__wrapped__`): pj.prepare reads the parameters (for `shapes`) off it, and its search for the arrays
    a function reads (closures, globals, same-module helpers: tracing/constants.py) follows `fun` as if the user
    had prepared `fun` itself."""
    def run(*args, **kwargs):
        return call(*args, **kwargs)
    globals_ = getattr(fun, "__globals__", None)
    if globals_ is not None:
        run = types.FunctionType(run.__code__, globals_, run.__name__, None, run.__closure__)
    return functools.update_wrapper(run, fun, updated=()) if same_signature else run


def grad(fun, argnums=0, has_aux: bool = False):
    """The gradient of `fun` (one real scalar output) with respect to its positional argument(s) `argnums`, like
    jax.grad: `pj.grad(f)(x)` has the structure of x (a tuple of such for a tuple `argnums`); with has_aux, `fun`
    returns (output, aux) and the call returns (grads, aux). Integer and bool inputs get zeros of their own dtype.
    Works on traced values inside prepared functions and eagerly on NumPy arrays."""
    return _transformed(fun, argnums, has_aux, with_value=False)


def value_and_grad(fun, argnums=0, has_aux: bool = False):
    """Like pj.grad, returning (value, grads), or ((value, aux), grads) with has_aux, as jax.value_and_grad."""
    return _transformed(fun, argnums, has_aux, with_value=True)


def _transformed(fun, argnums, has_aux: bool, with_value: bool):
    """The transformed function, one per function and options: kept in `fun`'s own attributes where it has them,
    so that `pj.grad(loss)(w)` written inside a Python loop prepares once for its eager calls (the cache lives
    and dies with `fun`)."""
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums) if isinstance(argnums, (tuple, list)) else None
    if nums is None or not all(isinstance(n, int) and not isinstance(n, bool) for n in nums):
        raise TypeError(f"argnums must be an int or a tuple of ints, got {type(argnums).__name__} {argnums!r}")
    key = (argnums if isinstance(argnums, int) else nums, bool(has_aux), with_value)
    attributes = getattr(fun, "__dict__", None)
    cache = attributes.setdefault("_prepjit_transformed", {}) if isinstance(attributes, dict) else {}
    if key not in cache:
        cache[key] = _as_function(_Transformed(fun, argnums, has_aux, with_value), fun)
    return cache[key]


def vjp(fun, *primals, has_aux: bool = False):
    """(outputs, f_vjp) as jax.vjp ((outputs, f_vjp, aux) with has_aux): f_vjp(cotangent), the cotangent shaped as
    the outputs, returns a tuple with one cotangent per primal. Eagerly (NumPy primals) the outputs and each
    f_vjp call run prepared functions."""
    if _traced_call(primals, {}):
        return traced.vjp(fun, *primals, has_aux=has_aux)
    forward = PreparedFunction(fun)  # per call: the kernels come from the kernel cache, the trace runs again
    backward = PreparedFunction(_as_function(_Backward(fun, has_aux), fun, same_signature=False))
    primals = tuple(_as_array_leaves(p) for p in primals)
    result = forward(*primals)

    def f_vjp(ct):
        return backward(primals, ct)
    return (result[0], f_vjp, result[1]) if has_aux else (result, f_vjp)


class _Backward:
    def __init__(self, fun, has_aux: bool):
        self.fun, self.has_aux = fun, has_aux

    def __call__(self, primals, ct):
        return traced.vjp(self.fun, *primals, has_aux=self.has_aux)[1](ct)
