"""pj.grad of elementwise math, reductions and contractions against central differences (float64) and, when it
is installed, JAX."""
import functools

import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from tests.tracing.gradcheck import (check_grad, jax, jax_grad, jax_x64, like_jax,  # noqa: F401 - jax_x64: the fixture
                                   needs_jax)

pytestmark = pytest.mark.usefixtures("jax_x64")


def _j(path: str):
    """A JAX function by its path under jax.numpy ("exp") or jax ("lax.rsqrt"), looked up when called."""
    def call(*args, **kwargs):
        obj = jax if "." in path else jax.numpy
        return functools.reduce(getattr, path.split("."), obj)(*args, **kwargs)
    return call


rng = np.random.default_rng(0)
X = rng.uniform(0.2, 0.9, (3, 4))          # in the domain of every op below
S = rng.standard_normal((3, 4))            # signed
Y = rng.uniform(0.5, 1.5, (3, 4))

# name -> (prepjit op, jax op, input)
UNARY = {
    "exp": (pnp.exp, _j("exp"), S), "exp2": (pnp.exp2, _j("exp2"), S), "log": (pnp.log, _j("log"), X),
    "log2": (pnp.log2, _j("log2"), X), "sqrt": (pnp.sqrt, _j("sqrt"), X), "sin": (pnp.sin, _j("sin"), S),
    "cos": (pnp.cos, _j("cos"), S), "tanh": (pnp.tanh, _j("tanh"), S), "abs": (pnp.abs, _j("abs"), S),
    "negative": (pnp.negative, _j("negative"), S), "square": (pnp.square, _j("square"), S),
    "reciprocal": (pnp.reciprocal, _j("reciprocal"), X), "rsqrt": (pnp.rsqrt, _j("lax.rsqrt"), X),
    "erf": (pnp.erf, _j("scipy.special.erf"), S), "log1p": (pnp.log1p, _j("log1p"), X),
    "expm1": (pnp.expm1, _j("expm1"), S), "sinh": (pnp.sinh, _j("sinh"), S), "cosh": (pnp.cosh, _j("cosh"), S),
    "tan": (pnp.tan, _j("tan"), X), "arctan": (pnp.arctan, _j("arctan"), S), "arcsin": (pnp.arcsin, _j("arcsin"), X),
    "arccos": (pnp.arccos, _j("arccos"), X), "arcsinh": (pnp.arcsinh, _j("arcsinh"), S),
    "arccosh": (pnp.arccosh, _j("arccosh"), X + 1.5), "arctanh": (pnp.arctanh, _j("arctanh"), X - 0.5),
    "sign": (pnp.sign, _j("sign"), S), "floor": (pnp.floor, _j("floor"), S * 3),
}
BINARY = {
    "add": (pnp.add, _j("add")), "subtract": (pnp.subtract, _j("subtract")), "multiply": (pnp.multiply, _j("multiply")),
    "divide": (pnp.divide, _j("divide")), "power": (pnp.power, _j("power")), "maximum": (pnp.maximum, _j("maximum")),
    "minimum": (pnp.minimum, _j("minimum")), "arctan2": (pnp.arctan2, _j("arctan2")), "hypot": (pnp.hypot, _j("hypot")),
    "logaddexp": (pnp.logaddexp, _j("logaddexp")), "mod": (pnp.mod, _j("mod")),
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
    if jax is not None:
        _per_op(names, got, jax_grad(lambda x: loss(jax.numpy, [UNARY[n][1] for n in names], x))(x))


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
        if jax is not None:
            want = jax_grad(lambda a, b: loss(jax.numpy, [BINARY[n][1] for n in names], a, b), argnum)(a, b)
            _per_op(names, got, want)


@needs_jax
def test_ties_and_kinks_match_jax():
    """Subgradients where JAX defines them: max/min split ties evenly, abs has slope 1 at 0, where passes to the
    branch taken; comparisons give zero."""
    x = np.array([[-1.0, 0.0, 2.0, 2.0], [3.0, -0.5, 0.0, 1.0]])
    y = np.array([[-1.0, 1.0, 2.0, 0.0], [3.0, 0.5, 0.0, 1.0]])

    def pf(x, y):
        return pnp.sum(pnp.maximum(x, y) * 2 + pnp.minimum(x, y) + pnp.abs(x) + pnp.where(x > y, x * y, y * 3)
                       + pnp.max(x) + pnp.min(x, axis=1).sum() + (x < y) + pnp.clip(x, -0.5, 2.0))

    def jf(x, y):
        jnp = jax.numpy
        return jnp.sum(jnp.maximum(x, y) * 2 + jnp.minimum(x, y) + jnp.abs(x) + jnp.where(x > y, x * y, y * 3)
                       + jnp.max(x) + jnp.min(x, axis=1).sum() + (x < y) + jnp.clip(x, -0.5, 2.0))
    like_jax(pj.grad(pf, (0, 1))(x, y), jf, x, y, argnums=(0, 1), rtol=1e-12, atol=0)


AXES = [(None, False), (0, False), (1, True), ((0, 1), True)]


@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "prod", "var", "std"])
def test_reductions(name):
    """Each reduction over every axis choice (with and without keepdims) in one function."""
    x = S.copy()
    op, jop = getattr(pnp, name), _j(name)
    weights = [_weights(np.sum(x, axis=axis, keepdims=keep).shape) for axis, keep in AXES]

    def loss(xp, op, x):
        return sum(xp.sum(op(x, axis=axis, keepdims=keep) * w) for (axis, keep), w in zip(AXES, weights))
    like_jax(check_grad(lambda x: loss(pnp, op, x), x), lambda x: loss(jax.numpy, jop, x), x)


def test_prod_with_zeros():
    """The product of the others, exactly, where the reduced slice holds one zero or several."""
    x = np.array([[0.0, 2.0, 3.0], [0.0, 0.0, 4.0], [1.0, 2.0, 5.0]])
    got = pj.grad(lambda x: pnp.sum(pnp.prod(x, axis=1) * np.array([1.0, 2.0, 3.0])))(x)
    np.testing.assert_allclose(np.asarray(got), [[6.0, 0, 0], [0, 0, 0], [30.0, 15.0, 6.0]])


CONTRACTIONS = {  # name -> (the op's NumPy / jax.numpy name, shapes)
    "matmul": ("matmul", (3, 4), (4, 5)), "matmul_batched": ("matmul", (2, 3, 4), (4, 2)),
    "matvec": ("matmul", (3, 4), (4,)), "vecmat": ("matmul", (4,), (4, 3)), "dot": ("dot", (3, 4), (4, 2)),
    "outer": ("outer", (3,), (4,)),
}
EINSUMS = [("ij,jk->ik", (3, 4), (4, 2)), ("bij,bjk->bik", (2, 3, 4), (2, 4, 2)), ("ij,ij->", (3, 4), (3, 4)),
           ("ii,i->i", (3, 3), (3,)), ("i,j->ij", (3,), (4,))]


@pytest.mark.parametrize("name", CONTRACTIONS)
def test_matmul(name):
    op_name, sa, sb = CONTRACTIONS[name]
    op, jop = getattr(pnp, op_name), _j(op_name)
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    w = _weights(getattr(np, op_name)(a, b).shape)
    for argnum in (0, 1):
        got = check_grad(lambda a, b: pnp.sum(op(a, b) * w), a, b, argnum=argnum)
        like_jax(got, lambda a, b: jax.numpy.sum(jop(a, b) * w), a, b, argnums=argnum)


@pytest.mark.parametrize("spec, sa, sb", EINSUMS)
def test_einsum_and_tensordot(spec, sa, sb):
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    w = _weights(np.einsum(spec, a, b).shape)
    for argnum in (0, 1):
        got = check_grad(lambda a, b: pnp.sum(pnp.einsum(spec, a, b) * w), a, b, argnum=argnum)
        like_jax(got, lambda a, b: jax.numpy.sum(jax.numpy.einsum(spec, a, b) * w), a, b, argnums=argnum)
    a3, b3 = rng.standard_normal((2, 3, 4)), rng.standard_normal((3, 4, 5))
    got = check_grad(lambda a: pnp.sum(pnp.tensordot(a, b3, axes=2) ** 2), a3)
    like_jax(got, lambda a: jax.numpy.sum(jax.numpy.tensordot(a, b3, axes=2) ** 2), a3)
