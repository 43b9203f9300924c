"""@pj.prepare: every guarantee of API.md, checked against NumPy on every available device."""
import logging
import os
import re
import subprocess
import sys
import threading

import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from tests.helpers import assert_matches

R = np.random.default_rng(0)
W = R.standard_normal((8, 12)).astype(np.float32)
VARS = {"n": (1, 32), "pos": (0, 11)}


def xs(n, seed=0):
    return np.random.default_rng(seed).standard_normal((n, 8)).astype(np.float32)


def make_layer(device, calls=None):
    @pj.prepare(vars=VARS, shapes={"x": ("n", 8)}, device=device)
    def layer(x, w, pos, scale=1.0):
        if calls is not None:
            calls.append(1)
        return pnp.tanh(x @ w)[:, :pos + 1] * scale
    return layer


def layer_ref(x, w, pos, scale=1.0):
    return (np.tanh(x @ w)[:, :pos + 1] * np.float32(scale)).astype(np.float32)


# ---- trace once, replay many ----

def test_replay_runs_body_once_and_compiles_nothing_after_first_call(device):
    calls = []
    f = make_layer(device, calls)
    x = xs(3)
    assert_matches(f(x, W, 2), layer_ref(x, W, 2), rtol=1e-4, atol=1e-5)
    first = f.stats
    assert first["traces"] == 1 and first["plans"] == 1 and first["compiles"] >= 1
    cases = [(1, 0), (32, 11), (7, 5), (2, 11), (32, 0), (5, 3)]
    for k, (n, pos) in enumerate(cases):
        x = xs(n, seed=k)
        assert_matches(f(x, W, pos), layer_ref(x, W, pos), rtol=1e-4, atol=1e-5)
    assert len(calls) == 1
    assert f.stats == {**first, "replays": 1 + len(cases)}


def test_same_signature_reuses_plan_new_dtype_or_static_dim_retraces(device):
    f = pj.prepare(lambda a: a * 2, device=device)
    f(np.ones(3, np.float32))
    f(np.zeros(3, np.float32))
    assert f.stats["traces"] == 1
    assert_matches(f(np.ones(4, np.float32)), np.full(4, 2, np.float32))
    assert_matches(f(np.ones(3, np.int32)), np.full(3, 2, np.int32))
    assert f.stats["traces"] == 3 and f.stats["plans"] == 3
    f(np.ones(4, np.float32))
    assert f.stats["traces"] == 3


def test_static_args_retrace_per_value(device):
    calls = []
    f = make_layer(device, calls)
    x = xs(4)
    for scale in (1.0, 0.5, 1.0, 2, 0.5):
        assert_matches(f(x, W, 3, scale), layer_ref(x, W, 3, scale), rtol=1e-4, atol=1e-5)
    assert len(calls) == 3  # 1.0, 0.5 and 2 (an int is a different static value)

    g = pj.prepare(lambda a, mode, axes: a.sum(axis=axes) if mode == "sum" else a.max(axis=axes), device=device)
    a = xs(5)
    assert_matches(g(a, "sum", (0,)), a.sum(axis=0), rtol=1e-5, atol=1e-5)
    assert_matches(g(a, "max", (0,)), a.max(axis=0))
    assert_matches(g(a, "max", None), a.max())
    assert g.stats["traces"] == 3


def test_kwargs_and_defaults(device):
    f = make_layer(device)
    x = xs(4)
    assert_matches(f(x, w=W, pos=2), layer_ref(x, W, 2), rtol=1e-4, atol=1e-5)
    assert_matches(f(pos=2, x=x, w=W, scale=1.0), layer_ref(x, W, 2), rtol=1e-4, atol=1e-5)
    assert f.stats["traces"] == 1
    with pytest.raises(pj.SignatureError):
        f(x, W)


# ---- var checks ----

def test_var_disagreement_names_both_places(device):
    f = pj.prepare(lambda a, b: a + b, vars={"n": (1, 10)}, shapes={"a": ("n",), "b": ("n", 2)}, device=device)
    with pytest.raises(pj.SignatureError) as info:
        f(np.ones(3, np.float32), np.ones((4, 2), np.float32))
    assert isinstance(info.value, TypeError)
    msg = str(info.value)
    assert "a.shape[0]" in msg and "b.shape[0]" in msg and "'n'" in msg
    g = pj.prepare(lambda a, n: a * n, vars={"n": (1, 10)}, shapes={"a": ("n",)}, device=device)
    with pytest.raises(pj.SignatureError, match=r"a\.shape\[0\].*\bn\b"):
        g(np.ones(3, np.float32), 4)
    assert_matches(g(np.ones(3, np.float32), 3), np.full(3, 3, np.float32))


@pytest.mark.parametrize("n,pos,var,value,bounds,where", [
    (33, 0, "n", 33, "[1, 32]", "x.shape[0]"),
    (3, 12, "pos", 12, "[0, 11]", "pos"),
    (3, -1, "pos", -1, "[0, 11]", "pos"),
])
def test_var_out_of_bounds_names_var_value_bounds_and_source(device, n, pos, var, value, bounds, where):
    f = make_layer(device)
    x = xs(2)
    good = f(x, W, 1)
    stats = f.stats
    with pytest.raises(pj.VarBoundError) as info:
        f(xs(n), W, pos)
    assert isinstance(info.value, pj.VarError)
    msg = str(info.value)
    assert f"'{var}'" in msg and str(value) in msg and bounds in msg and where in msg
    assert f.stats == stats
    assert_matches(good, layer_ref(x, W, 1), rtol=1e-4, atol=1e-5)
    assert_matches(f(xs(5), W, 4), layer_ref(xs(5), W, 4), rtol=1e-4, atol=1e-5)


def test_empty_array_gives_var_below_its_minimum(device):
    with pytest.raises(pj.VarBoundError, match=r"x\.shape\[0\]"):
        make_layer(device)(np.ones((0, 8), np.float32), W, 0)


@pytest.mark.parametrize("args", [
    (np.ones((3, 8, 1), np.float32), W, 1),   # rank
    (np.ones((3,), np.float32), W, 1),        # rank
    (np.ones((3, 9), np.float32), W, 1),      # static dim from shapes
    (np.ones((3, 8), np.float32), W, 1.5),    # scalar var must be an int
    (np.ones((3, 8), np.float32), W, True),
    (np.ones((3, 8), np.float32), W, "1"),
])
def test_signature_errors_then_keeps_working(device, args):
    f = make_layer(device)
    with pytest.raises(pj.SignatureError):
        f(*args)
    assert_matches(f(xs(3), W, 1), layer_ref(xs(3), W, 1), rtol=1e-4, atol=1e-5)


def test_pytree_parameter_with_pytree_of_specs(device):
    @pj.prepare(vars={"n": (1, 10)}, shapes={"p": {"a": ("n",), "b": ["n, 2", None]}}, device=device)
    def f(p):
        return p["a"][:, None] * p["b"][0] + p["b"][1].sum()

    a, b0, b1 = np.arange(3, dtype=np.float32), np.ones((3, 2), np.float32), np.ones(5, np.float32)
    assert_matches(f({"a": a, "b": [b0, b1]}), a[:, None] * b0 + 5)
    assert_matches(f({"a": a[:2], "b": [b0[:2], b1]}), a[:2, None] * b0[:2] + 5)
    assert f.stats["traces"] == 1
    for bad in ({"a": a}, [a, [b0, b1]], {"a": a, "b": [b0]}, {"a": a, "b": b0}):
        with pytest.raises(pj.SignatureError):
            f(bad)
    with pytest.raises(pj.SignatureError, match="disagrees"):
        f({"a": a, "b": [b0[:2], b1]})
    assert_matches(f({"a": a, "b": [b0, b1]}), a[:, None] * b0 + 5)


def test_shapes_as_strings_and_var_objects(device):
    n = pj.Var("n", 1, 16)
    f = pj.prepare(lambda a, b: a + b.sum(axis=1), shapes={"a": (n,), "b": "n, 4"}, device=device)
    a, b = np.arange(5, dtype=np.float32), np.ones((5, 4), np.float32)
    assert_matches(f(a, b), a + 4)
    assert_matches(f(a[:2], b[:2]), a[:2] + 4)
    assert f.stats["traces"] == 1
    assert f.plan(a, b).vars == {"n": (1, 16)}


def test_scalar_var_accepts_ints_numpy_ints_and_bound_vars(device):
    f = pj.prepare(lambda x, k: x[:k + 1] * k, vars={"k": (0, 7)}, device=device)
    x = np.arange(8, dtype=np.float32)
    for k in (0, np.int64(3), np.int32(7), pj.Var("k", 0, 7).bind(5)):
        kk = int(k.value if isinstance(k, pj.BoundVar) else k)
        assert_matches(f(x, k), x[:kk + 1] * kk)
    assert f.stats["traces"] == 1
    with pytest.raises(pj.SignatureError):
        f(x, pj.Var("j", 0, 7).bind(1))


# ---- outputs and inputs ----

def test_outputs_are_fresh_and_inputs_never_written(device):
    f = pj.prepare(lambda a, b: (a * 2, a, b[::-1] + 0), device=device)
    a, b = np.arange(4, dtype=np.float32), np.arange(3, dtype=np.float32)
    a0, b0 = a.copy(), b.copy()
    first = f(a, b)
    first_values = [np.asarray(r).copy() for r in first]
    second = f(a + 10, b + 10)
    for r, v in zip(first, first_values):
        np.testing.assert_array_equal(np.asarray(r), v)
    np.testing.assert_array_equal(a, a0)
    np.testing.assert_array_equal(b, b0)
    assert_matches(second[1], a + 10)
    a[0] = 99  # a result never aliases an argument
    np.testing.assert_array_equal(np.asarray(first[1]), a0)


def test_a_value_returned_twice_gives_independent_arrays(device):
    out = pj.prepare(lambda a: (a + 1, a + 1), device=device)(np.zeros(3, np.float32))
    assert out[0] is not out[1]
    first = out[0].numpy()
    np.asarray(out[1], copy=True)
    assert_matches(out[0], first)
    assert_matches(out[1], first)


def test_results_are_pj_arrays_that_feed_back_in(device):
    f = pj.prepare(lambda a: a * 2 + 1, device=device)
    g = pj.prepare(lambda a, b: a @ b, device=device)
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    r = f(a)
    assert isinstance(r, pj.Array)
    assert r.shape == (2, 3) and r.dtype == np.float32 and r.device == device
    assert_matches(f(r), (a * 2 + 1) * 2 + 1)
    assert_matches(g(r, f(a.T.copy())), (a * 2 + 1) @ (a.T * 2 + 1))
    np.testing.assert_array_equal(r.numpy(), a * 2 + 1)
    assert f.stats["traces"] == 2  # (2, 3) and (3, 2); a pj.Array argument has the signature of its array


def test_numpy_scalars_are_zero_d_arrays_not_static(device):
    f = pj.prepare(lambda a, s: a * s, device=device)
    a = np.arange(3, dtype=np.float32)
    assert_matches(f(a, np.float32(2)), a * np.float32(2))
    assert_matches(f(a, np.float32(3)), a * np.float32(3))
    assert f.stats["traces"] == 1
    assert_matches(f(a, np.float64(3)), a * np.float64(3))
    assert f.stats["traces"] == 2


def test_empty_results_from_symbolic_slices(device):
    f = pj.prepare(lambda x, pos: x[pos:] * 2, vars={"pos": (0, 8)}, device=device)
    x = np.arange(8, dtype=np.float32)
    assert_matches(f(x, 8), x[8:] * 2)
    assert_matches(f(x, 3), x[3:] * 2)


def test_threads_calling_one_prepared_function(device):
    f = make_layer(device)
    f(xs(1), W, 0)
    failures = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        for _ in range(25):
            n, pos = int(rng.integers(1, 33)), int(rng.integers(0, 12))
            x = rng.standard_normal((n, 8)).astype(np.float32)
            out = np.asarray(f(x, W, pos))
            ref = layer_ref(x, W, pos)
            if out.shape != ref.shape or not np.allclose(out, ref, rtol=1e-4, atol=1e-5):
                failures.append((seed, n, pos))

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert f.stats["traces"] == 1 and f.stats["replays"] == 1 + 6 * 25


def test_threads_preparing_at_once_trace_once(device):
    f = pj.prepare(lambda a: pnp.exp(a) - 1, device=device)
    a = np.linspace(-1, 1, 9, dtype=np.float32)
    results, barrier = [], threading.Barrier(4)

    def worker():
        barrier.wait()
        results.append(np.asarray(f(a)))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4 and all(np.allclose(r, np.exp(a) - 1, rtol=1e-5, atol=1e-6) for r in results)
    assert f.stats["traces"] == 1


# ---- introspection ----

def test_plan_without_running(device):
    f = make_layer(device)
    plan = f.plan(xs(3), W, 2)
    assert isinstance(plan, pj.ExecutionPlan)
    assert f.stats["replays"] == 0 and f.stats["traces"] == 1
    assert plan is f.plan(xs(9), W, 7)
    assert plan.vars == {"n": (1, 32), "pos": (0, 11)}
    text = str(plan)
    assert all(k.kernel.name in text for k in plan.kernels)
    assert all(k.kernel.source for k in plan.kernels)
    if device == "cpu":
        assert "define void" in plan.kernels[0].kernel.source
    f(xs(3), W, 2)
    assert f.stats["traces"] == 1 and f.stats["replays"] == 1


# ---- fori_loop ----

def loop_fn(trips, device):
    @pj.prepare(vars={"n": (1, 16)}, shapes={"x": ("n",)}, device=device)
    def f(x, y):
        return pj.fori_loop(0, trips, lambda i, c: (c[0] * 0.5 + i, c[1] + c[0].sum()), (x, y))
    return f


def loop_ref(x, y, trips):
    for i in range(trips):
        x, y = x * np.float32(0.5) + np.float32(i), y + x.sum()
    return x, y


def test_fori_loop_compiles_body_once_one_prepared_kernel_per_iteration(device):
    x, y = np.arange(5, dtype=np.float32), np.ones(2, np.float32)
    compiles = []
    for trips in (3, 40):
        f = loop_fn(trips, device)
        out = f(x, y)
        want = loop_ref(x, y, trips)
        assert_matches(out[0], want[0])
        assert_matches(out[1], want[1], rtol=1e-4, atol=1e-4)
        plan = f.plan(x, y)
        per_iter = [k for k in plan.kernels if k.fixedvars]
        by_i = {}
        for k in per_iter:
            by_i.setdefault(k.fixedvars["i"], []).append(k)
        assert sorted(by_i) == list(range(trips))
        assert len({len(ks) for ks in by_i.values()}) == 1
        for ks in zip(*by_i.values()):  # each body kernel is one compiled kernel shared by all iterations
            assert len({id(k.kernel) for k in ks}) == 1
        assert "i" not in plan.vars
        compiles.append(f.stats["compiles"])
        assert_matches(f(x[:2], y)[0], loop_ref(x[:2], y, trips)[0])
        assert f.stats["traces"] == 1
    assert compiles[1] <= compiles[0]


def test_fori_loop_with_symbolic_shapes_in_body(device):
    @pj.prepare(vars={"n": (1, 16)}, shapes={"x": ("n", 3)}, device=device)
    def f(x):
        return pj.fori_loop(1, 4, lambda i, c: c + x * i - c.mean(axis=0), x)

    for n in (1, 5, 16):
        x = xs(n)[:, :3].copy()
        want = x
        for i in range(1, 4):
            want = want + x * np.float32(i) - want.mean(axis=0)
        assert_matches(f(x), want, rtol=1e-4, atol=1e-5)


# ---- logging ----

def test_compile_log_gives_reasons(device, caplog):
    f = make_layer(device)
    with caplog.at_level(logging.INFO, logger="prepjit"):
        f(xs(3), W, 1)
        f(xs(4), W, 2)
        f(xs(4), W, 2, 0.5)
        f(xs(4).astype(np.float64), W, 2)
    traces = [r.getMessage() for r in caplog.records if r.getMessage().startswith("trace")]
    assert len(traces) == 3
    assert "first call" in traces[0]
    assert "scale" in traces[1] and "0.5" in traces[1]
    assert "dtype" in traces[2] and "float64" in traces[2]


def test_prepjit_log_env_logs_to_stderr(tmp_path):
    script = tmp_path / "run.py"
    script.write_text("import numpy as np, prepjit as pj\n"
                      "f = pj.prepare(lambda a: a * 2.75 + 0.25)\n"
                      "f(np.ones(3, np.float32)); f(np.ones(3, np.float32)); f(np.ones(4, np.float32))\n")
    env = {**os.environ, "PREPJIT_LOG": "compiles", "PREPJIT_CACHE": "0"}
    err = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, check=True,
                         timeout=120).stderr
    lines = [ln for ln in err.splitlines() if ln.startswith("prepjit:")]
    assert sum("trace" in ln for ln in lines) == 2
    assert any("first call" in ln for ln in lines)
    assert any("shape" in ln and "(3,)" in ln and "(4,)" in ln for ln in lines)
    assert any("compile" in ln for ln in lines)


# ---- keeps working after every error class ----

def test_keeps_working_after_each_error_class(device):
    f = make_layer(device)
    x = xs(6)
    errors = [
        (lambda: f(xs(40), W, 0), pj.VarBoundError),
        (lambda: f(xs(3), W, 99), pj.VarBoundError),
        (lambda: f(np.ones((2, 9), np.float32), W, 0), pj.SignatureError),
        (lambda: f(xs(3), W), pj.SignatureError),
        (lambda: f(xs(3), np.ones((9, 12), np.float32), 0), ValueError),  # like NumPy
        (lambda: f(xs(3), W, 0, np.ones((2, 2))), pj.TraceError),
    ]
    for call, error in errors:
        with pytest.raises(error):
            call()
        assert_matches(f(x, W, 4), layer_ref(x, W, 4), rtol=1e-4, atol=1e-5)
    assert f.stats["traces"] == 1


def test_unknown_device_is_device_error():
    with pytest.raises(pj.DeviceError):
        pj.prepare(lambda a: a, device="tpu")(np.ones(2, np.float32))


def test_non_native_and_non_contiguous_inputs(device):
    f = pj.prepare(lambda a: a + 1, device=device)
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    for _ in range(3):  # every call, not only the first (later calls may take a faster path)
        assert_matches(f(a.astype(">f4")), a + 1)
        assert_matches(f(np.asfortranarray(a)), a + 1)
    assert_matches(f(np.arange(12, dtype=np.float32).reshape(2, 6)[:, ::2]), np.arange(12, dtype=np.float32).reshape(2, 6)[:, ::2] + 1)


def test_loop_var_does_not_capture_an_outer_var_of_the_same_name(device):
    def body(x, i):
        outer = i
        return pj.fori_loop(0, 3, lambda i, c: c + outer + i, x)

    f = pj.prepare(body, vars={"i": (0, 10)}, device=device)
    a = np.arange(4, dtype=np.float32)
    assert_matches(f(a, 7), a + 3 * 7 + 3)
    assert_matches(f(a, 2), a + 3 * 2 + 3)
    plan = f.plan(a, 2)
    assert "i" in plan.vars
    assert sorted(k.fixedvars.popitem()[1] for k in plan.kernels if k.fixedvars) == [0, 1, 2]


def test_sequential_loops_both_use_the_body_parameter_name(device):
    def two_loops(x):
        y = pj.fori_loop(0, 2, lambda i, c: c + i, x)
        return pj.fori_loop(0, 3, lambda i, c: c * 2 + i, y)

    f = pj.prepare(two_loops, device=device)
    a = np.arange(3, dtype=np.float32)
    want = a + 1
    for i in range(3):
        want = want * 2 + i
    assert_matches(f(a), want)
    assert [k.fixedvars for k in f.plan(a).kernels if k.fixedvars] == [{"i": k} for k in (0, 1, 0, 1, 2)]


def test_pj_array_argument_is_not_read_through_the_host(device, monkeypatch):
    from prepjit.runtime.devices import get_device
    f = pj.prepare(lambda a: a * 2, device=device)
    a = np.arange(5, dtype=np.float32)
    r = f(a)
    f(a)  # warm: the replay path is prepared

    def no_host_read(*args, **kwargs):
        raise AssertionError("a pj.Array argument was read back to the host")

    monkeypatch.setattr(get_device(device), "to_numpy", no_host_read)
    out = f(r)
    monkeypatch.undo()
    assert_matches(out, a * 4)
    assert_matches(r, a * 2)


def test_var_no_argument_carries_is_var_error(device):
    n = pj.Var("n", 1, 8)
    f = pj.prepare(lambda x: x[:n] * 2, device=device)
    with pytest.raises(pj.VarError, match="'n'"):
        f(np.ones(8, np.float32))
    assert f.plan(np.ones(8, np.float32)).vars == {"n": (1, 8)}


@pytest.mark.parametrize("largest", [2**49, 2**61])
def test_bounds_too_large_to_allocate_give_a_memory_error(device, largest):
    """Intermediates sized at the vars' maxima that cannot be allocated raise MemoryError naming the bytes and the
    bounds, not a CompileError; the function keeps working for calls of another signature. The sizes fail on
    every host: 2**49 rows of 64 floats is 2**57 bytes a buffer, past any address space (57-bit with 5-level
    paging), so the mapping is refused even where memory is overcommitted (2**36 rows, 2**44 bytes, was mapped
    on such a host); 2**61 rows is past what a size_t holds."""
    f = pj.prepare(lambda x, k: pnp.sort(pnp.exp(x), axis=1)[:, :k], vars={"n": (1, largest)},
                   shapes={"x": ("n", 64)}, device=device)
    x = np.ones((4, 64), np.float32)
    with pytest.raises(MemoryError) as info:
        f(x, 8)
    assert not isinstance(info.value, pj.CompileError)
    need = re.search(r"need (\d+) bytes", str(info.value))
    assert f"n <= {largest}" in str(info.value) and need, str(info.value)
    assert int(need[1]) % largest == 0 and int(need[1]) >= 2 * largest * 64 * 4  # exp(x) and its sort, float32
    with pytest.raises(MemoryError):
        f(x, 8)
    small = pj.prepare(lambda x: pnp.sort(x, axis=1), vars={"n": (1, 64)}, shapes={"x": ("n", 64)}, device=device)
    assert_matches(small(x), np.sort(x, axis=1))


def test_a_declared_var_that_no_shape_uses_warns_at_prepare():
    """vars={"n": ...} without shapes= makes n stand for nothing (every size retraces): prepare warns, naming the
    var and the shapes spec to write; a var named in shapes (as a name, in a string or as a pj.Var, in a pytree
    spec) or a parameter's own name (a scalar var) is used and does not warn."""
    with pytest.warns(UserWarning, match=r"var 'n' is declared in vars but no shapes spec uses it.*shapes=\{'x': \('n'"):
        pj.prepare(lambda x: x * 2, vars={"n": (1, 64)})
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pj.prepare(lambda x, pos: x[pos], vars={"n": (1, 8), "pos": (0, 7)}, shapes={"x": "n, 4"})
        pj.prepare(lambda p: p["w"], vars={"n": (1, 8)}, shapes={"p": {"w": ("n", 4)}})
        pj.prepare(lambda x: x, shapes={"x": (pj.Var("n", 1, 8),)})
        pj.prepare(lambda x: x, vars=[pj.Var("n", 1, 8)], shapes={"x": ("n",)})


def test_an_argument_that_keeps_retracing_on_new_shapes_gets_a_hint(device):
    """The third plan traced for new static shapes of one argument warns once, naming the argument, the dims that
    changed and the shapes= spec that makes them symbolic (a declared but unused var first)."""
    f = pj.prepare(lambda x, w: x @ w, device=device)
    w = np.ones((4, 2), np.float32)
    f(np.ones((2, 4), np.float32), w)
    f(np.ones((3, 4), np.float32), w)
    with pytest.warns(UserWarning) as record:
        f(np.ones((5, 4), np.float32), w)
    (hint,) = [str(r.message) for r in record]
    assert "3 shapes of x ((2, 4), (3, 4), (5, 4))" in hint and "dim 0 changes" in hint
    assert "shapes={'x': ('n', 4)} with vars={'n': (1, MAX)}" in hint
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per argument
        f(np.ones((6, 4), np.float32), w)
        f(np.ones((6, 4), np.float32), w)
    with pytest.warns(UserWarning):
        g = pj.prepare(lambda x: x.sum(), vars={"rows": (1, 64)}, device=device)  # rows is unused
    g(np.ones((2, 2), np.float32))
    g(np.ones((3, 3), np.float32))
    with pytest.warns(UserWarning, match=r"dims 0, 1 change.*shapes=\{'x': \('rows', 'n'\)\} with vars=\{'n'"):
        g(np.ones((4, 4), np.float32))
    assert f.stats["traces"] == 4 and g.stats["traces"] == 3


def test_plan_shape_functions_are_compiled_once_per_source():
    """A plan's buffers of one shape share one compiled shape function (each compile is an eval); each gives the
    live shape at the var values it is called with."""
    from prepjit.jit.planner import compile_positional_fn, compile_shape_fn
    from prepjit.uop import UOp
    n = UOp.variable("n", 1, 64)
    first, again = compile_shape_fn((3, n + 1)), compile_shape_fn((3, n + 1))
    assert first is again and first({"n": 5}) == (3, 6)
    assert compile_shape_fn((n,))({"n": 7}) == (7,)
    assert compile_positional_fn((n * 2,), ("n",)) is compile_positional_fn((n * 2,), ("n",))
    assert compile_positional_fn((n * 2,), ("m", "n"))((1, 4)) == (8,)
