"""The cpu replay fast path (prepjit/replay.py, runtime/cpu_replay.py) and thread-split kernels match NumPy
and keep every guarantee of the full call path."""
import threading

import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp


def _f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_repeated_calls_replay_and_return_fresh_outputs(rng):
    f = pj.prepare(lambda a, b: a * b + 1, device="cpu")
    a, b = _f32(rng, 16), _f32(rng, 16)
    first = f(a, b)
    second = f(b, a + 1)
    np.testing.assert_allclose(np.asarray(first), a * b + 1, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(second), b * (a + 1) + 1, rtol=1e-6)
    assert f.stats["traces"] == 1 and f.stats["replays"] == 2


def test_reduction_chain_matches_numpy(rng):
    def chain(xp, a, b):
        for _ in range(10):
            a = a - xp.sum(a) * 0.01 + b
        return a
    f = pj.prepare(lambda a, b: chain(pnp, a, b), device="cpu")
    a, b = _f32(rng, 16), _f32(rng, 16)
    for _ in range(3):
        np.testing.assert_allclose(np.asarray(f(a, b)), chain(np, a, b), rtol=1e-5, atol=1e-6)


def test_symbolic_batch_and_scalar_var_checked_on_every_call(rng):
    @pj.prepare(vars={"n": (1, 64), "pos": (0, 7)}, shapes={"x": ("n", 8)}, device="cpu")
    def f(x, pos):
        return x[:, :pos + 1] * 2
    for n, pos in [(3, 2), (5, 7), (3, 0), (3, 2)]:
        x = _f32(rng, n, 8)
        np.testing.assert_allclose(np.asarray(f(x, pos)), x[:, :pos + 1] * 2)
    with pytest.raises(pj.VarBoundError):
        f(_f32(rng, 3, 8), 8)
    with pytest.raises(pj.VarBoundError):
        f(_f32(rng, 65, 8), 1)
    x = _f32(rng, 3, 8)
    np.testing.assert_allclose(np.asarray(f(x, 1)), x[:, :2] * 2)
    assert f.stats["traces"] == 1


def test_var_from_two_places_must_agree_on_the_fast_path(rng):
    @pj.prepare(vars={"n": (1, 16)}, shapes={"x": ("n",)}, device="cpu")
    def f(x, n):
        return x * 2
    x = _f32(rng, 4)
    f(x, 4)
    f(x, 4)
    with pytest.raises(pj.SignatureError):
        f(x, 5)


def test_kernel_vals_and_bindings_follow_fast_calls(rng):
    f = pj.prepare(lambda x: x * 3, vars={"n": (1, 32)}, shapes={"x": ("n",)}, device="cpu")
    f(_f32(rng, 5))
    f(_f32(rng, 9))
    plan = f.plan(_f32(rng, 9))
    assert plan.bindings == {"n": 9}
    assert all(k.vals == [9] for k in plan.kernels if k.kernel.var_names == ("n",))


def test_misaligned_and_non_contiguous_inputs(rng):
    f = pj.prepare(lambda a, b: a + b, device="cpu")
    a, b = _f32(rng, 16), _f32(rng, 16)
    f(a, b)
    raw = np.zeros(16 * 4 + 1, np.uint8)
    misaligned = raw[1:].view(np.float32)
    misaligned[:] = a
    assert not misaligned.flags.aligned
    np.testing.assert_allclose(np.asarray(f(misaligned, b)), a + b)
    wide = _f32(rng, 32)
    np.testing.assert_allclose(np.asarray(f(wide[::2], b)), wide[::2] + b)
    np.testing.assert_allclose(np.asarray(f(a, b)), a + b)


def test_pj_array_inputs_are_not_copied_through_the_host(rng):
    f = pj.prepare(lambda a: a * 2, device="cpu")
    a = _f32(rng, 8)
    once = f(a)
    twice = f(once)
    np.testing.assert_allclose(np.asarray(f(once)), a * 4)
    np.testing.assert_allclose(np.asarray(twice), a * 4)


def test_large_kernels_split_over_threads_match_numpy(rng):
    a, b, c = (_f32(rng, 1 << 18) for _ in range(3))
    f = pj.prepare(lambda a, b, c: (a * b + c * 2 - 1) * 0.5, device="cpu")
    for _ in range(2):
        np.testing.assert_allclose(np.asarray(f(a, b, c)), (a * b + c * 2 - 1) * 0.5, rtol=1e-6)
    x = _f32(rng, 1000, 300)
    g = pj.prepare(lambda x: x.sum(axis=1), vars={"n": (1, 1000)}, shapes={"x": ("n", 300)}, device="cpu")
    for n in (1000, 7, 999):
        np.testing.assert_allclose(np.asarray(g(x[:n])), x[:n].sum(axis=1), rtol=1e-4, atol=1e-4)


def test_concurrent_calls_are_isolated(rng):
    f = pj.prepare(lambda a, b: a * b + 1, device="cpu")
    inputs = [(_f32(rng, 64), _f32(rng, 64)) for _ in range(4)]
    f(*inputs[0])
    errors = []

    def worker(a, b):
        for _ in range(200):
            if not np.allclose(np.asarray(f(a, b)), a * b + 1):
                errors.append("mismatch")
    threads = [threading.Thread(target=worker, args=pair) for pair in inputs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_execute_with_vars_after_fast_calls(rng):
    f = pj.prepare(lambda x: x + 1, vars={"n": (1, 16)}, shapes={"x": ("n",)}, device="cpu")
    x = _f32(rng, 6)
    f(x)
    f(x)
    plan = f.plan(x)
    plan.write_input(0, x[:4])
    plan.execute_with_vars({"n": 4})
    np.testing.assert_allclose(plan.read_output(0), x[:4] + 1)
