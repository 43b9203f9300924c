"""Primitive graph builders (our `lax`): each builds one traced-graph UOp from `Tracer`s, checking shapes and
dtypes, and registers the op's transformation rules beside it (registry.py). The NumPy layer (`numpy_*.py`) is
written on top of these and never builds UOps itself.

Families: pointwise.py (cast, ALU ops, fma), reduction.py (REDUCE_AXIS), movement.py (reshape, permute, expand,
shrink, pad), gathering.py (GATHER and the leaves); core.py holds what they share.
"""
from .core import (broadcast_shapes, check_python_int_fits, dims_equal, fmt_shape, is_symbolic, normalize_axes,
                   normalize_axis, python_int_fits, result_dtype, to_sint, to_tracer)
from .gathering import gather
from .movement import broadcast_to, pad, permute, reshape, shrink
from .pointwise import cast, elementwise, fma
from .reduction import materialize, reduce
from .registry import Primitive, primitive, rules

__all__ = ["broadcast_shapes", "check_python_int_fits", "dims_equal", "fmt_shape", "is_symbolic", "normalize_axes",
           "normalize_axis", "python_int_fits", "result_dtype", "to_sint", "to_tracer", "gather", "broadcast_to", "pad",
           "permute", "reshape", "shrink", "cast", "elementwise", "fma", "materialize", "reduce", "Primitive",
           "primitive", "rules"]
