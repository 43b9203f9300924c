"""Captured arrays: a NumPy array a traced function reads from its closure, a global or `self.w` becomes a
constant of the plan.

As in JAX, the value is captured at trace time: the array is copied then, so mutating it afterwards does not
change what the prepared function computes. Each captured array is one more input of the traced graph (after
the arguments' inputs), which the prepared function feeds itself on every call (uploaded once per plan).
Whether the function still sees the same arrays is part of the call signature (`capture_key`): rebinding a
closure variable, a global or an attribute of a static argument to another array traces again. A replay on
the fast path (replay.py) checks that through a `CaptureWatch`, which follows the recorded way to the arrays
instead of searching for them again.
"""
from __future__ import annotations

import contextlib
import operator
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
    return _Scan(fn, static_values).found


def capture_key(arrays: list[np.ndarray]) -> tuple:
    return tuple((id(a), a.dtype.str, a.shape) for a in arrays)


class CaptureWatch:
    """Whether `fn` (with no static arguments) still reaches `arrays`, the result of its `reachable_arrays`, without
    scanning again on every call: the scan's path is recorded once, each object it looked inside (a function's
    closure cells and named globals, an object's attributes, a list's or a dict's items) with the objects it found
    there. While each still holds the same objects, the scan would find the same arrays: `same()` is a few
    identity comparisons. When something on the path changed (any value, rebound or not an array at all),
    `same()` scans again, compares what it finds with `arrays` by `capture_key`, and on a match records the new
    path. A captured array changed in place (its values, or its shape or dtype set in place) is the same array:
    the plan keeps the copy it was traced with."""

    def __init__(self, fn, arrays: list[np.ndarray]):
        self.fn, self.key = fn, capture_key(arrays)
        self.watched = self._record(_Scan(fn, ()))

    @staticmethod
    def _record(scan: "_Scan") -> list:
        """(reader, the objects it read) for each object the scan looked inside (the objects are kept: none of
        them goes away and is replaced by another at the same address while they are compared)."""
        return [(read, tuple(read())) for read in scan.readers]

    def same(self) -> bool:
        for read, values in self.watched:
            now = read()
            if len(now) != len(values) or not all(map(operator.is_, now, values)):
                return self._rescan()
        return True

    def _rescan(self) -> bool:
        scan = _Scan(self.fn, ())
        if capture_key(scan.found) != self.key:
            return False
        self.watched = self._record(scan)  # the same arrays, reached another way: watch that way from now on
        return True


class _Scan:
    """reachable_arrays' walk: `found` (the arrays, in walk order) and `readers`, for each object the walk looked
    inside (not tuples and bound methods: those cannot change), a function returning what it looked at."""

    def __init__(self, fn, static_values):
        self.found: list = []
        self.readers: list = []
        self.seen = {id(fn)}
        self.root_globals = getattr(getattr(fn, "__func__", fn), "__globals__", None)
        self.scan_fn(getattr(fn, "__func__", fn), 0)
        for v in static_values:
            self.scan(v, 0)

    def scan_fn(self, f, depth: int):
        code = getattr(f, "__code__", None)
        if code is None or f.__globals__ is not self.root_globals:
            return  # (helpers of other modules, such as prepjit's or NumPy's own, are not followed)
        cells, names, g = f.__closure__ or (), code.co_names, f.__globals__
        self.readers.append(lambda: (f.__code__, *map(_cell_contents, cells), *map(g.get, names)))
        for cell in cells:
            self.scan(_cell_contents(cell), depth)
        for name in names:
            if name in g:
                self.scan(g[name], depth)

    def scan(self, v, depth: int):
        if type(v) is np.ndarray:
            self.found.append(v)
            return
        if depth > _SCAN_DEPTH or id(v) in self.seen or isinstance(v, _OPAQUE) or v is None or v is _EMPTY:
            return
        self.seen.add(id(v))
        if isinstance(v, (list, tuple)):
            if not isinstance(v, tuple):
                self.readers.append(v.copy if type(v) is list else lambda: list(v))
            for x in v:
                self.scan(x, depth + 1)
        elif isinstance(v, dict):
            self.readers.append(v.values)
            for x in v.values():
                self.scan(x, depth + 1)
        elif isinstance(v, (types.FunctionType, types.MethodType)):
            if isinstance(v, types.MethodType):
                self.scan(v.__self__, depth + 1)
            self.scan_fn(getattr(v, "__func__", v), depth + 1)
        elif isinstance(getattr(v, "__dict__", None), dict):
            self.readers.append(lambda: vars(v).values())
            for x in vars(v).values():
                self.scan(x, depth + 1)


def _cell_contents(cell):
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return _EMPTY


_EMPTY = object()

_SCAN_DEPTH = 3
_OPAQUE = (type, types.ModuleType, str, bytes, int, float, complex, bool, np.generic, Tracer, UOp)
