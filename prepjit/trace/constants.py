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


def capture_key(fn, static_values) -> tuple:
    """The identity, dtype and shape of every NumPy array `fn` can reach without being called: its closure
    cells, the globals its code names, and the attributes of static arguments (`self`); part of the signature."""
    found = []
    seen_fns = set()
    root_globals = getattr(getattr(fn, "__func__", fn), "__globals__", None)

    def scan_fn(f):
        f = getattr(f, "__func__", f)
        code = getattr(f, "__code__", None)
        if code is None or id(f) in seen_fns or seen_fns and f.__globals__ is not root_globals:
            return  # (helpers of other modules, such as prepjit's or NumPy's own, are not followed)
        seen_fns.add(id(f))
        for cell in f.__closure__ or ():
            try:
                scan_value(cell.cell_contents)
            except ValueError:  # an empty cell
                pass
        g = getattr(f, "__globals__", {})
        for name in code.co_names:
            if name in g:
                scan_value(g[name])

    def scan_value(v):
        if type(v) is np.ndarray:
            found.append((id(v), v.dtype.str, v.shape))
        elif callable(v) and hasattr(getattr(v, "__func__", v), "__code__") and not isinstance(v, type):
            scan_fn(v)

    scan_fn(fn)
    for v in static_values:
        attrs = getattr(v, "__dict__", None)
        if isinstance(attrs, dict) and not isinstance(v, type):
            for a in attrs.values():
                if type(a) is np.ndarray:
                    found.append((id(a), a.dtype.str, a.shape))
    return tuple(found)
