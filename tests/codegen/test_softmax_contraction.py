"""Decode attention on the work-group targets is one kernel (softmax_contraction.py; render_rows' column reductions):
a softmax that only a contraction over its axis reads is computed inside the contraction's row kernel, a work-group
per query head holding the row's scores and probabilities in local memory, p @ V split over the group's work-items
by runs of value columns and slices of the positions. Every device equals NumPy; the cpu keeps its three kernels."""
import math
import re

import ml_dtypes
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from examples.models import llama
from prepjit.codegen import row_plan
from prepjit.codegen.gpu_launch import launch_of
from prepjit.codegen.optimize import optimize
from prepjit.codegen.schedule import schedule
from prepjit.codegen.targets import CUDA_TARGET, OPENCL_TARGET

from . import cuda_emulation

KV, GROUP, D, CONTEXT = 3, 3, 64, 256   # SmolLM2's grouped-query heads
TOLERANCE = {np.float32: 1e-5, ml_dtypes.bfloat16: 3e-2}


def attend(xp, q, k_cache, v_cache, pos):
    """One query row a head, q (KV, GROUP, D) computed from the argument (as RoPE computes it from the projection),
    against the caches' positions <= pos (llama.decode's attention)."""
    k_all, v_all = k_cache[:, :pos + 1], v_cache[:, :pos + 1]
    scores = (q * 1.5 - 0.5) @ xp.swapaxes(k_all, 1, 2) * (1 / math.sqrt(D))
    return llama.softmax(xp, scores) @ v_all


def _args(dtype, context=CONTEXT, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((KV, GROUP, D)) * 2
    k, v = (rng.standard_normal((KV, context, D)) for _ in range(2))
    return [a.astype(np.float32).astype(dtype) for a in (q, k, v)]


def _reference(args, pos):
    return attend(np, *(a.astype(np.float32) for a in args), pos)


def _check(got, want, dtype):
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(np.asarray(got).astype(np.float32), want, rtol=tol, atol=tol * np.abs(want).max())


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_decode_attention_is_one_kernel_on_gpus(device, dtype):
    """Scores, softmax and p @ V: one kernel on a GPU (was three), three on the cpu; NumPy's values at a var position
    (the first, one inside a run of the group, the last)."""
    args = _args(dtype)
    f = pj.prepare(lambda q, k, v, pos: attend(pnp, q, k, v, pos), vars={"pos": (0, CONTEXT - 1)}, device=device)
    for pos in (0, 37, CONTEXT - 1):
        _check(f(*args, pos), _reference(args, pos), dtype)
    kernels = [row["kernel"] for row in pj.profile(f, *args, 100).rows]
    assert len(kernels) == (3 if device == "cpu" else 1), kernels


def _kernel(dtype, pos=None, context=CONTEXT):
    """The scheduled kernel(s) of the GPU schedule: with a var position, or a static one (`pos`)."""
    args = _args(dtype, context)
    if pos is None:
        traced = pj.trace(pj.prepare(lambda q, k, v, pos: attend(pnp, q, k, v, pos), vars={"pos": (0, context - 1)}),
                          *args, 1)
    else:
        traced = pj.trace(lambda q, k, v: attend(pnp, q, k, v, pos), *args)
    sched = schedule(list(traced.outputs), list(traced.inputs))
    return args, sched


@pytest.mark.parametrize("target", [CUDA_TARGET, OPENCL_TARGET], ids=["cuda", "opencl"])
def test_the_fused_kernel_is_a_work_group_per_head(target):
    """The one kernel is a row kernel whose rows are the KV x GROUP query heads (a work-group each, covering the
    positions), its columns the head's D values; the scores' dot product over D is rendered once (into local memory),
    not again for the row's max, its sum and each value column; local arrays: scores, probabilities, p @ V's
    partials (and the max's and sum's of each warp), and the head's computed query row, which each position's dot
    product reads there."""
    _, sched = _kernel(np.float32)
    assert len(sched.kernels) == 1, [k.ast.arg for k in sched.kernels]
    launched = target.launched(optimize(sched.kernels[0].ast, target.language))
    run = 4 if target is CUDA_TARGET else 1   # (the dialect's items a work-item)
    assert launch_of(launched) == ("rows", 256, 1, run)
    rows = row_plan.rows_of(launched, 256, 1, run)
    assert [r.src[0].arg for r in rows.rows] == [KV, GROUP] and [c.src[0].arg for c in rows.cols] == [D]
    assert len(rows.columns) == 1 and rows.column_runs == D // run and rows.slices == 256 // (D // run)
    src = target.render(launched)
    assert src.global_size[0].arg == KV * GROUP * 256
    assert len(re.findall(rf"for \(.*< {D}L", src.source)) == 1, src.source   # the scores' loop over D
    assert len(re.findall(rf"row\d+\[{CONTEXT}\]", src.source)) == 2, src.source   # scores, probabilities
    assert len(re.findall(rf"row\d+\[{D}\]", src.source)) == 1, src.source   # the computed query row, once
    assert len(re.findall(rf"cp\d+\[{rows.slices * D}\]", src.source)) == 1, src.source   # p @ V's partials


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
@pytest.mark.parametrize("pos", [0, 39, 36])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_the_emulated_cuda_kernel_equals_numpy(dtype, pos):
    """The fused CUDA kernel, run through cuda_emulation (a static position: the emulation takes no vars; rows of 1, 40
    and 37 positions, runs of 4 and single ones), equals NumPy."""
    args, sched = _kernel(dtype, pos, context=48)
    (kernel,) = sched.kernels
    src = CUDA_TARGET.render(CUDA_TARGET.launched(optimize(kernel.ast, "cuda")))
    bufs = {i: a.ravel() for i, a in zip(sched.inputs, args)}
    out = np.zeros(sched.buffers[kernel.buffers[0]].max_size, dtype)
    cuda_emulation.run(src, [out] + [bufs[i] for i in kernel.buffers[1:]])
    want = _reference(args, pos)
    _check(out.reshape(want.shape), want, dtype)


def test_an_encoders_attention_keeps_its_tiled_contractions():
    """Many queries a head (an encoder's or a prefill's: each value row read by 64 softmax rows) stay three kernels,
    p @ V a tiled contraction: a work-group a row would read the values once for each query."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 64, D)).astype(np.float32) for _ in range(3))
    traced = pj.trace(lambda q, k, v: llama.softmax(pnp, q @ pnp.swapaxes(k, 1, 2)) @ v, q, k, v)
    sched = schedule(list(traced.outputs), list(traced.inputs))
    assert len(sched.kernels) == 3
    assert launch_of(CUDA_TARGET.launched(optimize(sched.kernels[2].ast, "cuda")))[0] == "tile"


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_the_fused_kernel_compiles_with_nvrtc(dtype):
    """The fused kernel (var position, SmolLM2's heads) compiles with NVRTC for sm_90 and sm_80 (no GPU needed)."""
    from prepjit.runtime.nvrtc import NVRTC
    try:
        nvrtc = NVRTC()
        nvrtc.compile("probe", 'extern "C" __global__ void probe(int *a) { a[0] = 1; }', ["-arch=sm_90"])
    except (pj.DeviceError, pj.CompileError) as e:
        pytest.skip(f"no working NVRTC here ({str(e).splitlines()[0]})")
    _, sched = _kernel(dtype)
    (kernel,) = sched.kernels
    src = CUDA_TARGET.render(CUDA_TARGET.launched(optimize(kernel.ast, "cuda")))
    for arch in ("sm_90", "sm_80"):
        nvrtc.compile(src.name, src.source, [f"-arch={arch}", "-std=c++17", "--fmad=false"])


def test_a_softmax_read_by_a_wide_contraction_keeps_its_kernels():
    """A softmax row read by a contraction of more than MAX_COLUMNS outputs a row (pooling a weight matrix's 512
    columns) keeps its kernels, the softmax row's and the contraction's (one, without MAX_COLUMNS): a row's work-group
    would take more columns than work-items."""
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((2, 40)).astype(np.float32), rng.standard_normal((40, 512)).astype(np.float32)
    traced = pj.trace(lambda x, w: llama.softmax(pnp, x) @ w, x, w)
    assert len(schedule(list(traced.outputs), list(traced.inputs)).kernels) == 2
