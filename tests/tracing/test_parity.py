"""Parity table: every op of prepjit.numpy / prepjit.nn against NumPy, on static and on symbolic shapes.

Each case is `fn(m, *arrays)` run with `m = pnp` inside a prepared function and `m = np` for the
reference (or an explicit `ref`). Shapes name the var "n": the static run uses n = 5; the
symbolic run prepares once with n a var and replays several values (0 included where NumPy
allows it), asserting that nothing is traced again.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pytest

import prepjit as pj
import prepjit.nn as pnn
import prepjit.numpy as pnp
from prepjit.runtime.devices import available_devices

N = "n"  # in an arg's shape: the symbolic dim; as an arg: the var's value passed as a scalar var


@dataclass
class A:
    """An array argument: shape (ints and "n"), dtype, and optionally a value range."""
    shape: tuple
    dtype: str = "float32"
    low: float | None = None
    high: float | None = None


@dataclass
class Case:
    name: str
    fn: object
    args: tuple
    ref: object = None
    sizes: tuple = (0, 1, 3, 7)
    rtol: float = 1e-5
    atol: float = 1e-6
    marks: list = field(default_factory=list)


def make(spec, n: int, rng):
    if spec is N:
        return n
    shape = tuple(n if d == N else d for d in spec.shape)
    dt = np.dtype(spec.dtype)
    if dt == np.bool_:
        return rng.random(shape) < 0.5
    if dt.kind in "iu":
        lo = spec.low if spec.low is not None else (0 if dt.kind == "u" else -9)
        hi = spec.high if spec.high is not None else 9
        return rng.integers(lo, hi + 1, shape).astype(dt)
    if spec.low is not None:
        return rng.uniform(spec.low, spec.high, shape).astype(dt)
    return (rng.standard_normal(shape) * 2).astype(dt)


def _erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype if x.dtype.kind == "f" else np.float64)


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _logsumexp(x, axis=None):
    m = x.max(axis=axis, keepdims=True)
    return np.squeeze(np.log(np.exp(x - m).sum(axis=axis, keepdims=True)) + m, axis=axis)


F = A((N, 4))
F3 = A((2, N, 3))
I = A((N, 4), "int32")
POS = A((N, 4), "float32", 0.1, 4.0)
IDS = A((N,), "int64", -3, 2)  # indices into a dim of size 3

CASES = [
    # ---- elementwise arithmetic ----
    Case("add", lambda m, a, b: a + b, (F, A((4,)))),
    Case("sub_int", lambda m, a, b: a - b, (I, A((N, 1), "int8"))),
    Case("mul_scalar", lambda m, a: a * 3 + 1.5, (I,)),
    Case("truediv", lambda m, a, b: a / b, (F, POS)),
    Case("floordiv_int", lambda m, a, b: a // b, (I, A((N, 4), "int32", -4, 4))),
    Case("mod_int", lambda m, a, b: a % b, (I, A((N, 4), "int32", -4, 4))),
    Case("floordiv_float", lambda m, a, b: a // b, (F, A((N, 4), "float32", -3, 3))),
    Case("mod_float", lambda m, a, b: a % b, (F, A((N, 4), "float32", -3, 3))),
    Case("pow_float", lambda m, a, b: a ** b, (POS, F)),
    Case("pow_int", lambda m, a, b: a ** b, (I, A((N, 4), "int32", 0, 5))),
    Case("pow_int_static", lambda m, a: a ** 3 + 2 ** a.astype(m.uint8), (A((N, 4), "int16", 0, 7),)),
    Case("negative", lambda m, a: m.negative(a) - a, (I,)),
    Case("abs", lambda m, a: m.abs(a), (F,)),
    Case("abs_int", lambda m, a: abs(a), (A((N, 4), "int8"),)),
    Case("sign", lambda m, a: m.sign(a), (I,)),
    Case("square", lambda m, a: m.square(a), (F,)),
    Case("reciprocal", lambda m, a: m.reciprocal(a), (POS,)),
    Case("exp", lambda m, a: m.exp(a), (F,)),
    Case("exp2", lambda m, a: m.exp2(a), (F,)),
    Case("log", lambda m, a: m.log(a), (POS,)),
    Case("log2", lambda m, a: m.log2(a), (POS,)),
    Case("log_int", lambda m, a: m.log(a), (A((N, 4), "int8", 1, 9),), rtol=1e-3),
    Case("sqrt", lambda m, a: m.sqrt(a), (POS,)),
    Case("rsqrt", lambda m, a: m.rsqrt(a), (POS,), ref=lambda a: (1 / np.sqrt(a)).astype(np.float32)),
    Case("sin", lambda m, a: m.sin(a), (F,)),
    Case("cos", lambda m, a: m.cos(a), (F,)),
    Case("tanh", lambda m, a: m.tanh(a), (F,)),
    Case("erf", lambda m, a: m.erf(a), (F,), ref=_erf),
    Case("floor_ceil", lambda m, a: (m.floor(a), m.ceil(a)), (F,)),
    Case("round", lambda m, a: (m.round(a * 4), m.round(a, 2), m.rint(a)), (F,)),
    Case("clip", lambda m, a: m.clip(a, -1, 0.5), (F,)),
    Case("maximum_minimum", lambda m, a, b: (m.maximum(a, b), m.minimum(a, b)), (F, A((4,)))),
    Case("where", lambda m, a, b: m.where(a > 0, a, b), (F, I)),
    Case("comparisons", lambda m, a, b: (a < b, a <= b, a > b, a >= b, a == b, a != b), (I, A((4,), "int32"))),
    Case("logical", lambda m, a, b: (m.logical_and(a, b), m.logical_or(a, b), m.logical_xor(a, b), m.logical_not(a)),
         (A((N, 4), "bool"), A((N, 4), "bool"))),
    Case("bitwise_int", lambda m, a, b: (a & b, a | b, a ^ b, ~a), (I, A((N, 4), "int32"))),
    Case("bitwise_bool", lambda m, a, b: (a & b, a | b, a ^ b, ~a), (A((N, 4), "bool"), A((N, 4), "bool"))),
    Case("shifts", lambda m, a, b: (m.left_shift(a, b), m.right_shift(a, b)), (I, A((N, 4), "int32", 0, 5))),
    Case("isnan_isinf", lambda m, a: (m.isnan(m.log(a)), m.isinf(a / 0), m.isfinite(m.log(a))), (F,)),
    Case("astype", lambda m, a: (a.astype(m.int8), a.astype(m.float16), (a > 0).astype(m.int32)), (F,)),
    # ---- nn helpers ----
    Case("relu", lambda m, a: pnn.relu(a), (F,), ref=lambda a: np.maximum(a, 0)),
    Case("sigmoid", lambda m, a: pnn.sigmoid(a), (F,), ref=lambda a: 1 / (1 + np.exp(-a))),
    Case("gelu_tanh", lambda m, a: pnn.gelu(a), (F,),
         ref=lambda a: 0.5 * a * (1 + np.tanh(np.float32(math.sqrt(2 / math.pi)) * (a + 0.044715 * a ** 3)))),
    Case("gelu_erf", lambda m, a: pnn.gelu(a, approximate=False), (F,),
         ref=lambda a: (a * 0.5 * (1 + _erf(a / np.float32(math.sqrt(2))))).astype(np.float32)),
    Case("softmax", lambda m, a: pnn.softmax(a), (F,), ref=_softmax),
    Case("softmax_axis0", lambda m, a: pnn.softmax(a, axis=0), (F,), ref=lambda a: _softmax(a, 0), sizes=(1, 3, 7)),
    Case("log_softmax", lambda m, a: pnn.log_softmax(a), (F,), ref=lambda a: np.log(_softmax(a))),
    Case("logsumexp", lambda m, a: pnn.logsumexp(a, axis=1), (F,), ref=lambda a: _logsumexp(a, 1)),
    Case("logsumexp_all", lambda m, a: pnn.logsumexp(a), (F,), ref=_logsumexp, sizes=(1, 3, 7)),
    # ---- reductions ----
    Case("sum", lambda m, a: (a.sum(), a.sum(0), a.sum(1, keepdims=True)), (F,)),
    Case("sum_int8", lambda m, a: m.sum(a, axis=0), (A((N, 4), "int8"),)),
    Case("sum_bool", lambda m, a: m.sum(a, axis=1), (A((N, 4), "bool"),)),
    Case("prod", lambda m, a: (m.prod(a, 0), m.prod(a, axis=1, keepdims=True)), (A((N, 4), "float32", 0.5, 1.5),)),
    Case("mean", lambda m, a: (a.mean(0), m.mean(a, axis=(0, 2), keepdims=True)), (F3,), sizes=(1, 3, 7)),
    Case("mean_int", lambda m, a: m.mean(a, 1), (I,)),
    Case("max_min", lambda m, a: (a.max(1), m.min(a, axis=1, keepdims=True), m.max(a, 0)), (F,), sizes=(1, 3, 7)),
    Case("max_int", lambda m, a: (a.max(1), a.min(1)), (A((N, 4), "uint8"),)),
    Case("argmax_argmin", lambda m, a: (m.argmax(a, 1), m.argmin(a, 1), m.argmax(a, axis=1, keepdims=True)), (F,)),
    Case("argmax_flat", lambda m, a: (m.argmax(a), m.argmin(a, axis=0)), (I,), sizes=(1, 3, 7)),
    Case("var_std", lambda m, a: (m.var(a, 0), m.std(a, axis=1), m.var(a, ddof=1), a.std(1, keepdims=True)), (F,),
         sizes=(2, 3, 7), rtol=1e-4),
    Case("var_int", lambda m, a: m.var(a, axis=1), (I,)),
    Case("cumsum", lambda m, a: (m.cumsum(a, axis=0), m.cumsum(a, 1), m.cumsum(a)), (F,), rtol=1e-4, atol=1e-5),
    Case("cumsum_int", lambda m, a: (m.cumsum(a, axis=1), m.cumprod(a, 0)), (A((N, 4), "int16", -3, 3),)),
    Case("all_any", lambda m, a: (m.all(a, 0), m.any(a, 1), m.all(a), m.any(a, keepdims=True)), (A((N, 4), "bool"),)),
    # ---- movement ----
    Case("reshape", lambda m, a: (a.reshape(-1), a.reshape(a.shape[0], 2, 2), m.reshape(a, (2, -1))), (F,)),
    Case("transpose", lambda m, a: (a.T, m.transpose(a, (1, 2, 0)), a.transpose(2, 0, 1)), (F3,)),
    Case("swapaxes_moveaxis", lambda m, a: (m.swapaxes(a, 0, 2), m.moveaxis(a, 0, -1), m.moveaxis(a, [0, 1], [2, 0])),
         (F3,)),
    Case("squeeze_expand", lambda m, a: (m.squeeze(a[:, None], 1), m.expand_dims(a, (0, 2)), m.squeeze(a[None, :, :1], (0, 2))),
         (F,)),
    Case("broadcast_to", lambda m, a: m.broadcast_to(a[:, :1], (a.shape[0], 4)) + m.broadcast_to(a[0], (2, 4))[1],
         (F,), sizes=(1, 3, 7)),
    Case("concatenate", lambda m, a, b: (m.concatenate([a, b, a], 0), m.concatenate([a, a * 2], axis=1)), (F, F)),
    Case("concatenate_none", lambda m, a, b: m.concatenate([a, b], axis=None), (F, I)),
    Case("stack", lambda m, a, b: (m.stack([a, b]), m.stack([a, b], axis=-1)), (F, F)),
    Case("split", lambda m, a: (*m.split(a, 2, axis=1), *m.split(a, [1, 3], axis=1)), (F,)),
    Case("pad", lambda m, a: (m.pad(a, ((1, 2), (0, 3))), m.pad(a, 1, constant_values=-2.5)), (F,)),
    Case("flip", lambda m, a: (m.flip(a), m.flip(a, 0), m.flip(a, axis=(1, 2))), (F3,)),
    Case("roll", lambda m, a: (m.roll(a, 2, 1), m.roll(a, -1, 0), m.roll(a, 3), m.roll(a, (1, -2), (0, 1))), (F,)),
    Case("tile", lambda m, a: (m.tile(a, 2), m.tile(a, (3, 1, 2))), (F,)),
    Case("repeat", lambda m, a: (m.repeat(a, 2, axis=0), m.repeat(a, 3, 1), m.repeat(a, 2)), (F,)),
    Case("triu_tril", lambda m, a: (m.triu(a), m.tril(a, -1), m.triu(a, 2), m.tril(a, 1)), (F,)),
    Case("triu_batched_int", lambda m, a: m.triu(a, 1), (A((2, N, N), "int16"),)),
    # ---- indexing ----
    Case("index_basic", lambda m, a: (a[1], a[:, 2], a[-1, ::-1], a[None, ..., 1:3], a[::2, ::-2], a[..., None]),
         (F,), sizes=(2, 3, 7)),
    Case("index_negative_steps", lambda m, a: (a[::-1], a[:0:-2], a[-2::-3, 1::2]), (F,)),
    Case("slice_by_var", lambda m, a, n: (a[:n], a[:n + 1][::-1], a[n:]), (A((8, 3)), N)),
    Case("gather_rows", lambda m, t, i: t[i], (A((3, 4)), IDS)),
    Case("gather_cols", lambda m, t, i: (t[:, i], t[1:, i], t[i, 1:3]), (A((3, 3)), IDS)),
    Case("gather_2d_ids", lambda m, t, i: t[i.reshape(1, -1)], (A((3, 4)), IDS)),
    Case("gather_pairs", lambda m, t, i: (t[i, i], t[i, 0], t[0, :, i], t[i, :, 0]), (A((3, 3, 3)), IDS)),
    Case("gather_split", lambda m, t, i: (t[i, :, i], t[None, i, ..., 1]), (A((3, 3, 3)), IDS)),
    Case("take", lambda m, t, i: (m.take(t, i, axis=1), m.take(t, i), m.take(t, i, axis=0, mode="wrap"),
                                  m.take(t, i + 2, axis=0, mode="clip")), (A((3, 3)), IDS)),
    Case("take_along_axis", lambda m, t, i: (m.take_along_axis(t, i, 1), m.take_along_axis(m.concatenate([t, t, t]), i[:1, :3], 0)),
         (A((N, 3)), A((N, 5), "int32", -3, 2))),
    Case("take_along_argmax", lambda m, t: m.take_along_axis(t, m.argmax(t, axis=1, keepdims=True), axis=1),
         (A((N, 6)),)),
    Case("embedding", lambda m, t, i: (t[i] * 2).sum(-1), (A((5, 8)), A((N,), "int32", 0, 4))),
    # ---- creation ----
    Case("zeros_ones_full", lambda m, a: (m.zeros((a.shape[0], 2)), m.ones(a.shape, m.int32), m.full(3, 7.5),
                                          m.full((2, a.shape[0]), 4, dtype=m.uint8)), (F,)),
    Case("like", lambda m, a: (m.zeros_like(a), m.ones_like(a, dtype=m.int64), m.full_like(a, 2)), (I,)),
    Case("arange", lambda m, a: (m.arange(a.shape[0]), m.arange(2, a.shape[0] + 5, 3), m.arange(5, 0, -2),
                                 m.arange(0.5, 2.0, 0.25)), (F,)),
    Case("arange_var", lambda m, n: (m.arange(n), m.arange(n, dtype=m.float32) * 2), (N,)),
    Case("eye", lambda m, a: (m.eye(a.shape[0]), m.eye(3, a.shape[0], k=1, dtype=m.int8), m.eye(4, k=-2)), (F,)),
    Case("linspace", lambda m, a: (m.linspace(0, 1, 5), m.linspace(-2.5, 3, a.shape[0]),
                                   m.linspace(1, 10, 4, endpoint=False), m.linspace(0, 9, 10, dtype=m.int32)), (F,)),
    # ---- linear algebra ----
    Case("matmul", lambda m, a, b: a @ b, (F, A((4, 3))), rtol=1e-4),
    Case("matmul_batched", lambda m, a, b: m.matmul(a, b), (A((2, N, 4)), A((2, 4, 3))), rtol=1e-4),
    Case("matmul_broadcast", lambda m, a, b: a @ b, (A((2, 1, N, 4)), A((3, 4, 2))), rtol=1e-4),
    Case("matmul_vectors", lambda m, a, b, v: (v @ a.T, a @ v, v @ v), (F, A((4, 3)), A((4,))), rtol=1e-4),
    Case("matmul_int", lambda m, a, b: a @ b, (I, A((4, 2), "int8"))),
    Case("dot", lambda m, a, b: (m.dot(a, b), m.dot(a, 2.0), m.dot(a[0], a[0]), m.dot(a, b.reshape(2, 4, 1))),
         (F, A((4, 2))), rtol=1e-4, sizes=(1, 3, 7)),
    Case("outer", lambda m, a, b: m.outer(a, b), (A((N,)), A((3,)))),
    Case("einsum_matmul", lambda m, a, b: (m.einsum("ij,jk->ik", a, b), m.einsum("ij,kj", a, b.T)), (F, A((4, 3))),
         rtol=1e-4),
    Case("einsum_attention", lambda m, q, k: m.einsum("bhqd,bhkd->bhqk", q, k), (A((1, 2, N, 4)), A((1, 2, 3, 4))),
         rtol=1e-4),
    Case("einsum_ellipsis", lambda m, a, b: (m.einsum("...ij,jk->...ik", a, b), m.einsum("...i->...", a),
                                            m.einsum("bij->ji", a)), (A((2, N, 4)), A((4, 3))), rtol=1e-4),
    Case("tensordot", lambda m, a, b: m.tensordot(a, b, axes=([1, 2], [0, 1])), (F3, A((N, 3, 2))), rtol=1e-4),
]


def _ref(case: Case, args):
    if case.ref is not None:
        return case.ref(*args)
    with np.errstate(all="ignore"):
        return case.fn(np, *args)


def _check(case: Case, got, want):
    got_leaves = got if isinstance(got, (tuple, list)) else (got,)
    want_leaves = want if isinstance(want, (tuple, list)) else (want,)
    assert len(got_leaves) == len(want_leaves)
    for g, w in zip(got_leaves, want_leaves):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype, f"{case.name}: dtype {g.dtype} != NumPy's {w.dtype}"
        assert g.shape == w.shape, f"{case.name}: shape {g.shape} != NumPy's {w.shape}"
        rtol = 1e-2 if w.dtype == np.float16 else case.rtol
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=rtol, atol=case.atol if w.dtype != np.float16 else 1e-2,
                                       equal_nan=True, err_msg=case.name)
        else:
            np.testing.assert_array_equal(g, w, err_msg=case.name)


def _params(case: Case) -> list[str]:
    return ["n" if a is N else f"a{i}" for i, a in enumerate(case.args)]


def _prepared(case: Case, symbolic: bool, device: str):
    params = _params(case)
    src = f"lambda {', '.join(params)}: fn(pnp, {', '.join(params)})"
    body = eval(src, {"fn": case.fn, "pnp": pnp})  # a function with one named parameter per argument
    if not symbolic:
        return pj.prepare(device=device)(body)
    shapes = {p: tuple(a.shape) for p, a in zip(params, case.args) if a is not N}
    return pj.prepare(vars={"n": (0, 8)}, shapes=shapes, device=device)(body)


# Every case runs on the cpu; other devices (whose compilers are slower) run these, symbolic only.
OTHER_DEVICE_CASES = {"floordiv_int", "mod_float", "pow_int_static", "erf", "where", "isnan_isinf", "softmax",
                      "argmax_argmin", "var_std", "cumsum", "pad", "roll", "concatenate", "gather_pairs",
                      "take_along_axis", "slice_by_var", "linspace", "matmul_batched", "einsum_attention"}


def _case_params(all_devices: bool) -> list:
    return [pytest.param(case, device, id=f"{device}-{case.name}") for device in available_devices()
            for case in CASES if device == "cpu" or all_devices and case.name in OTHER_DEVICE_CASES]


def _seed(case: Case) -> int:
    return sum(map(ord, case.name))


@pytest.mark.parametrize("case, device", _case_params(all_devices=False))
def test_static(case: Case, device):
    rng = np.random.default_rng(_seed(case))
    args = [make(a, 5, rng) for a in case.args]
    f = _prepared(case, False, device)
    _check(case, f(*args), _ref(case, args))


@pytest.mark.parametrize("case, device", _case_params(all_devices=True))
def test_symbolic(case: Case, device):
    rng = np.random.default_rng(_seed(case))
    f = _prepared(case, True, device)
    for n in case.sizes:
        args = [make(a, n, rng) for a in case.args]
        _check(case, f(*args), _ref(case, args))
    assert f.stats["traces"] == 1, f"{case.name} retraced: {f.stats}"


def test_every_required_op_is_exported():
    required = """add subtract multiply true_divide floor_divide mod power negative abs sign square reciprocal exp exp2
        log log2 sqrt rsqrt sin cos tanh erf floor ceil round clip maximum minimum where less less_equal greater
        greater_equal equal not_equal logical_and logical_or logical_not logical_xor bitwise_and bitwise_or
        bitwise_xor invert sum prod mean max min argmax argmin var std cumsum all any reshape transpose swapaxes
        moveaxis squeeze expand_dims broadcast_to concatenate stack split pad flip roll tile repeat triu tril take
        take_along_axis zeros ones full zeros_like ones_like full_like arange eye linspace matmul dot einsum outer
        astype float16 float32 float64 int8 int16 int32 int64 uint8 bool_""".split()
    assert [name for name in required if not hasattr(pnp, name)] == []
    assert [name for name in "sigmoid relu gelu softmax log_softmax logsumexp".split() if not hasattr(pnn, name)] == []
