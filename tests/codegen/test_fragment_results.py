"""A tensor-core tile's result stores (fragment_results.py): a pair of neighbouring 16-bit float results of a row
(bfloat16, and float16 where the dialect stores it as its bits in 16-bit unsigned ints, as CUDA's does) is one 32-bit
store where the output's elements are neighbours in memory and the first is at an even index, element stores
otherwise (odd rows of an odd row length, a transposed output, a pair past the last column); every case equals
NumPy's product on the CUDA emulation, mma.sync and wgmma alike."""
import ml_dtypes
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen.gpu_launch import launch, launch_of
from prepjit.codegen.render_cuda import CUDA, render_cuda
from prepjit.codegen.render_opencl import OPENCL
from prepjit.codegen.schedule import schedule
from prepjit.uop import Ops, UOp, dtypes

from . import cuda_emulation
from .test_render_opencl import kernel, load, loop

WORD_STORE = "*(unsigned int *)&buf0[at0] = "
EMULATED = pytest.mark.skipif(not cuda_emulation.available(),
                              reason="needs clang++ (the CPU emulation of CUDA kernels)")
# the output's dtype: (NumPy's, prepjit's, the tolerance of a result: rtol, atol)
DTYPES = {"bfloat16": (ml_dtypes.bfloat16, dtypes.bfloat16, (2 ** -7, 2e-2)),
          "float16": (np.float16, dtypes.float16, (2 ** -9, 1e-2))}
SIXTEEN_BITS = pytest.mark.parametrize("dtype", list(DTYPES))


def tile_kernel(fn, dtype, *args):
    """The one scheduled kernel of fn(*args), launched on CUDA: a tile on tensor cores multiplying `dtype`s."""
    traced = pj.trace(pj.prepare(fn), *args)
    (kern,) = schedule(list(traced.outputs), list(traced.inputs)).kernels
    ast = launch(kern.ast, CUDA)
    assert launch_of(ast)[0] == "tile" and launch_of(ast)[4:5] == (dtype,)
    return ast


def operands(m, n, k, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(shape, np.float32).astype(DTYPES[dtype][0]) for shape in ((m, k), (k, n), (n,)))


def product_plus_bias(a, b, c, dtype):
    """NumPy's (a @ b) rounded to `dtype`, plus c (in float32)."""
    product = (a.astype(np.float32) @ b.astype(np.float32)).astype(DTYPES[dtype][0])
    return product.astype(np.float32) + c.astype(np.float32)


def emulated(ast, inputs, shape, tile=None, wgmma=False):
    src = render_cuda(ast, tile)
    out = np.zeros(int(np.prod(shape)), inputs[0].dtype)
    cuda_emulation.run(src, [out.view(np.uint16), *(x.ravel().view(np.uint16) for x in inputs)], wgmma=wgmma)
    return out.reshape(shape).astype(np.float32), src.source


@SIXTEEN_BITS
def test_16_bit_results_are_stored_in_pairs_and_float32_ones_alone(dtype):
    a, b, c = operands(128, 64, 32, dtype)
    assert WORD_STORE in render_cuda(tile_kernel(lambda x, w, c: x @ w + c, dtype, a, b, c)).source
    wide = tile_kernel(lambda x, w: pnp.matmul(x, w, preferred_element_type=pnp.float32), dtype, a, b)
    assert "at0" not in render_cuda(wide).source


@SIXTEEN_BITS
def test_a_product_s_bits_are_converted_from_its_accumulators(dtype):
    """A result that is a tile's rounded accumulator is converted from the accumulator itself (the same bits, without
    the rounding and the widening between), mma.sync's and wgmma's."""
    a, b, _ = operands(128, 64, 32, dtype)
    source = render_cuda(tile_kernel(lambda x, w: x @ w, dtype, a, b)).source
    convert = {"bfloat16": "pj_float_to_bfloat16", "float16": "pj_float_to_half"}[dtype]
    assert f"bits0 = {convert}(wacc0[0]);" in source and f"bits0 = {convert}(acc0_0_0);" in source


@EMULATED
@SIXTEEN_BITS
@pytest.mark.parametrize("wgmma", [False, True], ids=["mma_sync", "wgmma"])
def test_products_past_the_range_and_nans_equal_numpy(wgmma, dtype):
    """x @ w whose results overflow float16 (inf), and a row and a column of NaNs (inf * 0): converted from the
    accumulators, they are NumPy's float32 products converted."""
    m, n, k = 64, 64, 32
    a, b, _ = operands(m, n, k, dtype, seed=3)
    a, b = a * DTYPES[dtype][0](200), b * DTYPES[dtype][0](200)
    a[5, 3], b[3, 7], b[4, :] = np.inf, 0, 0
    a[9, 4] = np.inf
    ast = tile_kernel(lambda x, w: x @ w, dtype, a, b)
    got, _ = emulated(ast, (a, b), (m, n), wgmma=wgmma)
    with np.errstate(invalid="ignore", over="ignore"):
        want = (a.astype(np.float32) @ b.astype(np.float32)).astype(DTYPES[dtype][0]).astype(np.float32)
    assert np.isnan(want).any() and (np.isinf(want).any() or dtype == "bfloat16")
    np.testing.assert_allclose(got, want, rtol=DTYPES[dtype][2][0], atol=1)


def test_only_a_dialect_storing_float16_as_its_bits_pairs_it():
    """CUDA stores float16 as `unsigned short` bits (pairable); OpenCL as `half` through vstore_half_rte (not)."""
    assert CUDA.mem_type(dtypes.float16) == CUDA.ctype(dtypes.uint16)
    assert OPENCL.mem_type(dtypes.float16) != OPENCL.ctype(dtypes.uint16) and OPENCL.tensor_core_mma is None


@EMULATED
@SIXTEEN_BITS
@pytest.mark.parametrize("wgmma", [False, True], ids=["mma_sync", "wgmma"])
@pytest.mark.parametrize("m, n, k", [(128, 96, 40), (70, 45, 33)])
def test_paired_stores_equal_numpy(m, n, k, wgmma, dtype):
    """x @ w + c in 16 bits: rows of an even length (every pair one word), of an odd one (45: odd rows start at odd
    indices, and the last column's pair is past the end), each emulated with the 128 x 64 and 64 x 64 tiles too."""
    a, b, c = operands(m, n, k, dtype)
    ast = tile_kernel(lambda x, w, c: x @ w + c, dtype, a, b, c)
    want = product_plus_bias(a, b, c, dtype)
    for tile in (None, (128, 64, 1, dtype), (64, 64, 1, dtype)):
        got, source = emulated(ast, (a, b, c), (m, n), tile, wgmma)
        assert WORD_STORE in source
        rtol, atol = DTYPES[dtype][2]
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=str(tile))


def transposed_kernel(m, n, k, dt):
    """out[j, i] = dt(sum_r a[i, r] * b[r, j]) + c[j]: the tile's columns j are the output's rows."""
    i, j = loop(UOp.const(m), 0), loop(UOp.const(n), 1)
    r = UOp(Ops.RANGE, dtypes.index, (UOp.const(k),), (2, "reduce"))
    a = load(1, dt, i * k + r).cast(dtypes.float32)
    b = load(2, dt, r * n + j).cast(dtypes.float32)
    total = UOp(Ops.REDUCE, dtypes.float32, (a * b, r), Ops.ADD).cast(dt) + load(3, dt, j)
    return launch(kernel(total, j * m + i, "r_n_m"), CUDA)


@EMULATED
@SIXTEEN_BITS
@pytest.mark.parametrize("wgmma", [False, True], ids=["mma_sync", "wgmma"])
def test_a_transposed_output_is_stored_element_by_element(wgmma, dtype):
    """A tile whose output is transposed: a pair of neighbouring columns of a tile row is m elements apart in the
    output, so each is stored alone (at1 != at0 + 1), and the result equals NumPy's."""
    m, n, k = 96, 64, 32
    a, b, c = operands(m, n, k, dtype, seed=1)
    ast = transposed_kernel(m, n, k, DTYPES[dtype][1])
    assert launch_of(ast)[4:5] == (dtype,)
    got, source = emulated(ast, (a, b, c), (n, m), wgmma=wgmma)
    assert WORD_STORE in source
    rtol, atol = DTYPES[dtype][2]
    np.testing.assert_allclose(got, product_plus_bias(a, b, c, dtype).T, rtol=rtol, atol=atol)


@SIXTEEN_BITS
@pytest.mark.parametrize("m, n, k", [(128, 96, 40), (70, 45, 33), (256, 384, 64)])
def test_16_bit_products_with_a_bias_equal_numpy(device, m, n, k, dtype):
    """x @ w + c in 16 bits on every device (on a CUDA GPU: tensor-core tiles whose results are stored in pairs, the
    last column's pair of an odd row length alone), within a 16-bit rounding of NumPy's."""
    a, b, c = operands(m, n, k, dtype, seed=2)
    got = np.asarray(pj.prepare(lambda x, w, c: x @ w + c, device=device)(a, b, c)).astype(np.float32)
    rtol, atol = DTYPES[dtype][2]
    np.testing.assert_allclose(got, product_plus_bias(a, b, c, dtype), rtol=rtol, atol=atol)
