"""Contractions of 16-bit floats on tensor cores (render_fragments.py): the launch decides the fragments on the AST
for dialects that have matrix instructions (CUDA), the kernel multiplies with them, and the products equal NumPy's
on every device (where the launch has no fragments, the same tests check the float32 tiles and the cpu)."""
import ml_dtypes
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen.gpu_launch import launch, launch_of
from prepjit.codegen.render_tiles import SHAPES
from prepjit.codegen.render_cuda import CUDA, render_cuda
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


@pytest.mark.parametrize("name", list(NARROW))
def test_sixteen_bit_contractions_launch_on_tensor_cores_in_cuda(name):
    ast = matmul_kernel(NARROW[name][0])
    assert launch_of(launch(ast, CUDA))[4:] == (name,)
    kind = "bf16" if name == "bfloat16" else "f16"
    source = render_cuda(ast).source
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32" in source and f"pj_mma_{kind}(acc0_0_0" in source
    assert "unsigned short As[" in source   # the slices staged as 16-bit values
    # a's rows along k: plain matrix loads; b's along its columns: transposed ones; both copied asynchronously
    assert "pj_ldmatrix_x4(a0_0" in source and "pj_ldmatrix_x4_trans(b0_0" in source
    assert "cp.async.cg.shared.global" in source and "pj_cp_async16(dst, src)" in source
    assert launch_of(launch(ast, OPENCL))[4:] == () and "mma" not in render_opencl(ast).source
    # its 32 x 128 tile has no warpgroup variant; a 128 x 128 one has both, the GPU's compiler keeping one
    assert "wgmma.mma_async" not in source and "#if PJ_WGMMA" not in source
    wide = render_cuda(ast, (128, 128, 1, name)).source
    assert f"wgmma.mma_async.sync.aligned.m64n128k16.f32.{kind}.{kind}" in wide and "#if PJ_WGMMA" in wide
    assert f"pj_wgmma_{kind}_n128_01(wacc1, " in wide and f"pj_mma_{kind}(acc0_0_0" in wide   # b along its columns


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
    """Each tile shape PREPJIT_TUNE may pick, on tensor cores (4 warps, each a quarter of the tile, or one warpgroup
    where the tile's rows are a multiple of 64 and the GPU has wgmma), with ragged edges on both sides and a partial
    slice, both operands' tiles minor along k or both along their own axes (128- and 64-byte swizzles)."""
    m, n, k = 200, 136, 40
    ast = strided_narrow_kernel(dtypes.bfloat16, m, n, k, a_t, b_t)
    for tm, tn in SHAPES:
        tile = (tm, tn, 1, "bfloat16")
        assert render_cuda(ast, tile).local_size == (128,)
        emulate(ast, ml_dtypes.bfloat16, m, n, k, a_t, b_t, tile=tile, wgmma=wgmma)


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
