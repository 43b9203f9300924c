"""Running a Python function on tracers: argument leaves in, traced output UOps and structure out."""
from __future__ import annotations

import attrs

from ..errors import TraceError
from ..uop import DType, Ops, UOp, sint
from ..uop.printer import format_graph
from . import prims
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

    @property
    def sink(self) -> UOp:
        return UOp(Ops.SINK, self.outputs[0].dtype if self.outputs else UOp.const(0).dtype, self.outputs)

    def __str__(self) -> str:
        return format_graph(self.sink)

    __repr__ = __str__


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
    result = fn(*args, **kwargs)
    out_leaves, paths, out_tree = flatten(result)
    outputs = []
    for leaf, path in zip(out_leaves, paths):
        try:
            t = prims.to_tracer(leaf)
        except TraceError as e:
            raise TraceError(f"the function returned {type(leaf).__name__} at result{path}: results must be "
                             f"arrays computed from the arguments ({e})") from None
        if t.weak:  # a bare Python scalar or var result becomes a 0-d array of its default dtype
            t = prims.cast(Tracer(t.uop), t.dtype)
        outputs.append(t.uop)
    return Traced(tuple(inputs), tuple(outputs), out_tree)
