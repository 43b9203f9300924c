"""Contractions of 16-bit floats on the cpu (optimize.py, packing.py, render_llvm.py): unpacked they read their
operands narrow, packed their copies hold the values widened once (float32 panels, as a float32 matmul reads); they
are register-blocked like float32 (the blocks hold float32 accumulators), and on an AVX512_BF16 target sum the
bfloat16 products they read narrow in pairs with vdpbf16ps (a PREPJIT_TUNE choice); every result is the float32 sum
of the exact products of the 16-bit values, rounded once (NumPy float32 on the widened values)."""
import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import prepjit as pj
from prepjit.codegen.optimize import Blocking, blocking_candidates, optimize, optimize_with
from prepjit.codegen.llvm_reductions import DOT
from prepjit.codegen.render_llvm import render_llvm
from prepjit.codegen.target import AVX2, AVX512, AVX512_BF16, host_target
from prepjit.uop import Ops, dtypes
from .test_optimize import _columns

bfloat16 = ml_dtypes.bfloat16
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PAIRED = Blocking(bf16_dot=True)  # vdpbf16ps pairing, a PREPJIT_TUNE candidate (off by default)


def _want(a, b, dtype):
    """The float32 contraction of the 16-bit values, rounded once to `dtype`."""
    return (a.astype(np.float32) @ b.astype(np.float32)).astype(dtype).astype(np.float32)


def _check(got, a, b, dtype):
    """Within half a 16-bit ulp (one rounding) plus float32 reduction error of the float32 contraction."""
    want = a.astype(np.float32) @ b.astype(np.float32)
    scale = np.abs(a.astype(np.float32)) @ np.abs(b.astype(np.float32))
    half_ulp = 2.0 ** -8 if dtype == bfloat16 else 2.0 ** -11
    error = np.abs(np.asarray(got).astype(np.float32) - want)
    np.testing.assert_array_less(error, half_ulp * np.abs(want) + 1e-5 * scale + 1e-30)


def _ranges(ast, kind):
    return [u for u in ast.toposort() if u.op is Ops.RANGE and u.arg[1] == kind]


@pytest.mark.parametrize("dtype", [bfloat16, np.float16])
@pytest.mark.parametrize("target,rows,cols,lanes", [(AVX512, 8, 32, 16), (AVX2, 6, 16, 8), (AVX512_BF16, 8, 32, 16)])
def test_16bit_matmul_is_blocked_as_float32_and_widens_its_operands_once(rng, dtype, target, rows, cols, lanes):
    """The block of a float32 matmul (its accumulators are float32), vectors of float32's lanes; the packed column
    panels and the row operand's copy hold each 16-bit value widened once (packing.py), so the register blocks read
    float32 as a float32 matmul's do (before: 16-bit panels, each value widened again by every block: MiniLM bf16
    took 1.6x float32's time on an AVX512_BF16 Xeon, the same time after)."""
    if dtype == bfloat16 and host_target().amx_bf16:
        pytest.skip("this host packs bfloat16 panels for AMX tiles (test_amx.py)")
    a, b = rng.standard_normal((512, 256)).astype(dtype), rng.standard_normal((256, 512)).astype(dtype)
    f = pj.prepare(lambda a, b: a @ b, device="cpu")
    _check(f(a, b), a, b, dtype)
    *packs, kernel = f.plan(a, b).kernels
    assert [p.ast.arg[:5] for p in packs] == ["pack_", "pack_"]
    narrow = dtypes.bfloat16 if dtype == bfloat16 else dtypes.float16
    for k in packs:   # each reads the 16-bit operand and stores float32
        assert {u.dtype for u in k.ast.toposort() if u.op is Ops.DEFINE_GLOBAL} == {narrow, dtypes.float32}
    assert {u.dtype for u in kernel.ast.toposort() if u.op is Ops.LOAD} == {dtypes.float32}
    blocked = optimize(kernel.kernel.scheduled, "llvm", target)
    assert _columns(blocked) == rows * cols and len(blocked.src) == rows * cols // lanes
    assert [r.src[0].arg for r in _ranges(blocked, "lane")] == [lanes]


@pytest.mark.parametrize("m,k,n", [(1, 576, 3072), (3, 64, 80)])   # (a packed contraction reads float32 panels)
def test_bfloat16_products_are_paired_for_vdpbf16ps_on_avx512_bf16(rng, m, k, n):
    """Where the target has AVX512_BF16 the blocked reduction runs over k / 2 pairs (a "pair" range), rendered as
    vdpbf16ps on 16 float lanes; targets without it keep one product per step."""
    a, b = rng.standard_normal((m, k)).astype(bfloat16), rng.standard_normal((k, n)).astype(bfloat16)
    f = pj.prepare(lambda a, b: a @ b, device="cpu")
    _check(f(a, b), a, b, bfloat16)
    kernel = f.plan(a, b).kernels[-1]
    paired = optimize_with(kernel.kernel.scheduled, "llvm", AVX512_BF16, PAIRED)
    assert [r.src[0].arg for r in _ranges(paired, "pair")] == [2]
    assert [r.src[0].arg for r in _ranges(paired, "reduce")] == [k // 2]
    assert f"call <16 x float> @{DOT}(" in render_llvm(paired, AVX512_BF16).source
    for target in (AVX512, AVX2):
        plain = optimize(kernel.kernel.scheduled, "llvm", target)
        assert not _ranges(plain, "pair") and DOT not in render_llvm(plain, target).source


def test_odd_and_symbolic_reductions_and_float16_are_not_paired(rng):
    for dtype, k in ((bfloat16, 65), (np.float16, 64)):
        a, b = rng.standard_normal((16, k)).astype(dtype), rng.standard_normal((k, 64)).astype(dtype)
        f = pj.prepare(lambda a, b: a @ b, device="cpu")
        _check(f(a, b), a, b, dtype)
        assert not _ranges(optimize_with(f.plan(a, b).kernels[-1].kernel.scheduled, "llvm", AVX512_BF16, PAIRED), "pair")
    f = pj.prepare(lambda a, b: a @ b, vars={"k": (1, 128)}, shapes={"a": (16, "k"), "b": ("k", 64)}, device="cpu")
    a, b = rng.standard_normal((16, 64)).astype(bfloat16), rng.standard_normal((64, 64)).astype(bfloat16)
    assert not _ranges(optimize_with(f.plan(a, b).kernels[-1].kernel.scheduled, "llvm", AVX512_BF16, PAIRED), "pair")


_SIZES = [(1, 576, 3072), (1, 2, 32), (5, 70, 33), (17, 130, 100), (64, 96, 1000), (200, 384, 64)]


@pytest.mark.parametrize("dtype", [bfloat16, np.float16])
@pytest.mark.parametrize("m,k,n", _SIZES)
def test_16bit_contractions_match_numpy_float32(rng, dtype, m, k, n):
    """Odd sizes (peeled column tails, clamped row blocks, odd reductions), x @ W, W @ x and x @ W.T."""
    a, b = rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)
    for fn, args in ((lambda a, b: a @ b, (a, b)), (lambda b, a: b.T @ a.T, (b, a)), (lambda a, b: a @ b.T.T, (a, b))):
        got = pj.prepare(fn, device="cpu")(*args)
        _check(got.T if fn(*(x.astype(np.float32) for x in args)).shape != (m, n) else got, a, b, dtype)


def test_16bit_contractions_with_symbolic_sizes(rng):
    f = pj.prepare(lambda x, w: x @ w, vars={"n": (1, 300), "m": (1, 40)}, shapes={"x": ("m", 96), "w": (96, "n")},
                   device="cpu")
    for m, n in ((1, 1), (1, 299), (7, 64), (40, 300), (33, 31)):
        x, w = rng.standard_normal((m, 96)).astype(bfloat16), rng.standard_normal((96, n)).astype(bfloat16)
        _check(f(x, w), x, w, bfloat16)


def test_bfloat16_subnormal_inputs_on_the_host(rng):
    """Documented (docs/tracing.md): by default bfloat16 products are widened, subnormals multiplied exactly; only
    the vdpbf16ps pairing PREPJIT_TUNE may choose and AMX tiles (the default where the host has them: amx.py) read
    them as zero (as JAX's CPU backend, denormals flushed)."""
    a = np.full((8, 64), 1e-39, np.float32).astype(bfloat16)  # subnormal in bfloat16 and float32
    b = np.full((64, 32), 2.0 ** 100, np.float32).astype(bfloat16)
    got = np.asarray(pj.prepare(lambda a, b: a @ b, device="cpu")(a, b)).astype(np.float32)
    exact = _want(a, b, bfloat16)
    assert np.all(exact > 0)
    np.testing.assert_array_equal(got, np.zeros_like(exact) if host_target().amx_bf16 else exact)


def test_16bit_contractions_on_avx2():
    """The same contractions compiled for a CPU without AVX-512 (PREPJIT_CPU=haswell): blocked, no vdpbf16ps,
    equal to NumPy."""
    script = ("import json, numpy as np, ml_dtypes\n"
              "from tests.codegen import test_contraction_16bit as t\n"
              "from prepjit.codegen.target import host_target\n"
              "rng = np.random.default_rng(1)\n"
              "for dtype in (ml_dtypes.bfloat16, np.float16):\n"
              "    for m, k, n in t._SIZES:\n"
              "        t.test_16bit_contractions_match_numpy_float32(rng, dtype, m, k, n)\n"
              "t.test_16bit_contractions_with_symbolic_sizes(rng)\n"
              "t.test_bfloat16_subnormal_inputs_on_the_host(rng)\n"
              "print(json.dumps([host_target().cpu, host_target().vector_bytes, host_target().bf16_dot]))\n")
    env = dict(os.environ, PREPJIT_CPU="haswell")
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == ["haswell", 32, False]


def test_pairing_is_a_tuning_choice(rng):
    """PREPJIT_TUNE times the paired kernel against the widened one (neither wins on every AVX512_BF16 CPU), where
    the contraction reads its 16-bit operands unpacked (32 rows: too few to pack)."""
    a, b = rng.standard_normal((32, 128)).astype(bfloat16), rng.standard_normal((128, 256)).astype(bfloat16)
    kernel = pj.prepare(lambda a, b: a @ b, device="cpu").plan(a, b).kernels[-1]
    scheduled = kernel.kernel.scheduled
    kernels = [optimize_with(scheduled, "llvm", AVX512_BF16, c) for c in blocking_candidates(scheduled, AVX512_BF16)]
    assert {bool(_ranges(k, "pair")) for k in kernels} == {False, True}
    assert optimize_with(kernel.kernel.scheduled, "llvm", AVX512_BF16, Blocking(bf16_dot=False)) == \
        optimize_with(kernel.kernel.scheduled, "llvm", AVX512, Blocking())
