"""pj.grad through movement (reshape, transpose, broadcast, slices with steps, pad, flip, concatenate, split, roll,
tile, repeat), gathers and scatters (.at[]), cumsum and prepjit.nn against central differences and, when it is
installed, JAX (each case is written once for both, against a NumPy-like namespace `xp`)."""
import numpy as np
import pytest

import prepjit as pj
import prepjit.nn as pnn
import prepjit.numpy as pnp
from tests.tracing.gradcheck import check_grad, jax, like_jax, jax_x64  # noqa: F401 - jax_x64: the fixture

pytestmark = pytest.mark.usefixtures("jax_x64")

rng = np.random.default_rng(1)
X = rng.standard_normal((4, 6))
IDS = np.array([[3, 0], [3, -1], [1, 1]])

# name -> f(xp, x): one function written for both prepjit.numpy and jax.numpy
CASES = {
    "reshape_transpose": lambda xp, x: xp.reshape(x, (3, 8)).T @ xp.ones((3, 2)),
    "broadcast": lambda xp, x: xp.broadcast_to(x[:, :1], (4, 5)) * xp.broadcast_to(x[0], (2, 4, 6))[1, :, :5],
    "slice_steps": lambda xp, x: x[::2, 1::3] * 2 + x[3:0:-2, ::-1][:, :2].sum(),
    "negative_steps": lambda xp, x: x[::-1, 4:0:-3],
    "pad": lambda xp, x: xp.pad(x, ((1, 2), (0, 3)))[::2] * xp.arange(9.0),
    "pad_modes": lambda xp, x: xp.pad(x, ((2, 1), (1, 2)), mode="reflect")[1:]
                 + xp.pad(x, ((2, 1), (1, 2)), mode="edge")[:-1] + xp.pad(x, 2, mode="wrap")[1:-1, 1:],
    "flip": lambda xp, x: xp.flip(x, 1) * xp.arange(6.0),
    "concatenate_stack": lambda xp, x: xp.concatenate([x, x[:, :2] * 3], axis=1).sum(1)
                         + xp.stack([x, -x]).max(0)[:, 0],
    "split": lambda xp, x: xp.split(x, 3, axis=1)[1] * xp.split(x, [1, 3], axis=1)[1],
    "roll": lambda xp, x: xp.roll(x, 2, axis=1) * xp.arange(6.0) + xp.roll(x, -1),
    "tile": lambda xp, x: xp.tile(x[:2], (2, 3)).sum(1) * xp.arange(4.0),
    "repeat": lambda xp, x: xp.repeat(x, 2, axis=0)[:5, ::2],
    "repeat_flat": lambda xp, x: xp.repeat(x[0], 3)[:4] * xp.arange(4.0),
    "squeeze_expand": lambda xp, x: xp.squeeze(xp.expand_dims(x, 0), 0) ** 2,
    "moveaxis_swapaxes": lambda xp, x: xp.moveaxis(xp.reshape(x, (2, 2, 6)), 0, 2)
                         * xp.swapaxes(x.reshape(2, 2, 6), 0, 2).transpose(1, 0, 2),
    "triu_tril": lambda xp, x: xp.triu(x, 1) + xp.tril(x) * 2,
    "take": lambda xp, x: xp.take(x, xp.asarray([5, 0, 0, 2]), axis=1) * xp.arange(4.0),
    "fancy_index": lambda xp, x: x[xp.asarray(IDS)] * xp.arange(6.0)
                   + x[xp.asarray([1, 1, 2]), xp.asarray([0, 0, 5])].sum(),
    "take_along_axis": lambda xp, x: xp.take_along_axis(x, xp.asarray([[0, 0, 5]] * 4), axis=1),
    "cumsum": lambda xp, x: xp.cumsum(x, axis=1) * xp.arange(6.0) + xp.cumsum(x[0]),
    "cumprod": lambda xp, x: xp.cumprod(x[:, :4] * 0.5 + 1, axis=0),
    "mean_var_norm": lambda xp, x: (x - x.mean(-1, keepdims=True)) / xp.sqrt(x.var(-1, keepdims=True) + 1e-5),
    "linalg_norm": lambda xp, x: xp.linalg.norm(x, axis=1) + xp.linalg.norm(x),
}
NN = {
    "softmax": lambda nn, x: nn.softmax(x, axis=-1),
    "log_softmax": lambda nn, x: nn.log_softmax(x, axis=0),
    "logsumexp": lambda nn, x: nn.logsumexp(x, axis=1),
    "sigmoid_silu": lambda nn, x: nn.sigmoid(x) + nn.silu(x),
    "gelu": lambda nn, x: nn.gelu(x),
    "gelu_exact": lambda nn, x: nn.gelu(x, approximate=False),
    "relu": lambda nn, x: nn.relu(x),
}


def _weighted(f, xp):
    def loss(x):
        y = f(xp, x)
        return xp.sum(y * xp.reshape(xp.linspace(0.5, 1.5, y.size), y.shape))
    return loss


def _nn(name):
    """(prepjit's case, JAX's case) for a prepjit.nn function (JAX's namespace built when called)."""
    def theirs(xp, x):
        import jax.scipy.special as jsp
        jnn = type("jnn", (), {"softmax": staticmethod(jax.nn.softmax), "logsumexp": staticmethod(jsp.logsumexp),
                               "log_softmax": staticmethod(jax.nn.log_softmax), "relu": staticmethod(jax.nn.relu),
                               "sigmoid": staticmethod(jax.nn.sigmoid), "silu": staticmethod(jax.nn.silu),
                               "gelu": staticmethod(jax.nn.gelu)})
        return NN[name](jnn, x)
    return (lambda xp, x: NN[name](pnn, x)), theirs


@pytest.mark.parametrize("name", list(CASES) + list(NN))
def test_grad(name):
    ours, theirs = (CASES[name], CASES[name]) if name in CASES else _nn(name)
    got = check_grad(_weighted(ours, pnp), X)
    if jax is not None:
        like_jax(got, _weighted(theirs, jax.numpy), X)


def test_at_set_and_add():
    """Functional updates: .at[].add passes the cotangent to both, .at[].set cuts the overwritten elements off
    the target; repeated ids accumulate into the updates' gradient read."""
    ids = np.array([0, 2, 2])

    def f(xp, x, u):
        return xp.sum(x.at[xp.asarray(ids)].add(u * 2).at[:, 1].set(u[0, :4] * 3) ** 2)
    x, u = X, rng.standard_normal((3, 6))
    for argnum in (0, 1):
        got = check_grad(lambda x, u: f(pnp, x, u), x, u, argnum=argnum)
        like_jax(got, lambda x, u: f(jax.numpy, x, u), x, u, argnums=argnum)


@pytest.mark.parametrize("name", ["cumsum_flat", "tile_and_repeat"])
def test_gradients_whose_kernels_need_a_gate_as_a_whole_in_the_proof(name):
    """Their kernels read `r0*4 + r1 + 8` under the gate `r0*4 + r1 < 4`: proven from the gate as a whole."""
    f = {"cumsum_flat": lambda x: pnp.sum(pnp.cumsum(x) ** 2),
         "tile_and_repeat": lambda x: pnp.sum(pnp.tile(x[:2], (2, 1)).sum(1) * pnp.repeat(x, 2, axis=0)[:4, 0])}[name]
    check_grad(f, X)
