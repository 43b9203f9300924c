"""Running a Python function on tracers: argument leaves in, traced output UOps and structure out."""
from __future__ import annotations

import contextlib
import functools
import sys
import threading

import attrs

from ..errors import PrepjitError, TraceError
from ..uop import DType, Ops, UOp, sint
from ..uop.printer import format_graph
from . import checks, prims
from .constants import capturing
from .pytree import TreeDef, flatten
from .tracer import Tracer


@attrs.frozen
class ArrayLeaf:
    dtype: DType
    shape: tuple  # ints and var UOps


@attrs.frozen
class VarLeaf:
    var: UOp


@attrs.frozen
class Traced:
    """A traced function: INPUT nodes (one per array leaf, in order), output nodes and their structure."""

    inputs: tuple[UOp, ...]
    outputs: tuple[UOp, ...]
    out_tree: TreeDef
    constraints: tuple = ()  # IndexConstraints every call must meet (checks.py)
    flags: tuple = ()        # (0-d bool UOp, what): a gather read an out-of-range id when true
    constants: tuple = ()    # captured arrays (constants.py), copied at trace time: the last inputs' values

    @property
    def sink(self) -> UOp:
        return UOp(Ops.SINK, self.outputs[0].dtype if self.outputs else UOp.const(0).dtype, self.outputs)

    def __str__(self) -> str:
        return format_graph(self.sink)

    __repr__ = __str__


_active = threading.local()  # .var_names: the var names in use by the trace running on this thread


@contextlib.contextmanager
def reserved_var_name(base: str, taken: set):
    """A var name (`base`, `base1`, ...) that neither `taken` nor the running trace uses, reserved while inside."""
    in_use = getattr(_active, "var_names", None)
    if in_use is None:
        in_use = set()
    name, n = base, 1
    while name in in_use or name in taken:
        name, n = f"{base}{n}", n + 1
    in_use.add(name)
    try:
        yield name
    finally:
        in_use.discard(name)


def input_tracer(number: int, dtype: DType, shape: tuple[sint, ...]) -> Tracer:
    return Tracer(UOp(Ops.INPUT, dtype, (), (number, tuple(shape))))


def trace_call(fn, build_args, leaves: list) -> Traced:
    """Call `fn` with tracers for the leaves: ArrayLeaf -> INPUT, VarLeaf -> symbolic int, else static.

    `build_args(values)` rebuilds (args, kwargs) from the leaf values in order.
    """
    inputs, values = [], []
    for leaf in leaves:
        if isinstance(leaf, ArrayLeaf):
            t = input_tracer(len(inputs), leaf.dtype, leaf.shape)
            inputs.append(t.uop)
            values.append(t)
        elif isinstance(leaf, VarLeaf):
            values.append(Tracer(leaf.var, weak=True))
        else:
            values.append(leaf)
    args, kwargs = build_args(values)
    outer = getattr(_active, "var_names", None)
    _active.var_names = _leaf_var_names(leaves)
    try:
        with checks.recording(set(_active.var_names)) as recorded, capturing(len(inputs)) as captured:
            result = fn(*args, **kwargs)
            out_leaves, paths, out_tree = flatten(result)
            results = [_result_tracer(leaf, path) for leaf, path in zip(out_leaves, paths)]
    except PrepjitError:
        raise
    except Exception as e:  # noqa: BLE001 - every failure reaches the user as a prepjit error (of e's class too)
        raise wrap_error(e, TraceError) from e
    finally:
        _active.var_names = outer
    inputs += [captured.by_id[id(x)].uop for x in captured.originals]
    return Traced(tuple(inputs), tuple(results), out_tree, tuple(recorded.constraints),
                  tuple((prims.to_tracer(f).uop, what) for f, what in recorded.flags), tuple(captured.values))


def _result_tracer(leaf, path: str) -> UOp:
    """A result leaf as a traced array (a NumPy array returned as it is is captured, like one read)."""
    try:
        t = prims.to_tracer(leaf)
    except TraceError as e:
        raise TraceError(f"the function returned {type(leaf).__name__} at result{path}: results must be "
                         f"arrays computed from the arguments ({e})") from None
    if t.weak:  # a bare Python scalar or var result becomes a 0-d array of its default dtype
        t = prims.cast(Tracer(t.uop), t.dtype)
    return t.uop


def _leaf_var_names(leaves: list) -> set[str]:
    names = set()
    for leaf in leaves:
        if isinstance(leaf, VarLeaf):
            names.add(leaf.var.arg[0])
        elif isinstance(leaf, ArrayLeaf):
            names |= {v.arg[0] for d in leaf.shape if isinstance(d, UOp) for v in d.variables()}
    return names


def wrap_error(e: Exception, base: type[PrepjitError]) -> PrepjitError:
    """`e` as a `base` (TraceError, CompileError) that is still an instance of `e`'s own class, so that
    `except ValueError` or NumPy's AxisError keep catching it; same message (RecursionError: explained)."""
    message = str(e)
    if isinstance(e, RecursionError):
        message = (f"Python's recursion limit ({sys.getrecursionlimit()}) was exceeded while tracing: the traced "
                   f"function recurses too deeply (does it call itself on traced values?) ({e})")
    try:
        return _combined(base, type(e))(message)
    except Exception:  # noqa: BLE001 - a class that cannot be combined, or built from one message: `base` alone
        return base(f"{type(e).__name__}: {message}")


@functools.lru_cache(maxsize=None)
def _combined(base: type, cls: type) -> type:
    return type(f"{base.__name__}({cls.__name__})", (cls, base), {"__module__": base.__module__})
