"""The cpu's operand prologue (codegen/operand_prologue.py): a matvec's operand computed from its reduction's index
only (RMSNorm's normalised row, SiLU(gate) * up) is computed once per call into an array of the kernel's own, and
the contraction, reading it back, is optimised as a plain matvec (split at a quantized weight's blocks)."""
import ml_dtypes
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen.bounds import prove_kernel
from prepjit.codegen.render_llvm import render_llvm
from prepjit.codegen.schedule import schedule
from prepjit.codegen.targets import LLVM
from prepjit.errors import CompileError
from prepjit.uop import Ops, UOp, dtypes

K, N = 576, 960


def _weights(rng, kind):
    """(the weight as the kernel reads it, its dequantize-and-transpose, its float64 (N, K) values)."""
    w = (rng.standard_normal((N, K)) * 0.05).astype(np.float32)
    if kind == "f32":
        return w, lambda w: w.T, w.astype(np.float64)
    if kind == "bf16":
        b = w.astype(ml_dtypes.bfloat16)
        return b, lambda w: w.T.astype(np.float32), b.astype(np.float64)
    blocks = pj.quant.quantize(w, kind)
    return blocks, lambda b: pj.quant.dequantize(b, kind).T, pj.quant.dequantize(blocks, kind).astype(np.float64)


def _norm_matvec(xp, x, gain, w, deq):
    return x / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) + 1e-5) * gain @ deq(w)


def _swiglu_down(xp, gate, up, w, deq):
    return gate / (1 + xp.exp(-gate)) * up @ deq(w)


@pytest.mark.parametrize("kind", ["f32", "bf16", "q4_1", "q8_0"])
@pytest.mark.parametrize("g", [_norm_matvec, _swiglu_down])
def test_a_computed_operand_is_computed_in_the_matvec_reading_it(device, rng, kind, g):
    """One kernel on every device (the cpu had 2 before this prologue: the operand materialised, then the matvec),
    equal to NumPy in float64 of the same weights."""
    a, b = rng.standard_normal(K).astype(np.float32), rng.standard_normal(K).astype(np.float32)
    w, deq, w64 = _weights(rng, kind)
    f = pj.prepare(lambda a, b, w: g(pnp, a, b, w, deq), device=device)
    want = g(np, a.astype(np.float64), b.astype(np.float64), w64, lambda w: w.T)
    np.testing.assert_allclose(np.asarray(f(a, b, w)), want, rtol=2e-5, atol=2e-5)
    assert [row["kernel"] for row in pj.profile(f, a, b, w).rows] == [f"r_{N}"]


def _launched(g, kind, rng):
    a, b = rng.standard_normal(K).astype(np.float32), rng.standard_normal(K).astype(np.float32)
    w, deq, _ = _weights(rng, kind)
    traced = pj.trace(lambda a, b, w: g(pnp, a, b, w, deq), a, b, w)
    (kernel,) = schedule(list(traced.outputs), list(traced.inputs), pack_contractions=True).kernels
    return LLVM.launched(kernel.ast)


@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
def test_the_operand_is_a_prologue_and_the_matvec_keeps_its_block_split(rng, kind):
    """The launched kernel's first store writes the operand (K elements) into its own array; the contraction reads
    it back and is split at the weight's blocks (a lane range: vectors of a block's steps), as a matvec of a
    materialised operand is (inlined without the prologue it was not split: 64 ms a token instead of 20). (On AVX2
    a q4_1 kernel computes the operand's block sums into an array of its own next: block_scales.py.)"""
    ast = _launched(_norm_matvec, kind, rng)
    first, *more, main = ast.src
    assert first.src[0].op is Ops.DEFINE_LOCAL and first.src[0].arg == (0, K)
    assert all(st.src[0].op is Ops.DEFINE_LOCAL for st in more) and len(more) <= 1
    assert any(u.op is Ops.RANGE and u.arg[1] == "lane" for u in main.toposort())
    assert any(u.op is Ops.LOAD and u.src[0] is first.src[0] for u in main.toposort())
    assert not any(u.op is Ops.SQRT for u in main.toposort())  # the norm is computed in the prologue only


def test_the_prologue_runs_before_the_parallel_loop(rng):
    """Rendered, the mean of squares' loop comes first, then the operand's loop, then the loop over this call's
    outputs (from %start): the operand is computed once per call, not once per output."""
    source = render_llvm(_launched(_norm_matvec, "q4_1", rng)).source
    starts = [line.split(",")[0].strip() for line in source.splitlines()
              if line.strip().startswith("store i64 0,") or line.strip().startswith("store i64 %start,")]
    first_output = starts.index("store i64 %start")
    assert first_output >= 2 and set(starts[:first_output]) == {"store i64 0"}, starts
    assert "%local0 = alloca [576 x float], align 64" in source


def _local_kernel(end: int) -> UOp:
    """out[j] = sum_k scratch[k] after scratch[k'] = k' for k' < `end`: a 16-element array."""
    scratch = UOp(Ops.DEFINE_LOCAL, dtypes.float32, (), (0, 16))
    k2 = UOp(Ops.RANGE, dtypes.index, (UOp.const(end),), (2, "serial"))
    first = UOp(Ops.STORE, dtypes.bool, (scratch, k2, UOp(Ops.CAST, dtypes.float32, (k2,))))
    j = UOp(Ops.RANGE, dtypes.index, (UOp.const(4),), (0, "loop"))
    k = UOp(Ops.RANGE, dtypes.index, (UOp.const(16),), (1, "reduce"))
    total = UOp(Ops.REDUCE, dtypes.float32, (UOp(Ops.LOAD, dtypes.float32, (scratch, k)), k), Ops.ADD)
    out = UOp(Ops.STORE, dtypes.bool, (UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0), j, total))
    return UOp(Ops.SINK, dtypes.bool, (first, out), "r_4")


def test_the_bounds_proof_covers_the_kernels_own_array():
    """Its accesses are proven against the size its DEFINE_LOCAL names: 16 stores of 16 elements pass, 17 do not."""
    assert prove_kernel(_local_kernel(16), [(4,)]) == 3
    with pytest.raises(CompileError, match="store to buffer slot"):
        prove_kernel(_local_kernel(17), [(4,)])


def test_operands_of_some_loops_are_prologues_too(rng):
    """Attention scores over a cache whose new row is k's RoPE, against q's RoPE: both RoPEs depend on the heads and
    the reduction, not on the cache position, so each is computed once per call (k's 3 x 64, q's 3 x 2 x 64 values)
    and the contraction only selects the new row (one WHERE left; inline, each RoPE is a chain of them at every
    cache element)."""
    from examples.models.llama import rope
    cache = rng.standard_normal((3, 16, 64)).astype(np.float32)
    qk = rng.standard_normal(576).astype(np.float32)
    cos, sin = rng.standard_normal((2, 64)).astype(np.float32)

    def g(qk, cache, cos, sin, pos):
        k = rope(pnp, qk[384:].reshape(3, 64), cos, sin)
        q = rope(pnp, qk[:384].reshape(3, 2, 64), cos, sin)
        return q @ pnp.swapaxes(cache[:, :pos + 1].at[:, pos].set(k), 1, 2)
    traced = pj.trace(pj.prepare(g, vars={"pos": (0, 15)}), qk, cache, cos, sin, 5)
    (kernel,) = schedule(list(traced.outputs), list(traced.inputs), pack_contractions=True).kernels
    *prologue, main = LLVM.launched(kernel.ast).src
    assert sorted(st.src[0].arg[1] for st in prologue) == [192, 384]
    assert sum(u.op is Ops.WHERE for u in main.toposort()) == 1


def test_operands_past_the_stack_budget_stay_inline(rng):
    """The kernel's own arrays live on each calling thread's stack, laid out for a var's maximum: the normalised rows
    of a batch of at most 8 rows of 2**12 floats (128 KiB in float32, MAX_BYTES) are a prologue, in float64 (256 KiB)
    computed inline; both equal NumPy for each batch size."""
    from prepjit.codegen.operand_prologue import MAX_BYTES
    rows, n = 8, 1 << 12
    for dtype, kept in ((np.float32, True), (np.float64, False)):
        assert (rows * n * np.dtype(dtype).itemsize <= MAX_BYTES) == kept
        gain, w = rng.standard_normal(n).astype(dtype), rng.standard_normal((8, n)).astype(dtype)
        f = pj.prepare(lambda x, g, w: _norm_matvec(pnp, x, g, w, lambda w: w.T), vars={"B": (1, rows)},
                       shapes={"x": ("B", n)})
        for b in (1, 5, rows):
            x = rng.standard_normal((b, n)).astype(dtype)
            np.testing.assert_allclose(np.asarray(f(x, gain, w)), _norm_matvec(np, x, gain, w, lambda w: w.T),
                                       rtol=1e-4, atol=1e-3)
        traced = pj.trace(f, x, gain, w)
        (kernel,) = schedule(list(traced.outputs), list(traced.inputs), pack_contractions=True).kernels
        locals_ = [u for u in LLVM.launched(kernel.ast).toposort() if u.op is Ops.DEFINE_LOCAL]
        assert bool(locals_) == kept
