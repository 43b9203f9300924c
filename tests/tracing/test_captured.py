"""Captured arrays (tracing/constants.py): NumPy arrays a prepared function reads from its closure, a global or
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


class Weights:
    """A model object holding its weight arrays as attributes, read by a closure."""

    def __init__(self, rng, n):
        for i in range(n):
            setattr(self, f"w{i}", rng.uniform(0.5, 1.5, 8).astype(np.float32))


def chain(xp, x, weights):
    for w in weights:
        x = x * w + 1
    return x


def scans_during(work) -> int:
    """How many times tracing/constants.py walks a function's closure and globals for its arrays while `work` runs."""
    import sys
    from prepjit.tracing import constants
    count = 0

    def profile(frame, event, arg):
        nonlocal count
        if event == "call" and frame.f_code.co_filename == constants.__file__ and frame.f_code.co_name == "scan_fn":
            count += 1
    sys.setprofile(profile)
    try:
        work()
    finally:
        sys.setprofile(None)
    return count


def test_closure_replays_on_the_fast_path_without_scanning(device, rng, monkeypatch):
    model = Weights(rng, 25)
    f = pj.prepare(lambda x: chain(pnp, x, vars(model).values()), device=device)
    x = rng.standard_normal(8).astype(np.float32)
    want = chain(np, x, vars(model).values())
    np.testing.assert_allclose(np.asarray(f(x)), want, rtol=1e-5)
    monkeypatch.setattr(f.signature, "read", None)  # the full path cannot run: every call below is a fast replay
    results = []
    assert scans_during(lambda: results.extend(np.asarray(f(x)) for _ in range(5))) == 0
    for got in results:
        np.testing.assert_allclose(got, want, rtol=1e-5)
    model.step = 1  # not an array: one scan to see that the arrays are the same, then none again
    assert scans_during(lambda: f(x)) > 0 and scans_during(lambda: f(x)) == 0
    model.w3[:] = 7  # mutated in place: the plan keeps the value it was traced with
    np.testing.assert_allclose(np.asarray(f(x)), want, rtol=1e-5)
    assert f.stats["traces"] == 1


@pytest.mark.parametrize("change", ["swap", "new attribute", "None to array", "list appended"])
def test_closure_changes_that_trace_again(change, rng):
    """What the fast path's watch on a closure's objects must notice: the arrays the function reaches changed."""
    model = Weights(rng, 4)
    model.bias, model.more = None, []

    def forward(xp, x):
        extra = [v for name, v in vars(model).items() if name.startswith("extra")]
        y = chain(xp, x, [model.w0, model.w1, model.w2, model.w3] + extra + model.more)
        return y if model.bias is None else y + model.bias.sum()

    f = pj.prepare(lambda x: forward(pnp, x))
    x = rng.standard_normal(8).astype(np.float32)
    for _ in range(3):
        np.testing.assert_allclose(np.asarray(f(x)), forward(np, x), rtol=1e-5)
    if change == "swap":
        model.w2 = np.full(8, 3, np.float32)
    elif change == "new attribute":
        model.extra = np.full(8, 2, np.float32)
    elif change == "None to array":
        model.bias = np.ones(3, np.float32)
    else:
        model.more.append(np.full(8, 0.5, np.float32))
    for _ in range(2):
        np.testing.assert_allclose(np.asarray(f(x)), forward(np, x), rtol=1e-5)
    assert f.stats["traces"] == 2


def test_calls_of_other_shapes_share_one_watch_of_the_closure(rng):
    model = Weights(rng, 3)
    f = pj.prepare(vars={"n": (1, 8)}, shapes={"x": ("n", 8)})(lambda x: chain(pnp, x, vars(model).values()))
    for n, dtype in ((1, np.float32), (2, np.float32), (3, np.float32), (2, np.float64)):
        x = rng.standard_normal((n, 8)).astype(dtype)
        for _ in range(2):
            np.testing.assert_allclose(np.asarray(f(x)), chain(np, x, vars(model).values()), rtol=1e-5)
    # one key for every n of a dtype (n is read from x's shape), two plans, one watch of the closure
    assert len(f._fast_calls.calls) == 2 and len(f._fast_calls.watches) == 1
    model.w1 = np.full(8, 2, np.float32)  # every key's plan sees the swap
    for n, dtype in ((1, np.float32), (2, np.float32), (2, np.float64)):
        x = rng.standard_normal((n, 8)).astype(dtype)
        np.testing.assert_allclose(np.asarray(f(x)), chain(np, x, vars(model).values()), rtol=1e-5)
    assert f.stats["traces"] == 4
