"""Shared by the gradient tests: pj.grad against central finite differences in float64, and JAX (float64) as a
second reference when it is installed. One prepared function (value_and_grad) gives both the gradient and the
values the differences are taken of, so each check compiles once."""
import numpy as np
import pytest

import prepjit as pj

try:
    import jax
except ImportError:  # the finite-difference checks still run
    jax = None

needs_jax = pytest.mark.skipif(jax is None, reason="compares with JAX, which is not installed")


@pytest.fixture
def jax_x64():
    """JAX in 64-bit mode for one test (the references are float64), its previous mode back afterwards. The
    gradient test modules use it for every test (`pytestmark`)."""
    if jax is None:
        yield
        return
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", previous)


def check_grad(f, *args, argnum=0, rtol=1e-5, atol=1e-7, eps=1e-6):
    """pj.grad(f) (eager, float64) at `args` against central differences of f; returns the gradient."""
    vg = pj.value_and_grad(f, argnum)
    args = [np.array(a, dtype=np.float64) if i == argnum else a for i, a in enumerate(args)]
    got = np.asarray(vg(*args)[1])
    x = args[argnum]
    want = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + eps
        hi = float(np.asarray(vg(*args)[0]))
        x[i] = old - eps
        lo = float(np.asarray(vg(*args)[0]))
        x[i] = old
        want[i] = (hi - lo) / (2 * eps)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    return got


def jax_grad(f, argnums=0):
    """jax.grad(f, argnums), jitted (JAX's op-by-op dispatch is the slow part of these tests)."""
    return jax.jit(jax.grad(f, argnums))


def like_jax(got, jax_fn, *args, argnums=0, rtol=1e-9, atol=1e-12):
    """Compare `got` (an array, or a tuple for a tuple `argnums`) with jax.grad(jax_fn)(*args) if JAX is here."""
    if jax is None:
        return
    want = jax_grad(jax_fn, argnums)(*args)
    for g, w in (zip(got, want) if isinstance(argnums, tuple) else [(got, want)]):
        np.testing.assert_allclose(np.asarray(g), w, rtol=rtol, atol=atol)
