"""Quantized weights on tensor cores (render_tiles.fragment_kind, fragment_unpack.py): x @ pj.quant.dequantize(b,
kind).T under precision="bf16" with many rows (a prefill's var T up to 512) is a bfloat16 tensor-core tile, each weight
chunk unpacked from its blocks and rounded to bfloat16 as it is staged; a var batch of fewer than
gpu_launch.TENSOR_BATCH_ROWS (at its least) keeps its batch row kernel, and the default precision ("highest") the exact
FMA tile whatever the activations. Through cuda_emulation (mma.sync and wgmma) every kind equals NumPy's float32 model
of the dequantized weights rounded to bfloat16 (products summed in float32), and is within 2**-9 of each output's sum of
|x * w| of the unrounded model."""
import ml_dtypes
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen import gpu_launch
from prepjit.codegen.optimize import DEFAULT_BLOCKING, Blocking, optimize
from prepjit.codegen.schedule import schedule
from prepjit.codegen.targets import CUDA_TARGET

from . import cuda_emulation
from .test_quant_matvec import _blocks
from .test_render_fragments import working_nvrtc

N = 301          # columns: not a multiple of a tile's
KINDS = {"q8_0": 576, "q4_0": 576, "q4_1": 576, "q4_k": 512, "q6_k": 256}   # (k: whole blocks of the kind)


def _prepared(kind, k, most, dtype, precision, least=1):
    return pj.prepare(lambda x, b: pnp.matmul(x, pj.quant.dequantize(b, kind).T, precision=precision),
                      vars={"T": (least, most)}, shapes={"x": ("T", k)}), (
        np.ones((max(3, least), k), dtype), _blocks(np.random.default_rng(0), kind, N, k))


def _launched(kind, k, most, dtype=ml_dtypes.bfloat16, tile=None, precision="bf16", least=1):
    f, args = _prepared(kind, k, most, dtype, precision, least)
    traced = pj.trace(f, *args)
    sched = schedule(list(traced.outputs), list(traced.inputs))
    (kern,) = sched.kernels
    assert list(kern.buffers[1:]) == list(sched.inputs)   # (slots: the output, x, the blocks)
    return kern, CUDA_TARGET.launched(optimize(kern.ast, "cuda"), Blocking(tile=tile) if tile else DEFAULT_BLOCKING)


@pytest.mark.parametrize("kind", ["q8_0", "q4_1"])
def test_many_rows_under_bf16_precision_take_tensor_cores(kind):
    """A prefill's var T up to 512 of bfloat16 activations by a quantized weight under precision="bf16": a tile of
    bfloat16 fragments, the weight's chunks unpacked from the blocks a chunk at a time (its scale, and q4_1's min,
    read once a chunk, not once a weight) and stored as one 16-byte store; the default precision keeps the exact
    float32 FMA tile (bfloat16, float16 or float32 activations), a decode batch of at most FEW_VAR_ROWS its batch row
    kernel (from fewer than TENSOR_BATCH_ROWS rows; from that many: one tile of the batch)."""
    k = KINDS[kind]
    _, launched = _launched(kind, k, 512)
    # (64 x 32 tiles, k's 18 slices split between 3 sets of work-items: gpu_launch.unpacked_tile)
    assert gpu_launch.launch_of(launched) == ("tile", 64, 32, 3, "bfloat16")
    source = CUDA_TARGET.render(launched).source
    chunks = source.count("q[0] = pj_float_to_bfloat16(")   # (a chunk's 8 weights, then one 16-byte store)
    assert chunks == source.count("q[7] = pj_float_to_bfloat16(") == source.count("*(uint4 *)dst = uint4{q[0]") > 0
    assert source.count("= pj_half_to_float(") == chunks * (2 if kind == "q4_1" else 1)
    for dtype in (ml_dtypes.bfloat16, np.float16, np.float32):
        _, launched = _launched(kind, k, 512, dtype, precision=None)
        assert len(gpu_launch.launch_of(launched)) == 4   # (no fragments: exact float32)
    _, launched = _launched(kind, k, gpu_launch.TENSOR_BATCH_ROWS - 1)
    assert gpu_launch.launch_of(launched)[0] == "batch"
    _, launched = _launched(kind, k, gpu_launch.FEW_VAR_ROWS)
    assert gpu_launch.launch_of(launched)[0] == "batch"
    _, launched = _launched(kind, k, gpu_launch.FEW_VAR_ROWS, least=gpu_launch.TENSOR_BATCH_ROWS)
    assert gpu_launch.launch_of(launched)[:2] == ("tile", gpu_launch.FEW_VAR_ROWS)   # (test_tensor_batch_tiles.py)


def _check(out, x, blocks, kind):
    """`out` against NumPy: the weights rounded to bfloat16, products summed (float64 here); and within the
    rounding's bound (2**-9 of each product) of the unrounded float32 model."""
    w = pj.quant.dequantize(blocks, kind)
    x64 = x.astype(np.float64)
    rounded = x64 @ w.astype(ml_dtypes.bfloat16).astype(np.float64).T
    magnitude = np.abs(x64) @ np.abs(w.astype(np.float64)).T
    np.testing.assert_allclose(out, rounded, rtol=0, atol=1e-5 * magnitude.max())
    bound = 2.0 ** -9 * magnitude + 1e-5 * magnitude.max()
    assert (np.abs(out - x64 @ w.astype(np.float64).T) <= bound).all()


EMULATED = pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")


TILES = {"policy": (None, False), "policy-wgmma": (None, True), "128x128-wgmma": ((128, 128, 1, "bfloat16"), True),
         "4-sets": ((64, 32, 4, "bfloat16"), False), "4-sets-wgmma": ((64, 32, 4, "bfloat16"), True)}
# every kind's unpacking in the wgmma tiles; the mma.sync ones (4x as slow to emulate: ~10 s a kind), whose staging is
# the same, on q4_1 (and q6_k for the sets' even k split: q4_1's is ragged)
TILE_CASES = [(kind, tile) for kind in KINDS for tile in ("policy-wgmma", "128x128-wgmma")] + \
    [("q4_1", tile) for tile in TILES if tile not in ("policy-wgmma", "128x128-wgmma")] + \
    [("q6_k", "4-sets"), ("q6_k", "4-sets-wgmma")]


@EMULATED
@pytest.mark.parametrize("kind, tile", TILE_CASES, ids=[f"{tile}-{kind}" for kind, tile in TILE_CASES])
def test_emulated_quantized_tiles_equal_numpy(kind, tile):
    """The CUDA tile of bfloat16 activations by each kind's blocks, through cuda_emulation at T = 1, 37 and 130
    (ragged rows; 301 columns, ragged too), the policy's tile (64 x 32, k split between sets of work-items: mma.sync,
    and wgmma as on sm_90a), a 128 x 128 one and one of 4 sets (q4_1's 18 slices: two sets' last slice past k's
    end, zeros), equals NumPy (`_check`)."""
    tile, wgmma = TILES[tile]
    k = KINDS[kind]
    kern, launched = _launched(kind, k, 512, tile=tile)
    assert gpu_launch.launch_of(launched)[4:] == ("bfloat16",)
    src = CUDA_TARGET.render(launched)
    rng = np.random.default_rng(1)
    blocks = _blocks(rng, kind, N, k)
    for t in (1, 37, 130):
        x = rng.standard_normal((t, k)).astype(ml_dtypes.bfloat16)
        out = np.zeros((t, N), np.float32)
        cuda_emulation.run(src, [out, x.view(np.uint16).ravel(), blocks.ravel()], wgmma=wgmma, var_values={"T": t})
        _check(out, x, blocks, kind)


def test_quantized_tiles_compile_with_nvrtc():
    """The q4_1 and q6_k tiles (the policy's and 128 x 128: the warp-specialised variant on sm_90a) compile for
    sm_90a and sm_80."""
    nvrtc = working_nvrtc()
    for kind, tile in (("q4_1", None), ("q4_1", (128, 128, 1, "bfloat16")), ("q6_k", None)):
        src = CUDA_TARGET.render(_launched(kind, KINDS[kind], 512, tile=tile)[1])
        for arch in ("sm_90a", "sm_80"):
            nvrtc.compile(src.name, src.source, [f"-arch={arch}", "-std=c++17", "--fmad=false"])
