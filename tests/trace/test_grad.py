"""pj.grad of elementwise math, reductions and contractions against central differences (float64) and JAX."""
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from tests.trace.gradcheck import check_grad

jax = pytest.importorskip("jax")
jnp = jax.numpy
jax.config.update("jax_enable_x64", True)


def _jgrad(f, argnums=0):  # jitted: JAX's op-by-op dispatch is the slow part of these tests
    return jax.jit(jax.grad(f, argnums))


def _jvalue_and_grad(f, argnums=0):
    return jax.jit(jax.value_and_grad(f, argnums))

rng = np.random.default_rng(0)
X = rng.uniform(0.2, 0.9, (3, 4))          # in the domain of every op below
S = rng.standard_normal((3, 4))            # signed
Y = rng.uniform(0.5, 1.5, (3, 4))

# name -> (prepjit op, jax op, input)
UNARY = {
    "exp": (pnp.exp, jnp.exp, S), "exp2": (pnp.exp2, jnp.exp2, S), "log": (pnp.log, jnp.log, X),
    "log2": (pnp.log2, jnp.log2, X), "sqrt": (pnp.sqrt, jnp.sqrt, X), "sin": (pnp.sin, jnp.sin, S),
    "cos": (pnp.cos, jnp.cos, S), "tanh": (pnp.tanh, jnp.tanh, S), "abs": (pnp.abs, jnp.abs, S),
    "negative": (pnp.negative, jnp.negative, S), "square": (pnp.square, jnp.square, S),
    "reciprocal": (pnp.reciprocal, jnp.reciprocal, X), "rsqrt": (pnp.rsqrt, jax.lax.rsqrt, X),
    "erf": (pnp.erf, jax.scipy.special.erf, S), "log1p": (pnp.log1p, jnp.log1p, X),
    "expm1": (pnp.expm1, jnp.expm1, S), "sinh": (pnp.sinh, jnp.sinh, S), "cosh": (pnp.cosh, jnp.cosh, S),
    "tan": (pnp.tan, jnp.tan, X), "arctan": (pnp.arctan, jnp.arctan, S), "arcsin": (pnp.arcsin, jnp.arcsin, X),
    "arccos": (pnp.arccos, jnp.arccos, X), "arcsinh": (pnp.arcsinh, jnp.arcsinh, S),
    "arccosh": (pnp.arccosh, jnp.arccosh, X + 1.5), "arctanh": (pnp.arctanh, jnp.arctanh, X - 0.5),
    "sign": (pnp.sign, jnp.sign, S), "floor": (pnp.floor, jnp.floor, S * 3),
}
BINARY = {
    "add": (pnp.add, jnp.add), "subtract": (pnp.subtract, jnp.subtract), "multiply": (pnp.multiply, jnp.multiply),
    "divide": (pnp.divide, jnp.divide), "power": (pnp.power, jnp.power), "maximum": (pnp.maximum, jnp.maximum),
    "minimum": (pnp.minimum, jnp.minimum), "arctan2": (pnp.arctan2, jnp.arctan2), "hypot": (pnp.hypot, jnp.hypot),
    "logaddexp": (pnp.logaddexp, jnp.logaddexp), "mod": (pnp.mod, jnp.mod),
}


def _weights(shape):
    return np.linspace(0.5, 1.5, int(np.prod(shape))).reshape(shape)


def _per_op(names, got, want):
    """Compare op by op (row k of the stacked inputs is op k's), naming the op that differs."""
    for k, name in enumerate(names):
        np.testing.assert_allclose(got[k], want[k], rtol=1e-9, atol=1e-12, err_msg=name)


def test_unary():
    """Every unary op in one function of stacked inputs (one prepare): row k goes through op k."""
    names = list(UNARY)
    x = np.stack([UNARY[n][2] for n in names])
    w = _weights(x.shape[1:])

    def loss(xp, ops, x):
        return sum(xp.sum(op(x[k]) * w) for k, op in enumerate(ops))
    got = check_grad(lambda x: loss(pnp, [UNARY[n][0] for n in names], x), x, rtol=1e-5, atol=1e-6)
    _per_op(names, got, _jgrad(lambda x: loss(jnp, [UNARY[n][1] for n in names], x))(x))


def test_binary():
    """Every binary op in one function (one prepare): op k combines a[k] with b[k], a row that broadcasts."""
    names = list(BINARY)
    a = np.stack([X + 0.3] * len(names))
    b = np.stack([Y[:1]] * len(names))
    w = _weights(a.shape[1:])

    def loss(xp, ops, a, b):
        return sum(xp.sum(op(a[k], b[k]) * w) for k, op in enumerate(ops))
    for argnum in (0, 1):
        got = check_grad(lambda a, b: loss(pnp, [BINARY[n][0] for n in names], a, b), a, b, argnum=argnum,
                         rtol=1e-5, atol=1e-6)
        want = _jgrad(lambda a, b: loss(jnp, [BINARY[n][1] for n in names], a, b), argnum)(a, b)
        _per_op(names, got, want)


def test_ties_and_kinks_match_jax():
    """Subgradients where JAX defines them: max/min split ties evenly, abs has slope 1 at 0, where passes to the
    branch taken; comparisons give zero."""
    x = np.array([[-1.0, 0.0, 2.0, 2.0], [3.0, -0.5, 0.0, 1.0]])
    y = np.array([[-1.0, 1.0, 2.0, 0.0], [3.0, 0.5, 0.0, 1.0]])

    def pf(x, y):
        return pnp.sum(pnp.maximum(x, y) * 2 + pnp.minimum(x, y) + pnp.abs(x) + pnp.where(x > y, x * y, y * 3)
                       + pnp.max(x) + pnp.min(x, axis=1).sum() + (x < y) + pnp.clip(x, -0.5, 2.0))

    def jf(x, y):
        return jnp.sum(jnp.maximum(x, y) * 2 + jnp.minimum(x, y) + jnp.abs(x) + jnp.where(x > y, x * y, y * 3)
                       + jnp.max(x) + jnp.min(x, axis=1).sum() + (x < y) + jnp.clip(x, -0.5, 2.0))
    got = pj.grad(pf, (0, 1))(x, y)
    want = _jgrad(jf, (0, 1))(x, y)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-12)


AXES = [(None, False), (0, False), (1, True), ((0, 1), True)]


@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "prod", "var", "std"])
def test_reductions(name):
    """Each reduction over every axis choice (with and without keepdims) in one function."""
    x = S.copy()
    op, jop = getattr(pnp, name), getattr(jnp, name)
    weights = [_weights(np.sum(x, axis=axis, keepdims=keep).shape) for axis, keep in AXES]

    def loss(xp, op, x):
        return sum(xp.sum(op(x, axis=axis, keepdims=keep) * w) for (axis, keep), w in zip(AXES, weights))
    got = check_grad(lambda x: loss(pnp, op, x), x)
    np.testing.assert_allclose(got, _jgrad(lambda x: loss(jnp, jop, x))(x), rtol=1e-9, atol=1e-12)


def test_prod_with_zeros_matches_jax():
    x = np.array([[0.0, 2.0, 3.0], [0.0, 0.0, 4.0], [1.0, 2.0, 5.0]])
    got = pj.grad(lambda x: pnp.sum(pnp.prod(x, axis=1) * np.array([1.0, 2.0, 3.0])))(x)
    want = _jgrad(lambda x: jnp.sum(jnp.prod(x, axis=1) * jnp.array([1.0, 2.0, 3.0])))(x)
    np.testing.assert_allclose(np.asarray(got), want)


CONTRACTIONS = {  # name -> (prepjit op, jax op, shapes)
    "matmul": (pnp.matmul, jnp.matmul, (3, 4), (4, 5)),
    "matmul_batched": (pnp.matmul, jnp.matmul, (2, 3, 4), (4, 2)),
    "matvec": (pnp.matmul, jnp.matmul, (3, 4), (4,)),
    "vecmat": (pnp.matmul, jnp.matmul, (4,), (4, 3)),
    "dot": (pnp.dot, jnp.dot, (3, 4), (4, 2)),
    "outer": (pnp.outer, jnp.outer, (3,), (4,)),
}
EINSUMS = [("ij,jk->ik", (3, 4), (4, 2)), ("bij,bjk->bik", (2, 3, 4), (2, 4, 2)), ("ij,ij->", (3, 4), (3, 4)),
           ("ii,i->i", (3, 3), (3,)), ("i,j->ij", (3,), (4,))]


@pytest.mark.parametrize("name", CONTRACTIONS)
def test_matmul(name):
    op, jop, sa, sb = CONTRACTIONS[name]
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    w = _weights(np.shape(jop(a, b)))
    for argnum in (0, 1):
        got = check_grad(lambda a, b: pnp.sum(op(a, b) * w), a, b, argnum=argnum)
        np.testing.assert_allclose(got, _jgrad(lambda a, b: jnp.sum(jop(a, b) * w), argnum)(a, b), rtol=1e-9)


@pytest.mark.parametrize("spec, sa, sb", EINSUMS)
def test_einsum_and_tensordot(spec, sa, sb):
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    w = _weights(np.einsum(spec, a, b).shape)
    grads = pj.grad(lambda a, b: pnp.sum(pnp.einsum(spec, a, b) * w), (0, 1))(a, b)
    want = _jgrad(lambda a, b: jnp.sum(jnp.einsum(spec, a, b) * w), (0, 1))(a, b)
    for g, v in zip(grads, want):
        np.testing.assert_allclose(np.asarray(g), v, rtol=1e-9, atol=1e-12)
    a3, b3 = rng.standard_normal((2, 3, 4)), rng.standard_normal((3, 4, 5))
    got = pj.grad(lambda a: pnp.sum(pnp.tensordot(a, b3, axes=2) ** 2))(a3)
    np.testing.assert_allclose(np.asarray(got), _jgrad(lambda a: jnp.sum(jnp.tensordot(a, b3, axes=2) ** 2))(a3),
                               rtol=1e-9)
