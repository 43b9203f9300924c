"""codegen/reuse.py: softmax's exp, computed once per element in its one-kernel form (stored, then read back by
the sum and the division), on static and symbolic rows; NumPy agrees."""
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen.optimize import optimize
from prepjit.uop import Ops


def softmax(x):
    e = pnp.exp(x - pnp.max(x, axis=-1, keepdims=True))
    return e / pnp.sum(e, axis=-1, keepdims=True)


def _reference(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _exps(ast) -> int:
    return sum(u.op in (Ops.EXP, Ops.EXP2) for u in optimize(ast, "llvm").toposort())


@pytest.mark.parametrize("symbolic", [False, True])
def test_softmax_computes_its_exp_once(rng, symbolic):
    kwargs = {"vars": {"n": (1, 300)}, "shapes": {"x": (None, "n")}} if symbolic else {}
    f = pj.prepare(softmax, device="cpu", **kwargs)
    for n in ((1, 7, 300) if symbolic else (257,)):
        x = (rng.standard_normal((33, n)) * 4).astype(np.float32)
        np.testing.assert_allclose(np.asarray(f(x)), _reference(x), rtol=1e-5, atol=1e-7)
    (kernel,) = f.plan(x).kernels
    assert _exps(kernel.kernel.scheduled) == 1 and len(optimize(kernel.kernel.scheduled, "llvm").src) == 2
    scheduled = kernel.kernel.scheduled
    assert sum(u.op is Ops.EXP or u.op is Ops.EXP2 for u in scheduled.toposort()) == 2  # before: in both places


def test_a_value_not_read_again_keeps_one_store(rng):
    f = pj.prepare(lambda x: x / pnp.sum(pnp.exp(x), axis=-1, keepdims=True), device="cpu")
    x = rng.standard_normal((16, 64)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(f(x)), x / np.exp(x).sum(-1, keepdims=True), rtol=1e-5)
    (kernel,) = f.plan(x).kernels
    assert len(optimize(kernel.kernel.scheduled, "llvm").src) == 1
