"""Collectives inside a traced function: `pj.psum`, `pj.pmean`, `pj.all_gather`, `pj.device_index`.

They talk across the replicas of a multi-device prepare (`pj.prepare(..., devices=[...])`, multi_device.py).
While such a function traces, a `ReplicaAxis` is active on the thread: each collective records what it reads
and returns a placeholder (an INPUT leaf numbered from PLACEHOLDER_BASE up) that stands for its result.
replicas.py then cuts the graph at those placeholders into stages; the collective runs between its stages
(runtime/collectives.py on the host, runtime/nccl.py on CUDA). `device_index()` is one more placeholder, an
int32 the call gives each replica.

Outside a multi-device prepare a collective raises TraceError: there is no axis to reduce over (JAX raises
"unbound axis name" likewise). With a single device the axis has size 1 and they are the identity (psum,
pmean) or add a leading axis of 1 (all_gather), as in JAX.
"""
from __future__ import annotations

import contextlib
import itertools
import threading

import attrs

from ..errors import TraceError
from ..uop import Ops, UOp, dtypes
from . import prims
from .tracer import Tracer

PLACEHOLDER_BASE = 1 << 40  # INPUT numbers of collective results: far above any argument's


@attrs.frozen
class Collective:
    kind: str      # "psum" | "all_gather" (stacked along a new leading axis, in replica order)
    source: UOp    # the value each replica contributes
    result: UOp    # its placeholder (INPUT leaf)


@attrs.define
class ReplicaAxis:
    """The replica axis a multi-device function traces under: its size (every replica of the job) and what
    the trace asked for."""

    size: int
    collectives: list = attrs.field(factory=list)
    index: UOp | None = None  # device_index()'s placeholder, once asked for
    _numbers: object = attrs.field(factory=lambda: itertools.count(PLACEHOLDER_BASE))

    def placeholder(self, dtype, shape) -> UOp:
        return UOp(Ops.INPUT, dtype, (), (next(self._numbers), tuple(shape)))


_state = threading.local()  # .axis: the ReplicaAxis of the trace running on this thread


@contextlib.contextmanager
def replica_axis(size: int):
    """Trace under a replica axis of `size` replicas; yields the ReplicaAxis recording the collectives."""
    outer = getattr(_state, "axis", None)
    _state.axis = axis = ReplicaAxis(size)
    try:
        yield axis
    finally:
        _state.axis = outer


def _axis(name: str) -> ReplicaAxis:
    axis = getattr(_state, "axis", None)
    if axis is None:
        raise TraceError(f"pj.{name} talks across the replicas of a multi-device prepared function, and is called "
                         "outside one: prepare the function with devices=[...] (devices=['cpu'] gives one replica, "
                         "where it is the identity)")
    return axis


def _tree_map(fn, tree):
    if isinstance(tree, (list, tuple)) and not isinstance(tree, Tracer):
        mapped = [_tree_map(fn, t) for t in tree]
        return type(tree)(*mapped) if hasattr(tree, "_fields") else type(tree)(mapped)
    if isinstance(tree, dict):
        return {k: _tree_map(fn, v) for k, v in tree.items()}
    return fn(tree)


def _record(name: str, kind: str, x, shape_of) -> Tracer:
    axis = _axis(name)
    t = prims.to_tracer(x)
    if t.weak:  # a Python scalar or var: a 0-d array of its default dtype
        t = prims.cast(Tracer(t.uop), t.dtype)
    if kind == "psum" and t.dtype == dtypes.bool:
        raise TraceError(f"pj.{name} of a bool array: cast it first (x.astype(pnp.int32))")
    result = axis.placeholder(t.dtype, shape_of(tuple(t.uop.shape), axis.size))
    axis.collectives.append(Collective(kind, t.uop, result))
    return Tracer(result)


def psum(x, axis_name=None):
    """The sum of `x` over every replica (a pytree of arrays too), the same on each; `axis_name` is accepted
    for JAX's spelling and ignored (there is one replica axis). Summed in replica order, in x's dtype."""
    return _tree_map(lambda v: _record("psum", "psum", v, lambda s, n: s), x)


def pmean(x, axis_name=None):
    """psum(x) / the number of replicas (a pytree too). With an uneven split this is the mean of the replicas'
    values, not of the rows: weight by each replica's row count for that (docs/devices.md)."""
    def one(v):
        total = _record("pmean", "psum", v, lambda s, n: s)
        return total / _axis("pmean").size
    return _tree_map(one, x)


def all_gather(x, axis_name=None, *, axis: int = 0, tiled: bool = False):
    """Every replica's `x`, in replica order, stacked along a new axis `axis` (JAX's default), or with
    `tiled=True` concatenated along the existing axis `axis`. Every replica must give the same shape."""
    from . import numpy_api as pnp

    def one(v):
        t = prims.to_tracer(v)
        ndim = len(t.uop.shape)
        if not (-ndim - (not tiled) <= axis < ndim + (not tiled)) or tiled and ndim == 0:
            raise TraceError(f"pj.all_gather: axis {axis} is out of range for an array of {ndim} dims"
                             f"{' (tiled)' if tiled else ''}")
        stacked = _record("all_gather", "all_gather", t, lambda s, n: (n, *s))  # (replicas, *x.shape)
        if not tiled:
            return pnp.moveaxis(stacked, 0, axis % (ndim + 1))
        k = axis % ndim
        moved = pnp.moveaxis(stacked, 0, k)  # (..., replicas, x.shape[k], ...) -> merge the two
        shape = stacked.shape[1:]
        return pnp.reshape(moved, (*shape[:k], shape[k] * _axis("all_gather").size, *shape[k + 1:]))
    return _tree_map(one, x)


def device_index(axis_name=None) -> Tracer:
    """This replica's index in the job (0 .. replicas - 1, in the order of `devices`, then of processes), an
    int32 scalar (JAX's lax.axis_index)."""
    axis = _axis("device_index")
    if axis.index is None:
        axis.index = axis.placeholder(dtypes.int32, ())
    return Tracer(axis.index)

