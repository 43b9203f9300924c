"""Decode attention on the work-group targets is one kernel (softmax_contraction.py; render_rows' column reductions):
a softmax that only a contraction over its axis reads is computed inside the contraction's row kernel, a work-group
per query head holding the row's scores and probabilities in local memory, p @ V split over the group's work-items
by runs of value columns and slices of the positions. Every device equals NumPy; the cpu's one kernel is
llvm_softmax.py's (test_paged_attention_cpu.py). A KV head's query heads fold into one work-group only where that
leaves row_plan.FOLD_MIN_GROUPS work-groups (not SmolLM2's 3 KV heads of one row): the tests of the folded kernel's
structure lower it (conftest's `few_groups`; test_render_row_fold.py tests the rule)."""
import math
import re

import ml_dtypes
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from examples.models import llama, llama_paged
from examples.models.common import cast
from prepjit.codegen import render_rows, row_plan
from prepjit.codegen.gpu_launch import launch_of
from prepjit.codegen.fusion import kernel_roots
from prepjit.codegen.optimize import optimize
from prepjit.codegen.schedule import schedule
from prepjit.codegen.softmax_contraction import softmax_contractions
from prepjit.codegen.targets import CUDA_TARGET, OPENCL_TARGET
from prepjit.uop import Ops

from . import cuda_emulation
from .test_render_fragments import working_nvrtc

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
    """Scores, softmax and p @ V: one kernel on a GPU and on the cpu (llvm_softmax.py; was three); NumPy's values at
    a var position (the first, one inside a run of the group, the last)."""
    args = _args(dtype)
    f = pj.prepare(lambda q, k, v, pos: attend(pnp, q, k, v, pos), vars={"pos": (0, CONTEXT - 1)}, device=device)
    for pos in (0, 37, CONTEXT - 1):
        _check(f(*args, pos), _reference(args, pos), dtype)
    kernels = [row["kernel"] for row in pj.profile(f, *args, 100).rows]
    assert len(kernels) == 1, kernels


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


@pytest.mark.usefixtures("few_groups")   # (a fold at few rows: row_plan.FOLD_MIN_GROUPS)
@pytest.mark.parametrize("target", [CUDA_TARGET, OPENCL_TARGET], ids=["cuda", "opencl"])
def test_the_fused_kernel_is_a_work_group_per_key_value_head(target):
    """The one kernel is a row kernel whose rows are the KV x GROUP query heads, a work-group (covering the
    positions) for each KV head's GROUP query heads (row_plan.Rows.fold: the keys and values it reads are theirs
    alike), its columns the head's D values; the scores' dot product over D is rendered once (into local memory),
    not again for the row's max, its sum and each value column; local arrays, a row of each for each query head:
    scores, probabilities, p @ V's partials (a row a warp's slices on CUDA, where shuffles add them; a slice's on
    OpenCL) (and the max's and sum's of each warp), and the head's computed query row, which each position's dot
    product reads there."""
    _, sched = _kernel(np.float32)
    assert len(sched.kernels) == 1, [k.ast.arg for k in sched.kernels]
    launched = target.launched(optimize(sched.kernels[0].ast, target.language))
    run = 4 if target is CUDA_TARGET else 1   # (the dialect's items a work-item)
    assert launch_of(launched) == ("rows", 256, 1, run, GROUP)
    rows = row_plan.rows_of(launched, 256, 1, run, GROUP)
    assert [r.src[0].arg for r in rows.rows] == [KV, GROUP] and [c.src[0].arg for c in rows.cols] == [D]
    assert rows.fold is rows.rows[1]
    assert len(rows.columns) == 1 and rows.column_runs == D // run and rows.slices == 256 // (D // run)
    src = target.render(launched)
    assert src.global_size[0].arg == KV * 256
    loops = 0 if target is CUDA_TARGET else 1   # (CUDA: a team of lanes a score, test_the_scores_are_team_work)
    assert len(re.findall(rf"for \(.*< {D}L", src.source)) == loops, src.source   # the scores' loop over D
    assert len(re.findall(rf"row\d+\[{GROUP}\]\[{CONTEXT}\]", src.source)) == 2, src.source   # scores, probabilities
    assert len(re.findall(rf"row\d+\[{GROUP}\]\[{D}\]", src.source)) == 1, src.source   # the query rows, once
    stored = rows.slices // row_plan.warp_slices(rows, target is CUDA_TARGET)
    assert stored == (rows.slices // 2 if target is CUDA_TARGET else rows.slices)   # (16 runs a row: 2 slices a warp)
    assert len(re.findall(rf"cp\d+\[{GROUP}\]\[{stored * D}\]", src.source)) == 1, src.source   # p @ V's partials


@pytest.mark.usefixtures("few_groups")   # (a fold at few rows: row_plan.FOLD_MIN_GROUPS)
@pytest.mark.parametrize("dtype, lanes", [(np.float32, 8), (ml_dtypes.bfloat16, 4)])
def test_the_scores_are_team_work(dtype, lanes):
    """On CUDA each position's score is a team's: `lanes` neighbouring lanes each add a run of 32 bytes of the key row
    (8 float32, 16 bfloat16: the compiler's two 16-byte loads) and the team adds its lanes' sums by shuffles, a pass
    filling 256 / lanes positions; no work-item computes a score's 64 terms in a loop (it did: 64 dependent adds and
    loads of key rows 128 bytes apart between neighbouring work-items). OpenCL (no shuffles) keeps that loop."""
    _, sched = _kernel(dtype)
    ast = optimize(sched.kernels[0].ast, "cuda")
    src = CUDA_TARGET.render(CUDA_TARGET.launched(ast)).source
    assert not re.findall(rf"for \(.*< {D}L", src), src
    assert re.search(rf"const int (tl\d+) = lid % {lanes};", src), src
    assert re.search(rf"for \(long long (tb\d+) = 0; \1 < \w+; \1 \+= {256 // lanes}\)", src), src
    offsets = [int(o) for o in re.findall(r"__shfl_xor_sync\(0xffffffffu, acc\d+, (\d+)\)", src)]
    assert offsets == [lanes >> k for k in range(1, lanes.bit_length()) for _ in range(GROUP)], offsets   # (3 heads)
    opencl = OPENCL_TARGET.render(OPENCL_TARGET.launched(optimize(sched.kernels[0].ast, "opencl"))).source
    assert len(re.findall(rf"for \(.*< {D}L", opencl)) == 1, opencl


@pytest.mark.usefixtures("few_groups")   # (a fold at few rows: row_plan.FOLD_MIN_GROUPS)
def test_p_at_v_takes_16_byte_runs_and_adds_its_partials_pairwise():
    """bfloat16 values on CUDA: p @ V's work-items take runs of 8 columns (one 16-byte load of a value row), so the
    group's 256 take 32 slices of the positions (9 a work-item at 257 positions; runs of 4: 16 slices, 17 each); a
    column's 32 partials are added pairwise (5 levels, not a chain of 31 adds): the 4 slices of a warp by shuffles
    (lanes 8 apart, then 16: 2 levels, row_plan.warp_slices), the warps' 8 sums stored, and a column's total reads
    them together (3 levels), a work-item a column, for each query head of the KV head's work-group."""
    _, sched = _kernel(ml_dtypes.bfloat16)
    launched = CUDA_TARGET.launched(optimize(sched.kernels[0].ast, "cuda"))
    assert launch_of(launched) == ("rows", 256, 1, 8, GROUP)
    rows = row_plan.rows_of(launched, 256, 1, 8, GROUP)
    assert rows.column_runs == D // 8 and rows.slices == 32 and row_plan.warp_slices(rows, True) == 4
    src = CUDA_TARGET.render(launched).source
    offsets = re.findall(r"__shfl_xor_sync\(0xffffffffu, (ca\d+_\d+_\d+), (\d+)\)", src)
    assert len(offsets) == 2 * GROUP * 8, offsets   # (two levels, each head's 8 columns of a run)
    assert {o for _, o in offsets} == {"8", "16"}, offsets
    partials = re.findall(r"float (cs\d+) = cp\d+\[", src)
    assert len(partials) == 8 * GROUP, src
    depth = dict.fromkeys(partials, 0)
    for out, a, b in re.findall(r"float (t\d+) = (\w+) \+ (\w+);", src):
        if a in depth and b in depth:
            depth[out] = max(depth[a], depth[b]) + 1
    assert max(depth.values()) == 3, src
    assert "const long long c = lid;" in src, src   # (a column a work-item)


@pytest.mark.usefixtures("few_groups")   # (a fold at few rows: row_plan.FOLD_MIN_GROUPS)
@pytest.mark.parametrize("target", [CUDA_TARGET, OPENCL_TARGET], ids=["cuda", "opencl"])
def test_p_at_v_loads_its_positions_in_flight_together(target):
    """A work-item's p @ V takes POSITIONS_IN_FLIGHT positions of its slice a step: their value rows' loads first
    (into variables, those past the row at its last position), then the sums (a select keeps a sum past the row), the
    kernel's launch bounded on CUDA (else ptxas keeps ~32 registers and issues each load at its use; a fold's to
    FOLD_RESIDENT work-groups). Was a loop of one position a step: a memory round trip a position (9 at pos 256, 16 at
    511)."""
    _, sched = _kernel(ml_dtypes.bfloat16, context=512)
    launched = target.launched(optimize(sched.kernels[0].ast, target.language))
    rows = row_plan.rows_of(launched, *launch_of(launched)[1:])
    src = target.render(launched).source
    step = re.search(rf"for \(long(?: long)? (fb\d+) = cj; \1 < \w+; \1 \+= (\d+)\)", src)
    assert step and int(step.group(2)) == rows.slices * render_rows.POSITIONS_IN_FLIGHT, src
    end = src.index("cp", src.index("}\n", src.index(" ? ", step.end())))
    loop = src[step.end():min(end, src.find("__shfl_xor_sync", step.end()) % len(src))]   # (the partials' shuffles)
    run = 8 if target is CUDA_TARGET else 1
    held = re.findall(r"^\s*float (pl\d+_\d+_\d+_\d+);", loop, re.M)
    assert len(held) == render_rows.POSITIONS_IN_FLIGHT * run, loop
    sums = [m.start() for m in re.finditer(r"ca\d+_\d+_\d+ = ", loop)]   # (a KV head's query heads' sums)
    assert len(sums) == render_rows.POSITIONS_IN_FLIGHT * run * GROUP, loop
    assert all(loop.index(f"{v} = ") < sums[0] for v in held), loop   # (every load before the first sum)
    assert len(re.findall(r"ca\d+_\d+_\d+ = fb\d+ \+ \d+ < \w+ \? ", loop)) == (
        render_rows.POSITIONS_IN_FLIGHT - 1) * run * GROUP
    bound = f"__launch_bounds__(256, {row_plan.FOLD_RESIDENT})"   # (a KV head's work-group: its registers bounded)
    assert (bound in src) == (target is CUDA_TARGET), src


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


DECODE_POSITIONS = (0, 1, 31, 256, 511)   # one position, a team's, a warp's, past a pass of 256, the context's last


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_decode_attention_on_opencl_equals_numpy_at_every_pass(dtype):
    """A context of 512 (SmolLM2's decode bench) on opencl (a work-item a score, the row's passes of 256): NumPy's
    values at positions that end the row inside a team, a warp and the second and last passes."""
    args = _args(dtype, context=512)
    f = pj.prepare(lambda q, k, v, pos: attend(pnp, q, k, v, pos), vars={"pos": (0, 511)}, device="opencl")
    for pos in DECODE_POSITIONS:
        _check(f(*args, pos), _reference(args, pos), dtype)


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
@pytest.mark.parametrize("pos", DECODE_POSITIONS)
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_the_emulated_team_scores_equal_numpy(dtype, pos):
    """The fused CUDA kernel at a context of 512, run through cuda_emulation (static positions): the scores' teams
    (the last pass's teams past the row compute its last position and store nothing) equal NumPy."""
    args, sched = _kernel(dtype, pos, context=512)
    (kernel,) = sched.kernels
    src = CUDA_TARGET.render(CUDA_TARGET.launched(optimize(kernel.ast, "cuda")))
    assert "__shfl_xor_sync(0xffffffffu, acc" in src.source
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


@pytest.mark.usefixtures("few_groups")   # (a fold at few rows: row_plan.FOLD_MIN_GROUPS)
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_the_fused_kernel_compiles_with_nvrtc(dtype):
    """The fused kernel (var position, SmolLM2's heads) compiles with NVRTC for sm_90 and sm_80 (no GPU needed)."""
    nvrtc = working_nvrtc()
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


BLOCK, POOL = 16, 24   # a paged cache: blocks of 16 positions, a pool of 24 blocks


def paged_attend(xp, q, k, v, pos, table, k_pool, v_pool, dtype=np.float32):
    """llama_paged's decode attention: each row's query heads q (B, KV * GROUP, D) against the cached positions < pos
    of the blocks its table lists and its own key/value (k, v: (B, KV, D)), one softmax over both parts."""
    b, nb = table.shape
    slots = xp.arange(nb)[:, None] * BLOCK + xp.arange(BLOCK)[None, :]
    visible = (slots[None] < pos[:, None, None])[:, None]
    q = q.reshape(b, KV, GROUP, 1, D)
    own = cast(xp.einsum("bkgqd,bkd->bkgq", q, k) * (1 / math.sqrt(D)), np.float32)[..., None]
    cached = llama_paged._cached_scores(xp, q, k_pool[table], visible, D)
    return llama_paged._attend(xp, cached, own, v_pool[table], v[:, :, None], visible, dtype)


def _paged_args(dtype, pos, nb, seed=3):
    rng = np.random.default_rng(seed)
    b = len(pos)
    q, k, v = (rng.standard_normal(s) * 2 for s in ((b, KV * GROUP, D), (b, KV, D), (b, KV, D)))
    k_pool, v_pool = (rng.standard_normal((POOL, KV, BLOCK, D)) for _ in range(2))
    table = rng.permutation(POOL)[:b * nb].reshape(b, nb)
    floats = [a.astype(np.float32).astype(dtype) for a in (q, k, v)]
    return floats[:3] + [np.array(pos, np.int64), table] + [a.astype(np.float32).astype(dtype) for a in (k_pool, v_pool)]


def _paged_reference(args, dtype):
    return paged_attend(np, *(a.astype(np.float32) if a.dtype == dtype else a for a in args), dtype=dtype)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_paged_decode_attention_is_one_kernel_on_gpus(device, dtype):
    """The paged two-part softmax (cached positions through the block table, the token's own key; one max and one sum
    over both, p_cached @ V_blocks + p_own @ v_own) is one kernel on a GPU, a work-group per (row, query head); NumPy's
    values at one row and at three rows of ragged positions (none cached, inside a block, the table's last)."""
    f = pj.prepare(lambda q, k, v, pos, table, k_pool, v_pool: paged_attend(pnp, q, k, v, pos, table, k_pool, v_pool,
                                                                            dtype),
                   vars={"B": (1, 8), "NB": (1, 8)},
                   shapes={"q": ("B", KV * GROUP, D), "k": ("B", KV, D), "v": ("B", KV, D), "pos": ("B",),
                           "table": ("B", "NB")}, device=device)
    for pos, nb in (([37], 3), ([0, 17, 64], 4)):
        args = _paged_args(dtype, pos, nb)
        _check(f(*args), _paged_reference(args, dtype), dtype)
    if device != "cpu":   # (beside the block table's bounds check, r_1)
        kernels = [row["kernel"] for row in pj.profile(f, *args).rows if not row["kernel"].startswith("r_1")]
        assert len(kernels) == 1, kernels


def _paged_kernel(dtype, pos, nb):
    """The GPU schedule's kernels of paged attention at static rows and table width (the emulation takes no vars)."""
    args = _paged_args(dtype, pos, nb)
    traced = pj.trace(lambda *a: paged_attend(pnp, *a, dtype=dtype), *args)
    return args, schedule(list(traced.outputs), list(traced.inputs))


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_the_emulated_paged_cuda_kernel_equals_numpy(dtype):
    """The fused paged kernel in CUDA, run through cuda_emulation (three rows: no cached position, 20 and 48 of the
    table's 3 blocks), equals NumPy."""
    args, sched = _paged_kernel(dtype, [0, 20, 48], 3)
    (kernel,) = sched.kernels
    launched = CUDA_TARGET.launched(optimize(kernel.ast, "cuda"))
    assert launch_of(launched)[0] == "rows"
    src = CUDA_TARGET.render(launched)
    bufs = {i: a.ravel() for i, a in zip(sched.inputs, args)}
    out = np.zeros(sched.buffers[kernel.buffers[0]].max_size, dtype)
    cuda_emulation.run(src, [out] + [bufs[i] for i in kernel.buffers[1:]])
    want = _paged_reference(args, dtype)
    _check(out.reshape(want.shape), want, dtype)


def _stale(args, value):
    """`args` with every pool slot past each row's position (in its table's blocks) holding `value`."""
    q, k, v, pos, table, k_pool, v_pool = (a.copy() for a in args)
    for b, p in enumerate(pos):
        for n, block in enumerate(table[b]):
            for pool in (k_pool, v_pool):
                pool[block, :, max(0, p - n * BLOCK):] = value
    return [q, k, v, pos, table, k_pool, v_pool]


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_a_paged_rows_slots_past_its_length_never_reach_its_result(device, dtype):
    """A slot past a sequence's length (a freed block's stale key and value, here NaN) adds nothing to its row: the
    masked scores are -inf, their probabilities and values 0 (llama_paged._attend); was NaN (0 * NaN in p @ V).
    NumPy's values of the clean pool, on every device."""
    f = pj.prepare(lambda q, k, v, pos, table, k_pool, v_pool: paged_attend(pnp, q, k, v, pos, table, k_pool, v_pool,
                                                                            dtype),
                   vars={"B": (1, 8), "NB": (1, 8)},
                   shapes={"q": ("B", KV * GROUP, D), "k": ("B", KV, D), "v": ("B", KV, D), "pos": ("B",),
                           "table": ("B", "NB")}, device=device)
    args = _paged_args(dtype, [0, 17, 40], 4)
    _check(f(*_stale(args, np.nan)), _paged_reference(args, dtype), dtype)


@pytest.mark.usefixtures("few_groups")   # (a fold at few rows: row_plan.FOLD_MIN_GROUPS)
@pytest.mark.parametrize("target", [CUDA_TARGET, OPENCL_TARGET], ids=["cuda", "opencl"])
def test_the_paged_kernel_stops_at_a_rows_last_visible_block(target):
    """On a GPU the paged row's passes (the scores, the max, the sum, the probabilities, p @ V) run over the blocks a
    row sees, min(NB, ceil(pos[b] / block)) (row_bounds.py), not over the table's width: the masked rest adds only
    identities. The block range's end reads the row's position; the row's length stays NB x block at its largest
    (the local arrays, the bounds proof)."""
    f = pj.prepare(lambda q, k, v, pos, table, k_pool, v_pool: paged_attend(pnp, q, k, v, pos, table, k_pool, v_pool),
                   vars={"B": (1, 8), "NB": (1, 8)},
                   shapes={"q": ("B", KV * GROUP, D), "k": ("B", KV, D), "v": ("B", KV, D), "pos": ("B",),
                           "table": ("B", "NB")})
    traced = pj.trace(f, *_paged_args(np.float32, [5, 9], 2))
    (kernel,) = schedule(list(traced.outputs), list(traced.inputs)).kernels
    launched = target.launched(optimize(kernel.ast, target.language))
    ends = {r.src[0] for u in launched.toposort() if u.op is Ops.REDUCE for r in u.src[1:]}
    blocks = [e for e in ends if e.op is Ops.MIN]
    assert len(blocks) == 1 and blocks[0].vmax == 8, ends
    assert any(u.op is Ops.LOAD for u in blocks[0].toposort()), blocks[0]
    src = target.render(launched).source
    assert len(re.findall(rf"row\d+\[{GROUP}\]\[{8 * BLOCK}\]", src)) == 2, src   # (scores, probabilities: longest row)


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
def test_the_emulated_bounded_paged_kernel_ignores_stale_slots():
    """The CUDA kernel that stops at each row's last visible block, through cuda_emulation: rows with no cached
    position, one inside the second block and the table's last, stale slots NaN; NumPy's values of the clean pool."""
    args, sched = _paged_kernel(ml_dtypes.bfloat16, [0, 20, 48], 3)
    (kernel,) = sched.kernels
    src = CUDA_TARGET.render(CUDA_TARGET.launched(optimize(kernel.ast, "cuda")))
    stale = _stale(args, np.nan)
    bufs = {i: a.ravel() for i, a in zip(sched.inputs, stale)}
    out = np.zeros(sched.buffers[kernel.buffers[0]].max_size, ml_dtypes.bfloat16)
    cuda_emulation.run(src, [out] + [bufs[i] for i in kernel.buffers[1:]])
    want = _paged_reference(args, ml_dtypes.bfloat16)
    _check(out.reshape(want.shape), want, ml_dtypes.bfloat16)


@pytest.mark.usefixtures("few_groups")   # (a fold at few rows: row_plan.FOLD_MIN_GROUPS)
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_the_fused_paged_kernel_compiles_with_nvrtc(dtype):
    """The fused paged kernel (var rows and table width) compiles with NVRTC for sm_90 and sm_80 (no GPU needed)."""
    nvrtc = working_nvrtc()
    f = pj.prepare(lambda q, k, v, pos, table, k_pool, v_pool: paged_attend(pnp, q, k, v, pos, table, k_pool, v_pool,
                                                                            dtype),
                   vars={"B": (1, 8), "NB": (1, 8)},
                   shapes={"q": ("B", KV * GROUP, D), "k": ("B", KV, D), "v": ("B", KV, D), "pos": ("B",),
                           "table": ("B", "NB")})
    traced = pj.trace(f, *_paged_args(dtype, [5, 9], 2))
    (kernel,) = schedule(list(traced.outputs), list(traced.inputs)).kernels
    src = CUDA_TARGET.render(CUDA_TARGET.launched(optimize(kernel.ast, "cuda")))
    for arch in ("sm_90", "sm_80"):
        nvrtc.compile(src.name, src.source, [f"-arch={arch}", "-std=c++17", "--fmad=false"])


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_the_paged_decode_step_has_one_attention_kernel_a_layer(device, dtype):
    """llama_paged.decode_batch (2 layers, var rows and table width): a layer's attention is one kernel (on the cpu
    too: llvm_softmax.py, where the norms are computed in their projections: fewer kernels), so
    the step is at most 10 kernels a layer (the norm, q/k/v, attention, wo, the norm, gate/up, SiLU * up, down, the
    new key and value) and the head's 2, besides the bounds checks (r_1); it was 19 a layer."""
    cfg = llama.Config(layers=2, dim=72, ff=128, heads=KV * GROUP, kv_heads=KV, vocab=64, context=64,
                       rope_theta=10000.0, eps=1e-5)
    params = llama.random_params(np.random.default_rng(0), cfg)
    decode, _ = llama_paged.prepared(cfg, context=64, block_size=BLOCK, max_batch=4, max_chunk=8, device=device,
                                     dtype=dtype)
    pools = [np.zeros((cfg.layers, 4, KV, BLOCK, cfg.head_dim), dtype) for _ in range(2)]
    cos, sin = llama.rope_tables(cfg, 64)
    plan = decode.plan(params, np.array([1, 2]), np.array([3, 20]), np.array([[0, 1], [2, 3]]), *pools, cos, sin)
    names = [pk.kernel.name for pk in plan.kernels if not pk.kernel.name.startswith("r_1")]
    assert len(names) <= 10 * cfg.layers + 2, names


def test_a_norm_of_a_long_contraction_keeps_its_kernels(device):
    """A decode step's final norm reads the last down projection (sums of 1536) and its normalised row is read by a
    head of 256 outputs (a small vocabulary): a row normalised like a softmax's, but its values are no scores (each
    sums more than SCORE_MAX), so the down projection keeps its kernel, the head's holding the norm (was one kernel:
    each of the head's 256 work-groups computed the down projection, twice, in the norm's prologue); NumPy's values."""
    rng = np.random.default_rng(4)
    h, a = rng.standard_normal(576).astype(np.float32), rng.standard_normal(1536).astype(np.float32)
    gain = rng.standard_normal(576).astype(np.float32)
    down, head = (rng.standard_normal(s).astype(np.float32) * 0.05 for s in ((1536, 576), (576, 256)))

    def final(xp, h, a, down, gain, head):
        return llama.rms_norm(xp, h + a @ down, gain, 1e-5) @ head

    args = (h, a, down, gain, head)
    traced = pj.trace(lambda *args: final(pnp, *args), *args)
    assert len(schedule(list(traced.outputs), list(traced.inputs)).kernels) == 2
    f = pj.prepare(lambda *args: final(pnp, *args), device=device)
    _check(f(*args), final(np, *args), np.float32)


def test_a_norm_of_short_sums_is_no_softmax():
    """An RMSNorm of a projection's row (sums of 64, within SCORE_MAX) read by a 64-column contraction has a row's sum
    over values that are row-shaped sums, as a softmax has, but no row max and no exponential: softmax_contractions
    finds nothing there and the projection keeps its kernel (was: taken for a softmax row, its 'scores' computed
    inside the reading contraction's kernel)."""
    rng = np.random.default_rng(5)
    a, gain = rng.standard_normal(64).astype(np.float32), rng.standard_normal(48).astype(np.float32)
    w, head = (rng.standard_normal(s).astype(np.float32) * 0.1 for s in ((64, 48), (48, 64)))

    def normed(xp, a, w, gain, head):
        return llama.rms_norm(xp, a @ w, gain, 1e-5) @ head

    traced = pj.trace(lambda *args: normed(pnp, *args), a, w, gain, head)
    outputs = list(traced.outputs)
    assert softmax_contractions(kernel_roots(outputs)[0], outputs) == {}
