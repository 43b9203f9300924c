"""GPU row kernels (render_rows.py). Matvec-shaped ones: a one-row projection, with or without a fused RMSNorm
prologue, gets a warp per output and MATVEC_WARPS outputs a work-group on dialects with shuffles (lanes take 16-byte
runs, combined by shuffles; the norm's mean of squares computed once per work-group), and computes what NumPy does on
every device and, for CUDA, through cuda_emulation. Rows that combine through local memory are a work-group's each."""
import ml_dtypes
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen import gpu_launch, row_plan
from prepjit.codegen.optimize import optimize
from prepjit.codegen.render_cuda import CUDA, render_cuda
from prepjit.codegen.render_opencl import render_opencl
from prepjit.codegen.schedule import schedule
from prepjit.codegen.targets import CUDA_TARGET

from . import cuda_emulation

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
OUTPUTS = 301   # at least MATVEC_MIN_OUTPUTS, not a multiple of MATVEC_WARPS (the last group's warps past it leave)
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
    """On CUDA each output of a one-row projection is a warp's, MATVEC_WARPS a work-group, its lanes taking 16
    bytes of weights at a time; the only barriers are the norm's (once per work-group its mean of squares, then its
    normalised row into local memory; none without it). Before: a work-group of 160 work-items per output in runs of
    4, a barrier for each of its reductions, the row normalised again by each output."""
    _, k = _one_kernel(norm, _args(576, DTYPES[dtype]))
    launched = CUDA_TARGET.launched(optimize(k.ast, "cuda"))
    assert gpu_launch.launch_of(launched) == ("rows", row_plan.WARP, row_plan.MATVEC_WARPS, run)
    src = CUDA_TARGET.render(launched)
    assert src.local_size == (row_plan.WARP * row_plan.MATVEC_WARPS,)
    assert src.source.count("__syncthreads()") == 2 * norm   # the norm's mean of squares, its normalised row
    assert "sqrt" not in src.source.split("return;")[1]   # each output reads the normalised row, computed once
    monkeypatch.setattr(row_plan, "WARP_PER_OUTPUT", False)   # the knob: the work-group per output of before
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
    assert gpu_launch.launch_of(launched)[1:3] == (row_plan.WARP, row_plan.MATVEC_WARPS)
    src = render_cuda(launched)
    bufs = {i: a.ravel() for i, a in zip(sched.inputs, args)}
    out = np.zeros(sched.buffers[kern.buffers[0]].max_size, DTYPES[dtype])
    cuda_emulation.run(src, [out] + [bufs[i] for i in kern.buffers[1:]])
    want = _reference(args, norm)
    got = out.astype(np.float64).reshape(want.shape)
    np.testing.assert_allclose(got, want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype] * np.abs(want).max())


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
@pytest.mark.parametrize("dtype", [np.int16, np.int8, np.float32])
def test_rows_of_a_warp_combined_in_local_memory_get_a_work_group_each(dtype):
    """Rows of one warp each whose partials combine through a local-memory tree (integers narrower than 4 bytes have
    no shuffles) get a work-group each: packed 4 a group, the warps' trees shared one local array (and the warps past
    the last row left before its barriers), and an int16 row max of 8 rows of 100 came out wrong (fails before);
    rows that shuffle stay packed."""
    x = np.random.default_rng(1).integers(-100, 100, (8, 100)).astype(dtype)
    traced = pj.trace(lambda x: x.max(axis=1), x)
    sched = schedule(list(traced.outputs), list(traced.inputs))
    (kern,) = sched.kernels
    launched = CUDA_TARGET.launched(optimize(kern.ast, "cuda"))
    assert gpu_launch.launch_of(launched)[1:3] == (row_plan.WARP, 4 if dtype == np.float32 else 1)
    out = np.zeros(8, dtype)
    cuda_emulation.run(render_cuda(launched), [out, x.ravel()])
    np.testing.assert_array_equal(out, x.max(axis=1))


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
@pytest.mark.parametrize("kind", ["q8_0", "q4_0", "q4_1"])
def test_quantized_matvecs_get_a_warp_per_output(kind):
    """A normalised row times a dequantized weight (pj.quant, 1-byte quants: lanes take runs of 16) is a warp per
    output on CUDA, and its emulated kernel equals the cpu's."""
    rng = np.random.default_rng(4)
    x, g = rng.standard_normal((1, 576)).astype(np.float32), rng.standard_normal(576).astype(np.float32)
    blocks = pj.quant.quantize(rng.standard_normal((OUTPUTS, 576)).astype(np.float32), kind)

    def fn(x, g, b):
        return (x / pnp.sqrt(pnp.mean(x * x) + 1e-5) * g) @ pj.quant.dequantize(b, kind).T
    traced = pj.trace(fn, x, g, blocks)
    sched = schedule(list(traced.outputs), list(traced.inputs))
    (kern,) = sched.kernels
    launched = CUDA_TARGET.launched(optimize(kern.ast, "cuda"))
    assert gpu_launch.launch_of(launched) == ("rows", row_plan.WARP, row_plan.MATVEC_WARPS, 16)
    bufs = {i: np.ascontiguousarray(a).ravel() for i, a in zip(sched.inputs, (x, g, blocks))}
    out = np.zeros(OUTPUTS, np.float32)
    cuda_emulation.run(render_cuda(launched), [out] + [bufs[i] for i in kern.buffers[1:]])
    want = np.asarray(pj.prepare(fn, device="cpu")(x, g, blocks)).ravel()
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
