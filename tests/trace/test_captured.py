"""Captured arrays (trace/constants.py): NumPy arrays a prepared function reads from its closure, a global or
`self.w` are plan constants, copied at trace time; rebinding the name to another array traces again."""
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp

GLOBAL_BIAS = np.array([1.0, -2.0, 3.0], np.float32)


def test_closure_capture(device, rng):
    w = rng.standard_normal((4, 3)).astype(np.float32)
    f = pj.prepare(lambda x: pnp.tanh(x @ w), device=device)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    for _ in range(3):
        np.testing.assert_allclose(np.asarray(f(x)), np.tanh(x @ w), rtol=1e-5, atol=1e-6)
    assert f.stats["traces"] == 1 and f.stats["plans"] == 1


def test_global_capture_and_int_constants(device):
    table = np.array([10, 20, 30], np.int64)
    f = pj.prepare(lambda x, ids: (x + GLOBAL_BIAS, pnp.asarray(table)[ids], pnp.take(table, ids) * 2), device=device)
    x, ids = np.zeros(3, np.float32), np.array([2, 0], np.int32)
    got = f(x, ids)
    np.testing.assert_array_equal(np.asarray(got[0]), GLOBAL_BIAS)
    np.testing.assert_array_equal(np.asarray(got[1]), table[ids])
    np.testing.assert_array_equal(np.asarray(got[2]), table[ids] * 2)
    assert np.asarray(got[1]).dtype == np.int64
    with pytest.raises(pj.TraceError, match=r"pnp.asarray\(table\)"):  # NumPy's own indexing cannot take a tracer
        pj.prepare(lambda ids: table[ids], device=device)(ids)


class Linear:
    def __init__(self, w, b):
        self.w, self.b = w, b

    @pj.prepare
    def __call__(self, x):
        return x @ self.w + self.b


def test_method_reads_self_w(rng):
    w, b = rng.standard_normal((3, 2)).astype(np.float32), np.ones(2, np.float32)
    layer, other = Linear(w, b), Linear(-w, 2 * b)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(layer(x)), x @ w + b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(other(x)), x @ -w + 2 * b, rtol=1e-5, atol=1e-6)  # two arrays, two plans
    np.testing.assert_allclose(np.asarray(layer(x)), x @ w + b, rtol=1e-5, atol=1e-6)
    assert Linear.__call__.stats["traces"] == 2


def test_mutation_after_prepare_does_not_change_results():
    w = np.array([1.0, 2.0, 3.0], np.float32)
    f = pj.prepare(lambda x: x * w)
    x = np.ones(3, np.float32)
    np.testing.assert_array_equal(np.asarray(f(x)), [1, 2, 3])
    w[:] = 100.0  # captured at trace time, as JAX does: the plan keeps the value it was traced with
    np.testing.assert_array_equal(np.asarray(f(x)), [1, 2, 3])
    np.testing.assert_array_equal(np.asarray(f(x)), [1, 2, 3])
    assert f.stats["traces"] == 1


def test_rebinding_to_another_array_traces_again():
    layer = Linear(np.eye(2, dtype=np.float32), np.zeros(2, np.float32))
    x = np.array([[1.0, 2.0]], np.float32)
    np.testing.assert_array_equal(np.asarray(layer(x)), x)
    layer.w = 3 * np.eye(2, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(layer(x)), 3 * x)
    w = np.float32(2) * np.ones(2, np.float32)

    def g(x):
        return x * w
    f = pj.prepare(g)
    np.testing.assert_array_equal(np.asarray(f(x)), 2 * x)
    np.testing.assert_array_equal(np.asarray(f(x)), 2 * x)
    assert len(f._fast_calls.calls) == 1  # the replay took the fast path (replay.py), which checks the captures
    w = np.full(2, 5, np.float32)  # the closure cell now holds another array
    np.testing.assert_array_equal(np.asarray(f(x)), 5 * x)
    np.testing.assert_array_equal(np.asarray(f(x)), 5 * x)
    assert f.stats["traces"] == 2


def test_symbolic_shapes_and_same_array_used_twice():
    w = np.arange(3, dtype=np.float32)
    f = pj.prepare(vars={"n": (1, 8)}, shapes={"x": ("n", 3)})(lambda x: x * w + w)
    for n in (1, 4, 8):
        x = np.ones((n, 3), np.float32)
        np.testing.assert_array_equal(np.asarray(f(x)), x * w + w)
    assert f.stats["traces"] == 1
    assert len(f.plan(np.ones((2, 3), np.float32)).inputs) == 2  # the argument, and w once


def test_a_captured_array_is_saved_with_its_trace_time_value(tmp_path):
    w = np.ones(3, np.float32)
    f = pj.prepare(lambda x: x + w)
    f.save(tmp_path / "f.pjplan", np.ones(3, np.float32))
    w[:] = 5
    np.testing.assert_array_equal(np.asarray(pj.load(tmp_path / "f.pjplan")(np.ones(3, np.float32))), 2)


class Model:
    def __init__(self):
        self.layers = [Linear(np.eye(2, dtype=np.float32), np.zeros(2, np.float32))]

    @pj.prepare
    def __call__(self, x):
        return self.layers[0].w.sum() * x


def test_rebinding_a_nested_attribute_traces_again():
    m = Model()
    x = np.ones(2, np.float32)
    np.testing.assert_array_equal(np.asarray(m(x)), 2 * x)
    m.layers[0].w = np.full((2, 2), 3.0, np.float32)
    np.testing.assert_array_equal(np.asarray(m(x)), 12 * x)
    np.testing.assert_array_equal(np.asarray(m(x)), 12 * x)
    assert Model.__call__.stats["traces"] == 2
