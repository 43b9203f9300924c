"""Contractions of 16-bit floats on tensor cores (render_fragments.py): the launch decides the fragments on the AST
for dialects that have matrix instructions (CUDA), the kernel multiplies with them, and the products equal NumPy's
on every device (where the launch has no fragments, the same tests check the float32 tiles and the cpu). Float32
contractions whose precision is "tf32" (m16n8k8 on tf32-rounded operands, bit-equal to its emulation) or "bf16"
(operands rounded to bfloat16) too."""
import itertools
import re

import ml_dtypes
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen import gpu_launch, render_fragments, render_tiles
from prepjit.codegen.gpu_launch import launch, launch_of
from prepjit.codegen.optimize import optimize
from prepjit.codegen.render_tiles import SHAPES
from prepjit.codegen.render_cuda import CUDA, render_cuda
from prepjit.codegen.schedule import schedule
from prepjit.codegen.targets import CUDA_TARGET
from prepjit.codegen.render_opencl import OPENCL, render_opencl
from prepjit.uop import Ops, UOp, dtypes

from . import cuda_emulation
from .test_render_opencl import kernel, load, loop

NARROW = {"bfloat16": (dtypes.bfloat16, ml_dtypes.bfloat16), "float16": (dtypes.float16, np.float16)}


def matmul_kernel(dtype, m=256, n=192, k=64):
    i, j = loop(UOp.const(m), 0), loop(UOp.const(n), 1)
    r = UOp(Ops.RANGE, dtypes.index, (UOp.const(k),), (2, "reduce"))
    a, b = load(1, dtype, i * k + r), load(2, dtype, r * n + j)
    if dtype != dtypes.float32:
        a, b = a.cast(dtypes.float32), b.cast(dtypes.float32)
    return kernel(UOp(Ops.REDUCE, dtypes.float32, (a * b, r), Ops.ADD), i * n + j, "r_m_n")


def declares_tiles(source: str, element: str, stages: int | None = None) -> bool:
    """Whether the kernel declares its A tiles of `element` values (`stages` of them where given): a static local
    array, or one in dynamic local memory (past render_fragments.STATIC_LOCAL_BYTES)."""
    first = rf"\[{stages}\]" if stages is not None else r"\["
    return re.search(rf"{element} (As|\(&As\)){first}", source) is not None


@pytest.mark.parametrize("name", list(NARROW))
def test_sixteen_bit_contractions_launch_on_tensor_cores_in_cuda(name):
    ast = matmul_kernel(NARROW[name][0])
    assert launch_of(launch(ast, CUDA))[4:] == (name,)
    kind = "bf16" if name == "bfloat16" else "f16"
    source = render_cuda(ast).source
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32" in source and f"pj_mma_{kind}(acc0_0_0" in source
    assert declares_tiles(source, "unsigned short")   # the slices staged as 16-bit values
    # a's rows along k: plain matrix loads; b's along its columns: transposed ones; both copied asynchronously
    assert "pj_ldmatrix_x4(a0_0" in source and "pj_ldmatrix_x4_trans(b0_0" in source
    assert "cp.async.cg.shared.global" in source and "pj_cp_async16(dst, src)" in source
    assert launch_of(launch(ast, OPENCL))[4:] == () and "mma" not in render_opencl(ast).source
    # its 32 x 128 tile has no warpgroup variant; a 128 x 128 one has both, the GPU's compiler keeping one
    assert "wgmma.mma_async" not in source and "#if PJ_WGMMA" not in source
    wide = render_cuda(ast, (128, 128, 1, name)).source
    assert f"wgmma.mma_async.sync.aligned.m64n128k16.f32.{kind}.{kind}" in wide and "#if PJ_WGMMA" in wide
    assert f"pj_wgmma_{kind}_n128_01(wacc0, " in wide and f"pj_mma_{kind}(acc0_0_0" in wide   # b along its columns
    # two warpgroups of 64 rows (FRAGMENT_OUTPUTS), two tiles a multiprocessor (RESIDENT_TILES)
    assert "__launch_bounds__(256, 2)" in wide and render_cuda(ast, (128, 128, 1, name)).local_size == (256,)


def test_float32_contractions_keep_their_fma_tiles():
    ast = matmul_kernel(dtypes.float32)
    assert len(launch_of(launch(ast, CUDA))) == 4 and "mma" not in render_cuda(ast).source


@pytest.mark.parametrize("name", list(NARROW))
@pytest.mark.parametrize("m, n, k, batch", [(256, 192, 64, 1), (70, 45, 33, 1), (128, 96, 40, 3)])
def test_sixteen_bit_matmuls_equal_numpy(device, name, m, n, k, batch):
    """Tensor-core tiles on a CUDA device (every edge partial in 70 x 45 x 33, a partial slice at k = 40, a batch),
    float32 tiles or the cpu's kernels elsewhere: float32 products of the 16-bit values summed in float32."""
    np_dtype = NARROW[name][1]
    rng = np.random.default_rng(0)
    a = rng.standard_normal((batch, m, k), np.float32).astype(np_dtype)
    b = rng.standard_normal((batch, k, n), np.float32).astype(np_dtype)
    f = pj.prepare(lambda x, y: pnp.matmul(x, y, preferred_element_type=pnp.float32), device=device)
    got = np.asarray(f(a, b))
    want = a.astype(np.float32) @ b.astype(np.float32)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4 * np.sqrt(k))


def strided_narrow_kernel(dtype, m, n, k, a_t=False, b_t=False, batch=1, offset=0, scale_b=False):
    """out[p, i, j] = sum_r a[p, i, r] * b[p, r, j] + 1 over 16-bit operands widened to float32: a stored (m, k) or
    transposed (k, m), b (k, n) or (n, k), each `offset` elements into its buffer (an unaligned view), b times 2 (in its
    16-bit float) where `scale_b` (a computed operand)."""
    p, i, j = loop(UOp.const(batch), 0), loop(UOp.const(m), 1), loop(UOp.const(n), 2)
    r = UOp(Ops.RANGE, dtypes.index, (UOp.const(k),), (3, "reduce"))
    a = load(1, dtype, p * (m * k) + (r * m + i if a_t else i * k + r) + offset).cast(dtypes.float32)
    b = load(2, dtype, p * (k * n) + (j * k + r if b_t else r * n + j) + offset)
    b = (b * UOp.const(2.0, dtype) if scale_b else b).cast(dtypes.float32)
    total = UOp(Ops.REDUCE, dtypes.float32, (a * b, r), Ops.ADD)
    return kernel(total + UOp.const(1.0, dtypes.float32), (p * m + i) * n + j, "r_p_m_n")


def emulate(ast, np_dtype, m, n, k, a_t=False, b_t=False, batch=1, offset=0, scale_b=False, tile=None, seed=0,
            tensor_cores=True, wgmma=False):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((batch, m, k), np.float32).astype(np_dtype)
    b = rng.standard_normal((batch, k, n), np.float32).astype(np_dtype)
    a_mem = np.ascontiguousarray(np.swapaxes(a, 1, 2)) if a_t else a
    b_mem = np.ascontiguousarray(np.swapaxes(b, 1, 2)) if b_t else b
    pad = np.zeros(offset, np_dtype)
    out = np.zeros(batch * m * n, np.float32)
    src = render_cuda(ast, tile)
    assert "pj_mma_" in src.source
    cuda_emulation.run(src, [out, np.concatenate([pad, a_mem.ravel()]).view(np.uint16),
                             np.concatenate([pad, b_mem.ravel()]).view(np.uint16)], tensor_cores, wgmma)
    want = a.astype(np.float32) @ (b.astype(np.float32) * (2 if scale_b else 1)) + 1
    np.testing.assert_allclose(out.reshape(batch, m, n), want, rtol=1e-5, atol=1e-4 * np.sqrt(k), err_msg=str(tile))


EMULATED = pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")


@EMULATED
@pytest.mark.parametrize("wgmma", [False, True], ids=["mma_sync", "wgmma"])
@pytest.mark.parametrize("name", list(NARROW))
@pytest.mark.parametrize("m, n, k, a_t, b_t, batch, offset, scale_b", [
    (256, 192, 64, False, False, 1, 0, False),   # a along k, b along its columns: copies, ldmatrix and .trans
    (70, 45, 33, False, False, 1, 0, False),     # every edge partial: b's columns no multiple of 8, a partial slice
    (130, 136, 40, True, True, 1, 0, False),     # both transposed: a along its rows (.trans), b along k
    (128, 96, 40, False, False, 2, 1, False),    # a batch, both views one element in: no aligned chunk, element copies
    (96, 128, 48, False, False, 1, 0, True),     # b computed (b * 2 in its 16-bit float): element copies
])
def test_tensor_core_kernels_compute_the_matmul(name, m, n, k, a_t, b_t, batch, offset, scale_b, wgmma):
    """The CUDA tensor-core kernel, run on the CPU through cuda_emulation (mma.sync, ldmatrix and cp.async emulated
    from the PTX ISA's layouts; with `wgmma` compiled as for sm_90a: wgmma reading the swizzled tiles through its
    matrix descriptors, emulated from the descriptor and swizzle formats), equals NumPy's float32 matmul."""
    dtype, np_dtype = NARROW[name]
    if name == "float16" and not cuda_emulation.F16C:
        pytest.skip("the emulation converts float16 with x86-64's F16C")
    ast = strided_narrow_kernel(dtype, m, n, k, a_t, b_t, batch, offset, scale_b)
    emulate(ast, np_dtype, m, n, k, a_t, b_t, batch, offset, scale_b, wgmma=wgmma)


@EMULATED
@pytest.mark.parametrize("wgmma", [False, True], ids=["mma_sync", "wgmma"])
@pytest.mark.parametrize("a_t, b_t", [(False, False), (True, True)])
def test_every_tensor_core_tile_shape_computes_the_matmul(wgmma, a_t, b_t):
    """Each tile shape PREPJIT_TUNE may pick, on tensor cores (a warpgroup per FRAGMENT_OUTPUTS outputs: its warps
    each a part of the tile, or warpgroup instructions where the tile's rows are a multiple of 64 and the GPU has
    wgmma), with ragged edges on both sides and a partial
    slice, both operands' tiles minor along k or both along their own axes (128- and 64-byte swizzles)."""
    m, n, k = 200, 136, 40
    ast = strided_narrow_kernel(dtypes.bfloat16, m, n, k, a_t, b_t)
    for tm, tn in SHAPES:
        tile = (tm, tn, 1, "bfloat16")
        assert render_cuda(ast, tile).local_size == (render_tiles.fragment_threads(tm, tn),)
        emulate(ast, ml_dtypes.bfloat16, m, n, k, a_t, b_t, tile=tile, wgmma=wgmma)


def test_tiles_that_copy_their_operands_stage_more_slices_ahead(monkeypatch):
    """render_fragments.stages_for: as many stages as fit 64 KB, at most MAX_STAGES where both operands are copied (a
    64 x 64 bf16 tile's 8 KB slices: 8; 128 x 64: 5; 128 x 128: 4), at most UNPACKED_STAGES where one unpacks quantized
    blocks (a var batch's tile of one set of warps: 6 KB slices, 4)."""
    from .test_tensor_batch_tiles import _kernel   # (which imports this module)
    ast = strided_narrow_kernel(dtypes.bfloat16, 200, 136, 300)
    for (tm, tn), stages in (((64, 64), 8), ((128, 64), 5), ((128, 128), 4)):
        assert declares_tiles(render_cuda(ast, (tm, tn, 1, "bfloat16")).source, "unsigned short", stages), (tm, tn)
    monkeypatch.setattr(gpu_launch, "BATCH_TILE_WARPS", 0)   # (one set of warps)
    launched = CUDA_TARGET.launched(optimize(_kernel("q8_0", 576)[1].ast, "cuda"))
    assert launch_of(launched) == ("tile", 64, 32, 1, "bfloat16")
    assert declares_tiles(CUDA_TARGET.render(launched).source, "unsigned short", 4)


# render_fragments' knobs of the warpgroup kernels (the defaults first), each timed on a GPU before it is a default
HOPPER_LOCAL_BYTES = 200 * 1024   # (an H100 block may have 227 KB of local memory)
VARIANTS = [{}, {"FRAGMENT_OUTPUTS": 128 * 128, "WGMMA_IN_FLIGHT": 0},   # (the default before 2 warpgroups a tile)
            {"SLICE_K": 64, "MAX_LOCAL_BYTES": HOPPER_LOCAL_BYTES}]   # (64-deep slices: two stages in 64 KB, four here)


@pytest.fixture(params=VARIANTS, ids=lambda v: "-".join(f"{k}={x}" for k, x in v.items()) or "default")
def variant(request, monkeypatch):
    for knob, value in request.param.items():
        monkeypatch.setattr(render_tiles if knob == "FRAGMENT_OUTPUTS" else render_fragments, knob, value)
    return request.param


@EMULATED
@pytest.mark.parametrize("a_t, b_t", [(False, False), (True, True)])
def test_every_wgmma_variant_computes_the_matmul(variant, a_t, b_t):
    """Each variant of the warpgroup kernels (sm_90a, emulated with wgmma asynchronous: an instruction reads its
    stage and accumulators only when waited for, so a stage refilled too early shows) on tiles of 64 and 128 rows
    (one warpgroup) and of 128 x 256 and 256 x 128 (two warpgroups, 64 or 128 rows each; the mma.sync variant's 8
    warps too; with FRAGMENT_OUTPUTS 64 x 128, two warpgroups of 64 rows for 128 x 128 and four for the larger), ragged on both sides, k long enough for the stages to be refilled several times and a partial last
    slice, both 16-bit operands minor along k or along their own axes; tf32 with both along k: the same bits as its
    reference."""
    m, n, k = 200, 136, 300
    ast = strided_narrow_kernel(dtypes.bfloat16, m, n, k, a_t, b_t)
    for tm, tn in ((128, 128), (64, 128), (128, 64), (128, 256), (256, 128)):
        tile = (tm, tn, 1, "bfloat16")
        assert render_cuda(ast, tile).local_size == (128 * max(1, tm * tn // render_tiles.FRAGMENT_OUTPUTS),)
        emulate(ast, ml_dtypes.bfloat16, m, n, k, a_t, b_t, tile=tile, wgmma=True)
        if tm * tn > 128 ** 2:
            emulate(ast, ml_dtypes.bfloat16, m, n, k, a_t, b_t, tile=tile)
    for tile in ((128, 128, 1, "tf32"), (256, 128, 1, "tf32")) if not a_t else ():   # (its own layout: once a variant)
        got, a, b = emulate_float32("tf32", m, n, k, False, True, tile=tile, wgmma=True)
        np.testing.assert_array_equal(got, tf32_reference(a, b) + np.float32(1))


@EMULATED
@pytest.mark.parametrize("name", list(NARROW))
def test_gpus_before_sm80_get_the_same_products_without_tensor_cores(name):
    """The helpers' own code for GPUs older than sm_80 (mma from shuffles, ldmatrix from shuffled row addresses,
    plain copies), run through cuda_emulation with __CUDA_ARCH__ undefined: the same matmul, ragged and transposed."""
    dtype, np_dtype = NARROW[name]
    if name == "float16" and not cuda_emulation.F16C:
        pytest.skip("the emulation converts float16 with x86-64's F16C")
    for m, n, k, a_t, b_t in ((70, 45, 33, False, False), (130, 136, 40, True, True), (96, 64, 64, False, False)):
        emulate(strided_narrow_kernel(dtype, m, n, k, a_t, b_t), np_dtype, m, n, k, a_t, b_t, tensor_cores=False)


def tf32(x: np.ndarray) -> np.ndarray:
    """float32 rounded to tf32 as cvt.rna.tf32.f32 (to nearest, ties away from zero: the low 13 bits dropped)."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x1000) & 0xFFFFE000).astype(np.uint32).view(np.float32)


def tf32_reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Operands rounded to tf32, their (exact) products summed in float32 in k order: the emulated instruction's
    arithmetic, so the kernel's result equals it bit for bit."""
    a, b = tf32(a), tf32(b)
    out = np.zeros(a.shape[:-1] + b.shape[-1:], np.float32)
    for r in range(a.shape[-1]):
        out = (out + a[..., r:r + 1] * b[..., r:r + 1, :]).astype(np.float32)
    return out


def float32_kernel(m, n, k, precision, a_t=False, b_t=False, batch=1, offset=0, scale_b=False):
    """strided_narrow_kernel's contraction over float32 operands, its product carrying `precision` (None: exact)."""
    p, i, j = loop(UOp.const(batch), 0), loop(UOp.const(m), 1), loop(UOp.const(n), 2)
    r = UOp(Ops.RANGE, dtypes.index, (UOp.const(k),), (3, "reduce"))
    a = load(1, dtypes.float32, p * (m * k) + (r * m + i if a_t else i * k + r) + offset)
    b = load(2, dtypes.float32, p * (k * n) + (j * k + r if b_t else r * n + j) + offset)
    b = b * UOp.const(2.0, dtypes.float32) if scale_b else b
    total = UOp(Ops.REDUCE, dtypes.float32, (UOp(Ops.MUL, dtypes.float32, (a, b), precision), r), Ops.ADD)
    return kernel(total + UOp.const(1.0, dtypes.float32), (p * m + i) * n + j, "r_p_m_n")


def emulate_float32(precision, m, n, k, a_t=False, b_t=False, batch=1, offset=0, scale_b=False, tile=None,
                    tensor_cores=True, seed=0, wgmma=False):
    """The float32 contraction under `precision` rendered for CUDA and run through cuda_emulation: (result, a, b)."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((batch, m, k), np.float32)
    b = rng.standard_normal((batch, k, n), np.float32)
    a_mem = np.ascontiguousarray(np.swapaxes(a, 1, 2)) if a_t else a
    b_mem = np.ascontiguousarray(np.swapaxes(b, 1, 2)) if b_t else b
    pad = np.zeros(offset, np.float32)
    out = np.zeros(batch * m * n, np.float32)
    src = render_cuda(float32_kernel(m, n, k, precision, a_t, b_t, batch, offset, scale_b), tile)
    cuda_emulation.run(src, [out, np.concatenate([pad, a_mem.ravel()]), np.concatenate([pad, b_mem.ravel()])],
                       tensor_cores, wgmma)
    return out.reshape(batch, m, n), a, b * (2 if scale_b else 1)


TF32_CASES = [
    (256, 192, 64, False, False, 1, 0, False),   # a along k (matrix loads), b along its columns (a load a register)
    (70, 45, 33, False, False, 1, 0, False),     # every edge partial: b's columns no multiple of 4, a partial slice
    (130, 136, 40, True, True, 1, 0, False),     # both transposed: a along its rows (loads), b along k (matrix loads)
    (128, 96, 40, False, False, 2, 1, False),    # a batch, both views one element in: no aligned chunk, element copies
    (96, 128, 48, False, False, 1, 0, True),     # b computed (b * 2): element copies
    (256, 136, 40, False, True, 1, 0, False),    # both along k (x @ W.T): matrix loads, and wgmma on sm_90a
    (130, 96, 33, False, True, 2, 1, False),     # the same ragged, batched, unaligned
]


def test_tf32_contractions_launch_on_tensor_cores_in_cuda():
    """A float32 contraction whose product carries "tf32" gets tf32 fragments (m16n8k8, operands rounded by
    cvt.rna.tf32.f32, staged as float32 and copied asynchronously), "bf16" the bfloat16 fragments; without a
    precision it keeps its FMA tiles; OpenCL has no tensor cores."""
    ast = float32_kernel(256, 192, 64, "tf32")
    assert launch_of(launch(ast, CUDA))[4:] == ("tf32",)
    source = render_cuda(ast).source
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in source and "pj_mma_tf32(acc0_0_0" in source
    assert "cvt.rna.tf32.f32" in source and "a0_0 = pj_round_tf32(a0_0)" in source
    assert declares_tiles(source, "float") and "pj_cp_async16(dst, src)" in source and "pj_ldmatrix_x4(a0_0" in source
    assert "m16n8k16" not in source and "wgmma.mma_async" not in render_cuda(ast, (128, 128, 1, "tf32")).source
    both_k = render_cuda(float32_kernel(256, 192, 64, "tf32", b_t=True), (128, 128, 1, "tf32")).source
    assert "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32" in both_k and "pj_mma_tf32(acc0_0_0" in both_k
    assert launch_of(launch(float32_kernel(256, 192, 64, "bf16"), CUDA))[4:] == ("bfloat16",)
    assert "m16n8k16.row.col.f32.bf16" in render_cuda(float32_kernel(256, 192, 64, "bf16")).source
    assert len(launch_of(launch(float32_kernel(256, 192, 64, None), CUDA))) == 4
    assert launch_of(launch(ast, OPENCL))[4:] == () and "mma" not in render_opencl(ast).source


@EMULATED
@pytest.mark.parametrize("wgmma", [False, True], ids=["mma_sync", "wgmma"])
@pytest.mark.parametrize("m, n, k, a_t, b_t, batch, offset, scale_b", TF32_CASES)
def test_tf32_kernels_round_operands_and_sum_in_float32(m, n, k, a_t, b_t, batch, offset, scale_b, wgmma):
    """The tf32 tensor-core kernel through cuda_emulation (m16n8k8 emulated from the PTX ISA's fragment layouts,
    reading only the tf32 bits of its operands; with `wgmma` compiled as for sm_90a, where tiles of rows a multiple of
    64 with both operands along k use wgmma m64nNk8 on the local tiles, rounded there) equals, bit for bit, operands
    rounded to tf32 (RNA) with products summed in float32 in k order, and is within tf32's error of the float64
    product."""
    got, a, b = emulate_float32("tf32", m, n, k, a_t, b_t, batch, offset, scale_b, wgmma=wgmma)
    np.testing.assert_array_equal(got, (tf32_reference(a, b) + np.float32(1)).astype(np.float32))
    exact = a.astype(np.float64) @ b + 1
    assert np.abs(got - exact).max() <= 2.0 ** -10 * (np.abs(a) @ np.abs(b)).max()
    assert np.abs(got - exact).max() > 1e-5   # (not the exact product: the operands were rounded)


@EMULATED
@pytest.mark.parametrize("a_t, b_t, wgmma", [(False, False, False), (True, True, False), (False, True, True)])
def test_every_tf32_tile_shape_and_gpus_before_sm80(a_t, b_t, wgmma):
    """Each tile shape PREPJIT_TUNE may pick, ragged on both sides with a partial slice (with both operands along k
    also as for sm_90a: wgmma where the rows are a multiple of 64); and the helpers' own code for GPUs older than
    sm_80 (shuffles, __CUDA_ARCH__ undefined): the same bits."""
    m, n, k = 200, 136, 40
    for tm, tn in SHAPES:
        got, a, b = emulate_float32("tf32", m, n, k, a_t, b_t, tile=(tm, tn, 1, "tf32"), wgmma=wgmma)
        np.testing.assert_array_equal(got, tf32_reference(a, b) + np.float32(1), err_msg=str((tm, tn)))
    got, a, b = emulate_float32("tf32", m, n, k, a_t, b_t, tensor_cores=False)
    np.testing.assert_array_equal(got, tf32_reference(a, b) + np.float32(1))


@EMULATED
@pytest.mark.parametrize("a_t, b_t", [(False, False), (True, True)])
def test_bf16_precision_rounds_float32_operands_to_bfloat16(a_t, b_t):
    """"bf16": the float32 operands rounded to bfloat16 (nearest even, as ml_dtypes) on the bfloat16 fragments,
    products summed in float32."""
    m, n, k = 130, 96, 40
    got, a, b = emulate_float32("bf16", m, n, k, a_t, b_t)
    rounded = a.astype(ml_dtypes.bfloat16).astype(np.float32) @ b.astype(ml_dtypes.bfloat16).astype(np.float32) + 1
    np.testing.assert_allclose(got, rounded, rtol=1e-5, atol=1e-4 * np.sqrt(k))
    assert np.abs(got - (a.astype(np.float64) @ b + 1)).max() > 1e-3


def test_traced_precision_selects_the_kernel():
    """Through tracing: pnp.matmul(precision="tf32") (and the default's context) renders the tf32 tensor-core
    kernel for CUDA; "highest" (the default) keeps the exact float32 FMA tiles."""
    a, b = np.ones((256, 64), np.float32), np.ones((64, 192), np.float32)

    def source(fn):
        traced = pj.trace(pj.prepare(fn), a, b)
        (k,) = schedule(list(traced.outputs), list(traced.inputs)).kernels
        return render_cuda(k.ast).source
    assert "m16n8k8" in source(lambda x, y: pnp.matmul(x, y, precision="tf32"))
    with pj.default_matmul_precision("tensorfloat32"):
        assert "m16n8k8" in source(lambda x, y: x @ y)
    assert "mma" not in source(lambda x, y: x @ y)
    assert "mma" not in source(lambda x, y: pnp.matmul(x, y, precision="highest"))
    assert "m16n8k16.row.col.f32.bf16" in source(lambda x, y: pnp.matmul(x, y, precision="bf16"))


def working_nvrtc():
    """NVRTC, where it loads and compiles here (else the test is skipped)."""
    from prepjit.runtime.nvrtc import NVRTC
    try:
        nvrtc = NVRTC()
        nvrtc.compile("probe", 'extern "C" __global__ void probe(int *a) { a[0] = 1; }', ["-arch=sm_80"])
    except (pj.DeviceError, pj.CompileError) as e:
        pytest.skip(f"no working NVRTC here ({str(e).splitlines()[0]})")
    return nvrtc


def test_tf32_kernels_compile_with_nvrtc_for_sm80_and_sm90():
    """The tf32 (and float32-under-bf16) tile kernels, k-minor and transposed operands, compile for sm_80, sm_90 and
    sm_90a (wgmma for both operands along k) (NVRTC alone: its inline PTX is checked by ptxas)."""
    nvrtc = working_nvrtc()
    for precision, a_t, b_t, tile in (("tf32", False, False, None), ("tf32", True, True, (128, 128, 1, "tf32")),
                                      ("tf32", False, True, (128, 128, 1, "tf32")), ("bf16", False, False, None)):
        src = render_cuda(float32_kernel(256, 192, 64, precision, a_t, b_t), tile)
        for arch in ("sm_80", "sm_90", "sm_90a"):
            nvrtc.compile(src.name, src.source, [f"-arch={arch}", "-std=c++17", "--fmad=false"])


def test_every_wgmma_variant_compiles_with_nvrtc_for_sm90a_and_sm80(variant):
    """Each variant's 4096^3 kernels (16-bit operands along k or along their own axes, tf32 both along k) compile for
    sm_90a (wgmma) and sm_80 (mma.sync), ptxas checking their inline PTX and local memory; tiles beyond 48 KB are
    in dynamic local memory, whose size the runtime reads from the cubin (cuda_cubin.py), 0 for static tiles."""
    from prepjit.runtime.cuda_cubin import dynamic_local_bytes
    nvrtc = working_nvrtc()
    kernels = [(strided_narrow_kernel(dtypes.bfloat16, 4096, 4096, 4096, t, t), "bfloat16") for t in (False, True)]
    kernels.append((float32_kernel(4096, 4096, 4096, "tf32", b_t=True), "tf32"))
    for (ast, kind), tile in itertools.product(kernels, ((128, 128), (128, 256))):
        src = render_cuda(ast, (*tile, 1, kind))
        # (a warp-specialised tile declares its Hopper variant's size and the others': PJ_WARP_SPECIALISED ? x : y)
        declared = re.search(r"pj_dynamic_local_bytes = (?:PJ_WARP_SPECIALISED \? (\d+) : )?(\d+);", src.source)
        for arch in ("sm_90a", "sm_80"):
            cubin = nvrtc.compile(src.name, src.source, [f"-arch={arch}", "-std=c++17", "--fmad=false"])
            size = (declared.group(1) if arch == "sm_90a" else None) or declared.group(2) if declared else 0
            assert dynamic_local_bytes(cubin) == int(size)
        if tile == (128, 128):   # (four 32-deep stages of 128 x 128, or two 64-deep ones: 64 KB, beyond static's 48)
            assert declared is not None
            # 16-bit tiles of two warpgroups: three 64-deep stages of the warp-specialised variant on sm_90a (96 KB)
            specialised = kind == "bfloat16" and "FRAGMENT_OUTPUTS" not in variant
            assert (declared.group(1) == str(96 * 1024)) == specialised, declared.group(0)


@EMULATED
def test_traced_tf32_matmul_with_an_epilogue_runs_as_emulated():
    """The scheduled kernel of a traced x @ W.T under "tf32" with a fused bias and tanh (both operands k-minor) runs
    through cuda_emulation: the tf32 reference's products, then the epilogue (tanh within float32's error)."""
    rng = np.random.default_rng(5)
    x, w, bias = (rng.standard_normal(s, np.float32) for s in ((96, 40), (72, 40), (72,)))
    traced = pj.trace(pj.prepare(lambda x, w, c: pnp.tanh(pnp.matmul(x, w.T, precision="tf32") + c)), x, w, bias)
    (k,) = schedule(list(traced.outputs), list(traced.inputs)).kernels
    src = render_cuda(k.ast)
    assert "pj_mma_tf32(" in src.source and "pj_ldmatrix_x4(b0_0" in src.source
    out = np.zeros(96 * 72, np.float32)
    cuda_emulation.run(src, [out, x, w, bias])
    np.testing.assert_allclose(out.reshape(96, 72), np.tanh(tf32_reference(x, w.T) + bias), rtol=2e-6, atol=2e-6)


@EMULATED
@pytest.mark.parametrize("wgmma", [False, True], ids=["mma_sync", "wgmma"])
def test_a_head_merged_operand_is_copied_asynchronously(wgmma):
    """An attention's context (batch, heads, T, d) read by the output projection with its heads merged, (batch, T,
    heads * d) @ W: its index along k, (k // d) * T * d + k % d, steps by one inside every chunk of 8, so its chunks
    are copied as they are (cp.async; they were read and rounded one element at a time), and the product equals
    NumPy's."""
    rng = np.random.default_rng(0)
    heads, t, d, n = 4, 64, 32, 96
    ctx = rng.standard_normal((2, heads, t, d), np.float32).astype(ml_dtypes.bfloat16)
    w = rng.standard_normal((heads * d, n), np.float32).astype(ml_dtypes.bfloat16)
    traced = pj.trace(pj.prepare(lambda c, w: pnp.swapaxes(c, 1, 2).reshape(2, t, heads * d) @ w), ctx, w)
    (kern,) = schedule(list(traced.outputs), list(traced.inputs)).kernels
    ast = launch(kern.ast, CUDA)
    assert launch_of(ast)[4:] == ("bfloat16",)
    src = render_cuda(ast)
    assert "srcA0 = &buf1[" in src.source and "pj_cp_async16(dst, src)" in src.source
    out = np.zeros(2 * t * n, ml_dtypes.bfloat16)
    cuda_emulation.run(src, [out.view(np.uint16), ctx.ravel().view(np.uint16), w.ravel().view(np.uint16)],
                       wgmma=wgmma)
    want = np.swapaxes(ctx.astype(np.float32), 1, 2).reshape(2, t, heads * d) @ w.astype(np.float32)
    np.testing.assert_allclose(out.astype(np.float32).reshape(want.shape), want, rtol=2 ** -7, atol=1e-3)


@EMULATED
def test_warpgroup_descriptors_are_computed_once(monkeypatch):
    """A warpgroup tile's matrix descriptors of stage 0 are computed once, each slice's step an offset from them in
    16-byte units (a stage of a's 128 x 32 elements: 512; a step 32 bytes along a k-minor row: 2; 16 rows of b's
    128-byte blocks: 128); the products equal the descriptors computed from each address (DESCRIPTORS_ONCE off), bit
    for bit (ragged edges, a partial slice; both operands along k / their own axes)."""
    m, n, k = 200, 136, 104
    for a_t in (False, True):
        outs = []
        for once in (True, False):
            monkeypatch.setattr(render_fragments, "DESCRIPTORS_ONCE", once)
            ast = strided_narrow_kernel(dtypes.bfloat16, m, n, k, a_t, a_t)
            src = render_cuda(ast, (128, 64, 1, "bfloat16"))
            if not a_t:
                assert ("wdA1 = pj_wgmma_desc(&As[0][0][wg_m + 64][0], 16, 512, 2)" in src.source) == once
                assert ("pj_wgmma_desc_add(wdA1, (st * 512 + 2)), pj_wgmma_desc_add(wdB, (st * 256 + 128))"
                        in src.source) == once
            rng = np.random.default_rng(0)
            a = rng.standard_normal((k, m) if a_t else (m, k), np.float32).astype(ml_dtypes.bfloat16)
            b = rng.standard_normal((n, k) if a_t else (k, n), np.float32).astype(ml_dtypes.bfloat16)
            out = np.zeros(m * n, np.float32)
            cuda_emulation.run(src, [out, a.ravel().view(np.uint16), b.ravel().view(np.uint16)], True, True)
            outs.append(out)
        np.testing.assert_array_equal(outs[0], outs[1])
        want = (a.T if a_t else a).astype(np.float32) @ (b.T if a_t else b).astype(np.float32) + 1
        np.testing.assert_allclose(outs[0].reshape(m, n), want, rtol=1e-5, atol=1e-4 * np.sqrt(k))
