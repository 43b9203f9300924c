"""Contractions of 16-bit floats on tensor cores (render_fragments.py): the launch decides the fragments on the AST
for dialects that have matrix instructions (CUDA), the kernel multiplies with them, and the products equal NumPy's
on every device (where the launch has no fragments, the same tests check the float32 tiles and the cpu)."""
import ml_dtypes
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen.gpu_launch import launch, launch_of
from prepjit.codegen.render_cuda import CUDA, render_cuda
from prepjit.codegen.render_opencl import OPENCL, render_opencl
from prepjit.uop import Ops, UOp, dtypes

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
    assert launch_of(launch(ast, OPENCL))[4:] == () and "mma" not in render_opencl(ast).source


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
