"""The kernel cache: identical kernels compile once per process and are shared, also between threads."""
import threading
import time

import numpy as np

import prepjit as pj
from prepjit.runtime.cache import kernel_cache


def test_identical_kernels_compile_once(device):
    a = np.arange(7, dtype=np.float32)

    def body(x):
        return x * 3.25 - 0.125  # a constant no other test uses, so the first compile happens here

    f = pj.prepare(body, device=device)
    g = pj.prepare(lambda y: y * 3.25 - 0.125, device=device)
    misses = kernel_cache.misses
    f(a)
    assert f.stats["compiles"] == 1 and kernel_cache.misses == misses + 1
    g(a)
    assert g.stats["compiles"] == 0 and g.stats["traces"] == 1
    assert kernel_cache.misses == misses + 1
    assert f.plan(a).kernels[0].kernel is g.plan(a).kernels[0].kernel


def test_kernels_shared_within_a_plan():
    f = pj.prepare(lambda a, b: ((a * 2.375).sum(axis=0), (b * 2.375).sum(axis=0)))  # a constant no other test uses
    misses = kernel_cache.misses
    plan = f.plan(np.ones((3, 5), np.float32), np.ones((3, 5), np.float32))
    assert len(plan.kernels) == 2
    assert plan.kernels[0].kernel is plan.kernels[1].kernel
    assert f.stats["compiles"] == 1 and f.stats["disk_hits"] == 0
    assert kernel_cache.misses == misses + 1


def test_threads_preparing_the_same_kernels_build_each_once(monkeypatch):
    from prepjit.codegen.targets import Target
    optimized = []
    render = Target.render

    def slow_optimize(target, ast, *args):  # holds the build open so that the other thread arrives during it
        optimized.append(ast)
        time.sleep(0.2)
        return render(target, ast, *args)
    monkeypatch.setattr(Target, "render", slow_optimize)

    def body(x):
        return (x * 1.625).sum(axis=0) - 0.0625  # constants no other test uses

    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    functions = [pj.prepare(body), pj.prepare(body)]
    start = threading.Barrier(2)
    results = [None, None]

    def call(i):
        start.wait()
        results[i] = np.asarray(functions[i](x))
    threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for r in results:
        np.testing.assert_allclose(r, (x * np.float32(1.625)).sum(0) - np.float32(0.0625), rtol=1e-6)
    kernels = {k.kernel for f in functions for k in f.plan(x).kernels}
    assert len(optimized) == len(set(optimized)) == len(kernels)
    assert sum(f.stats["compiles"] for f in functions) == len(kernels)


def test_a_kernel_whose_builder_is_interrupted_is_built_by_its_waiter(monkeypatch):
    from prepjit.codegen.targets import Target
    optimized = []
    render = Target.render

    def interrupted_once(target, ast, *args):  # the first build stops as Ctrl-C would stop it, after the waiter arrived
        optimized.append(ast)
        if len(optimized) == 1:
            time.sleep(0.3)
            raise KeyboardInterrupt
        return render(target, ast, *args)
    monkeypatch.setattr(Target, "render", interrupted_once)

    def body(x):
        return x * 2.875 + 0.4375  # constants no other test uses: one kernel, built here

    x = np.arange(6, dtype=np.float32)
    outcome = {}

    def call(name, delay):
        time.sleep(delay)
        try:
            outcome[name] = np.asarray(pj.prepare(body)(x))
        except KeyboardInterrupt:
            outcome[name] = "interrupted"
    threads = [threading.Thread(target=call, args=("first", 0)), threading.Thread(target=call, args=("waiter", 0.1))]
    hits = kernel_cache.hits
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert outcome["first"] == "interrupted"
    np.testing.assert_allclose(outcome["waiter"], x * np.float32(2.875) + np.float32(0.4375))
    assert kernel_cache.hits > hits  # the waiter found the first build in flight and waited for it
    assert len(optimized) == 2 and optimized[0] is optimized[1]  # then built it itself after the interruption
