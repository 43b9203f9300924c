"""bfloat16 in every renderer: stored as its 16 bits, computed in float, and every conversion to it rounds once to
nearest even with NaN kept quiet, bit-equal to ml_dtypes (the LLVM renderer on this CPU and on AVX2 only, OpenCL,
and CUDA C through its CPU emulation)."""
import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import prepjit as pj
from prepjit.codegen.render_cuda import render_cuda
from prepjit.uop import Ops, UOp, dtypes

from . import cuda_emulation
from .test_render_opencl import kernel, load, loop

BF16 = ml_dtypes.bfloat16


def float32_patterns(random: int = 100_000) -> np.ndarray:
    """Every class of float32 bit pattern a conversion to bfloat16 can get wrong, both signs, and random bits:
    zeros, subnormals, normals whose low 16 bits are exactly half (ties to even, both parities), just under and
    over half, the largest floats (rounding to infinity), infinities and NaNs of every payload (one only in the low
    bits would become infinity if truncated)."""
    low = [0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF]
    high = [0x0000, 0x0001, 0x0002, 0x007F, 0x0080, 0x0081, 0x3F80, 0x3F81, 0x4B00, 0x7F7E, 0x7F7F, 0x7F80, 0x7F81,
            0x7FBF, 0x7FC0, 0x7FFF]
    bits = [(h << 16) | lo for h in high for lo in low]
    bits = np.array(bits + [b | 0x80000000 for b in bits], np.uint32)
    rand = np.random.default_rng(0).integers(0, 2**32, random, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([bits, rand]).view(np.float32)


def same_bits(got, want) -> bool:
    with np.errstate(all="ignore"):
        return np.array_equal(np.asarray(got).view(np.uint16), np.asarray(want).astype(BF16).view(np.uint16))


def float64_patterns() -> np.ndarray:
    """Doubles whose rounding to bfloat16 differs from rounding them to float first (a tie after that first
    rounding), beside the float32 classes, and doubles beyond float's range and subnormals."""
    with np.errstate(invalid="ignore"):
        x = float32_patterns(20_000).astype(np.float64)
    ties = np.array([1 + 2**-8 + 2**-30, 1 + 2**-8 - 2**-40, -(3 + 2**-6 + 2**-29), 2**-140 * (1 + 2**-8 + 2**-35),
                     1e300, -1e300, 1e-300, 3.4e38, 3.3961e38, 3.3962e38])
    return np.concatenate([x, ties])


def run_cast(device: str, x: np.ndarray) -> np.ndarray:
    return np.asarray(pj.prepare(lambda a: a.astype(BF16), device=device)(x))


@pytest.mark.parametrize("source", ["float32", "float64", "float16", "int32", "int64", "uint8"])
def test_casts_to_bfloat16_are_bit_equal_to_ml_dtypes(device, source):
    if source == "float32":
        x = float32_patterns()
    elif source == "float64":
        x = float64_patterns()
    elif source == "float16":
        x = np.arange(2**16, dtype=np.uint16).view(np.float16)
    else:
        info = np.iinfo(source)
        edge = np.array([info.min, info.max, 0, 1, 2**24 + 2**16 + 1 if info.bits > 24 else 3], np.int64)
        rand = np.random.default_rng(1).integers(info.min, info.max, 20_000, dtype=np.int64, endpoint=True)
        if source == "int64":  # ml_dtypes goes through a double: equal where the int is one
            rand = rand >> 11
        x = np.concatenate([edge.astype(source), rand.astype(source)])
    assert same_bits(run_cast(device, x), x)


def test_bfloat16_arrays_go_in_and_come_out_unchanged(device):
    bits = np.arange(2**16, dtype=np.uint16)
    x = bits.view(BF16)
    f = pj.prepare(lambda a: (a.astype(np.float32), a * 1), device=device)
    wide, same = f(x)
    assert wide.dtype == np.float32 and np.array_equal(wide.view(np.uint32), x.astype(np.float32).view(np.uint32))
    assert same.dtype == BF16
    nan = np.isnan(x.astype(np.float32))
    assert np.array_equal(np.asarray(same).view(np.uint16)[~nan], bits[~nan])  # a * 1 quiets NaNs only


def test_bfloat16_conversions_on_avx2():
    """The same LLVM IR compiled for a CPU without AVX512_BF16 (PREPJIT_CPU=haswell) converts the same bits."""
    script = ("import json, numpy as np, ml_dtypes, prepjit as pj\n"
              "from tests.codegen.test_render_bfloat16 import float32_patterns, float64_patterns, same_bits\n"
              "x, d = float32_patterns(), float64_patterns()\n"
              "f = pj.prepare(lambda a, b: (a.astype(ml_dtypes.bfloat16), b.astype(ml_dtypes.bfloat16)))\n"
              "a, b = f(x, d)\n"
              "from prepjit.llvm_cpu import compile_cpu\n"
              "print(json.dumps([compile_cpu().name, bool(same_bits(a, x)), bool(same_bits(b, d))]))\n")
    env = dict(os.environ, PREPJIT_CPU="haswell")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=root, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == ["haswell", True, True]


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
@pytest.mark.parametrize("source", [dtypes.float32, dtypes.float64, dtypes.int32])
def test_cuda_conversions_are_bit_equal_to_ml_dtypes(source):
    x = {dtypes.float32: float32_patterns(20_000), dtypes.float64: float64_patterns(),
         dtypes.int32: np.random.default_rng(2).integers(-2**31, 2**31, 20_000).astype(np.int32)}[source]
    r = loop(UOp.const(len(x)))
    src = render_cuda(kernel(UOp(Ops.CAST, dtypes.bfloat16, (load(1, source, r),)), r))
    assert "unsigned short *__restrict__ buf0" in src.source
    out = np.zeros(len(x), np.uint16)
    cuda_emulation.run(src, [out, x])
    assert same_bits(out.view(BF16), x)
    back = render_cuda(kernel(UOp(Ops.CAST, dtypes.float32, (load(1, dtypes.bfloat16, r),)), r))
    wide = np.zeros(len(x), np.float32)
    cuda_emulation.run(back, [wide, out])
    assert np.array_equal(wide.view(np.uint32), out.view(BF16).astype(np.float32).view(np.uint32))
