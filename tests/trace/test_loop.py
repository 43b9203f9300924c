"""pj.fori_loop bodies that read loop-dependent values the carry does not: nothing may be hoisted out of the loop."""
import numpy as np

import prepjit as pj
import prepjit.numpy as pnp


def test_body_reducing_a_slice_at_the_loop_var(device, rng):
    """xs[t].sum(0) does not read the carry but depends on t (a slice start, not a source): once per iteration."""
    xs = rng.standard_normal((5, 3, 4)).astype(np.float32)
    f = pj.prepare(lambda xs: pj.fori_loop(0, 5, lambda t, h: h + xs[t].sum(0), pnp.zeros(4, dtype=pnp.float32)),
                   device=device)
    np.testing.assert_allclose(np.asarray(f(xs)), xs.sum((0, 1)), rtol=1e-5, atol=1e-5)


def test_body_multiplying_a_slice_at_the_loop_var(device, rng):
    xs, u = rng.standard_normal((5, 3, 4)).astype(np.float32), rng.standard_normal((4, 4)).astype(np.float32)
    f = pj.prepare(lambda xs, u: pj.fori_loop(0, 5, lambda t, h: h + xs[t] @ u, pnp.zeros((3, 4), dtype=pnp.float32)),
                   device=device)
    np.testing.assert_allclose(np.asarray(f(xs, u)), sum(xs[t] @ u for t in range(5)), rtol=1e-4, atol=1e-4)


def test_inner_loop_reading_the_outer_loop_var(device, rng):
    """The inner loop's initial carry is loop-invariant but its body reads xs[t, k]: it runs per outer iteration."""
    xs = rng.standard_normal((4, 3, 2)).astype(np.float32)

    def f(xs):
        def outer(t, h):
            inner = pj.fori_loop(0, 3, lambda k, g: g + xs[t, k] * (t + 1), pnp.zeros(2, dtype=pnp.float32))
            return h + inner
        return pj.fori_loop(0, 4, outer, pnp.zeros(2, dtype=pnp.float32))
    ref = sum(xs[t, k] * (t + 1) for t in range(4) for k in range(3))
    np.testing.assert_allclose(np.asarray(pj.prepare(f, device=device)(xs)), ref, rtol=1e-5, atol=1e-5)


def test_loop_invariant_reduction_is_still_hoisted(device, rng):
    """A reduction that depends neither on the carry nor on the loop var is computed once, before the loop."""
    x = rng.standard_normal((3, 4)).astype(np.float32)
    f = pj.prepare(lambda x: pj.fori_loop(0, 6, lambda t, h: h + x.sum(0), pnp.zeros(4, dtype=pnp.float32)),
                   device=device)
    np.testing.assert_allclose(np.asarray(f(x)), 6 * x.sum(0), rtol=1e-5, atol=1e-5)
    reductions = [k for k in f.plan(x).kernels if k.kernel.name.startswith("r_")]
    assert len(reductions) == 1 and not reductions[0].fixedvars
