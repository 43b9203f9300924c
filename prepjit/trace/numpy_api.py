"""The NumPy-named namespace for traced arrays (re-exported as `prepjit.numpy`)."""
from ..uop import dtypes as _dtypes
from .numpy_linalg import dot, matmul, outer
from .numpy_math import (abs, absolute, add, all, amax, amin, any, astype, bitwise_and, bitwise_or, bitwise_xor, ceil,
                         clip, cos, divide, equal, exp, exp2, floor, floor_divide, greater, greater_equal, invert,
                         left_shift, less, less_equal, log, log2, logical_and, logical_not, logical_or, max, maximum,
                         mean, min, minimum, mod, multiply, negative, not_equal, power, prod, reciprocal, remainder,
                         right_shift, rint, sign, sin, sqrt, square, subtract, sum, tanh, true_divide, where)
from .numpy_shape import (arange, broadcast_to, concatenate, expand_dims, full, full_like, iota, ones, ones_like, ravel,
                          reshape, squeeze, stack, swapaxes, transpose, zeros, zeros_like)

bool_ = _dtypes.bool
int8, int16, int32, int64 = _dtypes.int8, _dtypes.int16, _dtypes.int32, _dtypes.int64
uint8, uint16, uint32, uint64 = _dtypes.uint8, _dtypes.uint16, _dtypes.uint32, _dtypes.uint64
float16, float32, float64 = _dtypes.float16, _dtypes.float32, _dtypes.float64
globals()["bool"] = bool_

__all__ = [n for n in dir() if not n.startswith("_")]
