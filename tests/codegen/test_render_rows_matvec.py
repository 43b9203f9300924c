"""Matvec-shaped row kernels (render_rows.py): a one-row projection, with or without a fused RMSNorm prologue, gets a
warp per output and MATVEC_WARPS outputs a work-group on dialects with shuffles (lanes take 16-byte runs, combined by
shuffles; the norm's mean of squares computed once per work-group), and computes what NumPy does on every device
and, for CUDA, through cuda_emulation."""
import ml_dtypes
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen import gpu_launch, render_rows
from prepjit.codegen.optimize import optimize
from prepjit.codegen.render_cuda import CUDA, render_cuda
from prepjit.codegen.render_opencl import render_opencl
from prepjit.codegen.schedule import schedule
from prepjit.codegen.targets import CUDA_TARGET

from . import cuda_emulation

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
OUTPUTS = 300   # at least MATVEC_MIN_OUTPUTS, not a multiple of MATVEC_WARPS (the last group's warps past it leave)
TOLERANCE = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 2e-3}


def projection(xp, x, g, w, norm):
    """x (1, k) @ w.T (w: (n, k), a linear layer's layout), x first RMS-normalised and scaled by g with `norm`."""
    if norm:
        x = x / xp.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-5) * g
    return x @ w.T


def _args(k: int, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x, g = rng.standard_normal((1, k)), rng.standard_normal(k) * 0.5 + 1
    w = rng.standard_normal((OUTPUTS, k)) / np.sqrt(k)
    return [a.astype(np.float32).astype(dtype) for a in (x, g, w)]


def _reference(args, norm):
    return projection(np, *(a.astype(np.float64) for a in args), norm)


def _one_kernel(norm, args):
    traced = pj.trace(lambda x, g, w: projection(pnp, x, g, w, norm), *args)
    sched = schedule(list(traced.outputs), list(traced.inputs))
    assert len(sched.kernels) == 1, [k.ast.arg for k in sched.kernels]
    return sched, sched.kernels[0]


@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("dtype, run", [("bfloat16", 8), ("float16", 8), ("float32", 4)])
def test_a_one_row_projection_gets_a_warp_per_output(monkeypatch, dtype, run, norm):
    """On CUDA each output of a one-row projection is a warp's, 8 a work-group, its lanes taking 16 bytes of weights
    at a time; the only barrier is the norm's (once per work-group; none without it). Before: a work-group of 160
    work-items per output in runs of 4, a barrier for each of its reductions."""
    sched, k = _one_kernel(norm, _args(576, DTYPES[dtype]))
    launched = CUDA_TARGET.launched(optimize(k.ast, "cuda"))
    assert gpu_launch.launch_of(launched) == ("rows", render_rows.WARP, render_rows.MATVEC_WARPS, run)
    src = CUDA_TARGET.render(launched)
    assert src.local_size == (render_rows.WARP * render_rows.MATVEC_WARPS,)
    assert src.source.count("__syncthreads()") == int(norm)
    monkeypatch.setattr(render_rows, "WARP_PER_OUTPUT", False)   # the knob: the work-group per output of before
    assert gpu_launch.launch_of(gpu_launch.launch(optimize(k.ast, "cuda"), CUDA)) == ("rows", 160, 1, 4)


@pytest.mark.parametrize("k", [576, 579, 20])
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_matvecs_compute_numpys_projection(device, dtype, norm, k):
    """A one-row projection (k = 576, an odd 579, 20: below a warp's width) with and without a fused norm equals
    NumPy's on every device."""
    args = _args(k, DTYPES[dtype], seed=k)
    f = pj.prepare(lambda x, g, w: projection(pnp, x, g, w, norm), device=device)
    got = np.asarray(f(*args)).astype(np.float64)
    want = _reference(args, norm)
    np.testing.assert_allclose(got, want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype] * np.abs(want).max())


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
@pytest.mark.parametrize("k", [576, 579, 20])
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_warp_per_output_matvecs_compute_numpys_projection(dtype, norm, k):
    """The CUDA warp-per-output kernel (k = 576 in 16-byte runs, an odd 579 in single elements, 20 below a warp's
    width in runs of 4), run through cuda_emulation, equals NumPy's projection; OpenCL renders it too."""
    args = _args(k, DTYPES[dtype], seed=k)
    sched, kern = _one_kernel(norm, args)
    render_opencl(optimize(kern.ast, "opencl"))
    launched = CUDA_TARGET.launched(optimize(kern.ast, "cuda"))
    assert gpu_launch.launch_of(launched)[1:3] == (render_rows.WARP, render_rows.MATVEC_WARPS)
    src = render_cuda(launched)
    bufs = {i: a.ravel() for i, a in zip(sched.inputs, args)}
    out = np.zeros(sched.buffers[kern.buffers[0]].max_size, DTYPES[dtype])
    cuda_emulation.run(src, [out] + [bufs[i] for i in kern.buffers[1:]])
    want = _reference(args, norm)
    got = out.astype(np.float64).reshape(want.shape)
    np.testing.assert_allclose(got, want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype] * np.abs(want).max())
