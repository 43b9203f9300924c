"""Basic indexing of traced arrays: ints, slices with steps, None and `...`, with static or symbolic bounds.

Slices clamp like NumPy's; an integer index that depends on vars is a constraint checked per call (checks.py)."""
from __future__ import annotations

import numpy as np

from ..errors import IndexBoundError, TraceError
from ..uop import Ops, UOp, as_int_if_const, dtypes, simplify, sint
from . import prims
from .checks import require
from .prims import is_symbolic, to_sint
from .tracer import Tracer


def _is_int_like(k) -> bool:
    if isinstance(k, (bool, np.bool_)):
        return False
    if isinstance(k, (int, np.integer, UOp)):
        return True
    return isinstance(k, Tracer) and k.ndim == 0 and k.dtype.is_int


def _clamp(v: sint, lo: sint, hi: sint) -> sint:
    return as_int_if_const(simplify((UOp.const(0) + v).smax(lo).smin(hi)))


def _slice_spec(s: slice, dim: sint):
    """(start, step, size) for slice `s` over a dim, NumPy semantics (negative bounds count from the end)."""
    step = 1 if s.step is None else s.step
    if isinstance(step, (UOp, Tracer)) or not isinstance(step, (int, np.integer)):
        raise TraceError("slice steps must be static ints")
    step = int(step)
    if step == 0:
        raise ValueError("slice step cannot be zero")
    if isinstance(dim, int) and all(v is None or isinstance(v, (int, np.integer)) for v in (s.start, s.stop)):
        start, stop, step = slice(s.start, s.stop, step).indices(dim)
        return start, step, len(range(start, stop, step))
    if s.start is None and s.stop is None and step == 1 and dim.op is not Ops.CONST and dim.vmin >= 0 and \
            simplify(dim) is dim:  # `:` over a symbolic dim (`x[..., :k]` spells one per leading axis): the whole dim,
        return 0, 1, dim          # what the clamped bounds below simplify to, without building them
    start, stop = (None if v is None else to_sint(v, "a slice bound") for v in (s.start, s.stop))

    def norm(v, default, lo, hi):
        if v is None:
            return default
        return _clamp(_from_end(v, dim), lo, hi)

    if step > 0:
        start = norm(start, 0, 0, dim)
        stop = norm(stop, dim, 0, dim)
        size = (UOp.const(0) + stop - start + step - 1) // step
    else:
        start = norm(start, UOp.const(0) + dim - 1, -1, UOp.const(0) + dim - 1)
        stop = norm(stop, -1, -1, UOp.const(0) + dim - 1)
        size = (UOp.const(0) + start - stop + (-step) - 1) // (-step)
    return as_int_if_const(start), step, as_int_if_const(simplify(size.smax(0)))


def _from_end(v: sint, dim: sint) -> sint:
    """A slice bound that may be negative counts from the end, as NumPy's do: v < 0 reads as dim + v.

    Written with min/max only (so it can be a dim): for an int v, -min(0, max(-1, v)) is 1 when v < 0, else 0."""
    if (v if isinstance(v, int) else v.vmin) >= 0:
        return v
    if (v if isinstance(v, int) else v.vmax) < 0:
        return UOp.const(0) + dim + v
    negative = UOp.const(0) - (UOp.const(0) + v).smax(-1).smin(0)
    return v + negative * dim


def index_int(k, dim: sint, where: str = "an axis"):
    """A (start, step, size=1) spec for an integer index; negatives count from the end (NumPy).

    A static index out of range for a static dim raises IndexBoundError now; an index or dim that
    depends on vars records the constraints `-dim <= k < dim` (checks.py), checked on every call.
    """
    k = to_sint(k, "an index")
    if isinstance(k, int) and isinstance(dim, int):
        if not -dim <= k < dim:
            raise IndexBoundError(f"index {k} is out of bounds for {where} with size {dim}")
        return k % dim, 1, 1
    text = f"index {_text(k)} on {where} (size {_text(dim)})"
    require(k, dim, True, text)
    if (k if isinstance(k, int) else k.vmin) >= 0:
        return k, 1, 1
    size = _text(dim)
    require(UOp.const(0) - dim, k, False, text, f"-{size if size.isidentifier() else f'({size})'} <= {_text(k)}")
    if (k if isinstance(k, int) else k.vmax) < 0:
        return as_int_if_const(simplify(UOp.const(0) + dim + k)), 1, 1
    negative = UOp(Ops.CMPLT, dtypes.bool, (k, UOp.const(0)))
    return simplify(UOp(Ops.WHERE, dtypes.index, (negative, k + dim, k))), 1, 1


def _text(d: sint) -> str:
    return d.render() if isinstance(d, UOp) else str(d)


def constant_index(k):
    """An integer list or NumPy array used as an index (`x[[0, 2]]`, `x.at[np.array(ids)]`) as a captured
    constant of the plan, which then gathers as a traced index does (an empty list too, as NumPy takes it);
    anything else unchanged (a boolean mask is refused by is_array_index)."""
    if isinstance(k, (list, np.ndarray)):
        a = np.asarray(k)
        if a.dtype.kind in "iu" or isinstance(k, list) and a.size == 0:
            from .constants import capture
            return capture(a.astype(np.int64) if a.dtype.kind not in "iu" else a)
    return k


def is_array_index(k) -> bool:
    """An integer-array index (a gather): a traced int array, or a 0-d one whose value depends on data."""
    if isinstance(k, (list, np.ndarray)) and np.asarray(k).dtype.kind != "b":
        raise IndexError(f"arrays used as indices must be of integer type, got {np.asarray(k).dtype}")
    if isinstance(k, (list, np.ndarray)) or isinstance(k, Tracer) and k.dtype == dtypes.bool:
        raise TraceError("boolean-mask indexing of traced arrays is not supported: a mask gives a data-dependent "
                         "shape (use pnp.where(mask, x, 0), or pnp.nonzero(mask, size=N) for the positions)")
    return isinstance(k, Tracer) and k.dtype.is_int and (k.ndim > 0 or not is_symbolic(k.uop))


def getitem(x: Tracer, key) -> Tracer:
    key = tuple(constant_index(k) for k in (key if isinstance(key, tuple) else (key,)))
    if any(is_array_index(k) for k in key):
        from .numpy_index import advanced_getitem
        return advanced_getitem(x, key)
    n_ellipsis = sum(1 for k in key if k is Ellipsis)
    if n_ellipsis > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
    if n_real > x.ndim:
        raise IndexError(f"too many indices for array: array is {x.ndim}-dimensional, but {n_real} were indexed")
    if n_ellipsis:
        i = next(i for i, k in enumerate(key) if k is Ellipsis)
        key = key[:i] + (slice(None),) * (x.ndim - n_real) + key[i + 1:]
    else:
        key = key + (slice(None),) * (x.ndim - n_real)
    spec, out_shape, dim_i = [], [], 0
    for k in key:
        if k is None:
            out_shape.append(1)
            continue
        dim = x.uop.shape[dim_i]
        if isinstance(k, slice):
            start, step, size = _slice_spec(k, dim)
            out_shape.append(size)
        elif _is_int_like(k):
            start, step, size = index_int(k, dim, f"axis {dim_i}")
        else:
            got = f"a {k.dtype.name} array" if isinstance(k, Tracer) else type(k).__name__
            raise IndexError(f"only integers, slices, None, ... and integer arrays are valid indices, got {got}")
        spec.append((start, step, size))
        dim_i += 1
    return prims.reshape(prims.shrink(x, spec), out_shape)
