"""pj.vmap against a Python loop over the examples: in_axes/out_axes, nesting, prepare with a var batch size
(one trace), loops, gathers and scatters inside, eager calls, and its errors."""
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp


def _close(a, b):
    np.testing.assert_allclose(np.asarray(a), b, rtol=1e-5, atol=1e-5)


def _layer(x, w):
    return pnp.tanh(x @ w).sum() + x.max()


def test_vmap_matches_a_python_loop_and_composes_with_prepare(device, rng):
    w = rng.standard_normal((3, 4)).astype(np.float32)

    @pj.prepare(vars={"b": (1, 32)}, shapes={"x": ("b", 3)}, device=device)
    def f(x, w):
        return pj.vmap(_layer, in_axes=(0, None))(x, w)
    for b in (1, 4, 9):
        x = rng.standard_normal((b, 3)).astype(np.float32)
        _close(f(x, w), [np.tanh(xi @ w).sum() + xi.max() for xi in x])
    assert f.stats["traces"] == 1


def test_vmap_eager_on_numpy(rng):
    x, w = rng.standard_normal((5, 3)), rng.standard_normal((3, 4))
    out = pj.vmap(_layer, in_axes=(0, None))(x, w)
    assert isinstance(out, pj.Array)
    _close(out, [np.tanh(xi @ w).sum() + xi.max() for xi in x])


def test_vmap_axes_and_nesting(rng):
    a, b = rng.standard_normal((3, 4)), rng.standard_normal(4)
    outer = pj.vmap(pj.vmap(lambda p, q: p * q + 1, in_axes=(0, None)), in_axes=(1, 0), out_axes=1)
    _close(outer(a, b), a * b + 1)
    pairs = pj.vmap(lambda d: (d["u"] + d["v"], d["u"].sum()), in_axes=({"u": 1, "v": 0},), out_axes=(0, None))
    with pytest.raises(ValueError, match="out_axes None"):
        pairs({"u": a, "v": a.T})
    s, t = pj.vmap(lambda d: (d["u"] + d["v"], d["u"].sum()), in_axes=({"u": 1, "v": 0},))({"u": a, "v": a.T})
    _close(s, a.T + a.T)
    _close(t, a.sum(0))
    _close(pj.vmap(lambda x: x.T @ x, in_axes=2)(rng.standard_normal((2, 3, 5))).shape, (5, 3, 3))


def test_vmap_of_reductions_movement_and_unbatched_outputs(rng):
    x = rng.standard_normal((4, 3, 5))

    def f(v):
        return (pnp.concatenate([v[:, ::2], v[::-1, 1:2]], axis=1).reshape(-1), v.mean(0), pnp.ones(2),
                pnp.pad(v, ((1, 0), (0, 2))).max(1))
    got = pj.vmap(f)(x)
    refs = [f_ for f_ in zip(*[(np.concatenate([v[:, ::2], v[::-1, 1:2]], axis=1).reshape(-1), v.mean(0),
                                np.ones(2), np.pad(v, ((1, 0), (0, 2))).max(1)) for v in x])]
    for g, r in zip(got, refs):
        _close(g, np.stack(r))


def test_vmap_of_gathers_scatters_and_loops(rng):
    t, ids = np.arange(5.0), np.array([0, 4, 2])
    _close(pj.vmap(lambda i: pnp.asarray(t)[i] * 2, in_axes=0)(ids), t[ids] * 2)
    rows = rng.standard_normal((3, 5))
    _close(pj.vmap(lambda r, i: r[i])(rows, ids), rows[np.arange(3), ids])
    _close(pj.vmap(lambda r, i: r.at[i].add(1.0))(rows, ids), rows + np.eye(5)[ids])
    loop = pj.vmap(lambda x: pj.fori_loop(0, 3, lambda j, c: c * x + j, pnp.zeros((), np.float64)))
    xs = np.array([0.5, 2.0])
    _close(loop(xs), [((0 * v + 0) * v + 1) * v + 2 for v in xs])
    halve = pj.vmap(lambda x: pj.while_loop(lambda c: c[0] > 1.0, lambda c: (c[0] / 2, c[1] + 1), (x, np.int64(0))))
    v, k = halve(np.array([1.0, 3.0, 100.0]))
    _close(v, [1.0, 0.75, 0.78125])
    assert np.asarray(k).tolist() == [0, 2, 7]


def test_vmap_of_a_gather_out_of_range_raises(rng):
    t = np.arange(5.0)
    f = pj.prepare(lambda ids: pj.vmap(lambda i: pnp.asarray(t)[i])(ids))
    with pytest.raises(pj.IndexBoundError):
        f(np.array([0, 7]))
    _close(f(np.array([1, 2])), [1, 2])


def test_vmap_of_cond_and_scan(rng):
    x = rng.standard_normal((6, 3))
    _close(pj.vmap(lambda v: pj.cond(v.sum() > 0, lambda: v * 2, lambda: -v))(x),
           [v * 2 if v.sum() > 0 else -v for v in x])
    c, ys = pj.vmap(lambda v: pj.scan(lambda h, e: (h + e, h * e), 0.0, v))(x)
    _close(c, x.sum(1))
    _close(ys, [[0.0, v[0] * v[1], (v[0] + v[1]) * v[2]] for v in x])


def test_vmap_errors(rng):
    x = rng.standard_normal((3, 2))
    with pytest.raises(ValueError, match="inconsistent"):
        pj.vmap(lambda a, b: a + b)(x, x[:2])
    with pytest.raises(ValueError, match="at least one"):
        pj.vmap(lambda a: a, in_axes=None)(x)
    with pytest.raises(ValueError, match="does not match"):
        pj.vmap(lambda a, b: a + b, in_axes=(0,))(x, x)


def test_vmap_composes_with_grad(rng):
    """Per-example gradients (vmap of grad) and the gradient of a vmapped loss (grad of vmap), in a prepared
    function with a var batch size; pj.lax spells the control flow as jax.lax does."""
    w, xs = rng.standard_normal((3, 4)), rng.standard_normal((5, 3))

    def loss(x, w):
        return (pnp.tanh(x @ w) ** 2).sum()
    per_example = []
    for x in xs:
        t = np.tanh(x @ w)
        per_example.append(np.outer(x, 2 * t * (1 - t * t)))
    f = pj.prepare(lambda xs, w: pj.vmap(pj.grad(loss, argnums=1), in_axes=(0, None))(xs, w),
                   vars={"b": (1, 16)}, shapes={"xs": ("b", 3)})
    for b in (1, 5):
        _close(f(xs[:b], w), np.array(per_example[:b]))
    assert f.stats["traces"] == 1
    _close(pj.grad(lambda w: pj.vmap(loss, in_axes=(0, None))(xs, w).sum())(w), np.sum(per_example, 0))
    assert pj.lax.scan is pj.scan and pj.lax.cond is pj.cond and pj.lax.while_loop is pj.while_loop


def test_vmap_is_a_batched_graph_not_a_loop_over_examples(rng):
    """The vmapped layer has the hand-batched plan's kernels (a packed contraction and two reductions), for any
    batch size; nothing in it runs once per example."""
    xs, w = rng.standard_normal((64, 32)).astype(np.float32), rng.standard_normal((32, 48)).astype(np.float32)
    spec = dict(vars={"b": (1, 256)}, shapes={"xs": ("b", 32)})
    mapped = pj.prepare(lambda xs, w: pj.vmap(lambda x, w: pnp.tanh(x @ w).sum(), in_axes=(0, None))(xs, w), **spec)
    batched = pj.prepare(lambda xs, w: pnp.tanh(xs @ w).sum(1), **spec)
    _close(mapped(xs, w), np.asarray(batched(xs, w)))
    kinds = [[k.kernel.name.split("_")[0] for k in f.plan(xs, w).kernels] for f in (mapped, batched)]
    assert kinds[0] == kinds[1] and not any(k.fixedvars for k in mapped.plan(xs, w).kernels)
