"""pj.vmap: map a function over a batch axis of its arguments (tracing/batching.py), traced or eager.

Inside a traced function (a prepared function's body, a loop body, another vmap) the batched computation is
traced into the same graph, so it is part of the plan and replays on new batch sizes (a var dim). Called on
NumPy arguments, the mapped function is prepared (one plan per signature, kept by the mapped function), run,
and returns pj.Arrays.
"""
from __future__ import annotations

import types

from ..jit.function import PreparedFunction
from ..tracing import batching
from ..tracing.constants import _active as _capture_state
from ..tracing.pytree import flatten
from ..tracing.tracer import Tracer


class _Mapped:
    """A mapped function (a plain object, not a closure, so that the arrays `fun` reads are found and key the
    eager plan as they do for a prepared function)."""

    def __init__(self, fun, in_axes, out_axes):
        self.fun, self.in_axes, self.out_axes = fun, in_axes, out_axes
        self.prepared = None
        self.__name__ = f"vmap({getattr(fun, '__name__', 'f')})"
        self.__doc__ = getattr(fun, "__doc__", None)

    def __call__(self, *args, **kwargs):
        if kwargs:
            raise TypeError(f"{self.__name__} takes positional arguments only (in_axes refers to them)")
        leaves, _, _ = flatten(args)
        if getattr(_capture_state, "captured", None) is None and not any(isinstance(x, Tracer) for x in leaves):
            if self.prepared is None:
                self.prepared = PreparedFunction(_runner(self, self.fun))
            return self.prepared(*args)
        return batching.vmap(self.fun, args, self.in_axes, self.out_axes)


def _runner(mapped, fun):
    """`mapped` as a function to prepare, its globals those of `fun` (so the arrays it reads are found)."""
    def run(*args):
        return mapped(*args)
    globals_ = getattr(fun, "__globals__", None)
    if globals_ is None:
        return run
    return types.FunctionType(run.__code__, globals_, getattr(fun, "__name__", "f"), None, run.__closure__)


def vmap(fun, in_axes=0, out_axes=0):
    """`fun` mapped over an axis of its positional arguments, as jax.vmap: `in_axes` is an int (the axis of
    every argument), None (not mapped), or a tuple/list/dict prefix of the arguments' structure of those;
    `out_axes` the same for the results (where the batch axis goes). The mapped sizes must agree; the size may
    be a var dim. Nested vmaps compose, and so do vmap and pj.prepare, pj.grad and the loops."""
    return _Mapped(fun, in_axes, out_axes)
