"""Traced operators, methods and NumPy functions on static shapes, each checked against NumPy."""
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from tests.helpers import assert_matches, check_op

R = np.random.default_rng(0)
A = R.standard_normal((4, 6)).astype(np.float32)
B = R.standard_normal((6,)).astype(np.float32)
POS = (np.abs(A) + 0.5).astype(np.float32)
I = np.array([[-7, 7, 0, 5], [3, -2, 9, -9]], np.int32)
J = np.array([[2, -2, 3, 4], [-3, 5, -4, 2]], np.int32)

BINARY = {
    "add": lambda xp, a, b: a + b, "radd": lambda xp, a, b: 1 + a, "sub": lambda xp, a, b: a - b,
    "rsub": lambda xp, a, b: 2 - a, "mul": lambda xp, a, b: a * b, "div": lambda xp, a, b: a / (b + 3),
    "rdiv": lambda xp, a, b: 1 / (a + 3), "pow": lambda xp, a, b: (xp.abs(a) + 1) ** 1.5,
    "rpow": lambda xp, a, b: 2.0 ** a, "neg": lambda xp, a, b: -a, "floordiv": lambda xp, a, b: a // (b + 3),
    "mod": lambda xp, a, b: a % (b + 3), "lt": lambda xp, a, b: a < b, "le": lambda xp, a, b: a <= b,
    "gt": lambda xp, a, b: a > b, "ge": lambda xp, a, b: a >= 0.5, "eq": lambda xp, a, b: a == a,
    "ne": lambda xp, a, b: a != b, "and": lambda xp, a, b: (a < 0) & (b > 0), "or": lambda xp, a, b: (a < 0) | (b > 0),
    "not": lambda xp, a, b: ~(a < 0), "xor": lambda xp, a, b: (a < 0) ^ (b > 0),
}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_operators_float32_with_broadcast(name, device):
    check_op(BINARY[name], A, B, device=device)


INT_OPS = {
    "floordiv": lambda xp, a, b: a // b, "mod": lambda xp, a, b: a % b, "truediv": lambda xp, a, b: a / b,
    "and": lambda xp, a, b: a & b, "or": lambda xp, a, b: a | b, "invert": lambda xp, a, b: ~a,
    "neg": lambda xp, a, b: -a, "mul_float": lambda xp, a, b: a * 2.5, "add_int": lambda xp, a, b: a + 3,
}


@pytest.mark.parametrize("name", sorted(INT_OPS))
def test_integer_operators_follow_python_semantics(name, device):
    check_op(INT_OPS[name], I, J, device=device)


UNARY = ["exp", "log", "sqrt", "tanh", "sin", "cos", "abs", "floor", "ceil", "sign", "square", "negative", "exp2",
         "log2", "rint", "reciprocal"]


@pytest.mark.parametrize("name", UNARY)
def test_unary_functions(name, device):
    check_op(lambda xp, a: getattr(xp, name)(a), POS if name in ("log", "sqrt", "log2") else A, device=device)


METHODS = {
    "T": lambda xp, a: a.T, "transpose": lambda xp, a: a.transpose(1, 0), "transpose_tuple": lambda xp, a: a.transpose((1, 0)),
    "reshape": lambda xp, a: a.reshape(3, 8), "reshape_tuple": lambda xp, a: a.reshape((2, 12)),
    "reshape_-1": lambda xp, a: a.reshape(-1, 3), "reshape_-1_last": lambda xp, a: a.reshape(2, -1),
    "flatten_-1": lambda xp, a: a.reshape(-1), "astype_int": lambda xp, a: (a * 3).astype(np.int32),
    "astype_f16": lambda xp, a: a.astype(xp.float16), "astype_bool": lambda xp, a: a.astype(bool),
    "sum": lambda xp, a: a.sum(), "sum0": lambda xp, a: a.sum(axis=0), "sum1k": lambda xp, a: a.sum(axis=1, keepdims=True),
    "sum_neg_axis": lambda xp, a: a.sum(axis=-1), "sum_tuple": lambda xp, a: a.sum(axis=(0, 1)),
    "mean": lambda xp, a: a.mean(), "mean1": lambda xp, a: a.mean(axis=1), "max": lambda xp, a: a.max(),
    "max0k": lambda xp, a: a.max(axis=0, keepdims=True), "min": lambda xp, a: a.min(), "min1": lambda xp, a: a.min(axis=1),
    "shape": lambda xp, a: a * a.shape[1], "ndim": lambda xp, a: a + a.ndim,
}


@pytest.mark.parametrize("name", sorted(METHODS))
def test_array_methods(name, device):
    check_op(METHODS[name], A, device=device)


def test_mixed_chain_of_ops(device):
    check_op(lambda xp, a, b: xp.where(a > 0, xp.exp(-a * b), xp.maximum(a, b) - 1).sum(axis=1), A, B, device=device)


# ---- dtype promotion follows NumPy 2 ----

DT = ["bool", "int8", "uint8", "int16", "int32", "int64", "uint32", "float16", "float32", "float64"]


@pytest.mark.parametrize("left", DT)
@pytest.mark.parametrize("right", ["bool", "int8", "uint8", "int32", "uint32", "float16", "float32"])
def test_binary_promotion_matches_numpy(left, right):
    a = np.array([1, 0, 1], left)
    b = np.array([1, 1, 0], right)
    out = pj.prepare(lambda x, y: x * y)(a, b)
    assert out.dtype == (a * b).dtype


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("scalar", [True, 2, 2.5])
def test_python_scalars_are_weak(dtype, scalar):
    a = np.array([1, 0, 1], dtype)
    out = pj.prepare(lambda x: x + scalar)(a)
    assert_matches(out, a + scalar)


def test_numpy_scalar_inside_function_is_strong():
    a = np.array([1, 2], np.float32)
    assert_matches(pj.prepare(lambda x: x * np.float64(2))(a), a * np.float64(2))


# ---- broadcasting ----

@pytest.mark.parametrize("sa,sb", [((4, 1), (1, 6)), ((3, 1, 5), (4, 1)), ((1,), (2, 3)), ((), (2, 2)), ((2, 1, 1), (3, 1))])
def test_broadcasting_shapes(sa, sb, device):
    a = R.standard_normal(sa).astype(np.float32)
    b = R.standard_normal(sb).astype(np.float32)
    check_op(lambda xp, x, y: x * y + x, a, b, device=device)


def test_incompatible_broadcast_raises_trace_error():
    with pytest.raises(pj.TraceError, match="cannot be broadcast"):
        pj.prepare(lambda x, y: x + y)(np.ones((2, 3), np.float32), np.ones((4,), np.float32))


# ---- shape functions ----

def test_expand_dims_broadcast_to_and_stack(device):
    check_op(lambda xp, a: xp.expand_dims(a, 1) + xp.expand_dims(a, -1)[:, :1], A, device=device)
    check_op(lambda xp, b: xp.broadcast_to(b, (3, 6)) * 2, B, device=device)
    check_op(lambda xp, b: xp.broadcast_to(b[:, None], (6, 2)), B, device=device)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concatenate(axis, device):
    check_op(lambda xp, a: xp.concatenate([a, a * 2, a[:, ::-1]], axis=axis), A, device=device)


def test_concatenate_uneven_parts(device):
    check_op(lambda xp, a: xp.concatenate([a[:1], a, a[2:]], axis=0), A, device=device)


# ---- matmul ----

@pytest.mark.parametrize("sa,sb", [((4, 6), (6, 5)), ((6,), (6, 5)), ((4, 6), (6,)), ((6,), (6,)), ((2, 4, 6), (6, 3)),
                                   ((2, 4, 6), (2, 6, 3)), ((1, 4, 6), (3, 6, 2))])
def test_matmul_shapes(sa, sb, device):
    a = R.standard_normal(sa).astype(np.float32)
    b = R.standard_normal(sb).astype(np.float32)
    out = pj.prepare(lambda x, y: x @ y, device=device)(a, b)
    assert_matches(out, a @ b, rtol=1e-4, atol=1e-5)


def test_matmul_of_integers_is_exact(device):
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    assert_matches(pj.prepare(lambda x: x @ x.T, device=device)(a), a @ a.T)


def test_matmul_shape_mismatch_raises():
    with pytest.raises((pj.TraceError, ValueError)):
        pj.prepare(lambda x, y: x @ y)(np.ones((2, 3), np.float32), np.ones((4, 2), np.float32))


def test_array_methods_import_nothing_per_call():
    """A tracer's methods (x.T, x.sum(), ...) reach numpy_api imported once, not through an import statement per call
    (~2 us each; a model's trace calls thousands)."""
    import builtins
    imports, real = [], builtins.__import__

    def f(x):
        x.T.sum()   # (numpy_api imported here at the latest)
        builtins.__import__ = lambda *a, **k: imports.append(a[0]) or real(*a, **k)
        try:
            return x.reshape(6, 2).T.sum(axis=0)
        finally:
            builtins.__import__ = real
    np.testing.assert_array_equal(np.asarray(pj.prepare(f)(np.arange(12, dtype=np.float32).reshape(3, 4))),
                                  np.arange(12, dtype=np.float32).reshape(6, 2).T.sum(axis=0))
    assert imports == []
