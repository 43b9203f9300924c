"""GPU batch row kernels (row_plan.batch_plan, render_batch_rows.py): a projection of a var batch B of at most
FEW_VAR_ROWS rows by quantized blocks (a decode step's B sequences) is a warp per column on CUDA (a work-group per
column on OpenCL), its weights unpacked once into registers per BATCH_CHUNK rows and the rows looped over; with a
residual, a computed operand (SiLU(gate) * up) and ragged batches (1, 3, 37: not a multiple of the chunk, 64: the
most) it equals NumPy on every device and through cuda_emulation; its kernel compiles with NVRTC. On CUDA a wide
one's column lanes own blocks of neighbouring columns (row_plan._block), whose outputs equal the unblocked kernel's
bit for bit for every block kind."""
import re

import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen import gpu_launch, render_batch_rows, row_plan
from prepjit.codegen.optimize import optimize
from prepjit.codegen.render_cuda import CUDA
from prepjit.codegen.schedule import schedule
from prepjit.codegen.targets import CUDA_TARGET, OPENCL_TARGET
from prepjit.uop import Ops

from . import cuda_emulation
from .test_render_fragments import working_nvrtc

K, N, MOST = 576, 301, 64   # (N: not a multiple of the work-group's warps)
BATCHES = [1, 3, 37, 64]


def projection(xp, kind, operand, k=K):
    """h + f(x) @ W.T of a batch: x (B, k) or gate/up (B, 2k) through SiLU(gate) * up, W (N, k) in `kind` blocks."""
    def fn(x, h, blocks):
        if operand == "silu":
            gate, up = x[:, :k], x[:, k:]
            x = gate / (1 + xp.exp(-gate)) * up
        w = pj.quant.dequantize(blocks, kind) if xp is pnp else blocks
        return h + x @ w.T
    return fn


def _args(kind, operand, b, seed=0, k=K):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((b, 2 * k if operand == "silu" else k)).astype(np.float32)
    h = rng.standard_normal((b, N)).astype(np.float32)
    return x, h, pj.quant.quantize((rng.standard_normal((N, k)) / np.sqrt(k)).astype(np.float32), kind)


def _reference(kind, operand, args):
    x, h, blocks = args
    w = pj.quant.dequantize(blocks, kind).astype(np.float64)
    return projection(np, kind, operand, w.shape[1])(x.astype(np.float64), h.astype(np.float64), w)


def _prepared(kind, operand, device=None, k=K):
    return pj.prepare(projection(pnp, kind, operand, k), vars={"B": (1, MOST)},
                      shapes={"x": ("B", None), "h": ("B", N)}, **({"device": device} if device else {}))


def _kernel(kind, operand, k=K):
    """The schedule of the projection at a var batch and its kernel that reads the weight."""
    traced = pj.trace(_prepared(kind, operand, k=k), *_args(kind, operand, 3, k=k))
    sched = schedule(list(traced.outputs), list(traced.inputs))
    return sched, sched.kernels[-1]


@pytest.mark.parametrize("kind", ["q8_0", "q4_1"])
def test_a_var_batch_projection_is_a_batch_row_kernel(kind, monkeypatch):
    """On CUDA a column is half a warp's (MATVEC_WARPS warps a work-group: 8 columns) in runs of 4 (the row of 576 in
    9 passes of the lanes' runs, 36 elements a lane, none idle; a warp in the matvec's runs of 16 one-byte quants
    would be 2 passes, 32 elements, the second for 4 lanes), the launch a column per chunk of BATCH_CHUNK rows, no
    local memory, a column a lane group (38 work-groups: too few for blocks of columns); on OpenCL a work-group per
    column. Before: a warp per (row, column), each unpacking the column's weights again."""
    _, kern = _kernel(kind, "plain")
    launched = gpu_launch.launch(optimize(kern.ast, "cuda"), CUDA)
    half = row_plan.WARP // 2
    assert gpu_launch.launch_of(launched) == ("batch", half, row_plan.MATVEC_WARPS * 2, 4, 1)
    src = CUDA_TARGET.render(launched)
    chunks = -(-37 // row_plan.BATCH_CHUNK)
    size = pj.uop.eval_uop(src.global_size[0], {"B": 37})
    assert size == -(-N * chunks // (row_plan.MATVEC_WARPS * 2)) * row_plan.WARP * row_plan.MATVEC_WARPS
    assert "__shared__" not in src.source and "__syncthreads" not in src.source
    steps = re.findall(r"for \(long long step = .*; step \+= (\d+)\)", src.source)
    assert steps == [str(render_batch_rows.SUMS_IN_FLIGHT), "1"]   # the rest a row at a time: a batch of 1 is 1 row
    opencl = gpu_launch.launch_of(OPENCL_TARGET.launched(optimize(kern.ast, "opencl")))
    assert opencl[0] == "batch" and opencl[2:] == (1, 1, 1)
    monkeypatch.setattr(gpu_launch, "FEW_VAR_ROWS", MOST - 1)   # a batch of more rows: its tile, as before
    assert gpu_launch.launch_of(gpu_launch.launch(optimize(kern.ast, "cuda"), CUDA))[0] == "tile"


def test_a_float_weight_and_a_fused_norm_keep_their_launch():
    """A float32 weight keeps its tile (few_var_batch: quantized blocks only), and a fused RMSNorm (a reduction of
    the batch's row alone) keeps a row kernel: batch_plan takes projections only."""
    traced = pj.trace(pj.prepare(lambda x, w: x @ w.T, vars={"B": (1, MOST)}, shapes={"x": ("B", K)}),
                      np.ones((3, K), np.float32), np.ones((N, K), np.float32))
    (kern,) = schedule(list(traced.outputs), list(traced.inputs)).kernels
    assert gpu_launch.launch_of(CUDA_TARGET.launched(optimize(kern.ast, "cuda")))[0] == "tile"
    blocks = pj.quant.quantize(np.ones((N, K), np.float32), "q8_0")
    norm = pj.prepare(lambda x, b: (x / pnp.sqrt(pnp.mean(x * x, axis=-1, keepdims=True) + 1e-5))
                      @ pj.quant.dequantize(b, "q8_0").T, vars={"B": (1, MOST)}, shapes={"x": ("B", K)})
    traced = pj.trace(norm, np.ones((3, K), np.float32), blocks)
    launches = [gpu_launch.launch_of(CUDA_TARGET.launched(optimize(k.ast, "cuda")))[0]
                for k in schedule(list(traced.outputs), list(traced.inputs)).kernels]
    assert "batch" not in launches or len(launches) > 1, launches


@pytest.mark.parametrize("operand", ["plain", "silu"])
@pytest.mark.parametrize("kind", ["q8_0", "q4_1"])
def test_batch_projections_compute_numpys(device, kind, operand):
    """One plan at batches of 1, 3, 37 and 64 rows equals NumPy's projection on every device."""
    f = _prepared(kind, operand, device)
    for b in BATCHES:
        args = _args(kind, operand, b, seed=b)
        want = _reference(kind, operand, args)
        got = np.asarray(f(*args)).astype(np.float64)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
@pytest.mark.parametrize("kind, k, lanes", [("q8_0", K, 16), ("q4_1", K, 16), ("q4_1", 64, 8), ("q4_1", 1536, 32)])
def test_the_emulated_batch_kernel_equals_numpy(kind, k, lanes):
    """The CUDA batch row kernel, run through cuda_emulation at B = 1, 3, 37 and 64 (a chunk of 16 rows a column: the
    last chunk ragged; a warp's columns straddling two chunks), equals NumPy's projection; with a column a quarter of
    a warp (k = 64), half of one (576) and a whole one (1536). (A SiLU(gate) * up operand is computed in a kernel
    before this one, whose source is then the plain operand's: the blocked test below runs one.)"""
    operand = "plain"
    sched, kern = _kernel(kind, operand, k)
    launched = CUDA_TARGET.launched(optimize(kern.ast, "cuda"))
    assert gpu_launch.launch_of(launched)[:2] == ("batch", lanes)
    src = CUDA_TARGET.render(launched)
    for b in BATCHES:
        args = _args(kind, operand, b, seed=b, k=k)
        bufs = dict(zip(sched.inputs, args))
        slots = [np.ascontiguousarray(bufs[i]).ravel() for i in kern.buffers[1:]]
        out = np.zeros((b, N), np.float32)
        cuda_emulation.run(src, [out] + slots, var_values={"B": b})
        want = _reference(kind, operand, args)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_the_batch_kernel_compiles_with_nvrtc():
    """The batch row kernel (q4_1, SiLU(gate) * up operand) and a head-wide one of blocks of 4 columns
    (test_a_wide_projection_blocks_its_columns) compile with NVRTC for sm_90 and sm_80."""
    nvrtc = working_nvrtc()
    kernels = [_kernel("q4_1", "silu")[1], _head_kernel(HEAD)[1]]
    for kern in kernels:
        src = CUDA_TARGET.render(CUDA_TARGET.launched(optimize(kern.ast, "cuda")))
        for arch in ("sm_90", "sm_80"):
            nvrtc.compile(src.name, src.source, [f"-arch={arch}", "-std=c++17", "--fmad=false"])


def swiglu(xp, kind):
    """SiLU(gate) * up of a batch x (B, K) by one contraction with the gate and up weights stacked (2N, K) in `kind`
    blocks, split after it (llama.swiglu's first half)."""
    def fn(x, blocks):
        w = pj.quant.dequantize(blocks, kind) if xp is pnp else blocks
        h = x @ w.T
        return h[:, :N] / (1 + xp.exp(-h[:, :N])) * h[:, N:]
    return fn


def _swiglu_args(kind, b, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((b, K)).astype(np.float32)
    return x, pj.quant.quantize((rng.standard_normal((2 * N, K)) / np.sqrt(K)).astype(np.float32), kind)


def _swiglu_prepared(kind, device=None):
    return pj.prepare(swiglu(pnp, kind), vars={"B": (1, MOST)}, shapes={"x": ("B", K)},
                      **({"device": device} if device else {}))


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
@pytest.mark.parametrize("kind", ["q4_1"])   # (each kind's unpacking: the emulated batch kernel tests)
def test_swiglu_of_one_contraction_is_one_batch_kernel(kind):
    """SiLU(gate) * up of gate/up's one contraction is one batch row kernel (fused_reductions._in_slices: each output
    computes its gate and its up sum, no (B, 2N) buffer and no elementwise kernel after it; before: 2 kernels); the
    emulated CUDA kernel at B = 1, 3, 37, 64 and every device's plan equal NumPy."""
    traced = pj.trace(_swiglu_prepared(kind), *_swiglu_args(kind, 3))
    sched = schedule(list(traced.outputs), list(traced.inputs))
    (kern,) = sched.kernels
    launched = CUDA_TARGET.launched(optimize(kern.ast, "cuda"))
    assert gpu_launch.launch_of(launched)[0] == "batch"
    src = CUDA_TARGET.render(launched)
    for b in BATCHES:
        args = _swiglu_args(kind, b, seed=b)
        x, blocks = args
        want = swiglu(np, kind)(x.astype(np.float64), pj.quant.dequantize(blocks, kind).astype(np.float64))
        bufs = dict(zip(sched.inputs, args))
        out = np.zeros((b, N), np.float32)
        cuda_emulation.run(src, [out] + [np.ascontiguousarray(bufs[i]).ravel() for i in kern.buffers[1:]],
                           var_values={"B": b})
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("kind", ["q4_1"])
def test_swiglu_of_one_contraction_computes_numpys(device, kind):
    """The fused SiLU(gate) * up plan at batches of 1, 3, 37 and 64 rows equals NumPy on every device."""
    f = _swiglu_prepared(kind, device)
    for b in BATCHES:
        x, blocks = _swiglu_args(kind, b, seed=b)
        want = swiglu(np, kind)(x.astype(np.float64), pj.quant.dequantize(blocks, kind).astype(np.float64))
        np.testing.assert_allclose(np.asarray(f(x, blocks)), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


HEAD = 16384   # (a model head's width: 512 work-groups of 8 blocks of 4 columns at one chunk of rows)


def _head_kernel(n, k=K, kind="q8_0"):
    """The kernel of h + x @ W.T at a var batch, W (n, k) in `kind` blocks, traced at 3 rows (the weight zeros: only
    its shape matters here)."""
    f = pj.prepare(lambda x, h, blocks: h + x @ pj.quant.dequantize(blocks, kind).T, vars={"B": (1, MOST)},
                   shapes={"x": ("B", k), "h": ("B", n)})
    traced = pj.trace(f, np.zeros((3, k), np.float32), np.zeros((3, n), np.float32),
                      pj.quant.quantize(np.zeros((n, k), np.float32), kind))
    sched = schedule(list(traced.outputs), list(traced.inputs))
    return sched, sched.kernels[-1]


def test_a_wide_projection_blocks_its_columns():
    """A head-wide projection (16384 columns of 576 Q8_0 weights) at a var batch is a batch row kernel whose column
    lanes own 4 neighbouring columns (row_plan._block: 4 x 36 held values a lane; 512 work-groups at one chunk), each
    row's element loaded once for the 4 (one load per 4 products, a row at a time), its launch a quarter of the
    columns' work-items; the 301-column projection keeps a column a lane group (in blocks, 10 work-groups at one
    chunk). Before: one load per product, every column a lane group."""
    _, kern = _head_kernel(HEAD)
    launched = gpu_launch.launch(optimize(kern.ast, "cuda"), CUDA)
    half = row_plan.WARP // 2
    assert gpu_launch.launch_of(launched) == ("batch", half, row_plan.MATVEC_WARPS * 2, 4, 4)
    src = CUDA_TARGET.render(launched)
    chunks = -(-37 // row_plan.BATCH_CHUNK)
    assert pj.uop.eval_uop(src.global_size[0], {"B": 37}) == HEAD // 4 * chunks // 8 * row_plan.MATVEC_WARPS * 32
    loads = re.findall(r"float (ld\d+) = buf2\[", src.source)
    products = [p for ld in loads for p in re.findall(rf"= fmaf\({ld}, ", src.source)]   # (each added to its sum)
    assert loads and len(products) == 4 * len(loads)
    _, narrow = _kernel("q8_0", "plain")
    assert gpu_launch.launch_of(gpu_launch.launch(optimize(narrow.ast, "cuda"), CUDA))[4:] == (1,)


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
@pytest.mark.parametrize("kind, operand, k, block", [("q8_0", "plain", K, 4), ("q4_1", "silu", K, 4),
                                                     ("q4_1", "plain", 64, 4), ("q4_1", "plain", 1536, 2)])
def test_the_emulated_blocked_kernel_equals_numpy_bit_for_bit(kind, operand, k, block, monkeypatch):
    """With blocks of columns taken at any width (BLOCK_MIN_GROUPS 0: the 301 columns in blocks of 4 or 2, the last
    one ragged), the emulated CUDA kernel at B = 37 and 64 (rows of 1536: 3 and 37) equals NumPy's projection and,
    bit for bit, the kernel of a column a lane group (each column's sum in the same order). (37: a ragged last chunk
    of a step of SUMS_IN_FLIGHT rows and one row alone; 64: whole chunks.)"""
    sched, kern = _kernel(kind, operand, k)
    sources = _unblocked_and_blocked(kern, monkeypatch)
    assert gpu_launch.launch_of(gpu_launch.launch(optimize(kern.ast, "cuda"), CUDA))[4:] == (block,)
    for b in (37, 64) if k <= K else (3, 37):   # (a long row's kernels emulate slowly: one ragged chunk, several)
        args = _args(kind, operand, b, seed=b, k=k)
        x = args[0].astype(np.float64)
        if operand == "silu":
            x = x[:, :k] / (1 + np.exp(-x[:, :k])) * x[:, k:]
        bufs = dict(zip(sched.inputs, args))
        plain, blocked = _emulated(kern, sources, {i: bufs.get(i, x.astype(np.float32)) for i in kern.buffers[1:]},
                                   b, N)
        want = _reference(kind, operand, args)
        np.testing.assert_allclose(blocked, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
        np.testing.assert_array_equal(blocked.view(np.uint32), plain.view(np.uint32))


def _emulated(kern, sources, bufs, b, n):
    """Each of the CUDA `sources` of `kern` run through cuda_emulation on `bufs` (input -> array) at B = b."""
    outs = []
    for src in sources:
        outs.append(np.full((b, n), np.nan, np.float32))
        cuda_emulation.run(src, [outs[-1]] + [np.ascontiguousarray(bufs[i]).ravel() for i in kern.buffers[1:]],
                           var_values={"B": b})
    return outs


def _unblocked_and_blocked(kern, monkeypatch) -> list:
    """The CUDA sources of `kern` with a column a lane group and with blocks taken at any width."""
    sources = []
    monkeypatch.setattr(row_plan, "BLOCK_MIN_GROUPS", 0)
    for blocks in ((), row_plan.BLOCK_COLUMNS):
        monkeypatch.setattr(row_plan, "BLOCK_COLUMNS", blocks)
        sources.append(CUDA_TARGET.render(gpu_launch.launch(optimize(kern.ast, "cuda"), CUDA)))
    return sources


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
@pytest.mark.parametrize("kind", ["q4_0", "q5_0", "q5_1", "q4_k", "q6_k"])
def test_every_kind_blocked_equals_the_unblocked_bit_for_bit(kind, monkeypatch):
    """x @ W.T of each other block kind (random blocks, finite weights; k = 768: 48 held values a lane, blocks of
    2 columns of the 130) through cuda_emulation at B = 1, 37 and 64: NumPy's, and bit for bit the unblocked
    kernel's."""
    from .test_quant_matvec import _blocks
    n, k, rng = 130, 768, np.random.default_rng(1)
    f = pj.prepare(lambda x, b: x @ pj.quant.dequantize(b, kind).T, vars={"B": (1, MOST)}, shapes={"x": ("B", k)})
    blocks = _blocks(rng, kind, n, k)
    traced = pj.trace(f, np.zeros((3, k), np.float32), blocks)
    sched = schedule(list(traced.outputs), list(traced.inputs))
    (kern,) = sched.kernels
    sources = _unblocked_and_blocked(kern, monkeypatch)
    assert gpu_launch.launch_of(gpu_launch.launch(optimize(kern.ast, "cuda"), CUDA))[4:] == (2,)
    w = pj.quant.dequantize(blocks, kind).astype(np.float64)
    for b in (1, 37, 64):
        x = rng.standard_normal((b, k)).astype(np.float32)
        plain, blocked = _emulated(kern, sources, dict(zip(sched.inputs, (x, blocks))), b, n)
        want = x.astype(np.float64) @ w.T
        np.testing.assert_allclose(blocked, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
        np.testing.assert_array_equal(blocked.view(np.uint32), plain.view(np.uint32))


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
def test_blocked_swiglu_equals_the_unblocked_bit_for_bit(monkeypatch):
    """SiLU(gate) * up of one contraction (two sums a column, 72 held values a lane: blocks of 2) through
    cuda_emulation at B = 3 and 37 (one ragged chunk, several; the blocks at B = 1 and 64: the emulated blocked
    kernel test): NumPy's, and bit for bit the unblocked kernel's."""
    traced = pj.trace(_swiglu_prepared("q4_1"), *_swiglu_args("q4_1", 3))
    sched = schedule(list(traced.outputs), list(traced.inputs))
    (kern,) = sched.kernels
    sources = _unblocked_and_blocked(kern, monkeypatch)
    assert gpu_launch.launch_of(gpu_launch.launch(optimize(kern.ast, "cuda"), CUDA))[4:] == (2,)
    for b in (3, 37):
        x, blocks = _swiglu_args("q4_1", b, seed=b)
        want = swiglu(np, "q4_1")(x.astype(np.float64), pj.quant.dequantize(blocks, "q4_1").astype(np.float64))
        plain, blocked = _emulated(kern, sources, dict(zip(sched.inputs, (x, blocks))), b, N)
        np.testing.assert_allclose(blocked, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
        np.testing.assert_array_equal(blocked.view(np.uint32), plain.view(np.uint32))


def test_gate_and_up_read_their_row_as_one_value():
    """Gate/up's two sums of a column run over one set of ranges in the launched kernel (row_plan.share_batch_ranges),
    so they read the row's elements as the same loads, which the kernel makes once for both (one pass). Before: two
    sets of ranges, the row loaded twice."""
    traced = pj.trace(_swiglu_prepared("q4_1"), *_swiglu_args("q4_1", 3))
    (kern,) = schedule(list(traced.outputs), list(traced.inputs)).kernels
    launched = gpu_launch.launch(optimize(kern.ast, "cuda"), CUDA)
    sums = [u for u in launched.toposort() if u.op is Ops.REDUCE]
    assert len(sums) == 2 and sums[0].src[1:] == sums[1].src[1:]
    rows = [{x for x in u.src[0].toposort() if x.op is Ops.LOAD and x.dtype.is_float} for u in sums]   # (x's)
    assert rows[0] and rows[0] == rows[1]


def test_a_gathered_q8_0_row_in_an_epilogue_equals_numpys(device):
    """h[ids] + x @ W.T with h a Q8_0 token table gathered by the batch's ids (a decode step's first residual) equals
    NumPy's at 1 to 37 rows: the batch row kernel's epilogue widens each gathered block's float16 scale (on OpenCL,
    PoCL widened it wrong through vload_half after the kernel's barriers: 25-50% errors from 5 rows on)."""
    rng = np.random.default_rng(0)
    table = pj.quant.quantize(rng.standard_normal((256, K)).astype(np.float32), "q8_0")
    blocks = pj.quant.quantize((rng.standard_normal((K, K)) / np.sqrt(K)).astype(np.float32), "q4_1")
    f = pj.prepare(lambda ids, t, x, b: pj.quant.dequantize(t[ids], "q8_0") + x @ pj.quant.dequantize(b, "q4_1").T,
                   vars={"B": (1, MOST)}, shapes={"ids": ("B",), "x": ("B", K)}, device=device)
    rows, w = pj.quant.dequantize(table, "q8_0").astype(np.float64), pj.quant.dequantize(blocks, "q4_1")
    for b in (1, 5, 17, 37):
        ids, x = rng.integers(0, 256, b), rng.standard_normal((b, K)).astype(np.float32)
        want = rows[ids] + x.astype(np.float64) @ w.T.astype(np.float64)
        got = np.asarray(f(ids, table, x, blocks))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
