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


def test_a_carry_updated_by_a_scatter_is_written_in_place(rng):
    """ys.at[t].set(row) as the carry's only use: the body writes one row into the carry's one buffer per
    iteration (no ping-pong copy of the whole carry), with static and with var bounds."""
    xs = rng.standard_normal((5, 4)).astype(np.float32)

    def body(t, ys):
        return ys.at[t].set(pnp.tanh(pnp.asarray(xs)[t]) * 2)
    for f, n in ((lambda: pj.fori_loop(0, 5, body, pnp.zeros((5, 4), np.float32)), None),
                 (lambda n: pj.fori_loop(0, n, body, pnp.zeros((5, 4), np.float32)), 5)):
        g = pj.prepare(f, vars={"n": (0, 5)}) if n else pj.prepare(f)
        args = (n,) if n else ()
        np.testing.assert_allclose(np.asarray(g(*args)), np.tanh(xs) * 2, rtol=1e-6)
        plan = g.plan(*args)
        in_loop = [k for k in plan.kernels if k.fixedvars or "t" in k.kernel.var_names]
        assert in_loop and not any(plan.buffers[k.buffer_indices[0]].size == 20 and not k.kernel.name.startswith("S")
                                   for k in in_loop)
        assert sum(b.size == 20 for i, b in enumerate(plan.buffers) if i not in plan.inputs) == 2  # carry, output
