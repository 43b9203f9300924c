"""The NumPy-named namespace for traced arrays (re-exported as `prepjit.numpy`)."""
from types import SimpleNamespace as _Namespace

import numpy as _np

from ..uop import dtypes as _dtypes
from .numpy_create import (arange, array, asarray, eye, full, full_like, identity, iota, linspace, ones, ones_like,
                           tri, zeros, zeros_like)
from .numpy_index import take, take_along_axis
from .numpy_linalg import dot, einsum, matmul, norm as _norm, outer, tensordot
from .numpy_math import (abs, absolute, add, around, astype, bitwise_and, bitwise_or, bitwise_xor, ceil, clip, cos,
                         divide, equal, erf, exp, exp2, floor, floor_divide, greater, greater_equal, invert, isfinite,
                         isinf, isnan, left_shift, less, less_equal, log, log2, logical_and, logical_not, logical_or,
                         logical_xor, maximum, minimum, mod, multiply, negative, not_equal, power, reciprocal,
                         remainder, right_shift, rint, round, rsqrt, sign, signbit, sin, sqrt, square, subtract, tanh,
                         true_divide)
from .numpy_reduce import (all, amax, amin, any, argmax, argmin, cumprod, cumsum, max, mean, min, prod, std, sum,
                           var)
from .numpy_transcend import (arccos, arccosh, arcsin, arcsinh, arctan, arctan2, arctanh, cosh, expm1, hypot,
                               log1p, logaddexp, nan_to_num, sinh, tan)
from .numpy_select import argwhere, flatnonzero, nonzero, searchsorted, unique, where
from .numpy_sort import argpartition, argsort, partition, sort
from .numpy_shape import (broadcast_to, concatenate, expand_dims, flip, moveaxis, pad, ravel, repeat, reshape, roll,
                          split, squeeze, stack, swapaxes, tile, transpose, tril, triu)

bool_ = _dtypes.bool
int8, int16, int32, int64 = _dtypes.int8, _dtypes.int16, _dtypes.int32, _dtypes.int64
uint8, uint16, uint32, uint64 = _dtypes.uint8, _dtypes.uint16, _dtypes.uint32, _dtypes.uint64
float16, float32, float64 = _dtypes.float16, _dtypes.float32, _dtypes.float64
globals()["bool"] = bool_
linalg = _Namespace(norm=_norm)  # pnp.linalg.norm
pow = power  # noqa: A001 - NumPy 2's alias
inf, nan, pi, e, euler_gamma, newaxis = _np.inf, _np.nan, _np.pi, _np.e, _np.euler_gamma, _np.newaxis  # NumPy's

__all__ = [n for n in dir() if not n.startswith("_")]


def __getattr__(name: str):
    """pnp.bfloat16: ml_dtypes' bfloat16 type (JAX's, so NumPy arrays of it are made with pnp.bfloat16 too),
    imported at its first use (uop/dtypes.py: its import is slow). Not in __all__, whose names a star-import reads."""
    if name == "bfloat16":
        return _dtypes.bfloat16.np.type
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
