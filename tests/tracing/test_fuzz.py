"""Differential fuzzing: random compositions of prepjit.numpy ops on random shapes, dtypes and var values vs NumPy.

A program is a short list of steps, each valid for any shape of the rank it is applied to; it is
run by `run_program` with `m = np` and, inside a prepared function whose first dim is the var
"n", with `m = pnp`. Several var values replay one plan (no retrace). Examples NumPy itself
rejects (an IndexError, a reduction over nothing) are skipped; where NumPy raises IndexError, the
prepared function must raise pj.IndexBoundError. Every input sits right before a PROT_NONE guard
page (tests/guard_pages.py) and every program also runs at the var's minimum, n = 0, so a kernel
reading outside an argument crashes the run. CI runs a bounded number of examples (a third of them on each
device other than the cpu); `pytest -m fuzz` (or PREPJIT_FUZZ_EXAMPLES=N) runs the larger profile. Every
failure found becomes a test in `test_numpy_regressions.py`. Both profiles run on every available device (the
guard pages catch stray reads on the cpu; on a GPU the comparison with NumPy is the check).
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import prepjit as pj
import prepjit.nn as pnn
import prepjit.numpy as pnp
from tests.conftest import DEVICES
from tests.guard_pages import guarded

DTYPES = ["float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8", "bool"]
UNARY = ["negative", "abs", "sign", "square", "tanh", "sin", "floor", "sqrt_abs", "exp_clipped", "log_abs", "erf",
         "relu", "sigmoid", "isnan", "logical_not", "invert", "round"]
BINARY = ["add", "subtract", "multiply", "true_divide", "floor_divide", "mod", "maximum", "minimum", "less",
          "greater_equal", "equal", "bitwise_and", "bitwise_xor", "power2"]
SCALARS = [2, -3, 0.5, True, 0]
REDUCE = ["sum", "max", "min", "mean", "prod", "argmax", "argmin", "var", "all", "any", "cumsum", "softmax",
          "logsumexp"]
EXAMPLES = int(os.environ.get("PREPJIT_FUZZ_EXAMPLES", "60"))


def _erf(m, x):
    if m is np:
        import math
        out = np.vectorize(math.erf, otypes=[np.float64])(x)
        return out.astype(x.dtype) if x.dtype.kind == "f" else out.astype(np.exp(np.ones(1, x.dtype)).dtype)
    return pnp.erf(x)


def unary(m, name, x):
    nn = pnn if m is pnp else None
    if name == "sqrt_abs":
        return m.sqrt(m.abs(x))
    if name == "exp_clipped":
        return m.exp(m.clip(x, -5, 5))
    if name == "log_abs":
        return m.log(m.abs(x) + 1)
    if name == "erf":
        return _erf(m, x)
    if name == "relu":
        return nn.relu(x) if nn else np.maximum(x, 0)
    if name == "sigmoid":
        return nn.sigmoid(x) if nn else 1 / (1 + np.exp(-x))
    return getattr(m, name)(x)


def binary(m, name, a, b):
    if name == "power2":
        return m.power(a, 2)
    return getattr(m, name)(a, b)


def reduce_step(m, name, x, axis, keepdims):
    if name in ("argmax", "argmin"):
        return getattr(m, name)(x, axis=axis, keepdims=keepdims)
    if name == "cumsum":
        return m.cumsum(x, axis=axis)
    if name == "softmax":
        if m is pnp:
            return pnn.softmax(x, axis=axis)
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        return e / e.sum(axis=axis, keepdims=True)
    if name == "logsumexp":
        if m is pnp:
            return pnn.logsumexp(x, axis=axis, keepdims=keepdims)
        mx = x.max(axis=axis, keepdims=True)
        mx = np.where(np.isfinite(mx), mx, 0)  # scipy.special.logsumexp's shift: logsumexp([-inf]) is -inf, not nan
        out = np.log(np.exp(x - mx).sum(axis=axis, keepdims=True)) + mx
        return out if keepdims else np.squeeze(out, axis)
    return getattr(m, name)(x, axis=axis, keepdims=keepdims)


def cast(m, x, dtype: str):
    """astype, with floats first made finite and in range of an int target: out-of-range float -> int
    conversions are undefined in C, and NumPy's result for them differs between platforms."""
    target = np.dtype(dtype)
    if np.dtype(x.dtype.name).kind == "f" and target.kind in "iu":
        info = np.iinfo(target)
        x = m.where(m.isfinite(x), m.clip(x, float(info.min), float(min(info.max, 2**62))), 0)
    return x.astype(getattr(m, dtype))


def run_program(m, program, x, ids):
    """Apply the steps to x (ids: an int array for gathers); axes are taken modulo the current rank."""
    for step in program:
        kind, args = step[0], step[1:]
        nd = x.ndim
        ax = args[-1] % nd if nd and args and isinstance(args[-1], int) and kind not in ("scalar", "cast") else 0
        if kind == "unary":
            x = unary(m, args[0], x)
        elif kind == "self":  # x op (x flipped along an axis, cast to another dtype)
            other = cast(m, m.flip(x, ax) if nd else x, args[1])
            x = binary(m, args[0], x, other)
        elif kind == "scalar":
            x = binary(m, args[0], x, args[1])
        elif kind == "reduce" and nd:
            x = reduce_step(m, args[0], x, ax, args[1])
        elif kind == "broadcast_reduce" and nd:
            x = x - x.max(axis=ax, keepdims=True)
        elif kind == "cast":
            x = cast(m, x, args[0])
        elif kind == "transpose" and nd:
            x = m.transpose(x, tuple(np.roll(np.arange(nd), args[0] % nd)))
        elif kind == "flip" and nd:
            x = m.flip(x, ax)
        elif kind == "roll" and nd:
            x = m.roll(x, args[0], ax)
        elif kind == "slice" and nd:
            start, stop, step_ = args[0], args[1], args[2]
            x = x[(slice(None),) * ax + (slice(start, stop, step_),)]
        elif kind == "index" and nd:
            x = x[(slice(None),) * ax + (args[0],)]
        elif kind == "newaxis":
            x = x[..., None] if args[0] else x[None]
        elif kind == "reshape_flat":
            x = x.reshape(-1)
        elif kind == "concat" and nd:
            x = m.concatenate([x, x[::-1]], axis=ax)
        elif kind == "pad" and nd:
            x = m.pad(x, [(args[0], args[1]) if i == ax else (0, 0) for i in range(nd)], constant_values=args[2])
        elif kind == "tile" and nd:
            x = m.tile(x, (2,) + (1,) * ax)
        elif kind == "repeat" and nd:
            x = m.repeat(x, 2, axis=ax)
        elif kind == "tri" and nd >= 2:
            x = m.triu(x, args[0]) if args[1] else m.tril(x, args[0])
        elif kind == "take" and nd:
            x = m.take(x, m.mod(ids, x.shape[ax]), axis=ax)
        elif kind == "take_along" and nd:
            x = m.take_along_axis(x, m.argmin(x, axis=ax, keepdims=True), axis=ax)
        elif kind == "where" and nd:
            x = m.where(x > args[0], x, m.flip(x, ax))
        elif kind == "matmul" and nd >= 1:
            x = x @ m.swapaxes(x, -1, -2) if nd >= 2 else x @ x
    return x


axis = st.integers(0, 3)
STEP = st.one_of(
    st.tuples(st.just("unary"), st.sampled_from(UNARY)),
    st.tuples(st.just("self"), st.sampled_from(BINARY), st.sampled_from(DTYPES), axis),
    st.tuples(st.just("scalar"), st.sampled_from(BINARY), st.sampled_from(SCALARS)),
    st.tuples(st.just("reduce"), st.sampled_from(REDUCE), st.booleans(), axis),
    st.tuples(st.just("broadcast_reduce"), axis),
    st.tuples(st.just("cast"), st.sampled_from(DTYPES)),
    st.tuples(st.just("transpose"), st.integers(1, 3)),
    st.tuples(st.just("flip"), axis),
    st.tuples(st.just("roll"), st.integers(-4, 4), axis),
    st.tuples(st.just("slice"), st.sampled_from([None, 0, 1, -1, -3]), st.sampled_from([None, 2, -1, 5]),
              st.sampled_from([None, 1, 2, -1, -2]), axis),
    st.tuples(st.just("index"), st.sampled_from([0, -1]), axis),
    st.tuples(st.just("newaxis"), st.booleans()),
    st.tuples(st.just("reshape_flat")),
    st.tuples(st.just("concat"), axis),
    st.tuples(st.just("pad"), st.integers(0, 2), st.integers(0, 2), st.sampled_from([0, 1]), axis),
    st.tuples(st.just("tile"), axis),
    st.tuples(st.just("repeat"), axis),
    st.tuples(st.just("tri"), st.integers(-1, 1), st.booleans(), axis),
    st.tuples(st.just("take"), axis),
    st.tuples(st.just("take_along"), axis),
    st.tuples(st.just("where"), st.sampled_from([0, 1]), axis),
    st.tuples(st.just("matmul"), axis),
)


def make_input(rng, shape, dtype):
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return rng.random(shape) < 0.5
    if dt.kind in "iu":
        return rng.integers(0 if dt.kind == "u" else -5, 6, shape).astype(dt)
    return (rng.standard_normal(shape) * 2).astype(dt)


def numpy_reference(program, x, ids):
    """NumPy's result, IndexError when NumPy raises one (prepjit must raise IndexBoundError), or None."""
    with np.errstate(all="ignore"):
        try:
            return run_program(np, program, x, ids)
        except IndexError:
            return IndexError
        except (ValueError, TypeError, OverflowError, np.exceptions.AxisError):
            return None  # NumPy rejects this example; so may we


def compare(got, want, note: str, half: bool = False):
    """got == want (floats within a tolerance: float16's when the program computed in float16 anywhere, `half`,
    since a sum in another order rounds differently there even when the result is cast to a wider type)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, f"dtype {got.dtype} != NumPy's {want.dtype}; {note}"
    assert got.shape == want.shape, f"shape {got.shape} != NumPy's {want.shape}; {note}"
    if want.dtype.kind == "f":
        finite = np.isfinite(want)
        scale = max(1.0, float(np.abs(want[finite]).max())) if finite.any() else 1.0
        tol = 2e-2 if want.dtype == np.float16 or half else 1e-4
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale, equal_nan=True, err_msg=note)
    else:
        np.testing.assert_array_equal(got, want, err_msg=note)


def check_program(program, dtype, rest_shape, n_values, seed, device="cpu"):
    """Prepare the program once with a var first dim for `device`, replay it for each n, compare each run with
    NumPy."""
    rng = np.random.default_rng(seed)
    f = pj.prepare(vars={"n": (0, 6)}, shapes={"x": ("n",) + tuple(rest_shape), "ids": (3,)}, device=device)(
        lambda x, ids: run_program(pnp, program, x, ids))
    checked = 0
    for n in dict.fromkeys([0, *n_values]):  # the var's minimum first: empty arguments
        x = guarded(make_input(rng, (n,) + tuple(rest_shape), dtype))
        ids = guarded(rng.integers(-4, 5, 3).astype(np.int32))
        want = numpy_reference(program, x, ids)
        if want is None:
            continue
        note = f"program={program} dtype={dtype} shape={x.shape}"
        if want is IndexError:  # prepjit raises IndexBoundError (or cannot trace the program at all)
            try:
                with np.errstate(all="ignore"):
                    f(x, ids)
            except (pj.IndexBoundError, pj.TraceError):
                continue
            raise AssertionError(f"NumPy raises IndexError but prepjit returned a result; {note}")
        with np.errstate(all="ignore"):
            got = f(x, ids)
        compare(got, want, note, half=dtype == "float16" or "float16" in repr(program))
        checked += 1
    assume(checked)
    assert f.stats["traces"] == 1, f.stats


PROGRAMS = dict(
    program=st.lists(STEP, min_size=1, max_size=4),
    dtype=st.sampled_from(DTYPES),
    rest_shape=st.lists(st.integers(1, 4), min_size=0, max_size=2),
    n_values=st.lists(st.integers(0, 6), min_size=1, max_size=3, unique=True),
    seed=st.integers(0, 2**16),
)
_common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
               derandomize=True)


@pytest.mark.parametrize("device", DEVICES)
def test_fuzz_programs(device):
    """EXAMPLES programs on the cpu; a third of them on each other device, where every example's kernels are
    compiled by the device's own compiler (PoCL's OpenCL takes seconds where the cpu's LLVM takes a fraction)."""
    @settings(max_examples=EXAMPLES if device == "cpu" else max(1, EXAMPLES // 3), **_common)
    @given(**PROGRAMS)
    def fuzz(program, dtype, rest_shape, n_values, seed):
        check_program(program, dtype, rest_shape, n_values, seed, device)
    fuzz()


@pytest.mark.fuzz
@settings(max_examples=int(os.environ.get("PREPJIT_FUZZ_LARGE", "2000")), **{**_common, "derandomize": False})
@pytest.mark.parametrize("device", DEVICES)
@given(**PROGRAMS)
def test_fuzz_programs_large(program, dtype, rest_shape, n_values, seed, device):
    check_program(program, dtype, rest_shape, n_values, seed, device)
