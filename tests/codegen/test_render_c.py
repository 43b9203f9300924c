"""The C-style renderer's reduction step (render_c.accumulate): on CUDA (Dialect.fused_sums) a float32 / float64 sum
of products is one fused multiply-add a product (fma(a, b, acc): rounded once, as the cpu's vector reductions and the
float32 tiles add theirs); a sum of other values, a max of products, a 16-bit sum and an elementwise a * b + c (NumPy
rounds the product and the sum apart) are not, nor is any on OpenCL (PoCL leaves fma() unvectorized); the row
kernel's sums equal NumPy's within float32 rounding, through cuda_emulation (clang++'s fmaf: one rounding) and on
OpenCL."""
import re

import numpy as np
import pytest

import prepjit as pj
from prepjit.codegen.optimize import optimize
from prepjit.codegen.schedule import schedule
from prepjit.codegen.targets import CUDA_TARGET, OPENCL_TARGET
from prepjit.runtime.devices import available_devices

from . import cuda_emulation

FMA = re.compile(r"\bfmaf?\(")
ROWS, K = 8, 576


def _operands(dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((ROWS, K)).astype(dtype) for _ in range(2)]


def _kernels(fn, args):
    traced = pj.trace(fn, *args)
    sched = schedule(list(traced.outputs), list(traced.inputs))
    return sched, sched.kernels


def _sources(fn, args) -> dict:
    """{dialect: its kernels' sources joined}."""
    _, kernels = _kernels(fn, args)
    return {dialect: "\n".join(target.render(target.launched(optimize(k.ast, dialect))).source for k in kernels)
            for target, dialect in ((CUDA_TARGET, "cuda"), (OPENCL_TARGET, "opencl"))}


@pytest.mark.parametrize("dtype, name", [(np.float32, "fmaf("), (np.float64, "fma(")])
def test_a_row_kernels_sum_of_products_is_fused_on_cuda(dtype, name):
    """Each product of a row's dot product is added by CUDA's fma, none multiplied on its own; OpenCL's are not."""
    sources = _sources(lambda a, b: (a * b).sum(-1), _operands(dtype))
    assert name in sources["cuda"] and not re.search(r"= ld\d+ \* ld\d+;", sources["cuda"])
    assert not FMA.search(sources["opencl"]) and re.search(r"= ld\d+ \* ld\d+;", sources["opencl"])


@pytest.mark.parametrize("fn", [lambda a, b: (a + b).sum(-1), lambda a, b: (a * b).max(-1), lambda a, b: a * b + a],
                         ids=["sum_of_sums", "max_of_products", "elementwise"])
def test_other_steps_are_not_fused(fn):
    for dialect, source in _sources(fn, _operands()).items():
        assert not FMA.search(source), dialect


def test_a_16_bit_sum_of_products_is_not_fused():
    """float16 is computed in float32 and rounded after each op: a float32 fma rounded again is not one rounding."""
    for dialect, source in _sources(lambda a, b: (a * b).sum(-1), _operands(np.float16)).items():
        assert not FMA.search(source), dialect


def _reference(a, b):
    return (a.astype(np.float64) * b.astype(np.float64)).sum(-1)


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
def test_the_emulated_fused_row_sums_equal_numpy():
    args = _operands(seed=1)
    sched, (kern,) = _kernels(lambda a, b: (a * b).sum(-1), args)
    src = CUDA_TARGET.render(CUDA_TARGET.launched(optimize(kern.ast, "cuda")))
    assert "fmaf(" in src.source
    bufs = {i: a.ravel() for i, a in zip(sched.inputs, args)}
    out = np.zeros(sched.buffers[kern.buffers[0]].max_size, np.float32)
    cuda_emulation.run(src, [out] + [bufs[i] for i in kern.buffers[1:]])
    want = _reference(*args)
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.skipif("opencl" not in available_devices(), reason="no OpenCL device")
def test_the_opencl_fused_row_sums_equal_numpy():
    args = _operands(seed=2)
    got = np.asarray(pj.prepare(lambda a, b: (a * b).sum(-1), device="opencl")(*args)).astype(np.float64)
    want = _reference(*args)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
