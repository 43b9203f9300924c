"""GPU row kernels that stop a row's reductions at its bound (row_bounds.py) leave the kernel's loop ranges as they
are: a masked softmax over a static row whose passes share the columns' range (row_plan.share_passes) stores
every column, the masked ones' zeros too, on CUDA through cuda_emulation as NumPy computes them."""
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen import gpu_launch, row_plan
from prepjit.codegen.optimize import optimize
from prepjit.codegen.schedule import schedule
from prepjit.codegen.targets import CUDA_TARGET
from prepjit.uop import Ops

from . import cuda_emulation

ROWS, WIDTH = 8, 256   # (CUDA: a work-group of 64 a row in runs of 4, the row's passes sharing the columns' range)


def masked_softmax(xp, x, length):
    """Softmax of each row of x over its first length[row] positions, 0 past them (each sum's identity: -inf for
    the max, 0 for the sum)."""
    mask = xp.arange(x.shape[-1])[None, :] < length[:, None]
    s = xp.where(mask, x, -np.inf)
    e = xp.where(mask, xp.exp(s - xp.max(s, axis=-1, keepdims=True)), 0)
    return e / xp.sum(e, axis=-1, keepdims=True)


def _args(seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((ROWS, WIDTH)).astype(np.float32), rng.integers(1, WIDTH, ROWS).astype(np.int32)


def _kernel(args):
    traced = pj.trace(pj.prepare(lambda x, length: masked_softmax(pnp, x, length)), *args)
    sched = schedule(list(traced.outputs), list(traced.inputs))
    (kern,) = sched.kernels
    return sched, kern, CUDA_TARGET.launched(optimize(kern.ast, "cuda"))


def test_a_rows_shared_column_range_keeps_its_end():
    """The row's max and sum are masked by one `position < length` over the columns' own range (shared passes):
    row_bounds leaves that range's static end, which the renderer's runs of 4 a work-item cover."""
    _, _, launched = _kernel(_args())
    launch = gpu_launch.launch_of(launched)
    assert launch[0] == "rows" and launch[2] == 1 and launch[1] * launch[3] == WIDTH, launch
    rows = row_plan.rows_of(launched, *launch[1:4])
    assert [c.src[0].op for c in rows.cols] == [Ops.CONST]


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
def test_the_emulated_masked_softmax_stores_every_column():
    args = _args()
    sched, kern, launched = _kernel(args)
    src = CUDA_TARGET.render(launched)
    bufs = dict(zip(sched.inputs, args))
    out = np.full((ROWS, WIDTH), np.nan, np.float32)
    cuda_emulation.run(src, [out] + [np.ascontiguousarray(bufs[i]).ravel() for i in kern.buffers[1:]])
    want = masked_softmax(np, args[0].astype(np.float64), args[1])
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("width", [256, 1024])
def test_masked_softmax_computes_numpys(device, width):
    """On every device, at a width whose passes share the columns' range (256 on CUDA) and one whose passes have
    ranges of their own, bounded at each row's length (1024), calls after a longer row's: NumPy's values."""
    f = pj.prepare(lambda x, length: masked_softmax(pnp, x, length), device=device)
    rng = np.random.default_rng(width)
    x = rng.standard_normal((ROWS, width)).astype(np.float32)
    for length in (np.full(ROWS, width, np.int32), rng.integers(1, width, ROWS).astype(np.int32)):
        got = np.asarray(f(x, length))
        np.testing.assert_allclose(got, masked_softmax(np, x.astype(np.float64), length), rtol=1e-5, atol=1e-7)
