"""A GPU batch row kernel's staged operands (fusion._batch_staged, gpu_launch.staged_operands, operand_prologue.Staging,
render_batch_rows.stage): a var batch's normalised rows (RMSNorm: x / sqrt(mean(x^2) + eps) * gain) that a projection
over quantized blocks reads are computed by the projection's kernel, once per chunk of BATCH_CHUNK rows, into local
memory (each row's mean of squares, then its values, in straight-line passes the work-group's lane groups share),
where the norm had a kernel of its own on the GPUs; gate/up's two sums read one array. A row too long to stage
(row_plan.stage_fits) keeps its norm's kernel. Values equal NumPy's on every device and through cuda_emulation (ragged
batches: 1, 3, 17, 37, 64 rows; a work-group's columns padded to one chunk), and the bounds proof covers the local
array's indices."""
import re

import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen import gpu_launch, row_plan
from prepjit.codegen.bounds import prove_kernel
from prepjit.codegen.optimize import optimize
from prepjit.codegen.schedule import schedule
from prepjit.codegen.render_cuda import CUDA as CUDA_TARGET_DIALECT
from prepjit.codegen.targets import CUDA_TARGET, OPENCL_TARGET
from prepjit.errors import CompileError
from prepjit.uop import Ops, UOp

from ..conftest import DEVICES
from . import cuda_emulation

N, MOST = 301, 64   # (N: not a multiple of a work-group's columns)
BATCHES = [1, 3, 17, 37, 64]


def normed(xp, kind, k, swiglu=False):
    """h + rms_norm(x) @ W.T of a batch x (B, k), W (N, k) in `kind` blocks; or SiLU(gate) * up of one contraction of
    the normalised rows by gate/up stacked (2N, k)."""
    def fn(x, gain, h, blocks):
        w = pj.quant.dequantize(blocks, kind) if xp is pnp else blocks
        rows = x / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) + 1e-5) * gain
        if swiglu:
            both = rows @ w.T
            return both[:, :N] / (1 + xp.exp(-both[:, :N])) * both[:, N:]
        return h + rows @ w.T
    return fn


def _args(kind, k, b, swiglu=False, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((b, k)).astype(np.float32)
    gain = (1 + 0.1 * rng.standard_normal(k)).astype(np.float32)
    h = rng.standard_normal((b, N)).astype(np.float32)
    w = (rng.standard_normal((2 * N if swiglu else N, k)) / np.sqrt(k)).astype(np.float32)
    return x, gain, h, pj.quant.quantize(w, kind)


def _reference(kind, k, args, swiglu=False):
    x, gain, h, blocks = args
    w = pj.quant.dequantize(blocks, kind).astype(np.float64)
    return normed(np, kind, k, swiglu)(x.astype(np.float64), gain.astype(np.float64), h.astype(np.float64), w)


def _prepared(kind, k, swiglu=False, device=None):
    return pj.prepare(normed(pnp, kind, k, swiglu), vars={"B": (1, MOST)}, shapes={"x": ("B", k), "h": ("B", N)},
                      **({"device": device} if device else {}))


def _schedule(kind, k, swiglu=False):
    traced = pj.trace(_prepared(kind, k, swiglu), *_args(kind, k, 3, swiglu))
    return schedule(list(traced.outputs), list(traced.inputs))


def _launched(target, kern):
    return target.launched(optimize(kern.ast, target.language))


def _staged(ast: UOp) -> list[UOp]:
    return row_plan.staged_stores(ast)


@pytest.mark.parametrize("swiglu", [False, True])
@pytest.mark.parametrize("kind", ["q8_0", "q4_1"])
def test_a_normalised_batch_is_computed_in_its_projection(device, kind, swiglu):
    """One kernel on the GPUs (they had two: the normalised rows, then the projection), equal to NumPy at every batch
    on every device: a batch row kernel staging one array (gate/up's two sums read the same rows). (The cpu keeps the
    norm's kernel here: its array is laid out for the batch's most rows, 64 x 576 values, past fusion.OPERAND_MAX.)"""
    f = _prepared(kind, 576, swiglu, device)
    for b in BATCHES:
        args = _args(kind, 576, b, swiglu, seed=b)
        want = _reference(kind, 576, args, swiglu)
        np.testing.assert_allclose(np.asarray(f(*args)), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    if device != "cpu":
        assert len(f.plan(*args).kernels) == 1
    (kern,) = _schedule(kind, 576, swiglu).kernels
    for target in (OPENCL_TARGET, CUDA_TARGET):
        launched = _launched(target, kern)
        assert gpu_launch.launch_of(launched)[0] == "batch"
        (stage,) = _staged(launched)
        assert stage.src[0].arg == (0, row_plan.BATCH_CHUNK * 576)


def test_a_row_too_long_to_stage_keeps_its_norm_kernel(device):
    """Rows of 1536 float32 values (96 KB a chunk, past STAGE_BYTES) are normalised in a kernel of their own on the
    GPUs, as before, and equal NumPy's."""
    f = _prepared("q8_0", 1536, device=device)
    args = _args("q8_0", 1536, 37)
    want = _reference("q8_0", 1536, args)
    np.testing.assert_allclose(np.asarray(f(*args)), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert not row_plan.stage_fits(1536, 4) and row_plan.stage_fits(576, 4)
    assert len(f.plan(*args).kernels) == 2


def test_each_work_group_reads_one_chunk_of_rows():
    """A staging kernel launches its columns per chunk rounded up to whole work-groups (301 columns, 8 a work-group on
    CUDA: 304), so a work-group's columns never straddle two chunks; the unstaged projection launches 301 a chunk."""
    sched = _schedule("q8_0", 576)
    launched = _launched(CUDA_TARGET, sched.kernels[0])
    rows = row_plan.rows_of(launched, *gpu_launch.launch_of(launched)[1:], batched=True)
    assert rows.staged and rows.pack == 8
    assert pj.uop.eval_uop(row_plan.launch_size(rows), {"B": 37}) == 304 * 3 * rows.group
    plain = pj.trace(pj.prepare(lambda x, b: x @ pj.quant.dequantize(b, "q8_0").T, vars={"B": (1, MOST)},
                                shapes={"x": ("B", 576)}), *_args("q8_0", 576, 3)[::3])
    (kern,) = schedule(list(plain.outputs), list(plain.inputs)).kernels
    launched = _launched(CUDA_TARGET, kern)
    rows = row_plan.rows_of(launched, *gpu_launch.launch_of(launched)[1:], batched=True)
    assert not rows.staged and pj.uop.eval_uop(row_plan.launch_size(rows), {"B": 37}) == -(-301 * 3 // 8) * 128


def test_the_bounds_proof_covers_the_staged_array():
    """The staged array's store and loads (a row at its index modulo BATCH_CHUNK) are proven against the size its
    DEFINE_LOCAL names; an array one element short is refused."""
    sched = _schedule("q4_1", 576)
    kern = sched.kernels[0]
    shapes = [sched.buffers[i].shape for i in kern.buffers]
    launched = _launched(CUDA_TARGET, kern)
    assert prove_kernel(launched, shapes) > 0
    (stage,) = _staged(launched)
    local = stage.src[0]
    short = UOp(Ops.DEFINE_LOCAL, local.dtype, (), (local.arg[0], local.arg[1] - 1))
    with pytest.raises(CompileError, match="cannot prove"):
        prove_kernel(launched.substitute({local: short}), shapes)


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
@pytest.mark.parametrize("kind, k, swiglu", [("q8_0", 576, False), ("q4_1", 576, False), ("q4_1", 64, False),
                                             ("q4_1", 576, True)])
def test_the_emulated_staged_kernel_equals_numpy(kind, k, swiglu):
    """The CUDA kernel (its lane groups taking the chunk's rows in turn, each row's mean of squares combined by
    shuffles, a barrier, then the rows' sums), run through cuda_emulation, equals NumPy's at every batch."""
    sched = _schedule(kind, k, swiglu)
    (kern,) = sched.kernels
    src = CUDA_TARGET.render(_launched(CUDA_TARGET, kern))
    assert "__shared__" in src.source and "__syncthreads" in src.source
    for b in BATCHES:
        args = _args(kind, k, b, swiglu, seed=b)
        bufs = dict(zip(sched.inputs, args))
        out = np.zeros((b, N), np.float32)
        cuda_emulation.run(src, [out] + [np.ascontiguousarray(bufs[i]).ravel() for i in kern.buffers[1:]],
                           var_values={"B": b})
        want = _reference(kind, k, args, swiglu)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_the_staging_prologue_is_straight_line_passes_its_lane_groups_share():
    """The CUDA kernel's staging prologue (from its loop over the chunk's rows in turns to the barrier after it) has
    no loop over a row's elements: its passes are straight-line (loads issued together), each guarded by its lane
    group's slice of the row (at one row all 8 lane groups of the work-group work on it), the slices' partial means
    of squares combined through a local array and a barrier, after which the values' pass loads nothing: the row's
    x, loaded for the mean of squares, and the gain, loaded with it, are kept in registers."""
    (kern,) = _schedule("q8_0", 576).kernels
    lines = CUDA_TARGET.render(_launched(CUDA_TARGET, kern)).source.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  for (long long i = 0;"))
    prologue = lines[start:lines.index("  __syncthreads();", start)]
    loops = [line.strip().split(";")[0] for line in prologue if line.strip().startswith("for (")]
    assert loops == ["for (long long i = 0", "for (int o = 8"]   # (the turns; the shuffles within a lane group)
    assert sum("if (slice" in line for line in prologue) == 3 * 576 // (16 * 4)   # (gain, squares, values: 9 runs)
    assert any(line.strip().startswith("__shared__") and "part" in line for line in lines)
    combined = next(i for i, line in enumerate(prologue) if line.strip() == "__syncthreads();")
    assert not [line for line in prologue[combined:] if re.search(r"\bbuf\d+\[", line)]


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
def test_staged_blocks_of_columns_equal_a_column_a_lane_group_bit_for_bit(monkeypatch):
    """With blocks of 4 columns taken at any width (BLOCK_MIN_GROUPS 0: 76 blocks, the last ragged, padded to 80 a
    chunk: 8 a work-group), the emulated staging kernel at B = 37 equals NumPy's and, bit for bit, the staging
    kernel of a column a lane group."""
    sched = _schedule("q8_0", 576)
    (kern,) = sched.kernels
    sources = []
    monkeypatch.setattr(row_plan, "BLOCK_MIN_GROUPS", 0)
    for blocks in ((), row_plan.BLOCK_COLUMNS):
        monkeypatch.setattr(row_plan, "BLOCK_COLUMNS", blocks)
        launched = gpu_launch.launch(optimize(kern.ast, "cuda"), CUDA_TARGET_DIALECT)
        sources.append(CUDA_TARGET.render(launched))
    assert gpu_launch.launch_of(launched)[4] == 4 and _staged(launched)
    args = _args("q8_0", 576, 37, seed=37)
    bufs = dict(zip(sched.inputs, args))
    outs = []
    for src in sources:
        outs.append(np.full((37, N), np.nan, np.float32))
        cuda_emulation.run(src, [outs[-1]] + [np.ascontiguousarray(bufs[i]).ravel() for i in kern.buffers[1:]],
                           var_values={"B": 37})
    want = _reference("q8_0", 576, args)
    np.testing.assert_allclose(outs[1], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    np.testing.assert_array_equal(outs[1].view(np.uint32), outs[0].view(np.uint32))


@pytest.mark.skipif("opencl" not in DEVICES, reason="needs the opencl device")
def test_a_paged_decode_step_computes_its_norms_in_its_projections():
    """llama_paged's decode step over quantized blocks on OpenCL (2 layers; a float token table: PoCL computes the
    gathered rows of a Q8_0 table wrong in the output projection's epilogue at batches past one, with or without
    staging) is 6 kernels a layer (qkv, q's RoPE, attention, o, gate/up with SiLU(gate) * up, down; was 8: each norm had
    a kernel), and its logits, keys and values equal NumPy's at 1, 5 and 37 sequences."""
    from examples.models import llama, llama_paged
    cfg = llama.Config(layers=2, dim=64, ff=128, heads=4, kv_heads=2, vocab=96, context=64, rope_theta=1e4, eps=1e-5)
    rng = np.random.default_rng(0)
    params = llama.random_params(rng, cfg)
    params["blocks"] = [{k: {"q8_0": pj.quant.quantize(v, "q8_0")} if v.ndim == 2 else v for k, v in bp.items()}
                        for bp in params["blocks"]]
    cos, sin = llama.rope_tables(cfg, cfg.context)
    k_pool, v_pool = rng.standard_normal((2, cfg.layers, 16, cfg.kv_heads, 4, cfg.head_dim)).astype(np.float32)
    decode, _ = llama_paged.prepared(cfg, context=64, block_size=4, max_batch=MOST, max_chunk=8, device="opencl")
    for b in (1, 5, 37):
        ids, pos = rng.integers(0, cfg.vocab, b), rng.integers(1, 60, b)
        args = (params, ids, pos, np.stack([rng.permutation(16) for _ in ids]), k_pool, v_pool, cos, sin)
        want = llama_paged.decode_batch(np, cfg, llama.dequantized(params), *args[1:])
        for got, w in zip(decode(*args), want):
            for g, x in zip(*((got, w) if isinstance(w, tuple) else ((got,), (w,)))):
                np.testing.assert_allclose(np.asarray(g), x, rtol=1e-4, atol=1e-4 * np.abs(x).max())
    names = [k.kernel.name for k in decode.plan(*args).kernels]
    assert names[:6] == ["r_B_128_1", "E_B_4_16", "r_B_2_2_1_16", "r_B_64", "r_B_128", "r_B_64"], names
    # + the final norm (the head is the float token table's: no batch row kernel), the head, each layer's new keys
    # and values, and three one-element kernels (r_1): 21, where the norms' kernels made it 25
    assert len(names) == 6 * cfg.layers + 9, names
