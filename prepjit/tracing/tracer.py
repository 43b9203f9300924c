"""Tracer: the array a traced function sees; its operators record UOps instead of computing."""
from __future__ import annotations

import functools

from ..errors import TraceError
from ..uop import DType, UOp


class Tracer:
    """A traced array: a node of the traced graph with NumPy's array interface.

    `weak` marks values that came from Python scalars (or vars), which take part in
    dtype promotion like NumPy's Python scalars do.
    """

    __slots__ = ("uop", "weak")
    __array_priority__ = 1000  # so ndarray <op> Tracer defers to us

    def __init__(self, uop: UOp, weak: bool = False):
        self.uop, self.weak = uop, weak

    # ---- metadata ----
    @property
    def dtype(self) -> DType:
        return self.uop.dtype

    @property
    def shape(self) -> tuple:
        """Dims as ints; symbolic dims as 0-d int64 Tracers usable in arithmetic, shapes and slices."""
        return tuple(d if isinstance(d, int) else Tracer(d, weak=True) for d in self.uop.shape)

    @property
    def shape_str(self) -> str:
        from .prims import fmt_shape
        return fmt_shape(self.uop.shape)

    @property
    def ndim(self) -> int:
        return len(self.uop.shape)

    @property
    def size(self):
        from ..uop import sym_prod
        s = sym_prod(self.uop.shape)
        return s if isinstance(s, int) else Tracer(s, weak=True)

    @property
    def T(self) -> "Tracer":
        return _np().transpose(self)

    @property
    def at(self):
        """JAX's functional updates: `x.at[idx].set(v)`, `.add(v)`, `.multiply(v)`, `.min(v)`, `.max(v)`."""
        from .numpy_at import AtIndexer
        return AtIndexer(self)

    def __setitem__(self, key, value):
        raise TraceError("traced arrays are immutable (as JAX's): write x = x.at[idx].set(value), or .add, "
                         ".multiply, .min, .max")

    def __repr__(self) -> str:
        """A symbolic int (a dim, or arithmetic on dims and vars) prints as its expression: `n`, `(n+1)`."""
        from .prims import is_symbolic
        if not self.uop.shape and self.dtype.is_int and is_symbolic(self.uop):
            return self.uop.render()
        return f"Tracer(shape={self.shape_str}, dtype={self.dtype.name})"

    # ---- methods ----
    def reshape(self, *shape, order="C") -> "Tracer":
        if order != "C":
            raise TraceError(f"reshape with order={order!r} is not supported; traced arrays are row-major (order='C')")
        return _np().reshape(self, shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape)

    def transpose(self, *axes) -> "Tracer":
        axes = axes[0] if len(axes) == 1 and (axes[0] is None or isinstance(axes[0], (tuple, list))) else (axes or None)
        return _np().transpose(self, axes)

    def astype(self, dtype) -> "Tracer":
        return _np().astype(self, dtype)

    def view(self, dtype) -> "Tracer":
        """The same bits read as `dtype` of the same element size (NumPy's view; a bitcast)."""
        from .prims.pointwise import bitcast
        return bitcast(self, dtype)

    # NumPy's functions (np.sum(x), np.cumsum(x), ...) call these methods with `out=` and their other keywords
    def sum(self, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=None):
        _unsupported(out=out)
        return _np().sum(self, axis=axis, keepdims=keepdims, dtype=dtype, initial=initial, where=where)

    def mean(self, axis=None, dtype=None, out=None, keepdims=False, where=None):
        _unsupported(out=out)
        return _np().mean(self, axis=axis, keepdims=keepdims, dtype=dtype, where=where)

    def max(self, axis=None, out=None, keepdims=False, initial=None, where=None):
        _unsupported(out=out)
        return _np().max(self, axis=axis, keepdims=keepdims, initial=initial, where=where)

    def min(self, axis=None, out=None, keepdims=False, initial=None, where=None):
        _unsupported(out=out)
        return _np().min(self, axis=axis, keepdims=keepdims, initial=initial, where=where)

    def prod(self, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=None):
        _unsupported(out=out)
        return _np().prod(self, axis=axis, keepdims=keepdims, dtype=dtype, initial=initial, where=where)

    def all(self, axis=None, out=None, keepdims=False, where=None):
        _unsupported(out=out)
        return _np().all(self, axis=axis, keepdims=keepdims, where=where)

    def any(self, axis=None, out=None, keepdims=False, where=None):
        _unsupported(out=out)
        return _np().any(self, axis=axis, keepdims=keepdims, where=where)

    def argmax(self, axis=None, out=None, keepdims=False):
        _unsupported(out=out)
        return _np().argmax(self, axis=axis, keepdims=keepdims)

    def argmin(self, axis=None, out=None, keepdims=False):
        _unsupported(out=out)
        return _np().argmin(self, axis=axis, keepdims=keepdims)

    def var(self, axis=None, dtype=None, out=None, ddof=0, keepdims=False, where=None):
        _unsupported(out=out)
        return _np().var(self, axis=axis, dtype=dtype, ddof=ddof, keepdims=keepdims, where=where)

    def std(self, axis=None, dtype=None, out=None, ddof=0, keepdims=False, where=None):
        _unsupported(out=out)
        return _np().std(self, axis=axis, dtype=dtype, ddof=ddof, keepdims=keepdims, where=where)

    def cumsum(self, axis=None, dtype=None, out=None):
        _unsupported(out=out)
        return _np().cumsum(self, axis=axis, dtype=dtype)

    def cumprod(self, axis=None, dtype=None, out=None):
        _unsupported(out=out)
        return _np().cumprod(self, axis=axis, dtype=dtype)

    def clip(self, min=None, max=None, out=None):  # noqa: A002 - NumPy's names
        _unsupported(out=out)
        return _np().clip(self, min, max)

    def round(self, decimals=0, out=None):
        _unsupported(out=out)
        return _np().round(self, decimals)

    def squeeze(self, axis=None):
        return _np().squeeze(self, axis)

    def swapaxes(self, a, b):
        return _np().swapaxes(self, a, b)

    def repeat(self, repeats, axis=None):
        return _np().repeat(self, repeats, axis)

    def take(self, indices, axis=None, mode=None, fill_value=None):
        return _np().take(self, indices, axis=axis, mode=mode, fill_value=fill_value)

    def argsort(self, axis=-1, kind=None, order=None, *, stable=None):
        return _np().argsort(self, axis, kind, order, stable=stable)

    def sort(self, axis=-1, kind=None, order=None, *, stable=None):
        """A sorted copy, as JAX's Array.sort (a traced array cannot be sorted in place)."""
        return _np().sort(self, axis, kind, order, stable=stable)

    def searchsorted(self, v, side="left", sorter=None):
        return _np().searchsorted(self, v, side, sorter)

    def nonzero(self, *, size=None, fill_value=None):
        return _np().nonzero(self, size=size, fill_value=fill_value)

    def flatten(self) -> "Tracer":
        return _np().reshape(self, (-1,))

    ravel = flatten

    def __getitem__(self, key) -> "Tracer":
        from .indexing import getitem
        return getitem(self, key)

    def __len__(self) -> int:
        if not self.uop.shape:
            raise TypeError("len() of unsized object")
        d = self.uop.shape[0]
        if not isinstance(d, int):
            raise TraceError("len() of an array with a symbolic first dim has no Python int; use x.shape[0]")
        return d

    # ---- operators ----
    def __add__(self, o): return _np().add(self, o)
    def __radd__(self, o): return _np().add(o, self)
    def __sub__(self, o): return _np().subtract(self, o)
    def __rsub__(self, o): return _np().subtract(o, self)
    def __mul__(self, o): return _np().multiply(self, o)
    def __rmul__(self, o): return _np().multiply(o, self)
    def __truediv__(self, o): return _np().true_divide(self, o)
    def __rtruediv__(self, o): return _np().true_divide(o, self)
    def __floordiv__(self, o): return _np().floor_divide(self, o)
    def __rfloordiv__(self, o): return _np().floor_divide(o, self)
    def __mod__(self, o): return _np().mod(self, o)
    def __rmod__(self, o): return _np().mod(o, self)
    def __pow__(self, o): return _np().power(self, o)
    def __rpow__(self, o): return _np().power(o, self)
    def __matmul__(self, o): return _np().matmul(self, o)
    def __rmatmul__(self, o): return _np().matmul(o, self)
    def __neg__(self): return _np().negative(self)
    def __pos__(self): return self
    def __abs__(self): return _np().abs(self)
    def __invert__(self): return _np().invert(self)
    def __and__(self, o): return _np().bitwise_and(self, o)
    def __rand__(self, o): return _np().bitwise_and(o, self)
    def __or__(self, o): return _np().bitwise_or(self, o)
    def __ror__(self, o): return _np().bitwise_or(o, self)
    def __xor__(self, o): return _np().bitwise_xor(self, o)
    def __rxor__(self, o): return _np().bitwise_xor(o, self)
    def __lshift__(self, o): return _np().left_shift(self, o)
    def __rlshift__(self, o): return _np().left_shift(o, self)
    def __rshift__(self, o): return _np().right_shift(self, o)
    def __rrshift__(self, o): return _np().right_shift(o, self)
    def __lt__(self, o): return _np().less(self, o)
    def __le__(self, o): return _np().less_equal(self, o)
    def __gt__(self, o): return _np().greater(self, o)
    def __ge__(self, o): return _np().greater_equal(self, o)
    def __eq__(self, o): return _np().equal(self, o)  # type: ignore[override]
    def __ne__(self, o): return _np().not_equal(self, o)  # type: ignore[override]
    __hash__ = object.__hash__

    # ---- what cannot be traced ----
    def _concrete(self, what: str):
        names = _var_names_only(self.uop)
        if names:
            raise TraceError(
                f"{what} of {self.uop.render()} depends on the var(s) {', '.join(names)}, whose values are known only "
                "when the prepared function is called (one trace serves every value in the bounds). Choose between "
                "computations with pj.cond(pred, true_fun, false_fun, *operands) or pj.switch, loop a var number of "
                "times with pj.fori_loop(0, n, body, carry) or pj.while_loop, use pnp.where for elementwise "
                "choices, or make the value static (a static argument, or a fixed size in shapes=)")
        raise TraceError(
            f"{what} of a traced array (shape {self.shape_str}, {self.dtype.name}) is not known while tracing: "
            "Python control flow cannot depend on array values. Use pnp.where(cond, a, b) for elementwise "
            "choices, pj.cond / pj.switch to choose between computations, pj.while_loop to loop until a "
            "condition on the data holds, pass the value as a static argument, or make it a var (vars={...}) if "
            "it is a size")

    def __bool__(self): self._concrete("the truth value")
    def __int__(self): self._concrete("the int value")
    def __float__(self): self._concrete("the float value")
    def __index__(self): self._concrete("the index value")
    def __complex__(self): self._concrete("the complex value")
    def item(self, *args): self._concrete("the Python value (.item())")
    def tolist(self): self._concrete("the Python list (.tolist())")
    def __array__(self, *a, **k):
        raise TraceError(
            f"a traced array (shape {self.shape_str}, {self.dtype.name}) cannot become a NumPy array while tracing: "
            "its values are not known yet. Use prepjit.numpy functions on it; a NumPy array it meets (indexed by "
            "it, as in table[ids], or combined by a NumPy function) becomes a traced constant with "
            "pnp.asarray(table)")

    def __iter__(self):
        return (self[i] for i in range(len(self)))


def _var_names_only(u: UOp) -> list[str]:
    """The vars a value is computed from when it reads no array data (a symbolic dim or a comparison of one),
    else []."""
    from ..uop import Ops
    from ..uop.ops import ALU
    nodes = u.toposort()
    if not all(n.op in ALU or n.op in (Ops.CONST, Ops.DEFINE_VAR, Ops.CAST) for n in nodes):
        return []
    return sorted({n.arg[0] for n in nodes if n.op is Ops.DEFINE_VAR})


@functools.cache
def _np():
    """numpy_api (which builds on Tracer), imported once: an import statement here cost ~2 us a call (2.8k calls in
    SmolLM2's first calls)."""
    from . import numpy_api
    return numpy_api


def _unsupported(**given):
    """NumPy's `out=` keyword (and `where=` of the methods that do not take it) is accepted at its default only."""
    for name, value in given.items():
        if value is not None:
            raise TraceError(f"{name}= is not supported on traced arrays: results are new arrays (drop {name}=, "
                             "and use pnp.where for masks)")
