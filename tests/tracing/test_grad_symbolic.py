"""Gradients on symbolic shapes: each case prepared once with a symbolic row count (and a symbolic slice bound),
replayed on several sizes (one trace), against JAX at each size (without JAX: against the static-shape
gradient, which test_grad_movement.py checks against central differences)."""
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from tests.tracing.gradcheck import jax, jax_grad, jax_x64  # noqa: F401 - jax_x64: the fixture
from tests.tracing.test_grad_movement import CASES, _nn, _weighted

pytestmark = pytest.mark.usefixtures("jax_x64")


def _reference(ours, theirs, *args, argnums=0):
    """JAX's gradient of `theirs`, or (without JAX) prepjit's static-shape eager gradient of `ours`."""
    if jax is not None:
        return jax_grad(theirs, argnums)(*args)
    return pj.grad(ours, argnums)(*args)

SYMBOLIC = ["slice_steps", "negative_steps", "pad", "pad_modes", "flip", "concatenate_stack", "split", "roll",
            "cumsum", "mean_var_norm", "take", "fancy_index", "repeat", "softmax", "log_softmax", "logsumexp"]
SIZES = (5, 8)


@pytest.mark.parametrize("name", SYMBOLIC)
def test_symbolic_rows_one_trace(name):
    ours, theirs = (CASES[name], CASES[name]) if name in CASES else _nn(name)
    f = pj.prepare(pj.grad(_weighted(ours, pnp)), vars={"n": (4, 16)}, shapes={"x": ("n", 6)})
    for n in SIZES:
        x = np.random.default_rng(n).standard_normal((n, 6))
        want = _reference(_weighted(ours, pnp), _weighted(theirs, jax and jax.numpy), x)
        np.testing.assert_allclose(np.asarray(f(x)), np.asarray(want), rtol=1e-9, atol=1e-12)
    assert f.stats["traces"] == 1


def test_symbolic_slice_bound_and_matmul():
    """x[:, :pos + 1] @ w[:pos + 1] with a scalar var pos: the slice's adjoint pads by a symbolic width."""
    @pj.prepare(vars={"pos": (0, 7), "n": (1, 9)}, shapes={"x": ("n", 8)})
    def g(x, w, pos):
        return pj.grad(lambda x, w: pnp.sum(pnp.tanh(x[:, :pos + 1] @ w[:pos + 1]) ** 2), (0, 1))(x, w)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 3))
    for n, pos in ((2, 0), (5, 3), (9, 7)):
        x = rng.standard_normal((n, 8))
        want = _reference(lambda x, w: pnp.sum(pnp.tanh(x[:, :pos + 1] @ w[:pos + 1]) ** 2),
                          lambda x, w: jax.numpy.sum(jax.numpy.tanh(x[:, :pos + 1] @ w[:pos + 1]) ** 2), x, w,
                          argnums=(0, 1))
        for a, b in zip(g(x, w, pos), want):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-12)
    assert g.stats["traces"] == 1


def test_symbolic_reductions_and_contractions():
    """Every reduction over the symbolic axis and the static one, matmul and einsum over a symbolic batch."""
    def loss(xp, x, w):
        y = xp.tanh(x @ w)
        return (xp.sum(y.max(0) * 2 + y.min(1, keepdims=True).sum() + xp.prod(y * 0.5 + 1, axis=0))
                + xp.mean(y) + xp.var(y, axis=0).sum() + xp.einsum("ni,nj->ij", x, y).sum() + xp.std(x))

    @pj.prepare(vars={"n": (1, 32)}, shapes={"x": ("n", 4)})
    def g(x, w):
        return pj.grad(lambda x, w: loss(pnp, x, w), (0, 1))(x, w)
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 3))
    for n in (1, 6, 17):
        x = rng.standard_normal((n, 4))
        want = _reference(lambda x, w: loss(pnp, x, w), lambda x, w: loss(jax.numpy, x, w), x, w, argnums=(0, 1))
        for a, b in zip(g(x, w), want):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-12)
    assert g.stats["traces"] == 1
