"""bfloat16 in every renderer: stored as its 16 bits, computed in float, and every conversion to it rounds the exact
value once to nearest even, a NaN becoming the quiet NaN of its sign (the LLVM renderer on this CPU and on AVX2
only, OpenCL, and CUDA C through its CPU emulation).

The reference, `exact_bfloat16`, is computed here from the exact value (NumPy's float64 rint, Python integers),
not by a library's cast: ml_dtypes 0.7 rounds once, as this does; ml_dtypes 0.6 and XLA's CPU code (jax 0.10)
round a float64 or an integer to float32 first, which rounds twice (1 + 2**-8 + 2**-30 becomes 1.0, not
1.0078125)."""
import json
import os
import re
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
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


BF16_MAX = float(ml_dtypes.finfo(BF16).max)


def exact_bfloat16(x) -> np.ndarray:
    """The bits of each value of `x` (floats of any width, or integers) rounded once to bfloat16: to nearest, ties
    to even, at bfloat16's 8 significant bits (fewer below its smallest normal, 2**-126), to infinity beyond its
    largest float; a NaN is the quiet NaN of its sign (0x7fc0, 0xffc0)."""
    x = np.asarray(x)
    if x.dtype.kind in "iu":  # exactly, in Python integers: an int64 need not be a double
        rounded = []
        for v in x.tolist():
            a, shift = abs(v), max(abs(v).bit_length() - 8, 0)
            kept, lost = divmod(a, 1 << shift)
            half = 1 << shift >> 1
            kept += shift > 0 and (lost > half or lost == half and kept & 1)
            rounded.append(float(kept << shift) * (-1 if v < 0 else 1))
        x = np.array(rounded)
    with np.errstate(invalid="ignore", over="ignore"):
        x = x.astype(np.float64)  # exact for every float dtype
        _, exp = np.frexp(x)  # |x| in [2**(exp-1), 2**exp)
        step = np.maximum(exp - 8, -133)  # the exponent of a bfloat16 ulp at |x| (subnormals: 2**-133)
        y = np.ldexp(np.rint(np.ldexp(x, -step)), step)  # exact: a scaling, then an integer rounded to even
        y = np.where(np.abs(y) > BF16_MAX, np.copysign(np.inf, x), y)
        bits = (y.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)  # y is a bfloat16: these are its bits
    return np.where(np.isnan(x), np.where(np.signbit(x), 0xFFC0, 0x7FC0), bits).astype(np.uint16)


def same_bits(got, x) -> bool:
    """Whether bfloat16 array `got` holds `x` rounded once to bfloat16, bit for bit."""
    return np.array_equal(np.asarray(got).view(np.uint16), exact_bfloat16(x))


def float64_patterns() -> np.ndarray:
    """Doubles whose rounding to bfloat16 differs from rounding them to float first (a tie after that first
    rounding), beside the float32 classes, and doubles beyond float's range and subnormals."""
    with np.errstate(invalid="ignore"):
        x = float32_patterns(20_000).astype(np.float64)
    ties = np.array([1 + 2**-8 + 2**-30, 1 + 2**-8 - 2**-40, -(3 + 2**-6 + 2**-29), 2**-140 * (1 + 2**-8 + 2**-35),
                     1e300, -1e300, 1e-300, 3.4e38, 3.3961e38, 3.3962e38])
    return np.concatenate([x, ties])


def bfloat16_ties(bits: int) -> list[int]:
    """The integers of `bits` bits halfway between two bfloat16s (2**e + 2**(e-8)), and their negatives: one more
    becomes one of them when rounded to float (e >= 25) or to double (e >= 54), so rounding it twice goes to even
    where rounding it once goes away from zero."""
    ties = [(1 << e) + (1 << (e - 8)) for e in range(8, bits - 1)]
    return [v for t in ties for v in (t, -t)]


def run_cast(device: str, x: np.ndarray) -> np.ndarray:
    return np.asarray(pj.prepare(lambda a: a.astype(BF16), device=device)(x))


@pytest.mark.parametrize("source", ["float32", "float64", "float16", "int32", "int64", "uint8", "uint32", "uint64"])
def test_casts_to_bfloat16_round_once(device, source):
    if source == "float32":
        x = float32_patterns()
    elif source == "float64":
        x = float64_patterns()
    elif source == "float16":
        x = np.arange(2**16, dtype=np.uint16).view(np.float16)
    else:
        info = np.iinfo(source)
        edge = [info.min, info.max, 0, 1, -1, 3] + [t + d for t in bfloat16_ties(info.bits) for d in (-1, 0, 1)]
        rand = np.random.default_rng(1).integers(info.min, info.max, 20_000, dtype=source, endpoint=True)
        x = np.concatenate([np.array([v for v in edge if info.min <= v <= info.max], source), rand,
                            rand >> np.random.default_rng(3).integers(0, info.bits, rand.size, dtype=source)])
    assert same_bits(run_cast(device, x), x)


def test_the_reference_rounds_as_ml_dtypes_07():
    """exact_bfloat16 is ml_dtypes' cast where that rounds once: from float32 and float16 in every version, from
    float64 and integers from 0.7 on (0.6 rounds those to float32 first)."""
    sources = [float32_patterns(), np.arange(2**16, dtype=np.uint16).view(np.float16)]
    if tuple(int(p) for p in ml_dtypes.__version__.split(".")[:2]) >= (0, 7):
        sources += [float64_patterns(), np.array(bfloat16_ties(64), np.int64) + 1,
                    np.random.default_rng(4).integers(-2**63, 2**63 - 1, 1000, dtype=np.int64)]
    for x in sources:
        with np.errstate(invalid="ignore", over="ignore"):
            assert np.array_equal(x.astype(BF16).view(np.uint16), exact_bfloat16(x))


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
@pytest.mark.parametrize("source", [dtypes.float32, dtypes.float64, dtypes.float16, dtypes.int32])
def test_cuda_conversions_are_bit_equal_to_ml_dtypes(source):
    """float16's NaNs keep their sign although the emulated cvt.f32.f16, as NVIDIA's, widens them to its canonical
    NaN (failed so: the H100's issue 21)."""
    x = {dtypes.float32: float32_patterns(20_000), dtypes.float64: float64_patterns(),
         dtypes.float16: np.arange(2**16, dtype=np.uint16).view(np.float16),
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


def quieted_bits(wide: np.ndarray) -> np.ndarray:
    """The bits of float32 `wide`, each NaN's quiet bit set (a target may quiet a signalling NaN as it widens)."""
    bits = wide.view(np.uint32)
    return np.where(np.isnan(wide), bits | np.uint32(0x00400000), bits)


def test_float16_widens_keeping_a_nans_sign_and_payload(device):
    """float16 -> float32 of every float16 bit-equal to NumPy's but for quieting: a NaN keeps its sign and payload
    (as the bfloat16 cast's sign needs)."""
    x = np.arange(2**16, dtype=np.uint16).view(np.float16)
    wide = np.asarray(pj.prepare(lambda a: a.astype(np.float32), device=device)(x))
    assert np.array_equal(quieted_bits(wide), quieted_bits(x.astype(np.float32)))


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
def test_cuda_float16_widens_keeping_a_nans_sign_and_payload():
    """As above, in CUDA C whose emulated cvt.f32.f16 gives NVIDIA's canonical NaN (failed so: issue 21)."""
    x = np.arange(2**16, dtype=np.uint16).view(np.float16)
    r = loop(UOp.const(len(x)))
    wide = np.zeros(len(x), np.float32)
    cuda_emulation.run(render_cuda(kernel(UOp(Ops.CAST, dtypes.float32, (load(1, dtypes.float16, r),)), r)), [wide, x])
    assert np.array_equal(quieted_bits(wide), quieted_bits(x.astype(np.float32)))


@pytest.mark.parametrize("narrow", [BF16, np.float16], ids=["bfloat16", "float16"])
def test_a_select_or_a_negation_of_16_bit_floats_keeps_their_bits(device, narrow):
    """where(x > 0, -x, y) over every 16-bit pattern: NumPy's bits wherever the result is not a NaN (a stored NaN
    is quieted, as every store quiets it). A select or a negation of 16-bit values is one of them: the renderers do
    not round it again."""
    bits = np.arange(2**16, dtype=np.uint16)
    x, y = bits.view(narrow), bits[::-1].copy().view(narrow)
    got = np.asarray(pj.prepare(lambda a, b: pnp.where(a > 0, -a, b), device=device)(x, y))
    want = np.where(x > 0, -x, y)
    nan = np.isnan(want.astype(np.float32))
    assert np.array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan]) and np.isnan(got[nan]).all()


def test_a_select_or_a_negation_of_bfloat16_is_rendered_without_rounding():
    r = loop(UOp.const(8))
    x, y = load(1, dtypes.bfloat16, r), load(2, dtypes.bfloat16, r)
    chosen = UOp(Ops.WHERE, dtypes.bfloat16, (x < y, UOp(Ops.NEG, dtypes.bfloat16, (x,)), y))
    body = render_cuda(kernel(chosen, r)).source.split("__global__")[1]
    assert "pj_round_bfloat16(" not in body and "pj_float_to_bfloat16(" in body   # rounded once: at the store
    added = render_cuda(kernel(x + y, r)).source.split("__global__")[1]
    assert "pj_round_bfloat16(" in added   # a sum is rounded


def test_a_stored_bfloat16_result_is_converted_once():
    """A rounded bfloat16 value that is stored is converted to its bits from the float it was rounded from (the same
    bits: converting an exact bfloat16 gives its own), not rounded and converted again; x + y over every pattern of
    x (y reversed) on the CUDA emulation: NumPy's bits wherever the sum is not a NaN."""
    r = loop(UOp.const(2**16))
    x, y = load(1, dtypes.bfloat16, r), load(2, dtypes.bfloat16, r)
    src = render_cuda(kernel(x + y, r))
    body = src.source.split("__global__")[1]
    total = re.search(r"float (t\d+) = ld\d+ \+ ld\d+;", body).group(1)
    assert f"= pj_float_to_bfloat16({total});" in body
    if not cuda_emulation.available():
        pytest.skip("needs clang++ (the CPU emulation of CUDA kernels)")
    bits = np.arange(2**16, dtype=np.uint16)
    a, b = bits.view(BF16), bits[::-1].copy().view(BF16)
    out = np.zeros(2**16, np.uint16)
    cuda_emulation.run(src, [out, a.view(np.uint16), b.view(np.uint16)])
    with np.errstate(invalid="ignore"):   # (inf + -inf)
        want = (a.astype(np.float32) + b.astype(np.float32)).astype(BF16)
    nan = np.isnan(want.astype(np.float32))
    assert np.array_equal(out[~nan], want.view(np.uint16)[~nan])
    assert np.isnan(out.view(BF16)[nan].astype(np.float32)).all()


def test_cuda_rounds_to_bfloat16_by_integer_rounding_not_inline_ptx():
    """CUDA's pj_float_to_bfloat16 rounds a float that is not a NaN by the integer rounding, as OpenCL does, not by an
    inline cvt.rn.bf16.f32: NVVM merges no loads across an asm statement (a bfloat16 RMSNorm + matvec's row, rounded
    element by element, was loaded 2 bytes at a time). NVRTC compiles it for sm_75, sm_80 and sm_90a. Its bits on a
    GPU: test_casts_to_bfloat16_round_once[cuda-float32] (every class of float32 pattern)."""
    from prepjit.codegen.render_opencl import render_opencl
    from .test_render_fragments import working_nvrtc
    r = loop(UOp.const(8))
    cast = kernel(UOp(Ops.CAST, dtypes.bfloat16, (load(1, dtypes.float32, r),)), r)
    src = render_cuda(cast)
    helper = src.source.split("pj_float_to_bfloat16(float x)")[1].split("\n}")[0]
    assert helper.index("> 0x7f800000u") < helper.index("(u + 0x7fffu + ((u >> 16) & 1u)) >> 16")
    assert "asm" not in helper
    assert "cvt.rn" not in render_opencl(cast).source
    nvrtc = working_nvrtc()
    for arch in ("sm_75", "sm_80", "sm_90a"):
        nvrtc.compile(src.name, src.source, [f"-arch={arch}", "-std=c++17"])
