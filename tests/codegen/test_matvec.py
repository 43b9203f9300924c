"""Matrix-vector contractions (codegen/matvec.py): both weight layouts, static and symbolic, equal NumPy."""
import re

import numpy as np
import pytest

import prepjit as pj
from prepjit.codegen.matvec import MATVEC_ROW_BYTES, MAX_ROWS, matvec_axes
from prepjit.codegen.optimize import optimize
from prepjit.codegen.target import AVX2, AVX512
from prepjit.uop import Ops

from .test_optimize import _columns


def _kernel_ast(f, *args):
    (kernel,) = f.plan(*args).kernels
    return kernel.kernel.scheduled


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-4), (np.float64, 1e-10)])
@pytest.mark.parametrize("n,k", [(577, 64), (49153, 17), (33, 577), (1536, 576)])
def test_rows_contiguous_weight_matches_numpy_and_is_a_matvec(rng, dtype, tol, n, k):
    """W @ h and h @ W.T (the weight contiguous along the reduction): one lone sum per output, the output
    columns the outermost loop (threads split it)."""
    w, h = rng.standard_normal((n, k)).astype(dtype), rng.standard_normal(k).astype(dtype)
    for fn in (lambda w, h: w @ h, lambda w, h: h @ w.T, lambda w, h: h[None] @ w.T):
        f = pj.prepare(fn, device="cpu")
        np.testing.assert_allclose(np.asarray(f(w, h)), fn(w, h), rtol=tol, atol=tol)
        ast = _kernel_ast(f, w, h)
        assert matvec_axes(ast) is not None
        out = optimize(ast, "llvm")
        assert len(out.src) == 1  # not register-blocked
        loops = sorted((u for u in out.toposort() if u.op is Ops.RANGE and u.arg[1] == "loop"), key=lambda r: r.arg[0])
        assert loops[0].src[0].arg == n


def test_a_few_rows_keep_the_columns_outermost(rng):
    w, x = rng.standard_normal((300, 40)).astype(np.float32), rng.standard_normal((3, 40)).astype(np.float32)
    f = pj.prepare(lambda x, w: x @ w.T, device="cpu")
    np.testing.assert_allclose(np.asarray(f(x, w)), x @ w.T, rtol=1e-4, atol=1e-4)
    out = optimize(_kernel_ast(f, x, w), "llvm")
    outer = min((u for u in out.toposort() if u.op is Ops.RANGE and u.arg[1] == "loop"), key=lambda r: r.arg[0])
    assert outer.src[0].arg == 300


def test_a_batch_of_matvecs_keeps_the_batch_outermost(rng):
    a, x = rng.standard_normal((64, 3, 40)).astype(np.float32), rng.standard_normal((64, 40)).astype(np.float32)
    f = pj.prepare(lambda a, x: (a @ x[:, :, None])[:, :, 0], device="cpu")
    np.testing.assert_allclose(np.asarray(f(a, x)), (a @ x[:, :, None])[:, :, 0], rtol=1e-4, atol=1e-4)
    ast = _kernel_ast(f, a, x)
    assert matvec_axes(ast) is not None and optimize(ast, "llvm") is ast


def test_symbolic_columns_and_rows(rng):
    f = pj.prepare(lambda x, w: x @ w.T, vars={"n": (1, 2000), "m": (1, MAX_ROWS)},
                   shapes={"x": ("m", 65), "w": ("n", 65)}, device="cpu")
    for m, n in ((1, 1), (1, 1999), (MAX_ROWS, 577)):
        x, w = rng.standard_normal((m, 65)).astype(np.float32), rng.standard_normal((n, 65)).astype(np.float32)
        np.testing.assert_allclose(np.asarray(f(x, w)), x @ w.T, rtol=1e-4, atol=1e-4)
    x, w = rng.standard_normal((2, 65)).astype(np.float32), rng.standard_normal((9, 65)).astype(np.float32)
    assert matvec_axes(_kernel_ast(f, x, w)) is not None


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-4), (np.float64, 1e-10)])
@pytest.mark.parametrize("target", [AVX2, AVX512])
def test_one_row_columns_contiguous_weight_is_blocked_wide(rng, dtype, tol, target):
    """h @ W (the weight contiguous along the output columns): blocks of MATVEC_ROW_BYTES of columns."""
    h, w = rng.standard_normal(577).astype(dtype), rng.standard_normal((577, 256)).astype(dtype)
    f = pj.prepare(lambda h, w: h @ w, device="cpu")
    np.testing.assert_allclose(np.asarray(f(h, w)), h @ w, rtol=tol, atol=tol)
    ast = _kernel_ast(f, h, w)
    assert _columns(optimize(ast, "llvm", target)) == MATVEC_ROW_BYTES // np.dtype(dtype).itemsize


@pytest.mark.parametrize("target,width", [(AVX2, 1024), (AVX512, 1024)])
def test_one_row_blocks_are_wide(rng, target, width):
    """x @ W (576, 3072), a decode step's up-projection: blocks of 1024 bytes of columns (past AVX2's registers:
    the accumulators live in L1) when they divide the columns and leave 8 blocks; 576 columns take 256 bytes."""
    h, w = rng.standard_normal(576).astype(np.float32), rng.standard_normal((576, 3072)).astype(np.float32)
    f = pj.prepare(lambda h, w: h @ w, device="cpu")
    np.testing.assert_allclose(np.asarray(f(h, w)), h @ w, rtol=1e-4, atol=1e-4)
    assert _columns(optimize(_kernel_ast(f, h, w), "llvm", target)) == width // 4
    g = pj.prepare(lambda h, w: h @ w, device="cpu")
    assert _columns(optimize(_kernel_ast(g, h, w[:, :576].copy()), "llvm", target)) == MATVEC_ROW_BYTES // 4


def test_columns_contiguous_weight_and_many_rows_stay_blocked(rng):
    """h @ W (the weight contiguous along the output) and matrices of many rows keep optimize.py's blocking."""
    h, w = rng.standard_normal(577).astype(np.float32), rng.standard_normal((577, 100)).astype(np.float32)
    f = pj.prepare(lambda h, w: h @ w, device="cpu")
    np.testing.assert_allclose(np.asarray(f(h, w)), h @ w, rtol=1e-4, atol=1e-4)
    assert matvec_axes(_kernel_ast(f, h, w)) is None
    x = rng.standard_normal((MAX_ROWS + 1, 577)).astype(np.float32)
    g = pj.prepare(lambda x, w: x @ w.T, device="cpu")
    np.testing.assert_allclose(np.asarray(g(x, w.T.copy())), x @ w, rtol=1e-4, atol=1e-4)
    assert matvec_axes(_kernel_ast(g, x, w.T.copy())) is None


@pytest.mark.parametrize("target", [AVX2, AVX512])
def test_one_row_over_16_bit_rows_a_page_apart_prefetches_rows_ahead(rng, target):
    """x @ W.astype(float32) for W (576, 3072) bfloat16 or float16 (rows 6 KB apart, a page or more): each reduction
    step of a column block asks for the block's cache lines ROWS_AHEAD rows ahead (one per 64 bytes of its span, and
    its last byte); float32 weights, and rows closer than a page, are not prefetched. Values equal NumPy's."""
    import ml_dtypes

    from prepjit.codegen.llvm_reductions import ROWS_AHEAD
    from prepjit.codegen.render_llvm import render_llvm
    h = rng.standard_normal(576).astype(np.float32)
    for dtype, rows_prefetched in ((ml_dtypes.bfloat16, True), (np.float16, True), (np.float32, False)):
        for n in (3072, 1024):
            w = rng.standard_normal((576, n)).astype(dtype)
            f = pj.prepare(lambda h, w: h @ w.astype(np.float32), device="cpu")
            np.testing.assert_allclose(np.asarray(f(h, w)), h @ w.astype(np.float32), rtol=1e-4, atol=1e-3)
            out = optimize(_kernel_ast(f, h, w), "llvm", target)
            ir = render_llvm(out, target).source
            span = _columns(out) * 2
            prefetched = rows_prefetched and n * 2 >= 4096
            assert ir.count("call void @llvm.prefetch") == ((span // 64 + 1) if prefetched else 0)
            if prefetched:
                assert f", {ROWS_AHEAD * n}\n" in ir  # the offset of the row ROWS_AHEAD steps ahead


@pytest.mark.parametrize("target", [AVX2, AVX512])
def test_one_row_over_16_bit_weight_rows_prefetches_the_row_ahead_into_l2(rng, target):
    """h @ W.T.astype(float32) for W (n, 600) bfloat16 or float16 (a lone sum per output over one contiguous row,
    600 no whole number of MAX_LANES steps): before each row's sum, one prefetch into L2 per cache line of the row
    SUM_AHEAD_BYTES ahead (a loop of 19 lines of 1200 bytes). Values equal NumPy's."""
    import ml_dtypes

    from prepjit.codegen.llvm_reductions import SUM_AHEAD_BYTES
    from prepjit.codegen.render_llvm import render_llvm
    h = rng.standard_normal(600).astype(np.float32)
    for dtype in (ml_dtypes.bfloat16, np.float16):
        w = rng.standard_normal((960, 600)).astype(dtype)
        f = pj.prepare(lambda h, w: h @ w.T.astype(np.float32), device="cpu")
        np.testing.assert_allclose(np.asarray(f(h, w)), h @ w.T.astype(np.float32), rtol=1e-4, atol=1e-3)
        ir = render_llvm(optimize(_kernel_ast(f, h, w), "llvm", target), target).source
        (call,) = [line for line in ir.splitlines() if "call void @llvm.prefetch" in line]
        assert call.endswith("i32 0, i32 2, i32 1)")  # a read, into L2
        assert f"i64 {SUM_AHEAD_BYTES}\n" in ir and ", 19\n" in ir and "mul i64 %r" in ir


def test_a_split_sum_over_float_rows_prefetches_every_line_of_a_block(rng):
    """h + ctx @ W.T.astype(float32) with ctx a (3, 3, 64) attention output (an o-projection: its sum split over
    ctx's layout and summed over lanes, 3 blocks of 192 per row): each block of a bfloat16 weight row (384 bytes)
    asks for all 6 of its cache lines PREFETCH_BYTES ahead, a float32 row's block (768 bytes) for all 12. Values
    equal NumPy's."""
    import ml_dtypes

    from prepjit.codegen.llvm_reductions import PREFETCH_BYTES
    p, v = rng.random((3, 3, 40)).astype(np.float32), rng.standard_normal((3, 40, 64)).astype(np.float32)
    h = rng.standard_normal(576).astype(np.float32)
    for dtype, lines in ((ml_dtypes.bfloat16, 6), (np.float32, 12)):
        w = rng.standard_normal((576, 576)).astype(dtype)
        f = pj.prepare(lambda p, v, w, h: h + (p @ v).reshape(576) @ w.T.astype(np.float32), device="cpu")
        want = h + (p @ v).reshape(576) @ w.T.astype(np.float32)
        np.testing.assert_allclose(np.asarray(f(p, v, w, h)), want, rtol=1e-4, atol=1e-3)
        ir = f.plan(p, v, w, h).kernels[-1].kernel.source
        assert "x float> zeroinitializer" in ir  # summed over lanes
        assert ir.count("call void @llvm.prefetch") == lines
        for at in range(lines):
            assert f"i64 {PREFETCH_BYTES + 64 * at}\n" in ir


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("n,k", [(960, 576), (576, 1536), (3000, 160)])
def test_a_float_row_sum_is_summed_over_lanes_with_every_line_prefetched(rng, device, n, k, dtype):
    """h @ W.T.astype(float32) for W (n, k) float32, bfloat16 or float16 (SmolLM2's projections and output head as
    llama.py stores them): values equal NumPy's on every device; on the cpu each output's sum over its weight row is
    split into k / 32 steps of a 32-lane vector (one vector accumulator, its lanes added up once) and every step
    asks for each cache line of its 128 (float32) or 64 (16-bit) bytes of the row PREFETCH_BYTES ahead."""
    import ml_dtypes

    from prepjit.codegen.block_split import MAX_LANES
    from prepjit.codegen.llvm_reductions import PREFETCH_BYTES
    stored = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    w, h = rng.standard_normal((n, k)).astype(stored), rng.standard_normal(k).astype(np.float32)
    f = pj.prepare(lambda h, w: h @ w.T.astype(np.float32), device=device)
    np.testing.assert_allclose(np.asarray(f(h, w)), h @ w.T.astype(np.float32), rtol=1e-4, atol=1e-4)
    if device != "cpu":
        return
    (kernel,) = f.plan(h, w).kernels
    ir = kernel.kernel.source
    assert f"<{MAX_LANES} x float> zeroinitializer" in ir
    assert re.search(rf"icmp slt i64 %r\d+, {k // MAX_LANES}\n", ir)  # the loop of steps
    lines = MAX_LANES * np.dtype(stored).itemsize // 64
    assert ir.count("call void @llvm.prefetch") == lines
    assert all(f"i64 {PREFETCH_BYTES + 64 * at}\n" in ir for at in range(lines))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_float32_row_streams_from_a_rolled_loop_of_steps(rng, dtype):
    """h @ W.T for W (960, 576) (SmolLM2's q/k/v projection): the loop of a float32 row's steps carries LLVM's
    unroll.disable hint (llvm_reductions.ROLLED), so the compiled kernel asks for the row's lines from that loop, one
    prefetch per line of a 128-byte step as the step's loads stream (2 prefetch instructions), not all 36 of a row
    in one burst after its sum (LLVM unrolls the 18 steps whole and sinks the prefetches). A bfloat16 row's loop is
    left to LLVM. Values equal NumPy's; the kernel's results have the same bits either way (same sums, same order)."""
    import llvmlite.binding as llvm
    import ml_dtypes

    from prepjit.codegen.llvm_reductions import ROLLED
    from prepjit.runtime.devices import get_device
    from prepjit.runtime.llvm_compile import optimised_module
    stored = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32
    w, h = rng.standard_normal((960, 576)).astype(stored), rng.standard_normal(576).astype(np.float32)
    f = pj.prepare(lambda h, w: h @ w.T.astype(np.float32), device="cpu")
    np.testing.assert_allclose(np.asarray(f(h, w)), h @ w.T.astype(np.float32), rtol=1e-4, atol=1e-4)
    (kernel,) = f.plan(h, w).kernels
    ir = kernel.kernel.source
    rolled = re.search(r"br label %L\d+\.cond, !llvm\.loop !(\d+)\n", ir)
    if dtype == "bfloat16":
        assert rolled is None
        return
    node = re.search(rf"^!{rolled.group(1)} = distinct !\{{!{rolled.group(1)}, !(\d+)\}}$", ir, re.M)
    assert re.search(rf"^!{node.group(1)} = !\{{{re.escape(ROLLED)}\}}$", ir, re.M)
    machine = get_device("cpu").target_machine
    if not machine.triple.startswith("x86_64"):
        return
    module = optimised_module(llvm, machine, ir)  # as the kernel is compiled
    # each copy of the rolled loop asks for 2 lines a step (LLVM may unroll the loop over rows around it, as on znver3,
    # which copies the rolled loop: 3 copies there, 2 prefetches each); unrolled, one block would hold all 36
    blocks = re.split(r"^\.?LBB\d+_\d+:", machine.emit_assembly(module), flags=re.M)
    counts = [n for n in (block.count("prefetcht0") for block in blocks) if n]
    assert counts and set(counts) == {2}, counts
