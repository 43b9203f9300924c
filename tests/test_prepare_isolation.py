"""Preparing leaves the process alone: no process-wide recursion limit, self-calls and deep inputs raise
prepjit errors, long op chains trace without deep recursion, and stats stay exact under threads."""
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp


def test_a_trace_leaves_the_recursion_limit_alone():
    limit = sys.getrecursionlimit()
    seen = []

    @pj.prepare
    def f(x):
        seen.append(sys.getrecursionlimit())
        return x + 1

    f(np.ones(3, np.float32))
    assert seen == [limit] and sys.getrecursionlimit() == limit


def test_a_keyboard_interrupt_during_a_trace_changes_nothing():
    limit = sys.getrecursionlimit()
    calls = []

    @pj.prepare
    def f(x):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return x * 2

    with pytest.raises(KeyboardInterrupt):
        f(np.ones(3, np.float32))
    assert sys.getrecursionlimit() == limit
    np.testing.assert_array_equal(f(np.ones(3, np.float32)).numpy(), np.full(3, 2, np.float32))


def test_deep_recursion_in_another_thread_during_a_trace_raises_recursion_error():
    """With the old process-wide limit of 100000 the other thread's recursion overflowed its C stack."""
    script = textwrap.dedent("""
        import sys, threading
        import numpy as np
        import prepjit as pj

        started, finished, result = threading.Event(), threading.Event(), []

        def deep(n):
            return deep(n + 1) + 1

        def other():
            started.wait()
            try:
                deep(0)
            except RecursionError:
                result.append("RecursionError")
            finished.set()

        threading.Thread(target=other).start()

        @pj.prepare
        def f(x):
            started.set()
            finished.wait(60)
            return x + 1

        f(np.ones(2, np.float32))
        print(result[0])
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "RecursionError"


def test_a_self_call_while_tracing_raises_trace_error_and_the_function_keeps_working():
    @pj.prepare
    def f(x):
        if x.shape[0] == 3:
            f(np.ones(2, np.float32))  # concrete arrays: would need the plan being built
        return x + 1

    with pytest.raises(pj.TraceError, match="called itself"):
        f(np.ones(3, np.float32))
    np.testing.assert_array_equal(f(np.ones(2, np.float32)).numpy(), np.full(2, 2, np.float32))

    @pj.prepare
    def g(x):
        return g(np.ones(2, np.float32)) if x.shape[0] == 3 else x

    with pytest.raises(pj.TraceError, match="called itself"):
        g.trace(np.ones(3, np.float32))


def test_a_pytree_nested_3000_deep_is_a_signature_error_in_and_a_trace_error_out():
    tree = np.ones(2, np.float32)
    for _ in range(3000):
        tree = [tree]
    with pytest.raises(pj.SignatureError, match="levels deep"):
        pj.prepare(lambda t: t)(tree)

    @pj.prepare
    def nest(x):
        for _ in range(3000):
            x = [x]
        return x

    with pytest.raises(pj.TraceError, match="levels deep"):
        nest(np.ones(2, np.float32))


def test_a_long_op_chain_prepares_without_deep_recursion():
    n = 1200  # > the default recursion limit: lowering, scheduling and rendering walk it iteratively
    assert sys.getrecursionlimit() < 3 * n

    @pj.prepare
    def f(x):
        for i in range(n):
            x = x * 0.999 + 0.001 if i % 2 else x - x.mean() * 0.5 if i % 97 == 0 else pnp.tanh(x)
        return x

    x = np.linspace(-1, 1, 8).astype(np.float32)
    want = x.copy()
    for i in range(n):
        want = want * np.float32(0.999) + np.float32(0.001) if i % 2 else \
            want - want.mean() * np.float32(0.5) if i % 97 == 0 else np.tanh(want)
    np.testing.assert_allclose(f(x).numpy(), want, rtol=1e-4, atol=1e-5)


def test_errors_from_inside_a_trace_are_prepjit_errors_of_their_own_class_too():
    @pj.prepare
    def bad_reshape(x):
        return x.reshape(5)

    with pytest.raises(pj.TraceError) as info:
        bad_reshape(np.ones(4, np.float32))
    assert isinstance(info.value, ValueError)

    @pj.prepare
    def recurse(x):
        return recurse(x)  # on traced values: inlined, forever

    with pytest.raises(pj.TraceError, match="recursion limit") as info:
        recurse(np.ones(2, np.float32))
    assert isinstance(info.value, RecursionError)


def test_stats_are_exact_under_threads():
    @pj.prepare
    def f(x):
        return x + 1

    x = np.ones(4, np.float32)
    f(x)
    threads, calls = 4, 400
    reads = []

    def work():
        for _ in range(calls):
            f(x)
            reads.append(f.stats["replays"])

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    stats = f.stats
    assert stats["replays"] == 1 + threads * calls
    assert stats["traces"] == stats["plans"] == 1
    assert max(reads) == 1 + threads * calls and f.stats["replays"] == stats["replays"]


def test_threads_calling_several_prepared_functions_get_numpy_results(device):
    """8 threads, three prepared functions (an elementwise one, a reduction, a gather whose ids are checked),
    varied shapes and a scalar var, each call's results compared with NumPy; an out-of-range id raises
    IndexBoundError in its own call only, and every function keeps working (the opencl device on the H200
    crashed with 6 threads on one function)."""
    scale = pj.prepare(lambda x, s: x * s + 1, vars={"n": (1, 40)}, shapes={"x": ("n", 3)}, device=device)
    total = pj.prepare(lambda x: (pnp.sum(x, axis=0), pnp.argmin(x, axis=1)), vars={"n": (1, 40)},
                       shapes={"x": ("n", 3)}, device=device)
    take = pj.prepare(lambda x, ids: pnp.take(x, ids, axis=0) * 2, vars={"n": (1, 40), "k": (0, 8)},
                      shapes={"x": ("n", 3), "ids": ("k",)}, device=device)
    failures = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        for _ in range(30):
            n = int(rng.integers(1, 41))
            x = rng.standard_normal((n, 3)).astype(np.float32)
            s = np.float32(rng.integers(-3, 4))
            got = [np.asarray(scale(x, s))] + [np.asarray(a) for a in total(x)]
            want = [x * s + 1, x.sum(axis=0), x.argmin(axis=1)]
            ids = rng.integers(-n, n + (2 if rng.random() < 0.2 else 0), int(rng.integers(0, 9))).astype(np.int32)
            if ids.size and (ids >= n).any():
                try:
                    take(x, ids)
                    failures.append((seed, "no IndexBoundError", n, ids.tolist()))
                except pj.IndexBoundError:
                    pass
            else:
                got.append(np.asarray(take(x, ids)))
                want.append(np.take(x, ids, axis=0) * 2)
            for g, w in zip(got, want):
                if g.shape != w.shape or not np.allclose(g, w, rtol=1e-5, atol=1e-5):
                    failures.append((seed, n, g, w))

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert scale.stats["traces"] == total.stats["traces"] == take.stats["traces"] == 1
