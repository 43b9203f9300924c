"""Register blocking of contractions (codegen/optimize.py): blocked kernels equal NumPy for every shape kind."""
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen.optimize import optimize
from prepjit.uop import Ops


@pytest.mark.parametrize("m,k,n", [(64, 32, 48), (128, 17, 96), (5, 7, 64), (16, 3, 32), (8, 8, 8), (3, 5, 7)])
def test_matmul_shapes_match_numpy(rng, m, k, n):
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    f = pj.prepare(lambda a, b: a @ b, device="cpu")
    np.testing.assert_allclose(np.asarray(f(a, b)), a @ b, rtol=1e-4, atol=1e-4)


def test_blocked_kernel_stores_a_block_per_iteration(rng):
    a, b = rng.standard_normal((64, 16)).astype(np.float32), rng.standard_normal((16, 64)).astype(np.float32)
    plan = pj.prepare(lambda a, b: a @ b, device="cpu").plan(a, b)
    (kernel,) = plan.kernels
    blocked = optimize(kernel.ast, "llvm")
    assert len(blocked.src) == 8 * 32 and all(s.op is Ops.STORE for s in blocked.src)
    assert optimize(kernel.ast, "opencl") is kernel.ast


def test_batched_float64_and_fused_operands(rng):
    x = rng.standard_normal((4, 16, 8))
    w = rng.standard_normal((8, 32))
    f = pj.prepare(lambda x, w: pnp.maximum(x @ w + 1, 0) @ w.T, device="cpu")
    ref = np.maximum(x @ w + 1, 0) @ w.T
    np.testing.assert_allclose(np.asarray(f(x, w)), ref, rtol=1e-10, atol=1e-10)


def test_symbolic_batch_matmul(rng):
    w = rng.standard_normal((24, 64)).astype(np.float32)
    f = pj.prepare(lambda x, w: x @ w, vars={"n": (1, 100)}, shapes={"x": ("n", 24)}, device="cpu")
    for n in (1, 37, 100):
        x = rng.standard_normal((n, 24)).astype(np.float32)
        np.testing.assert_allclose(np.asarray(f(x, w)), x @ w, rtol=1e-4, atol=1e-4)


def test_row_sums_and_integer_contractions_untouched_but_correct(rng):
    x = rng.integers(-5, 5, (16, 32)).astype(np.int32)
    y = rng.integers(-5, 5, (32, 16)).astype(np.int32)
    f = pj.prepare(lambda x, y: x @ y, device="cpu")
    np.testing.assert_array_equal(np.asarray(f(x, y)), x @ y)
    g = pj.prepare(lambda x: x.sum(axis=1), device="cpu")
    xf = x.astype(np.float32)
    np.testing.assert_allclose(np.asarray(g(xf)), xf.sum(axis=1))
