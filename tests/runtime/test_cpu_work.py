"""The cpu device's measure of a kernel's work (runtime/cpu.py _work_fn): it decides whether threads split a
launch, at the launch's var values, not at their maxima."""
import numpy as np

import prepjit as pj
from prepjit.runtime.cpu import PARALLEL_MIN_ITERATIONS, _work_fn


def test_work_follows_the_var_values(rng):
    f = pj.prepare(lambda x: x.sum(axis=1), vars={"n": (1, 100000)}, shapes={"x": ("n", 64)}, device="cpu")
    x = rng.standard_normal((10, 64)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(f(x)), x.sum(axis=1), rtol=1e-5)
    (kernel,) = f.plan(x).kernels
    work = _work_fn(kernel.kernel.scheduled, kernel.kernel.var_names)
    assert work([10]) == 640 < PARALLEL_MIN_ITERATIONS <= work([100000])
    assert work([0]) == 0


def test_static_work_counts_every_range(rng):
    w, h = rng.standard_normal((300, 50)).astype(np.float32), rng.standard_normal(50).astype(np.float32)
    f = pj.prepare(lambda w, h: w @ h, device="cpu")
    np.testing.assert_allclose(np.asarray(f(w, h)), w @ h, rtol=1e-4, atol=1e-4)
    (kernel,) = f.plan(w, h).kernels
    assert _work_fn(kernel.kernel.scheduled, kernel.kernel.var_names)([]) == 300 * 50
