"""Fusion decisions: a value several kernels read is computed once when recomputing it costs more."""
import numpy as np

import prepjit as pj
from prepjit.codegen.fusion import choose_materialized
from prepjit.codegen.schedule import schedule


def chain(a, b, steps):
    for _ in range(steps):
        a = a - a.sum() * 0.01 + b
    return a


def _schedule(fn, *args):
    traced = pj.trace(fn, *args)
    return traced, schedule(list(traced.outputs), list(traced.inputs))


def test_single_reader_values_are_always_inlined():
    x = np.ones((64, 64), np.float32)
    traced, sched = _schedule(lambda x: (x * 2 + 1).sum(axis=1), x)
    assert choose_materialized(list(traced.outputs)) == set()
    assert len(sched.kernels) == 1


def test_large_shared_chain_values_are_materialised(device, rng):
    a, b = (rng.random(100_000).astype(np.float32) for _ in range(2))
    traced, sched = _schedule(lambda a, b: chain(a, b, 10), a, b)
    assert choose_materialized(list(traced.outputs))  # the running value feeds a sum and the next step
    f = pj.prepare(device=device)(lambda a, b: chain(a, b, 10))
    want = chain(a, b, 10)
    np.testing.assert_allclose(np.asarray(f(a, b)), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_small_chains_stay_fused_but_kernels_stay_bounded(rng):
    a, b = (rng.random(16).astype(np.float32) for _ in range(2))
    _, short = _schedule(lambda a, b: chain(a, b, 10), a, b)
    assert len(short.kernels) == 11  # ten reductions and the result: recomputing 16 elements is cheaper
    _, long = _schedule(lambda a, b: chain(a, b, 80), a, b)
    biggest = max(len(k.ast.toposort()) for k in long.kernels)
    assert biggest < 200  # without materialising, the last kernel inlines all 80 steps (over 400 nodes)
    f = pj.prepare(lambda a, b: chain(a, b, 80))
    np.testing.assert_allclose(np.asarray(f(a, b)), chain(a, b, 80), rtol=1e-4, atol=1e-4)
