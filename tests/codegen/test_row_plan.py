"""Row kernels' shape (row_plan.py): short norm rows over many rows (MiniLM's LayerNorm of 384 over its 4096 tokens;
an RMSNorm of 576 over a var batch where WARP_ROWS_MIN is lowered) get a warp a row on CUDA, WARP_ROWS of them a
work-group, each lane taking several runs of 4 (shuffles only, no barrier), and equal NumPy through cuda_emulation;
few rows keep a work-group of several warps a row."""
import ml_dtypes
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen import gpu_launch, row_plan
from prepjit.codegen.optimize import optimize
from prepjit.codegen.render_cuda import CUDA
from prepjit.codegen.schedule import schedule
from prepjit.codegen.targets import CUDA_TARGET

from . import cuda_emulation

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}
TOLERANCE = {"float32": 1e-5, "bfloat16": 2e-2}
WARP_ROW = ("rows", row_plan.WARP, gpu_launch.WARP_ROWS, 4)   # a warp a row, runs of 4
MOST = 64   # a decode batch's most sequences


def layernorm(xp, x, g, b):
    c = x - xp.mean(x, axis=-1, keepdims=True)
    return c / xp.sqrt(xp.mean(c * c, axis=-1, keepdims=True) + 1e-12) * g + b


def rmsnorm(xp, x, g):
    return x / xp.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-5) * g


NORMS = {"layernorm": (layernorm, 384), "rmsnorm": (rmsnorm, 576)}


def _args(norm: str, rows: int, dtype, seed=0):
    fn, k = NORMS[norm]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, k)) * 3 + 1
    params = [rng.standard_normal(k) * 0.5 + 1 for _ in range(2 if fn is layernorm else 1)]
    return [a.astype(np.float32).astype(dtype) for a in (x, *params)]


def _kernel(fn, args, **prepare):
    norm = (lambda x, g, b: fn(pnp, x, g, b)) if fn is layernorm else lambda x, g: fn(pnp, x, g)
    traced = pj.trace(pj.prepare(norm, **prepare) if prepare else norm, *args)
    sched = schedule(list(traced.outputs), list(traced.inputs))
    (kern,) = sched.kernels
    return sched, kern, CUDA_TARGET.launched(optimize(kern.ast, "cuda"))


def _emulated(sched, kern, launched, args, var_values=None):
    bufs = dict(zip(sched.inputs, args))
    out = np.zeros(args[0].shape, args[0].dtype)
    cuda_emulation.run(CUDA_TARGET.render(launched), [out] + [np.ascontiguousarray(bufs[i]).ravel()
                                                             for i in kern.buffers[1:]], var_values=var_values)
    return out.astype(np.float64)


def _check(got, fn, args, dtype):
    want = fn(np, *(a.astype(np.float64) for a in args))
    np.testing.assert_allclose(got, want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype] * np.abs(want).max())


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("norm, rows", [("layernorm", 256), ("rmsnorm", 201)])
def test_short_norm_rows_get_a_warp_each(norm, rows, dtype, few_warp_rows):
    """A LayerNorm of 384 (3 runs of 4 a lane) over 256 rows and an RMSNorm of 576 (4.5 runs a lane: the last pass
    half the lanes') over 201 rows (the last work-group's 4th warp past the rows leaves) are a warp a row, 4 rows a
    work-group, with no barrier, and equal NumPy. The LayerNorm's passes share the columns' range (share_passes):
    each lane loads its 12 elements of the row once, for the mean, the variance and the output. The row's square root
    is computed once (render_row_values.row_values; before: at each element), and the LayerNorm's output pass loads
    g and b at every element before its math (the bfloat16 roundings' branches split no vector load), and stores its
    elements after converting every one (render_row_values.STORES_TOGETHER: a run's stores neighbours in one basic
    block). Before: 3 and 5 warps a row, a barrier per reduction (the rule off, WARP_ROWS_MIN past the rows)."""
    fn, k = NORMS[norm]
    args = _args(norm, rows, DTYPES[dtype], seed=rows)
    sched, kern, launched = _kernel(fn, args)
    assert gpu_launch.launch_of(launched) == WARP_ROW
    src = CUDA_TARGET.render(launched)
    assert src.local_size == (row_plan.WARP * gpu_launch.WARP_ROWS,) and "__syncthreads" not in src.source
    if norm == "layernorm":
        assert src.source.count("buf1[") == k // row_plan.WARP   # each element loaded once, kept in registers
        assert src.source.rindex("buf3[") < src.source.index("buf0[")   # g and b loaded for every element first
    assert src.source.count("sqrtf(") == 1   # the row's 1 / sqrt(mean + eps) once (render_row_values.row_values)
    if dtype == "bfloat16":   # every element converted before the first store (the stores side by side: vector stores)
        assert src.source.rindex("pj_float_to_bfloat16(") < src.source.index("buf0[")
    _check(_emulated(sched, kern, launched, args), fn, args, dtype)


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("k", [30, 40, 100, 576, 1000, 1024])
def test_a_warps_row_loads_each_element_once(k, dtype, few_warp_rows):
    """An RMSNorm over 70 rows of k: a warp a row whose lanes take ceil(k / 128) runs of 4, the last run past the
    row for some lanes where 128 does not divide k (40: 10 lanes of 32 take one; 576: 16 take a 5th; 1000: 26 an
    8th; 30, not in runs: 30 lanes one element), their run then the row's last one, read but not added nor stored.
    Each element is loaded once for the sum and the output (share_passes, Rows.passes; before, rows that a warp's
    runs did not divide exactly loaded them again in the output pass), and the values are NumPy's."""
    rng = np.random.default_rng(k)
    args = [(rng.standard_normal(s) * 2 + 1).astype(np.float32).astype(DTYPES[dtype]) for s in ((70, k), k)]
    sched, kern, launched = _kernel(rmsnorm, args)
    assert gpu_launch.launch_of(launched) == WARP_ROW
    src = CUDA_TARGET.render(launched).source
    per = 4 if k % 4 == 0 else 1
    assert src.count("buf1[") == -(-k // (per * row_plan.WARP)) * per and "__syncthreads" not in src
    _check(_emulated(sched, kern, launched, args), rmsnorm, args, dtype)


@pytest.mark.parametrize("norm", list(NORMS))
def test_the_rule_off_or_few_rows_keep_several_warps_a_row(monkeypatch, norm):
    """With fewer than WARP_ROWS_MIN rows (a decode batch of at most 64: 16 work-groups of a warp a row lost to 64 of
    5 warps on an H200) a row keeps a work-group of warps covering its runs of 4 (3 for 384, 5 for 576), as it does
    with the rule off; from WARP_ROWS_MIN rows (MiniLM's 4096 tokens) a row is a warp's."""
    fn, k = NORMS[norm]
    before = ("rows", row_plan.WARP * -(-k // (4 * row_plan.WARP)), 1, 4)   # (whole warps: 96, 160)
    assert gpu_launch.launch_of(_kernel(fn, _args(norm, 64, np.float32))[2]) == before
    batch = _kernel(fn, _args(norm, 3, np.float32), vars={"B": (1, 64)}, shapes={"x": ("B", k)})[2]
    assert gpu_launch.launch_of(batch) == before
    many = _args(norm, row_plan.WARP_ROWS_MIN, np.float32)
    assert gpu_launch.launch_of(_kernel(fn, many)[2]) == WARP_ROW
    monkeypatch.setattr(row_plan, "WARP_ROWS_MIN", 1 << 30)   # (launched afresh: CUDA_TARGET's launches are cached)
    assert gpu_launch.launch_of(gpu_launch.launch(optimize(_kernel(fn, many)[1].ast, "cuda"), CUDA)) == before


def test_long_rows_keep_a_work_group():
    """A row of more than WARP_ROW_RUNS runs a lane (2048 in runs of 4: 16) keeps a work-group of REDUCE_GROUP."""
    x = np.ones((256, 2048), np.float32)
    launched = _kernel(rmsnorm, [x, np.ones(2048, np.float32)])[2]
    assert gpu_launch.launch_of(launched) == ("rows", row_plan.REDUCE_GROUP, 1, 4)


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_a_decode_batchs_norm_rows_get_a_warp_each(dtype, few_warp_rows):
    """An RMSNorm over a decode batch of B in 1..64 sequences (SmolLM2's step: the rows' count at its most decides),
    with WARP_ROWS_MIN lowered (few_warp_rows; by default 64 rows keep their work-groups of warps), is a warp a row; the emulated kernel at B = 1 (one work-group, its 3 warps past the row leaving), 37 and 64 equals
    NumPy."""
    sched, kern, launched = _kernel(rmsnorm, _args("rmsnorm", 3, DTYPES[dtype]), vars={"B": (1, MOST)},
                                    shapes={"x": ("B", 576)})
    assert gpu_launch.launch_of(launched) == WARP_ROW
    for b in (1, 37, MOST):
        args = _args("rmsnorm", b, DTYPES[dtype], seed=b)
        _check(_emulated(sched, kern, launched, args, {"B": b}), rmsnorm, args, dtype)
