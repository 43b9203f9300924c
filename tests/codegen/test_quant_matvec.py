"""A matvec over a quantized weight (x @ pj.quant.dequantize(b, kind).T, codegen/block_split.py): its reduction
split at the weight's blocks with the innermost steps a vector (byte loads as vectors, no per-lane code), the
output columns split over threads, and results equal to NumPy's float32 of the dequantized weights."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import prepjit as pj
from prepjit.codegen.optimize import optimize
from prepjit.codegen.render_llvm import render_llvm
from prepjit.codegen.target import AVX2, AVX512
from prepjit.uop import Ops

KINDS = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q6_k"]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _blocks(rng, kind, n, k):
    """Random blocks of `kind` for an (n, k) weight, every row's weights finite (random scale bytes otherwise)."""
    blocks = rng.integers(0, 256, (n, k // pj.quant.block_size(kind) * pj.quant.block_bytes(kind)), dtype=np.uint8)
    with np.errstate(all="ignore"):
        finite = np.isfinite(pj.quant.dequantize(blocks, kind)).all(axis=1, keepdims=True)
    return np.where(finite, blocks, 0).astype(np.uint8)


def _matvec(kind, device="cpu"):
    return pj.prepare(lambda x, b: x @ pj.quant.dequantize(b, kind).T, device=device)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows", [1, 3])
def test_quantized_matvec_matches_numpy(kind, rows, device, rng):
    """Every kind, one row and a few (each row its own sum of the same blocks), against float64 NumPy of the
    dequantized weights with the float32 tests' tolerance (the split reassociates the sum)."""
    n, k = 72, 768
    blocks = _blocks(rng, kind, n, k)
    w = pj.quant.dequantize(blocks, kind)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    got = np.asarray(_matvec(kind, device)(x, blocks))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("kind,steps", [("q8_0", [24, 32]), ("q4_0", [24, 2, 16]), ("q4_1", [24, 2, 16]),
                                        ("q6_k", [3, 2, 2, 2, 2, 16])])
def test_the_reduction_is_split_at_the_blocks_and_vectorised(kind, steps, rng):
    """The kernel as launched on AVX-512: the output columns the outermost loop (threads split it), the reduction
    over the block ranges and an innermost lane range (its extents `steps`), no // or % left; its IR loads a block's
    bytes as one vector, sums vectors and adds the lanes once, with no lane-by-lane code, and prefetches the blocks
    ahead. (AVX2's vectors, narrower than the lanes, sum a block before its scales: the test below.)"""
    n, k = 64, 768
    blocks = _blocks(rng, kind, n, k)
    x = rng.standard_normal((1, k)).astype(np.float32)
    (kernel,) = _matvec(kind).plan(x, blocks).kernels
    for target in (AVX512,):
        out = optimize(kernel.kernel.scheduled, "llvm", target)
        (red,) = [u for u in out.toposort() if u.op is Ops.REDUCE]
        assert [r.src[0].arg for r in red.src[1:]] == steps
        assert [r.arg[1] for r in red.src[1:]] == ["reduce"] * (len(steps) - 1) + ["lane"]
        assert not [u for u in out.toposort() if u.op in (Ops.IDIV, Ops.MOD)]
        loops = sorted((u for u in out.toposort() if u.op is Ops.RANGE and u.arg[1] == "loop"), key=lambda r: r.arg[0])
        assert [r.src[0].arg for r in loops] == [n]
        ir = render_llvm(out, target).source
        assert f"load <{steps[-1]} x i8>" in ir and f"load <{steps[-1]} x float>" in ir
        assert f"llvm.vector.reduce.fadd.v{steps[-1]}f32" in ir and f"extractelement <{steps[-1]} x" not in ir
        assert ir.count("call void @llvm.prefetch") == 1  # the blocks' stream, once per block; not the activations


@pytest.mark.parametrize("kind,inner,hoisted", [("q8_0", [4], 0), ("q4_0", [2, 2], 0), ("q4_1", [2, 2], 1)])
def test_avx2_sums_a_block_before_its_scales(kind, inner, hoisted, rng):
    """AVX2 (8 float lanes, narrower than a block's 16 or 32): each term of x * w's product distributed over the
    scales (q4_1's d * x * q) is a sum over the blocks and 8 lanes of its scale times the block's sum of the rest
    over the in-block steps (extents `inner`); q4_1's m * x term reads x's block totals, the same for every output
    column, computed once per call into an array of the kernel's own (one float a block) before the parallel loop,
    and is a scalar sum over the blocks, rendered in the lane sum's loop (one block loop in the IR, one scalar
    FMA a block). Its IR widens a 4-bit block's bytes to int32 before their shift and mask, converts each scale
    once (q4_1's two as one <2 x half>), and the kernel equals NumPy."""
    n, k = 64, 768
    blocks = _blocks(rng, kind, n, k)
    x = rng.standard_normal((1, k)).astype(np.float32)
    (kernel,) = _matvec(kind).plan(x, blocks).kernels
    out = optimize(kernel.kernel.scheduled, "llvm", AVX2)
    reduces = [u for u in out.toposort() if u.op is Ops.REDUCE]
    outer = [r for r in reduces if r.src[-1].arg[1] == "lane"]
    assert len(outer) == 1 and [x.src[0].arg for x in outer[0].src[1:]] == [k // 32, 8]
    scale, block = outer[0].src[0].src
    assert block.op is Ops.REDUCE and not any(u.op is Ops.REDUCE for u in scale.toposort())
    over_blocks = [r for r in reduces if [x.src[0].arg for x in r.src[1:]] == [k // 32]]
    assert len(over_blocks) == hoisted
    assert all(r.src[0].op is Ops.MUL and
               any(s.op is Ops.LOAD and s.src[0].op is Ops.DEFINE_LOCAL for s in r.src[0].src) for r in over_blocks)
    inner_sums = [r for r in reduces if r not in outer and r not in over_blocks and
                  not any(st.src[0].op is Ops.DEFINE_LOCAL and r in st.toposort() for st in out.src)]
    assert all([x.src[0].arg for x in r.src[1:]] == inner for r in inner_sums)
    locals_ = [st for st in out.src if st.src[0].op is Ops.DEFINE_LOCAL]
    assert len(locals_) == hoisted and out.src[:hoisted] == tuple(locals_)
    assert all(st.src[0].arg[1] == k // 32 for st in locals_)
    assert not any(u.op is Ops.RANGE and u.arg[1] == "loop" for st in locals_ for u in st.toposort())
    ir = render_llvm(out, AVX2).source
    assert ir.count("fmul contract float") == hoisted  # the minimum term's scalar FMA, in the lane sum's block loop
    assert ir.count(f", {k // 32}\n") == 1 + hoisted  # loops over the blocks: the kernel's, x's totals (q4_1)
    assert "load <8 x i8>" in ir and "<16 x" not in ir and (kind == "q8_0" or "zext <8 x i8>" in ir)
    assert ir.count("fpext half") == (0 if kind == "q4_1" else 1)  # q4_1's d and m: one <2 x half>
    assert ir.count("fpext <2 x half>") == (1 if kind == "q4_1" else 0)
    got = _run_rendered(out, AVX2, n, [x, blocks])
    ref = x.astype(np.float64) @ pj.quant.dequantize(blocks, kind).T.astype(np.float64)
    np.testing.assert_allclose(got, ref[0], rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_a_block_scale_is_computed_once_per_block(rng):
    """q4_1's float16 scale and min are scalars converted once per block, in the block loop before the two nibble
    halves (unrolled, an accumulator each) use them: one conversion of both in the kernel (2 bytes apart: one
    <2 x half>, llvm_reductions.half_pairs), not two per half."""
    blocks = _blocks(rng, "q4_1", 64, 768)
    x = rng.standard_normal((1, 768)).astype(np.float32)
    (kernel,) = _matvec("q4_1").plan(x, blocks).kernels
    ir = render_llvm(optimize(kernel.kernel.scheduled, "llvm", AVX512), AVX512).source
    assert ir.count("fpext <2 x half>") == 1 and "fpext half" not in ir and ir.count("load <16 x i8>") == 2
    assert ir.count("alloca <16 x float>") == 2


def _run_rendered(kernel_ast, target, out_size, arrays):
    """The kernel rendered for `target`, compiled and run once over its whole range on `arrays` (its input buffers,
    in order after the output): the output."""
    import ctypes
    from prepjit.runtime.devices import get_device
    device = get_device("cpu")
    source = render_llvm(kernel_ast, target).source
    name = source.split("define void @", 1)[1].split("(", 1)[0]
    program = device.load(name, device.compile(name, source))
    out = np.zeros(out_size, np.float32)
    pointers = (ctypes.c_void_p * (1 + len(arrays)))(*[a.ctypes.data for a in (out, *arrays)])
    (loop,) = [u for u in kernel_ast.toposort() if u.op is Ops.RANGE and u.arg[1] == "loop"]
    program.fn(ctypes.addressof(pointers), ctypes.addressof((ctypes.c_int64 * 1)()), 0, loop.src[0].arg)
    return out


@pytest.mark.parametrize("kind", ["q4_0", "q4_1"])
def test_a_4_bit_weight_is_looked_up_in_a_table_of_its_block(kind, rng, monkeypatch):
    """On AVX-512 a 4-bit weight's value (q4_1's d * q + m, q4_0's d * (q - 8)) is one permute (vpermps) of a 16-entry
    table built once per block from the scales (one conversion of 16 lanes, not one per nibble half), indexed by the
    block's bytes widened to 32-bit lanes and shifted there (vpermps reads an index's low 4 bits: no byte shift or
    mask), and the sums are bit for bit those of the kernel that computes each lane's value; AVX2 and 8-bit weights
    keep the arithmetic."""
    from prepjit.codegen.llvm_reductions import PERMUTE, ReductionRendering
    from prepjit.codegen.target import host_target
    blocks = _blocks(rng, kind, 64, 768)
    x = rng.standard_normal((1, 768)).astype(np.float32)
    (kernel,) = _matvec(kind).plan(x, blocks).kernels
    out = optimize(kernel.kernel.scheduled, "llvm", AVX512)
    ir = render_llvm(out, AVX512).source
    assert ir.count(f"call <16 x float> @{PERMUTE}(") == 2 and ir.count("itofp <16 x i8>") == 1
    assert ir.count("lshr <16 x i32>") == 2 and "lshr <16 x i8>" not in ir and "and <16 x i8>" not in ir
    assert PERMUTE not in render_llvm(optimize(kernel.kernel.scheduled, "llvm", AVX2), AVX2).source
    (q8,) = _matvec("q8_0").plan(x, _blocks(rng, "q8_0", 64, 768)).kernels
    assert PERMUTE not in render_llvm(optimize(q8.kernel.scheduled, "llvm", AVX512), AVX512).source
    if host_target().vector_bytes < 64:
        pytest.skip("no AVX-512 on this host to run the kernels")
    tabled = _run_rendered(out, AVX512, 64, [x, blocks])
    monkeypatch.setattr(ReductionRendering, "lookup_tables", lambda self, bodies: {})
    computed = _run_rendered(out, AVX512, 64, [x, blocks])
    assert PERMUTE not in render_llvm(out, AVX512).source
    np.testing.assert_array_equal(tabled.view(np.uint32), computed.view(np.uint32))
    ref = x.astype(np.float64) @ pj.quant.dequantize(blocks, kind).T.astype(np.float64)
    np.testing.assert_allclose(tabled, ref[0], rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_quantized_matvec_on_avx2():
    """The same kernels compiled for a CPU without AVX-512 (PREPJIT_CPU=haswell) equal NumPy."""
    script = ("import json, numpy as np\n"
              "from tests.codegen import test_quant_matvec as t\n"
              "from prepjit.codegen.target import host_target\n"
              "rng = np.random.default_rng(1)\n"
              "for kind in t.KINDS:\n"
              "    for rows in (1, 3):\n"
              "        t.test_quantized_matvec_matches_numpy(kind, rows, 'cpu', rng)\n"
              "print(json.dumps([host_target().cpu, host_target().vector_bytes]))\n")
    env = dict(os.environ, PREPJIT_CPU="haswell")
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == ["haswell", 32]
