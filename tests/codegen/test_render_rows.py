"""GPU row kernels (render_rows.py). Matvec-shaped ones: a one-row projection, with or without a fused RMSNorm
prologue, gets a warp per output and MATVEC_WARPS outputs a work-group on dialects with shuffles (lanes take 16-byte
runs, combined by shuffles; the norm's mean of squares computed once per work-group), and computes what NumPy does on
every device and, for CUDA, through cuda_emulation. Rows that combine through local memory are a work-group's each."""
import math
import re

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
from prepjit.uop import Ops

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


def _quantized_projection(kind: str, operand: str):
    """(fn, args): a normalised row (the head's shape scaled down: `norm`) or attention's heads read through a swap
    of their axes, plus a residual (the o projection's: `heads`), times a pj.quant weight of OUTPUTS rows."""
    rng = np.random.default_rng(5)
    x, g = rng.standard_normal((1, 576)).astype(np.float32), rng.standard_normal(576).astype(np.float32)
    blocks = pj.quant.quantize(rng.standard_normal((OUTPUTS, 576)).astype(np.float32), kind)
    if operand == "norm":
        return (lambda x, g, b: (x / pnp.sqrt(pnp.mean(x * x) + 1e-5) * g) @ pj.quant.dequantize(b, kind).T,
                (x, g, blocks))
    ctx = x.reshape(3, 3, 64, 1)
    return (lambda h, ctx, b: h[:OUTPUTS] + pnp.swapaxes(ctx, 0, 1).reshape(576) @ pj.quant.dequantize(b, kind).T,
            (g, ctx, blocks))


def _numpy_projection(kind: str, operand: str, args):
    a, b = (np.asarray(v, np.float64) for v in args[:2])
    w = pj.quant.dequantize(args[2], kind).astype(np.float64)
    if operand == "norm":
        return ((a / np.sqrt((a * a).mean() + 1e-5) * b) @ w.T).ravel()
    return a[:OUTPUTS] + np.swapaxes(b, 0, 1).reshape(576) @ w.T


@pytest.mark.parametrize("operand", ["norm", "heads"])
@pytest.mark.parametrize("kind", ["q8_0", "q4_1"])
def test_quantized_matvecs_compute_numpys_projection(device, kind, operand):
    """A one-row projection over a quantized weight, of a normalised row or of heads read through a swap of their
    axes, equals NumPy's on every device."""
    fn, args = _quantized_projection(kind, operand)
    want = _numpy_projection(kind, operand, args)
    got = np.asarray(pj.prepare(fn, device=device)(*args)).astype(np.float64).ravel()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
@pytest.mark.parametrize("operand", ["norm", "heads"])
@pytest.mark.parametrize("kind, inner", [("q8_0", (32,)), ("q4_1", (2, 16))])
def test_quantized_matvecs_split_their_range_at_the_blocks(kind, inner, operand):
    """The same projections are a warp per output on CUDA, the row reduction over ranges split at the weight's blocks
    (row_plan.split_matvec_blocks: a lane's run of 16 stays in one block, its loads a constant offset apart, the
    block's scale at one address for the run, no division or modulo left in any index). Before, the heads'
    projection (no load along the unsplit range) was a work-group of 160 per output and the norm's read each
    element's scale at (k // 32) * B. The emulated kernel equals NumPy's projection."""
    fn, args = _quantized_projection(kind, operand)
    traced = pj.trace(fn, *args)
    sched = schedule(list(traced.outputs), list(traced.inputs))
    (kern,) = sched.kernels
    launched = CUDA_TARGET.launched(optimize(kern.ast, "cuda"))
    assert gpu_launch.launch_of(launched) == ("rows", row_plan.WARP, row_plan.MATVEC_WARPS, 16)
    (matvec,) = [u for u in launched.toposort() if u.op is Ops.REDUCE and len(u.src) > 2]
    ends = tuple(r.src[0].arg for r in matvec.src[1:])   # (the heads' split at 192 and 64 too: 3, 3, 2, ...)
    assert ends[-len(inner):] == inner and math.prod(ends) == 576
    assert not [u for u in launched.toposort() if u.op in (Ops.IDIV, Ops.MOD)]
    bufs = {i: np.ascontiguousarray(a).ravel() for i, a in zip(sched.inputs, args)}
    out = np.zeros(OUTPUTS, np.float32)
    cuda_emulation.run(render_cuda(launched), [out] + [bufs[i] for i in kern.buffers[1:]])
    want = _numpy_projection(kind, operand, args)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def _places(source: str, flat: str, per: int, lanes: int, start: int = 0) -> list[list[int]]:
    """For each local-array access `opN[...]` of the flat index `flat` in `source`, the element each of `lanes`
    work-items (their run at flat = start + lane * per) reaches."""
    found = re.findall(rf"op\d+\[({flat} [^\]]*)\]", source)
    return [[eval(expr.replace("/", "//"), {flat: start + lane * per}) for lane in range(lanes)] for expr in found]


@pytest.mark.parametrize("dtype, kind, per", [("bfloat16", None, 8), ("float32", "q4_1", 16), ("float32", "q8_0", 16)])
def test_a_warps_reads_of_the_shared_operand_are_side_by_side(dtype, kind, per):
    """The normalised row a matvec's warps read from local memory (computed once per work-group) lies so that each
    load of a warp (its lanes each at element e of their run) reads 32 neighbouring words: no two lanes in one bank
    (as the row lies, runs of 16 floats a lane put 16 lanes in a bank at each load, of 8 put 8: fails before); the
    work-group's stores fill the array, each element once."""
    if kind is None:
        _, kern = _one_kernel(True, _args(576, DTYPES[dtype]))
        ast = kern.ast
    else:
        fn, args = _quantized_projection(kind, "norm")
        traced = pj.trace(fn, *args)
        (kern,) = schedule(list(traced.outputs), list(traced.inputs)).kernels
        ast = kern.ast
    launched = CUDA_TARGET.launched(optimize(ast, "cuda"))
    assert gpu_launch.launch_of(launched)[3] == per
    source = CUDA_TARGET.render(launched).source
    head, reads = source.split("return;")
    (read_flat,) = set(re.findall(r"op\d+\[(f\d+) ", reads))
    loads = _places(reads, read_flat, per, row_plan.WARP)
    assert len(loads) >= per and all(p == list(range(p[0], p[0] + row_plan.WARP)) for p in loads)
    (store_flat,) = set(re.findall(r"op\d+\[(g\d+) ", head))
    size = int(re.search(r"float op\d+\[(\d+)\]", source).group(1))
    group = row_plan.WARP * row_plan.MATVEC_WARPS   # (one pass of the work-group's runs covers the row of 576)
    stored = [p for place in _places(head, store_flat, per, group) for lane, p in enumerate(place) if lane * per < 576]
    assert len(stored) == len(set(stored)) == 576 and max(stored) < size
