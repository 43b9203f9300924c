"""A var batch's quantized projection on tensor cores (gpu_launch.tensor_batch_tile): h + x @ pj.quant.dequantize(b,
kind).T of bfloat16 activations x (B, k) under precision="bf16", B a var of at most FEW_VAR_ROWS whose least is at
least TENSOR_BATCH_ROWS (a decode step's sequences: the kernel serves the var's whole range), is one tile of the whole
batch's rows by 32 columns (gpu_launch.BATCH_TILE), its k split between sets of warps, rather than the batch row
kernel; a range from fewer rows (a batch of one), under the exact default precision, or with the rule off, the batch
row kernel stays. SiLU(gate) * up of gate/up's one contraction is one tile of both sums (tile_pairs.py). Through
cuda_emulation (mma.sync, and wgmma as on sm_90a) at B = 32, 47 and 64 every kind equals NumPy's product with the
weights rounded to bfloat16 (test_fragment_unpack._check's tolerances); the launched kernel's accesses are proven
(rows past B unread)."""
import ml_dtypes
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen import gpu_launch
from prepjit.codegen.bounds import prove_launched
from prepjit.codegen.optimize import optimize
from prepjit.codegen.render_cuda import CUDA
from prepjit.codegen.schedule import schedule
from prepjit.codegen.targets import CUDA_TARGET

from . import cuda_emulation
from .test_fragment_unpack import _check
from .test_quant_matvec import _blocks
from .test_render_fragments import working_nvrtc

N, LEAST, MOST = 301, gpu_launch.TENSOR_BATCH_ROWS, 64   # (N: ragged for the tiles' 32 columns)
BATCHES = (LEAST, 47, MOST)   # (the least, past a 16-row fragment, the most)
KS = {"q8_0": 576, "q4_1": 576, "q4_0": 576, "q6_k": 768}   # (whole blocks of each kind)
EMULATED = pytest.mark.skipif(not cuda_emulation.available(),
                              reason="needs clang++ (the CPU emulation of CUDA kernels)")


def _kernel(kind, k, most=MOST, precision="bf16", dtype=ml_dtypes.bfloat16, n=N, least=LEAST):
    """The schedule and kernel of h + x @ W.T at a var batch B in least..most, W (n, k) in `kind` blocks."""
    f = pj.prepare(lambda x, h, b: h + pnp.matmul(x, pj.quant.dequantize(b, kind).T, precision=precision),
                   vars={"B": (least, most)}, shapes={"x": ("B", k), "h": ("B", n)})
    traced = pj.trace(f, np.ones((least, k), dtype), np.ones((least, n), np.float32),
                      _blocks(np.random.default_rng(0), kind, n, k))
    sched = schedule(list(traced.outputs), list(traced.inputs))
    (kern,) = sched.kernels
    return sched, kern


def _launch(kern):
    return gpu_launch.launch_of(CUDA_TARGET.launched(optimize(kern.ast, "cuda")))


def test_a_batch_of_many_rows_takes_a_tensor_core_tile(monkeypatch):
    """B in 32..64: a 64 x 32 tile (one tile's rows hold the batch), k's 18 slices between 6 sets of 4 warps (48's of
    k = 1536 too; fewer where the tiles are many); B of 32 only: the same tile; B from 1 or 31 (below
    TENSOR_BATCH_ROWS: the kernel serves a batch of one too), the exact default precision, float32 activations, or
    the rule off (TENSOR_BATCH_ROWS past FEW_VAR_ROWS): the batch row kernel. The launched tile's loads and store are
    proven (its rows past B are neither read nor written)."""
    sched, kern = _kernel("q4_1", 576)
    assert _launch(kern) == ("tile", 64, 32, 6, "bfloat16")
    launched = CUDA_TARGET.launched(optimize(kern.ast, "cuda"))
    b = pj.uop.UOp.variable("B", LEAST, MOST)
    shapes = dict(zip(sched.inputs, ((b, 576), (b, N), (N, 576 // 32 * 20))))
    assert prove_launched(launched, [(b, N)] + [shapes[i] for i in kern.buffers[1:]]) > 0   # (else it raises)
    assert _launch(_kernel("q4_1", 1536)[1]) == ("tile", 64, 32, 6, "bfloat16")
    # (a head of 49152 columns: 1536 tiles of one set give BATCH_TILE_WARPS; 3072: 96 tiles of 4 sets)
    assert _launch(_kernel("q8_0", 576, n=49152)[1]) == ("tile", 64, 32, 1, "bfloat16")
    assert _launch(_kernel("q4_1", 1536, n=3072)[1]) == ("tile", 64, 32, 4, "bfloat16")
    assert _launch(_kernel("q8_0", 576, most=32)[1]) == ("tile", 64, 32, 6, "bfloat16")
    assert _launch(_kernel("q8_0", 576, least=1)[1])[0] == "batch"
    assert _launch(_kernel("q8_0", 576, least=31)[1])[0] == "batch"
    assert _launch(_kernel("q8_0", 576, n=49152, least=1)[1])[0] == "batch"
    assert _launch(_kernel("q8_0", 576, precision=None)[1])[0] == "batch"
    assert _launch(_kernel("q8_0", 576, dtype=np.float32, precision=None)[1])[0] == "batch"
    monkeypatch.setattr(gpu_launch, "TENSOR_BATCH_ROWS", gpu_launch.FEW_VAR_ROWS + 1)
    assert gpu_launch.launch_of(gpu_launch.launch(optimize(kern.ast, "cuda"), CUDA))[0] == "batch"   # (uncached)


def _run(sched, kern, src, kind, k, b, wgmma, seed):
    rng = np.random.default_rng(seed)
    blocks = _blocks(rng, kind, N, k)
    x = rng.standard_normal((b, k)).astype(ml_dtypes.bfloat16)
    h = rng.standard_normal((b, N)).astype(np.float32)
    bufs = dict(zip(sched.inputs, (x.view(np.uint16), h, blocks)))
    out = np.full((b, N), np.nan, np.float32)
    cuda_emulation.run(src, [out] + [np.ascontiguousarray(bufs[i]).ravel() for i in kern.buffers[1:]],
                       wgmma=wgmma, var_values={"B": b})
    return out - h, x, blocks


@EMULATED
@pytest.mark.parametrize("kind, sets, wgmma",   # (every kind on Hopper's wgmma; sm_80's mma.sync on one: ~8 s each)
                         [(kind, 6, True) for kind in KS] + [("q8_0", 1, True), ("q4_1", 6, False)],
                         ids=lambda v: {True: "wgmma", False: "mma"}.get(v, str(v)) if isinstance(v, bool) else None)
def test_emulated_batch_tiles_equal_numpy(kind, sets, wgmma, monkeypatch):
    """Each kind's tile (the residual added in its epilogue; 6 sets of warps, and one as a head's: BATCH_TILE_WARPS
    0 here) through cuda_emulation at B = 32, 47 and 64 equals NumPy's product of the bfloat16-rounded weights,
    within 2**-9 of the float32 model's."""
    k = KS[kind]
    if sets == 1:
        monkeypatch.setattr(gpu_launch, "BATCH_TILE_WARPS", 0)
    sched, kern = _kernel(kind, k)
    launched = gpu_launch.launch(optimize(kern.ast, "cuda"), CUDA)   # (uncached: the monkeypatched constant)
    assert gpu_launch.launch_of(launched)[:4] == ("tile", 64, 32, sets)
    src = CUDA_TARGET.render(launched)
    for b in BATCHES:
        out, x, blocks = _run(sched, kern, src, kind, k, b, wgmma, seed=b)
        _check(out, x, blocks, kind)


def test_batch_tiles_compile_with_nvrtc():
    """The q4_1 tiles of k = 576 and 1536 (6 sets of warps: 108 KB of dynamic local memory on wgmma) and gate/up's
    paired tile compile for sm_90a and sm_80."""
    nvrtc = working_nvrtc()
    for kern in (_kernel("q4_1", 576)[1], _kernel("q4_1", 1536)[1], _swiglu("q4_1")[1]):
        src = CUDA_TARGET.render(CUDA_TARGET.launched(optimize(kern.ast, "cuda")))
        for arch in ("sm_90a", "sm_80"):
            nvrtc.compile(src.name, src.source, [f"-arch={arch}", "-std=c++17", "--fmad=false"])


PAIRED = 296   # gate/up's output columns: a multiple of a fragment's 8, ragged for a tile's 16


def _swiglu(kind, stacked=True, least=LEAST):
    """The schedule and kernel of SiLU(gate) * up of a var batch x (B in least..MOST, K) bfloat16: gate and up one
    contraction by
    their weights stacked (2 x PAIRED, K) in `kind` blocks, split after it (llama.swiglu, SiLU in float32), or
    (not `stacked`) two contractions by weights of their own."""
    k = KS[kind]

    def fn(x, blocks, other):
        if stacked:
            h = pnp.matmul(x, pj.quant.dequantize(blocks, kind).T, precision="bf16")
            gate, up = h[:, :PAIRED], h[:, PAIRED:]
        else:
            gate, up = (pnp.matmul(x, pj.quant.dequantize(b, kind).T, precision="bf16") for b in (blocks, other))
        return gate / (1 + pnp.exp(-gate)) * up
    f = pj.prepare(fn, vars={"B": (least, MOST)}, shapes={"x": ("B", k)})
    rng = np.random.default_rng(0)
    traced = pj.trace(f, np.ones((least, k), ml_dtypes.bfloat16), _blocks(rng, kind, (2 if stacked else 1) * PAIRED, k),
                      _blocks(rng, kind, PAIRED, k))
    sched = schedule(list(traced.outputs), list(traced.inputs))
    (kern,) = sched.kernels
    return sched, kern


@EMULATED
@pytest.mark.parametrize("kind, wgmma", [("q4_1", True), ("q8_0", True), ("q4_1", False)],   # (mma.sync: 12-16 s a kind)
                         ids=["wgmma-q4_1", "wgmma-q8_0", "mma-q4_1"])
def test_emulated_swiglu_tiles_equal_numpy(kind, wgmma):
    """SiLU(gate) * up of one contraction (one kernel: fused_reductions._in_slices) is one tile of both sums
    (tile_pairs.py: each output's gate and up sums in one work-item's accumulators, its launch ending with PAIR);
    through cuda_emulation at B = 32, 47 and 64 it equals NumPy's SiLU(gate) * up of the bfloat16-rounded weights (gate
    and up each within test_fragment_unpack._check's 1e-5 of their largest magnitude)."""
    from prepjit.codegen.tile_pairs import PAIR
    k = KS[kind]
    sched, kern = _swiglu(kind)
    launched = CUDA_TARGET.launched(optimize(kern.ast, "cuda"))
    assert gpu_launch.launch_of(launched) == ("tile", 64, 32, 6, "bfloat16", None, PAIR)
    assert _launch(_swiglu(kind, least=1)[1])[0] == "batch"   # (a batch of one in its range)
    b = pj.uop.UOp.variable("B", LEAST, MOST)
    shapes = dict(zip(sched.inputs, ((b, k), (2 * PAIRED, k // 32 * pj.quant.block_bytes(kind)))))
    assert prove_launched(launched, [(b, PAIRED)] + [shapes[i] for i in kern.buffers[1:]]) > 0
    src = CUDA_TARGET.render(launched)
    for b in BATCHES:
        rng = np.random.default_rng(b)
        blocks = pj.quant.quantize((rng.standard_normal((2 * PAIRED, k)) / np.sqrt(k)).astype(np.float32), kind)
        x = rng.standard_normal((b, k)).astype(ml_dtypes.bfloat16)
        bufs = dict(zip(sched.inputs, (x.view(np.uint16), blocks)))
        out = np.full((b, PAIRED), np.nan, np.float32)
        cuda_emulation.run(src, [out] + [np.ascontiguousarray(bufs[i]).ravel() for i in kern.buffers[1:]],
                           wgmma=wgmma, var_values={"B": b})
        w = pj.quant.dequantize(blocks, kind).astype(ml_dtypes.bfloat16).astype(np.float64)
        h = x.astype(np.float64) @ w.T
        gate, up = h[:, :PAIRED], h[:, PAIRED:]
        silu = gate / (1 + np.exp(-gate))
        # (an error e in gate moves SiLU(gate) by at most 1.1 e, times up; an error in up by SiLU(gate))
        tolerance = 1e-5 * np.abs(h).max() * (1.1 * np.abs(up) + np.abs(silu)) + 1e-6 * np.abs(silu * up).max()
        assert (np.abs(out - silu * up) <= tolerance).all()


def test_two_weights_of_their_own_keep_the_batch_kernel():
    """SiLU(x @ W1.T) * (x @ W2.T) of two weights (not one stacked weight's rows PAIRED apart) is no pair of a tile
    (tile_pairs.match_pair): its batch row kernel stays."""
    _, kern = _swiglu("q4_1", stacked=False)
    assert _launch(kern)[0] == "batch"
