"""How a tensor-core tile's operands are copied into local memory (fragment_copies.py): a chunk of a plain, aligned
operand by one asynchronous copy, tested against k's end only where a slice can pass it (k no multiple of the slices'
depth, or sets of work-items that split k); the products equal NumPy's on the CUDA emulation either way."""
import ml_dtypes
import pytest

from prepjit.codegen.render_cuda import render_cuda
from prepjit.uop import dtypes

from . import cuda_emulation
from .test_render_fragments import emulate, strided_narrow_kernel


@pytest.mark.parametrize("k, tested", [(64, False), (40, True)])
def test_whole_slices_copy_without_testing_k(k, tested):
    src = render_cuda(strided_narrow_kernel(dtypes.bfloat16, 128, 96, k), (128, 64, 1, "bfloat16")).source
    assert "pj_cp_async16(dst, src)" in src
    assert (f"gk + 8 <= {k}LL" in src) == tested and ("if (okA0)" in src) != tested


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
@pytest.mark.parametrize("wgmma", [False, True], ids=["mma_sync", "wgmma"])
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "unaligned"])
def test_whole_slices_compute_the_matmul(wgmma, offset):
    """k = 96 (three whole slices), a batch of 2; both operands one element into their buffers (no aligned chunk:
    element copies) or not, a along k and b along its columns, then both transposed."""
    for a_t in (False, True):
        ast = strided_narrow_kernel(dtypes.bfloat16, 130, 72, 96, a_t, a_t, batch=2, offset=offset)
        emulate(ast, ml_dtypes.bfloat16, 130, 72, 96, a_t, a_t, batch=2, offset=offset,
                tile=(128, 64, 1, "bfloat16"), wgmma=wgmma)
