"""Captured arrays: a NumPy array a traced function reads from its closure, a global or `self.w` becomes a
constant of the plan.

As in JAX, the value is captured at trace time: the array is copied then, so mutating it afterwards does not
change what the prepared function computes. Each captured array is one more input of the traced graph (after
the arguments' inputs), which the prepared function feeds itself on every call (uploaded once per plan).
Whether the function still sees the same arrays is part of the call signature (`capture_key`): rebinding a
closure variable, a global or an attribute of a static argument to another array traces again.
"""
from __future__ import annotations

import contextlib
import threading
import types

import numpy as np

from ..errors import TraceError
from ..uop import Ops, UOp, to_dtype
from .tracer import Tracer

_active = threading.local()  # .captured: the running trace's _Captured, or None outside traces


class _Captured:
    def __init__(self, first_input: int):
        self.first_input = first_input
        self.by_id: dict[int, Tracer] = {}
        self.originals: list = []   # kept alive so their ids stay theirs while a plan keys on them
        self.values: list[np.ndarray] = []


@contextlib.contextmanager
def capturing(first_input: int):
    """Inside: arrays captured by the trace become INPUT nodes numbered from `first_input`."""
    outer = getattr(_active, "captured", None)
    _active.captured = captured = _Captured(first_input)
    try:
        yield captured
    finally:
        _active.captured = outer


def capture(x) -> Tracer:
    """The traced constant for array-like `x`, read (copied) now."""
    captured = getattr(_active, "captured", None)
    if captured is None:
        raise TraceError("a NumPy array can be used in a traced computation only while a prepared function traces")
    hit = captured.by_id.get(id(x))
    if hit is not None:
        return hit
    value = np.array(x, copy=True, order="C")
    if not value.dtype.isnative:  # kernels read native byte order
        value = value.astype(value.dtype.newbyteorder("="))
    try:
        dtype = to_dtype(value.dtype)
    except TypeError as e:
        raise TraceError(f"a captured array of dtype {value.dtype} cannot be traced: {e}") from None
    number = captured.first_input + len(captured.values)
    t = Tracer(UOp(Ops.INPUT, dtype, (), (number, tuple(value.shape))))
    captured.by_id[id(x)] = t
    captured.originals.append(x)
    captured.values.append(value)
    return t


def reachable_arrays(fn, static_values) -> list[np.ndarray]:
    """Every NumPy array `fn` can reach without being called: through its closure cells, the globals its code
    names and the static arguments (`self`), following helper functions of the same module, attributes,
    lists, tuples and dicts a few levels deep. Their identities, dtypes and shapes are part of the signature
    (`capture_key`); the prepared function keeps them alive so that an id is never reused while it keys a plan."""
    found: list = []
    seen: set = set()
    root_globals = getattr(getattr(fn, "__func__", fn), "__globals__", None)

    def scan_fn(f, depth: int):
        code = getattr(f, "__code__", None)
        if code is None or f.__globals__ is not root_globals and seen:
            return  # (helpers of other modules, such as prepjit's or NumPy's own, are not followed)
        for cell in f.__closure__ or ():
            try:
                scan(cell.cell_contents, depth)
            except ValueError:  # an empty cell
                pass
        g = f.__globals__
        for name in code.co_names:
            if name in g:
                scan(g[name], depth)

    def scan(v, depth: int):
        if type(v) is np.ndarray:
            found.append(v)
            return
        if depth > _SCAN_DEPTH or id(v) in seen or isinstance(v, _OPAQUE) or v is None:
            return
        seen.add(id(v))
        if isinstance(v, (list, tuple)):
            for x in v:
                scan(x, depth + 1)
        elif isinstance(v, dict):
            for x in v.values():
                scan(x, depth + 1)
        elif isinstance(v, (types.FunctionType, types.MethodType)):
            if isinstance(v, types.MethodType):
                scan(v.__self__, depth + 1)
            scan_fn(getattr(v, "__func__", v), depth + 1)
        elif isinstance(getattr(v, "__dict__", None), dict):
            for x in vars(v).values():
                scan(x, depth + 1)

    seen.add(id(fn))
    scan_fn(getattr(fn, "__func__", fn), 0)
    for v in static_values:
        scan(v, 0)
    return found


def capture_key(arrays: list[np.ndarray]) -> tuple:
    return tuple((id(a), a.dtype.str, a.shape) for a in arrays)


_SCAN_DEPTH = 3
_OPAQUE = (type, types.ModuleType, str, bytes, int, float, complex, bool, np.generic, Tracer, UOp)
