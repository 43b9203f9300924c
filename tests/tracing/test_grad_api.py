"""pj.grad / value_and_grad / vjp as an API: argnums tuples, has_aux, pytrees, integer inputs, errors, inside
prepared functions with symbolic shapes (one trace across batch sizes), eager calls, and pj.fori_loop."""
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from tests.tracing.gradcheck import check_grad, jax, needs_jax, jax_x64  # noqa: F401 - jax_x64: the fixture

pytestmark = pytest.mark.usefixtures("jax_x64")

jnp = jax.numpy if jax is not None else None


def _jgrad(f, argnums=0):  # jitted: JAX's op-by-op dispatch is the slow part of these tests
    return jax.jit(jax.grad(f, argnums))


def _jvalue_and_grad(f, argnums=0):
    return jax.jit(jax.value_and_grad(f, argnums))


rng = np.random.default_rng(2)


def mlp_loss(xp, params, x, y):
    h = xp.tanh(x @ params["w1"] + params["b1"])
    logits = h @ params["w2"]
    logp = logits - xp.log(xp.sum(xp.exp(logits), axis=1, keepdims=True))
    return -xp.mean(xp.sum(logp * y, axis=1))


def _params(dtype=np.float64):
    return {"w1": rng.standard_normal((5, 8)).astype(dtype), "b1": rng.standard_normal(8).astype(dtype),
            "w2": rng.standard_normal((8, 3)).astype(dtype)}


@needs_jax
def test_pytree_params_match_jax_eagerly():
    params, x, y = _params(), rng.standard_normal((4, 5)), np.eye(3)[[0, 2, 1, 1]]
    value, grads = pj.value_and_grad(lambda p, x, y: mlp_loss(pnp, p, x, y))(params, x, y)
    jvalue, jgrads = _jvalue_and_grad(lambda p, x, y: mlp_loss(jnp, p, x, y))(params, x, y)
    np.testing.assert_allclose(np.asarray(value), jvalue, rtol=1e-12)
    assert set(grads) == set(params)
    for k in params:
        np.testing.assert_allclose(np.asarray(grads[k]), jgrads[k], rtol=1e-10, atol=1e-12)


@needs_jax
def test_symbolic_batch_one_trace_float32():
    """A training step prepared once with a symbolic batch: the gradient is part of the plan and replays."""
    params = _params(np.float32)

    @pj.prepare(vars={"n": (1, 64)}, shapes={"x": ("n", 5), "y": ("n", 3)})
    def step(params, x, y):
        loss, grads = pj.value_and_grad(lambda p: mlp_loss(pnp, p, x, y))(params)
        return loss, {k: params[k] - 0.1 * grads[k] for k in params}

    for n in (4, 9, 1, 33):
        x, y = rng.standard_normal((n, 5)).astype(np.float32), np.eye(3, dtype=np.float32)[rng.integers(0, 3, n)]
        loss, new = step(params, x, y)
        jloss, jgrads = _jvalue_and_grad(lambda p: mlp_loss(jnp, p, x, y))(params)
        np.testing.assert_allclose(np.asarray(loss), jloss, rtol=1e-5)
        for k in params:
            np.testing.assert_allclose(np.asarray(new[k]), params[k] - 0.1 * jgrads[k], rtol=1e-4, atol=1e-5)
    assert step.stats["traces"] == 1


def test_argnums_has_aux_and_int_inputs():
    a, b, k = rng.standard_normal(3), rng.standard_normal(3), np.arange(3)

    def f(a, b, k):
        out = pnp.sum(a * b * k + pnp.sin(a))
        return out, {"double": out * 2, "k": k}
    (ga, gb, gk), aux = pj.grad(f, argnums=(0, 1, 2), has_aux=True)(a, b, k)
    np.testing.assert_allclose(np.asarray(ga), b * k + np.cos(a))
    np.testing.assert_allclose(np.asarray(gb), a * k)
    assert np.asarray(gk).dtype == k.dtype and not np.asarray(gk).any()  # integer inputs: zeros of their dtype
    np.testing.assert_allclose(np.asarray(aux["double"]), 2 * np.sum(a * b * k + np.sin(a)))
    (value, aux2), g = pj.value_and_grad(f, argnums=-2, has_aux=True)(a, b, k)
    np.testing.assert_allclose(np.asarray(g), a * k)
    assert np.asarray(aux2["k"]).tolist() == [0, 1, 2]
    assert np.asarray(pj.grad(lambda x: x * x)(3.0)) == 6.0  # a Python float argument is differentiated too


def test_errors():
    with pytest.raises(pj.TraceError, match="one real scalar output"):
        pj.grad(lambda x: x * 2)(np.ones(3))
    with pytest.raises(pj.TraceError, match="argnums"):
        pj.grad(lambda x: pnp.sum(x), argnums=3)(np.ones(3))
    with pytest.raises(pj.TraceError, match="pair"):
        pj.grad(lambda x: pnp.sum(x), has_aux=True)(np.ones(3))
    with pytest.raises(pj.TraceError, match="trip count"):  # a while_loop's is known only per call (as JAX)
        pj.grad(lambda x: pnp.sum(pj.while_loop(lambda c: c[1] < 3, lambda c: (c[0] * 2, c[1] + 1),
                                                (x, 0))[0]))(np.ones(2))


@needs_jax
def test_vjp_traced_and_eager():
    x, w = rng.standard_normal((2, 3)), rng.standard_normal((3, 4))
    ct = rng.standard_normal((2, 4))

    def f(x, w):
        return pnp.tanh(x @ w), x.sum()
    (out, s), f_vjp = pj.vjp(f, x, w)
    gx, gw = f_vjp((ct, 2.0))
    (jout, _), jf_vjp = jax.vjp(lambda x, w: (jnp.tanh(x @ w), x.sum()), x, w)
    jgx, jgw = jf_vjp((ct, 2.0))
    np.testing.assert_allclose(np.asarray(out), jout, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(gx), jgx, rtol=1e-10)
    np.testing.assert_allclose(np.asarray(gw), jgw, rtol=1e-10)

    out, f_vjp = pj.vjp(lambda x: pnp.exp(x), x[0])  # one primal: f_vjp's prepared function takes (primals, ct)
    np.testing.assert_allclose(np.asarray(f_vjp(ct[0, :3])[0]), np.exp(x[0]) * ct[0, :3], rtol=1e-12)

    @pj.prepare
    def inside(x, w, ct):
        out, f_vjp = pj.vjp(lambda w: pnp.tanh(x @ w), w)
        return out, f_vjp(ct)[0]
    out, gw2 = inside(x, w, ct)
    np.testing.assert_allclose(np.asarray(gw2), jgw, rtol=1e-10)


def test_closure_value_equal_to_the_input_is_a_constant():
    """The differentiated input is a fresh placeholder: an equal value read from elsewhere (hash-consing would
    make it the same node) stays a constant."""
    @pj.prepare
    def f(x):
        y = x * 2
        return pj.grad(lambda z: pnp.sum(z * (x * 2)))(y)  # d/dz sum(z * c) = c, though z and c are equal nodes
    x = rng.standard_normal(4)
    np.testing.assert_allclose(np.asarray(f(x)), 2 * x)


def test_nested_grad_of_grad():
    x = rng.standard_normal(3)
    g2 = pj.grad(lambda x: pnp.sum(pj.grad(lambda y: pnp.sum(pnp.sin(y) * y))(x)))(x)
    np.testing.assert_allclose(np.asarray(g2), 2 * np.cos(x) - x * np.sin(x), rtol=1e-12)


def _rnn(xp, loop, h0, w, xs):
    xs = xp.asarray(xs)
    return xp.sum(loop(0, xs.shape[0], lambda t, h: xp.tanh(h @ w + xs[t]) * 0.9, h0) ** 2)


def _jax_loop(lo, hi, body, init):
    return jax.lax.fori_loop(lo, hi, body, init)


def test_fori_loop_matches_jax_and_differences():
    h0, w, xs = rng.standard_normal((2, 3)), rng.standard_normal((3, 3)) * 0.5, rng.standard_normal((5, 2, 3))
    for argnum in (0, 1, 2):
        got = check_grad(lambda h0, w, xs: _rnn(pnp, pj.fori_loop, h0, w, xs), h0, w, xs, argnum=argnum)
        if jax is not None:
            want = _jgrad(lambda h0, w, xs: _rnn(jnp, _jax_loop, h0, w, xs), argnum)(h0, w, xs)
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


@needs_jax
def test_fori_loop_in_a_prepared_step_runs_once_per_iteration():
    """The loop that keeps its carries replaces the plain one: the value and the gradient share it."""
    h0, w, xs = rng.standard_normal((2, 3)), rng.standard_normal((3, 3)) * 0.5, rng.standard_normal((6, 2, 3))

    @pj.prepare(vars={"b": (1, 8)}, shapes={"h0": ("b", 3), "xs": (6, "b", 3)})
    def step(h0, w, xs):
        return pj.value_and_grad(lambda w: _rnn(pnp, pj.fori_loop, h0, w, xs))(w)
    for b in (2, 5):
        h, x = rng.standard_normal((b, 3)), rng.standard_normal((6, b, 3))
        value, g = step(h, w, x)
        jv, jg = _jvalue_and_grad(lambda w: _rnn(jnp, _jax_loop, h, w, x))(w)
        np.testing.assert_allclose(np.asarray(value), jv, rtol=1e-12)
        np.testing.assert_allclose(np.asarray(g), jg, rtol=1e-9)
    assert step.stats["traces"] == 1
    kernels = step.plan(h, w, x).kernels
    assert {k.fixedvars.get("t") for k in kernels if "t" in k.fixedvars} == set(range(6))
    per_step = [(k.ast, tuple(sorted(k.fixedvars.items()))) for k in kernels if k.fixedvars]
    assert len(set(per_step)) == len(per_step)  # no iteration's kernel runs twice (the forward loop runs once)


@needs_jax
def test_nested_fori_loops():
    w, x0 = rng.standard_normal((3, 3)) * 0.4, rng.standard_normal(3)

    def f(xp, loop, w, x0):
        def outer(t, x):
            return loop(0, 3, lambda k, y: xp.sin(y @ w) + (t + 1) * 0.1, x) * 0.9
        return xp.sum(loop(0, 2, outer, x0) ** 2)
    got = pj.grad(lambda w, x0: f(pnp, pj.fori_loop, w, x0), (0, 1))(w, x0)
    want = _jgrad(lambda w, x0: f(jnp, _jax_loop, w, x0), (0, 1))(w, x0)
    for g, v in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), v, rtol=1e-9, atol=1e-12)


def test_eager_grad_retraces_when_a_global_it_reads_is_rebound():
    """The internal prepared function keys on the arrays `fun` reads, as a user's prepared function does."""
    global SCALE
    SCALE = np.full(3, 2.0)
    g = pj.grad(_reads_scale)
    np.testing.assert_allclose(np.asarray(g(np.ones(3))), 2.0)
    SCALE = np.full(3, 5.0)
    np.testing.assert_allclose(np.asarray(g(np.ones(3))), 5.0)


def _reads_scale(x):
    return pnp.sum(x * SCALE)


def test_every_traced_op_has_rules():
    """grad is a table: every op a traced graph can hold has a Primitive (the kernel-only ops have none), and the
    differentiable ones a vjp."""
    from prepjit.tracing.prims.registry import _table
    from prepjit.uop import Ops
    kernel_only = {Ops.DEFINE_GLOBAL, Ops.DEFINE_LOCAL, Ops.RANGE, Ops.REDUCE, Ops.BUFFER_SELECT, Ops.LOAD,
                   Ops.STORE, Ops.SINK, Ops.LAUNCH}
    assert {op for op in Ops if op not in _table} == kernel_only
    differentiable = {Ops.EXP, Ops.LOG, Ops.SQRT, Ops.TANH, Ops.ERF, Ops.MUL, Ops.FDIV, Ops.POW, Ops.MAX, Ops.WHERE,
                      Ops.CAST, Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.SHRINK, Ops.PAD, Ops.GATHER, Ops.SCATTER,
                      Ops.REDUCE_AXIS, Ops.LOOP}
    assert all(_table[op].vjp is not None for op in differentiable)


@needs_jax
def test_grad_inside_a_loop_body_and_through_it():
    """Gradient descent as a fori_loop whose body takes a gradient, and the gradient of its result (second order
    through the loop) against JAX."""
    x, y = rng.standard_normal((6, 3)), rng.standard_normal(6)

    def descend(xp, loop, grad, w0, steps):
        def loss(w):
            return xp.mean((xp.asarray(x) @ w - xp.asarray(y)) ** 2)
        return loop(0, steps, lambda i, w: w - 0.1 * grad(loss)(w), w0)
    w0 = rng.standard_normal(3)
    f = pj.prepare(lambda w0: descend(pnp, pj.fori_loop, pj.grad, w0, 5))
    np.testing.assert_allclose(np.asarray(f(w0)), descend(jnp, _jax_loop, jax.grad, w0, 5), rtol=1e-12)
    got = pj.grad(lambda w0: pnp.sum(descend(pnp, pj.fori_loop, pj.grad, w0, 3) ** 2))(w0)
    want = _jgrad(lambda w0: jnp.sum(descend(jnp, _jax_loop, jax.grad, w0, 3) ** 2))(w0)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-10)


@needs_jax
def test_loop_with_gathers_and_an_int_carry():
    """A body that gathers rows (its range flag is carried out of the loop) and counts in an int carry."""
    table, ids = rng.standard_normal((5, 3)), np.array([[0, 4], [2, 2], [1, 3]])

    def f(xp, loop, table, h0):
        t, i_ = xp.asarray(table), xp.asarray(ids)

        def body(i, c):
            h, k = c
            return xp.tanh(h + t[i_[i]].sum(0) * (k + 1).astype(h.dtype)), k + 2
        h, k = loop(0, 3, body, (h0, xp.asarray(np.int64(1))))
        return xp.sum(h ** 2) * k
    h0 = rng.standard_normal(3)
    got = pj.grad(lambda t, h: f(pnp, pj.fori_loop, t, h), (0, 1))(table, h0)
    want = _jgrad(lambda t, h: f(jnp, _jax_loop, t, h), (0, 1))(table, h0)
    for g, v in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), v, rtol=1e-10, atol=1e-11)


def test_out_of_range_gather_still_raises_under_grad():
    g = pj.grad(lambda t, ids: pnp.sum(t[ids] ** 2))
    np.testing.assert_allclose(np.asarray(g(np.ones(4), np.array([0, 3, 3]))), [2.0, 0, 0, 4.0])
    with pytest.raises(pj.IndexBoundError):
        g(np.ones(4), np.array([0, 4]))


@needs_jax
def test_scan_and_cond_match_jax():
    """pj.scan (a static fori_loop writing ys.at[t].set(y)) and pj.cond on a traced predicate differentiate."""
    w, xs = rng.standard_normal((3, 3)) * 0.5, rng.standard_normal((4, 3))

    def f(xp, lax, w, xs):
        def step(h, x):
            h = xp.tanh(h @ w + x)
            return h, h * 2
        h, ys = lax.scan(step, xp.zeros(3), xs)
        return xp.sum(ys ** 2) + lax.cond(xp.sum(h) > 0, lambda h: xp.sum(h * 3), lambda h: xp.sum(xp.sin(h)), h)
    got = pj.grad(lambda w, xs: f(pnp, pj, w, xs), (0, 1))(w, xs)
    want = _jgrad(lambda w, xs: f(jnp, jax.lax, w, xs), (0, 1))(w, xs)
    for g, v in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), v, rtol=1e-10, atol=1e-12)


def test_eager_grad_in_a_python_loop_prepares_once():
    def loss(w, x):
        return pnp.sum((x @ w) ** 2)
    x, w = rng.standard_normal((4, 3)), rng.standard_normal(3)
    for _ in range(3):
        w = w - 0.01 * np.asarray(pj.grad(loss)(w, x))
    assert pj.grad(loss) is pj.grad(loss) and pj.grad(loss) is not pj.grad(loss, 1)
    assert pj.grad(loss).__wrapped__ is loss and pj.grad(pj.grad(lambda w: pnp.sum(w ** 3)))
    transformed = pj.grad(loss).__closure__[0].cell_contents  # what the function calls (autodiff._Transformed)
    assert transformed.prepared.stats["traces"] == 1  # its eager prepared function traced once for the 3 calls


@needs_jax
def test_grad_and_vmap_compose_through_a_loop():
    """pj.vmap of pj.grad (per-example gradients) and pj.grad of pj.vmap, both through a fori_loop."""
    w, xs = rng.standard_normal((3, 3)) * 0.5, rng.standard_normal((5, 4, 3))

    def rnn(xp, loop, w, x):
        return xp.sum(loop(0, 4, lambda t, h: xp.tanh(h @ w + x[t]), xp.zeros(3)) ** 2)
    per_example = pj.vmap(pj.grad(lambda w, x: rnn(pnp, pj.fori_loop, w, x)), in_axes=(None, 0))(w, xs)
    want = jax.vmap(jax.grad(lambda w, x: rnn(jnp, _jax_loop, w, x)), in_axes=(None, 0))(w, xs)
    np.testing.assert_allclose(np.asarray(per_example), want, rtol=1e-10, atol=1e-12)
    total = pj.grad(lambda w: pnp.sum(pj.vmap(lambda x: rnn(pnp, pj.fori_loop, w, x))(xs)))(w)
    np.testing.assert_allclose(np.asarray(total), want.sum(0), rtol=1e-10, atol=1e-12)
