"""The kernel cache: identical kernels compile once per process and are shared."""
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
    f = pj.prepare(lambda a, b: (a.sum(axis=0), b.sum(axis=0)))
    plan = f.plan(np.ones((3, 5), np.float32), np.ones((3, 5), np.float32))
    assert len(plan.kernels) == 2
    assert plan.kernels[0].kernel is plan.kernels[1].kernel
    assert f.stats["compiles"] <= 1
