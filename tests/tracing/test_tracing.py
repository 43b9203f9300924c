"""Tracing a call: pytrees of arguments and results, pj.trace listings, and errors that explain the fix."""
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.tracing.pytree import flatten
from tests.helpers import assert_matches

A = np.arange(6, dtype=np.float32).reshape(2, 3)


def test_flatten_unflatten_round_trip():
    tree = {"a": [1, (2, None)], "b": {"c": 3}}
    leaves, paths, treedef = flatten(tree)
    assert leaves == [1, 2, 3]
    assert paths == ["['a'][0]", "['a'][1][0]", "['b']['c']"]
    assert treedef.unflatten(leaves) == tree
    assert treedef.num_leaves == 3
    assert flatten([1, 2])[2] != flatten((1, 2))[2]


def test_pytree_arguments_and_results(device):
    @pj.prepare(device=device)
    def f(params, xs):
        w, b = params["w"], params["b"]
        return {"y": xs[0] * w + b, "rest": [xs[1] - b, (w.sum(),)], "none": None}

    params = {"w": A, "b": np.ones(3, np.float32)}
    xs = [A + 1, A * 2]
    out = f(params, xs)
    assert set(out) == {"y", "rest", "none"} and out["none"] is None
    assert isinstance(out["rest"], list) and isinstance(out["rest"][1], tuple)
    assert_matches(out["y"], xs[0] * A + 1)
    assert_matches(out["rest"][0], xs[1] - 1)
    assert_matches(out["rest"][1][0], np.float32(A.sum()))


def test_returning_an_input_or_a_python_scalar(device):
    out = pj.prepare(lambda x: (x, 2, 1.5), device=device)(A)
    assert_matches(out[0], A)
    assert_matches(out[1], np.array(2))
    assert_matches(out[2], np.array(1.5))


def test_bool_of_traced_value_raises_helpful_trace_error():
    @pj.prepare
    def f(x):
        if x.sum() > 0:
            return x
        return -x

    with pytest.raises(pj.TraceError) as info:
        f(A)
    assert isinstance(info.value, TypeError)
    msg = str(info.value)
    assert "pnp.where" in msg and "static argument" in msg and "var" in msg


@pytest.mark.parametrize("use", [int, float, lambda x: x.__index__(), np.asarray])
def test_concrete_values_of_tracers_raise_trace_error(use):
    with pytest.raises(pj.TraceError):
        pj.prepare(lambda x: x * use(x[0, 0]))(A)


@pytest.mark.parametrize("use", [lambda v: v.item(), lambda v: v.tolist(), lambda v: v.reshape(1).item(0), complex,
                                 int, float, lambda v: [1, 2][v.astype(pnp.int32)]],
                         ids=["item", "tolist", "item(0)", "complex", "int", "float", "index"])
def test_python_values_of_tracers_explain_the_way_out(use):
    """Every way of asking a traced value for its Python value gets the TraceError that explains what to do
    (as `if x:` does), not an AttributeError."""
    with pytest.raises(pj.TraceError) as info:
        pj.prepare(lambda x: x * use(x[0, 0]))(A)
    assert not isinstance(info.value, AttributeError)
    assert "not known while tracing" in str(info.value) and "pnp.where" in str(info.value)


def test_numpy_constants_are_in_pnp(device):
    """JAX code spells NumPy's constants and newaxis through its namespace."""
    for name in ("inf", "nan", "pi", "e", "euler_gamma", "newaxis"):
        assert getattr(pnp, name) is getattr(np, name)
        assert name in pnp.__all__
    f = pj.prepare(lambda x: (pnp.where(x > 1, pnp.inf, x * pnp.pi), x[:, pnp.newaxis] * pnp.e, x + pnp.nan),
                   device=device)
    x = np.arange(3, dtype=np.float32)
    for out, ref in zip(f(x), (np.where(x > 1, np.inf, x * np.pi), x[:, None] * np.e, x + np.nan)):
        assert_matches(out, ref)


def test_capturing_an_array_of_an_unsupported_dtype_is_a_trace_error():
    const = np.ones(3, np.complex64)  # (captured arrays of supported dtypes are constants: test_captured.py)
    with pytest.raises(pj.TraceError, match="complex64"):
        pj.prepare(lambda x: x + const)(A)


def test_unsupported_dtype_is_rejected():
    with pytest.raises(pj.SignatureError):
        pj.prepare(lambda x: x)(np.ones(2, np.complex64))


def test_returning_a_string_is_a_trace_error():
    with pytest.raises(pj.TraceError, match="result"):
        pj.prepare(lambda x: (x, "hello"))(A)


def test_pj_trace_prints_a_graph_without_compiling():
    def f(x, y):
        return pnp.tanh(x @ y).sum(axis=1)

    traced = pj.trace(f, A, A.T.copy())
    text = str(traced)
    for op in ("INPUT", "TANH", "REDUCE_AXIS", "SINK"):
        assert op in text
    assert len(traced.inputs) == 2 and len(traced.outputs) == 1
    assert traced.outputs[0].shape == (2,)


def test_pj_trace_of_prepared_function_keeps_vars_and_does_not_compile():
    @pj.prepare(vars={"n": (1, 8)}, shapes={"x": ("n", 3)})
    def f(x):
        return x * 2

    text = str(pj.trace(f, A))
    assert "(n, 3)" in text
    assert f.stats["compiles"] == 0 and f.stats["traces"] == 0


def test_fori_loop_body_must_keep_the_carry_structure():
    with pytest.raises(pj.TraceError, match="structure"):
        pj.prepare(lambda x: pj.fori_loop(0, 3, lambda i, c: (c, c), x))(A)
    with pytest.raises(pj.TraceError, match="shape"):
        pj.prepare(lambda x: pj.fori_loop(0, 3, lambda i, c: c.sum(), x))(A)
    with pytest.raises(pj.TraceError, match="int32"):
        pj.prepare(lambda x: pj.fori_loop(0, 3, lambda i, c: c.astype(np.int32), x))(A)
    with pytest.raises(pj.TraceError, match="int or a symbolic int"):
        pj.prepare(lambda x: pj.fori_loop(0, 2.5, lambda i, c: c, x))(A)


def test_fori_loop_with_empty_range_returns_the_carry(device):
    assert_matches(pj.prepare(lambda x: pj.fori_loop(3, 3, lambda i, c: c * 2, x), device=device)(A), A)


def test_a_traced_dtype_compares_and_converts_like_numpys(device):
    """Inside a trace `x.dtype` equals NumPy's dtypes, scalar types and names, and np.dtype(x.dtype) is NumPy's,
    as in jax.numpy (model code branches on `x.dtype == np.float32` and casts with `np.dtype(x.dtype)`)."""
    seen = {}

    @pj.prepare(device=device)
    def f(x, y):
        seen["eq"] = (x.dtype == np.float32, x.dtype == pnp.float32, x.dtype == "float32", x.dtype == np.dtype("f4"),
                      y.dtype == pnp.bfloat16, x.dtype != np.int32, x.dtype == y.dtype, x.dtype == None)  # noqa: E711
        seen["np"] = (np.dtype(x.dtype), np.dtype(y.dtype))
        return x.astype(np.dtype(y.dtype))

    out = np.asarray(f(np.full(3, 1.5, np.float32), np.zeros(2, pnp.bfloat16)))
    assert seen["eq"] == (True, True, True, True, True, True, False, False)
    assert seen["np"] == (np.dtype(np.float32), np.dtype(pnp.bfloat16))
    assert out.dtype == pnp.bfloat16 and out.astype(np.float32).tolist() == [1.5] * 3
