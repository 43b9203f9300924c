"""fused_reductions.fused_reductions(one_contraction=True), as the cpu schedules: a kernel computes at most one
contraction inside it, so SwiGLU's two projections are each register-blocked (one kernel holding both was
unblocked)."""
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.uop import Ops


def swiglu(x, wg, wu):
    g = x @ wg
    return g / (pnp.exp(-g) + 1) * (x @ wu)


@pytest.mark.parametrize("symbolic", [False, True])
def test_two_contractions_read_by_one_product_get_a_kernel_each(rng, symbolic):
    kwargs = {"vars": {"b": (1, 64)}, "shapes": {"x": ("b", None)}} if symbolic else {}
    f = pj.prepare(swiglu, device="cpu", **kwargs)
    wg, wu = (rng.standard_normal((2, 96, 160)) * 0.1).astype(np.float32)
    for rows in ((1, 5, 64) if symbolic else (1,)):
        x = rng.standard_normal((rows, 96)).astype(np.float32)
        g = x @ wg
        np.testing.assert_allclose(np.asarray(f(x, wg, wu)), g / (np.exp(-g) + 1) * (x @ wu), rtol=1e-4, atol=1e-5)
        reductions = [sum(u.op is Ops.REDUCE for u in k.kernel.scheduled.toposort()) for k in f.plan(x, wg, wu).kernels]
        assert max(reductions) == 1 and sum(reductions) == 2


def test_other_reductions_read_together_still_share_a_kernel(rng):
    f = pj.prepare(lambda x: x.sum(axis=1) + x.max(axis=1), device="cpu")
    x = rng.standard_normal((40, 30)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(f(x)), x.sum(1) + x.max(1), rtol=1e-5)
    (kernel,) = f.plan(x).kernels
    assert sum(u.op is Ops.REDUCE for u in kernel.kernel.scheduled.toposort()) == 2
