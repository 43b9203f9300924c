"""Shared by the gradient tests: pj.grad against central finite differences in float64. One prepared function
(value_and_grad) gives both the gradient and the values the differences are taken of, so each check compiles
once."""
import numpy as np

import prepjit as pj


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
