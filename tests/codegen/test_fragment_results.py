"""A tensor-core tile's result stores (fragment_results.py): a pair of neighbouring bfloat16 results of a row is one
32-bit store where the output's elements are neighbours in memory and the first is at an even index, element stores
otherwise (odd rows of an odd row length, a transposed output, a pair past the last column); every case equals
NumPy's product on the CUDA emulation, mma.sync and wgmma alike."""
import ml_dtypes
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen.gpu_launch import launch, launch_of
from prepjit.codegen.render_cuda import CUDA, render_cuda
from prepjit.codegen.schedule import schedule
from prepjit.uop import Ops, UOp, dtypes

from . import cuda_emulation
from .test_render_opencl import kernel, load, loop

WORD_STORE = "*(unsigned int *)&buf0[at0] = "
EMULATED = pytest.mark.skipif(not cuda_emulation.available(),
                              reason="needs clang++ (the CPU emulation of CUDA kernels)")


def tile_kernel(fn, *args):
    """The one scheduled kernel of fn(*args), launched on CUDA: a tile on tensor cores."""
    traced = pj.trace(pj.prepare(fn), *args)
    (kern,) = schedule(list(traced.outputs), list(traced.inputs)).kernels
    ast = launch(kern.ast, CUDA)
    assert launch_of(ast)[0] == "tile" and launch_of(ast)[4:5] == ("bfloat16",)
    return ast


def operands(m, n, k, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, k), np.float32).astype(ml_dtypes.bfloat16),
            rng.standard_normal((k, n), np.float32).astype(ml_dtypes.bfloat16),
            rng.standard_normal((n,), np.float32).astype(ml_dtypes.bfloat16))


def emulated(ast, a, b, c, shape, tile=None, wgmma=False):
    src = render_cuda(ast, tile)
    out = np.zeros(int(np.prod(shape)), ml_dtypes.bfloat16)
    cuda_emulation.run(src, [out.view(np.uint16), *(x.ravel().view(np.uint16) for x in (a, b, c))], wgmma=wgmma)
    return out.reshape(shape).astype(np.float32), src.source


def test_bfloat16_results_are_stored_in_pairs_and_float32_ones_alone():
    a, b, c = operands(128, 64, 32)
    assert WORD_STORE in render_cuda(tile_kernel(lambda x, w, c: x @ w + c, a, b, c)).source
    wide = tile_kernel(lambda x, w: pnp.matmul(x, w, preferred_element_type=pnp.float32), a, b)
    assert "at0" not in render_cuda(wide).source


@EMULATED
@pytest.mark.parametrize("wgmma", [False, True], ids=["mma_sync", "wgmma"])
@pytest.mark.parametrize("m, n, k", [(128, 96, 40), (70, 45, 33)])
def test_paired_stores_equal_numpy(m, n, k, wgmma):
    """x @ w + c in bfloat16: rows of an even length (every pair one word), of an odd one (45: odd rows start at odd
    indices, and the last column's pair is past the end), each emulated with the 128 x 64 and 64 x 64 tiles too."""
    a, b, c = operands(m, n, k)
    ast = tile_kernel(lambda x, w, c: x @ w + c, a, b, c)
    want = ((a.astype(np.float32) @ b.astype(np.float32)).astype(ml_dtypes.bfloat16).astype(np.float32)
            + c.astype(np.float32))
    for tile in (None, (128, 64, 1, "bfloat16"), (64, 64, 1, "bfloat16")):
        got, source = emulated(ast, a, b, c, (m, n), tile, wgmma)
        assert WORD_STORE in source
        np.testing.assert_allclose(got, want, rtol=2 ** -7, atol=2e-2, err_msg=str(tile))


def transposed_kernel(m, n, k):
    """out[j, i] = bfloat16(sum_r a[i, r] * b[r, j]) + c[j]: the tile's columns j are the output's rows."""
    i, j = loop(UOp.const(m), 0), loop(UOp.const(n), 1)
    r = UOp(Ops.RANGE, dtypes.index, (UOp.const(k),), (2, "reduce"))
    a = load(1, dtypes.bfloat16, i * k + r).cast(dtypes.float32)
    b = load(2, dtypes.bfloat16, r * n + j).cast(dtypes.float32)
    total = UOp(Ops.REDUCE, dtypes.float32, (a * b, r), Ops.ADD).cast(dtypes.bfloat16) + load(3, dtypes.bfloat16, j)
    return launch(kernel(total, j * m + i, "r_n_m"), CUDA)


@EMULATED
@pytest.mark.parametrize("wgmma", [False, True], ids=["mma_sync", "wgmma"])
def test_a_transposed_output_is_stored_element_by_element(wgmma):
    """A tile whose output is transposed: a pair of neighbouring columns of a tile row is m elements apart in the
    output, so each is stored alone (at1 != at0 + 1), and the result equals NumPy's."""
    m, n, k = 96, 64, 32
    a, b, c = operands(m, n, k, seed=1)
    ast = transposed_kernel(m, n, k)
    assert launch_of(ast)[4:5] == ("bfloat16",)
    got, source = emulated(ast, a, b, c, (n, m), wgmma=wgmma)
    assert WORD_STORE in source
    want = ((a.astype(np.float32) @ b.astype(np.float32)).astype(ml_dtypes.bfloat16).astype(np.float32)
            + c.astype(np.float32)).T
    np.testing.assert_allclose(got, want, rtol=2 ** -7, atol=2e-2)


@pytest.mark.parametrize("m, n, k", [(128, 96, 40), (70, 45, 33), (256, 384, 64)])
def test_bfloat16_products_with_a_bias_equal_numpy(device, m, n, k):
    """x @ w + c in bfloat16 on every device (on a CUDA GPU: tensor-core tiles whose results are stored in pairs, the
    last column's pair of an odd row length alone), within a bfloat16 rounding of NumPy's."""
    a, b, c = operands(m, n, k, seed=2)
    got = np.asarray(pj.prepare(lambda x, w, c: x @ w + c, device=device)(a, b, c)).astype(np.float32)
    want = ((a.astype(np.float32) @ b.astype(np.float32)).astype(ml_dtypes.bfloat16).astype(np.float32)
            + c.astype(np.float32))
    np.testing.assert_allclose(got, want, rtol=2 ** -7, atol=2e-2)
