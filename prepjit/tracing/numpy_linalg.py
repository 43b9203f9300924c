"""NumPy-named linear algebra on traced arrays: matmul (batched and vector cases), dot, outer, tensordot, einsum,
and `linalg.norm`.

The contractions take jax.numpy's `preferred_element_type=` (the result dtype) and `precision=` (precision.py: their
product carries it).
Their dtype rule is `_contraction_dtypes`: the operands' promoted dtype is the result unless
`preferred_element_type` says otherwise, and products and sums are computed in the compute dtype of the wider of
the two (float32 for 16-bit floats), rounded once to the result."""
from __future__ import annotations

import string

import numpy as np

from ..errors import TraceError
from ..uop import DType, dtypes, promote, to_dtype
from . import prims
from .numpy_create import iota
from .numpy_math import absolute, multiply, not_equal, power, sqrt
from .numpy_reduce import amax, amin, sum
from .numpy_shape import expand_dims, reshape, swapaxes
from .precision import matmul_precision, product
from .prims import to_tracer
from .tracer import Tracer


def _contraction_dtypes(xs: list[Tracer], preferred_element_type, precision) -> tuple[DType, DType, str]:
    """(accumulation dtype, result dtype, resolved precision) of a contraction of `xs` (see the module docstring)."""
    chosen = matmul_precision(precision)
    dt = prims.result_dtype(*xs)
    out = dt if preferred_element_type is None else to_dtype(preferred_element_type)
    return promote((dt, False), (out, False)).compute, out, chosen


def matmul(a, b, *, precision=None, preferred_element_type=None) -> Tracer:
    a, b = to_tracer(a), to_tracer(b)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError("matmul: input operand does not have enough dimensions")
    a2 = expand_dims(a, 0) if a.ndim == 1 else a
    b2 = expand_dims(b, 1) if b.ndim == 1 else b
    if not prims.dims_equal(a2.uop.shape[-1], b2.uop.shape[-2]):
        raise ValueError(f"matmul: contracted dims differ: {a.shape_str} @ {b.shape_str}")
    acc, dt, chosen = _contraction_dtypes([a, b], preferred_element_type, precision)
    # (..., M, K) -> (..., M, 1, K);  (..., K, N) -> (..., 1, N, K);  multiply and sum over K
    lhs = expand_dims(prims.cast(a2, acc), -2)
    rhs = expand_dims(swapaxes(prims.cast(b2, acc), -1, -2), -3)
    out = prims.cast(sum(product(lhs, rhs, chosen), axis=-1, dtype=acc), dt)
    if a.ndim == 1:
        out = reshape(out, out.uop.shape[:-2] + out.uop.shape[-1:])
    if b.ndim == 1:
        out = reshape(out, out.uop.shape[:-1])
    return out


def dot(a, b, *, precision=None, preferred_element_type=None) -> Tracer:
    """NumPy's dot: a product with scalars, matmul up to 2-d, else a sum over a's last and b's second-to-last axis."""
    a, b = (Tracer(t.uop) for t in (to_tracer(a), to_tracer(b)))  # dot converts scalars to arrays: no weak scalars
    if a.ndim == 0 or b.ndim == 0:
        acc, dt, _ = _contraction_dtypes([a, b], preferred_element_type, precision)   # (a product: nothing summed)
        return prims.cast(multiply(prims.cast(a, acc), prims.cast(b, acc)), dt)
    if b.ndim <= 2:
        return matmul(a, b, precision=precision, preferred_element_type=preferred_element_type)
    return tensordot(a, b, axes=([a.ndim - 1], [b.ndim - 2]), precision=precision,
                     preferred_element_type=preferred_element_type)


def tensordot(a, b, axes=2, *, precision=None, preferred_element_type=None) -> Tracer:
    a, b = to_tracer(a), to_tracer(b)
    if isinstance(axes, int):
        axes_a, axes_b = list(range(a.ndim - axes, a.ndim)), list(range(axes))
    else:
        axes_a, axes_b = ([x] if isinstance(x, int) else list(x) for x in axes)
    axes_a = [prims.normalize_axis(x, a.ndim) for x in axes_a]
    axes_b = [prims.normalize_axis(x, b.ndim) for x in axes_b]
    if len(axes_a) != len(axes_b):
        raise ValueError("shape-mismatch for sum")
    letters = iter(string.ascii_letters)
    sub_a = [next(letters) for _ in range(a.ndim)]
    sub_b = [next(letters) for _ in range(b.ndim)]
    for i, j in zip(axes_a, axes_b):
        sub_b[j] = sub_a[i]
    out = [c for i, c in enumerate(sub_a) if i not in axes_a] + [c for j, c in enumerate(sub_b) if j not in axes_b]
    return einsum(f"{''.join(sub_a)},{''.join(sub_b)}->{''.join(out)}", a, b, precision=precision,
                  preferred_element_type=preferred_element_type)


def outer(a, b) -> Tracer:
    a, b = to_tracer(a), to_tracer(b)
    return multiply(reshape(a, (-1, 1)), reshape(b, (1, -1)))


def einsum(subscripts: str, *operands, precision=None, preferred_element_type=None) -> Tracer:
    """NumPy's einsum (explicit or implicit output, `...` broadcasting): align every operand to one index
    space, multiply, sum the contracted letters. Repeated letters within one operand are not supported."""
    xs = [to_tracer(x) for x in operands]
    inputs, output = _parse_einsum(subscripts.replace(" ", ""), xs)
    for k, (subs, x) in enumerate(zip(inputs, xs)):
        inputs[k], xs[k] = _diagonals(subs, x)
    sizes: dict = {}
    for subs, x in zip(inputs, xs):
        for c, d in zip(subs, x.uop.shape):
            if c in sizes and not (isinstance(d, int) and d == 1):
                if isinstance(sizes[c], int) and sizes[c] == 1:
                    sizes[c] = d
                elif not prims.dims_equal(sizes[c], d):
                    raise ValueError(f"einsum: dimension of index {c!r} differs between operands")
            else:
                sizes.setdefault(c, d)
    contracted = sorted(set(sizes) - set(output))
    order = list(output) + contracted
    acc, dt, chosen = _contraction_dtypes(xs, preferred_element_type, precision)
    aligned = []
    for subs, x in zip(inputs, xs):
        x = prims.permute(prims.cast(x, acc), [subs.index(c) for c in order if c in subs])
        present = [c for c in order if c in subs]
        aligned.append(reshape(x, [x.uop.shape[present.index(c)] if c in subs else 1 for c in order]))
    terms = aligned[0]
    for x in aligned[1:]:
        terms = product(terms, x, chosen)
    terms = prims.broadcast_to(terms, [sizes[c] for c in order])
    if contracted:
        terms = sum(terms, axis=tuple(range(len(output), len(order))), dtype=acc)
    return prims.cast(terms, dt)


def _diagonals(subs: list[str], x: Tracer) -> tuple[list[str], Tracer]:
    """An operand with a letter repeated (`ii`, `bii`) reduced to its diagonal along those axes, the letter kept
    once."""
    while len(set(subs)) != len(subs):
        c = next(c for c in subs if subs.count(c) > 1)
        i, j = subs.index(c), subs.index(c, subs.index(c) + 1)
        shape = x.uop.shape
        if not prims.dims_equal(shape[i], shape[j]):
            raise ValueError(f"einsum: dimensions in operand for collapsing index {c!r} don't match "
                             f"({prims.fmt_shape(shape)})")
        out_shape = tuple(d for m, d in enumerate(shape) if m != j)
        dims = [("index", 0) if m == j else ("dim", m if m < j else m - 1) for m in range(x.ndim)]
        x = prims.gather(x, [iota(out_shape, i)], dims)
        subs = subs[:j] + subs[j + 1:]
    return subs, x


def _parse_einsum(subscripts: str, xs: list) -> tuple[list[list[str]], list[str]]:
    """Per-operand letter lists and the output letters, with `...` expanded to unused letters."""
    lhs, arrow, rhs = subscripts.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(xs):
        raise ValueError(f"einsum: {len(terms)} operand subscripts for {len(xs)} operands")
    used = set(subscripts)
    spare = [c for c in string.ascii_letters if c not in used]
    ell_rank = max([x.ndim - len(t.replace("...", "")) for t, x in zip(terms, xs) if "..." in t], default=0)
    ell = spare[:ell_rank]
    inputs = []
    for t, x in zip(terms, xs):
        if "..." in t:
            before, _, after = t.partition("...")
            n = x.ndim - len(before) - len(after)
            subs = list(before) + ell[ell_rank - n:] + list(after)
        else:
            subs = list(t)
        if len(subs) != x.ndim:
            raise ValueError(f"einsum: subscripts {t!r} do not match an operand of dimension {x.ndim}")
        inputs.append(subs)
    if arrow:
        output = list(rhs.replace("...", "".join(ell))) if "..." in rhs else list(rhs)
    else:
        letters = [c for subs in inputs for c in subs]
        output = ell + sorted(c for c in set(letters) if letters.count(c) == 1 and c not in ell)
    return inputs, output


def norm(x, ord=None, axis=None, keepdims: bool = False) -> Tracer:  # noqa: A002 - NumPy's name
    """NumPy's linalg.norm: vector norms (ord None/2, 1, inf, -inf, 0, any p) and matrix norms ('fro', 1, -1,
    inf, -inf; 2 and 'nuc' need singular values and are refused); integer input is computed in float64."""
    x = to_tracer(x)
    if not x.dtype.is_float:
        x = prims.cast(x, dtypes.float64)
    if axis is None:
        if ord is None:
            return sqrt(sum(multiply(x, x), axis=None, keepdims=keepdims))
        if x.ndim not in (1, 2):
            raise ValueError("Improper number of dimensions to norm.")
        axes = tuple(range(x.ndim))
    else:
        axes = tuple(prims.normalize_axis(a, x.ndim) for a in (axis if isinstance(axis, tuple) else (axis,)))
    if len(axes) == 1:
        return _vector_norm(x, ord, axes[0], keepdims)
    if len(axes) == 2:
        return _matrix_norm(x, ord, axes, keepdims)
    raise ValueError("Improper number of dimensions to norm.")


def _vector_norm(x: Tracer, ord, axis: int, keepdims: bool) -> Tracer:  # noqa: A002
    if ord is None or ord == 2:
        return sqrt(sum(multiply(x, x), axis=axis, keepdims=keepdims))
    if isinstance(ord, str):
        raise ValueError(f"Invalid norm order '{ord}' for vectors")
    a = absolute(x)
    if ord == np.inf:
        return amax(a, axis=axis, keepdims=keepdims)
    if ord == -np.inf:
        return amin(a, axis=axis, keepdims=keepdims)
    if ord == 0:
        return sum(prims.cast(not_equal(x, 0), x.dtype), axis=axis, keepdims=keepdims)
    if ord == 1:
        return sum(a, axis=axis, keepdims=keepdims)
    p = float(ord)
    return power(sum(power(a, prims.cast(to_tracer(p), x.dtype)), axis=axis, keepdims=keepdims),
                 prims.cast(to_tracer(1.0 / p), x.dtype))


def _matrix_norm(x: Tracer, ord, axes: tuple, keepdims: bool) -> Tracer:  # noqa: A002
    row, col = axes
    if row == col:
        raise ValueError("Duplicate axes given.")
    if ord in (None, "fro"):
        return sqrt(sum(multiply(x, x), axis=axes, keepdims=keepdims))
    if ord in (1, -1, np.inf, -np.inf):
        inner, outer_axis = (row, col) if ord in (1, -1) else (col, row)
        sums = sum(absolute(x), axis=inner, keepdims=True)
        out = (amax if ord > 0 else amin)(sums, axis=outer_axis, keepdims=True)
        return out if keepdims else prims.reshape(out, tuple(d for m, d in enumerate(x.uop.shape) if m not in axes))
    if ord in (2, -2, "nuc"):
        raise TraceError(f"linalg.norm with ord={ord!r} needs singular values, which traced arrays do not have yet")
    raise ValueError(f"Invalid norm order {ord!r} for matrices")
