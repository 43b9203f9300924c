"""An encoder's attention on CUDA is one tensor-core kernel (attention_tiles.py decides it, render_attention.py renders
it): softmax(q @ k^T * scale + mask) @ v, T queries a key, a work-group per (batch, head, block of queries), a pass
over the keys per row reduction (the scores by mma.sync, or, up to KEEP_KEYS keys, what the last pass kept) and a
last one multiplying the probabilities (from the score accumulators' registers) by the values. Checked through
cuda_emulation against NumPy with the graph's roundings, at key lengths of one var's range that are and are not
multiples of the key block, with a padding mask; causal, grouped-query and cross attention too, and MiniLM's layer."""
import math
import re

import ml_dtypes
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from examples.models import minilm
from examples.models.common import DTYPES, tree_cast
from prepjit.codegen import attention_tiles, targets
from prepjit.codegen.attention_tiles import KEEP_KEYS, match_attention
from prepjit.codegen.bounds import prove_launched
from prepjit.codegen.gpu_launch import launch_of
from prepjit.codegen.schedule import schedule
from prepjit.codegen.targets import CUDA_HOPPER_TARGET, CUDA_TARGET, LLVM, OPENCL_TARGET
from prepjit.uop import Ops, dtypes

from . import cuda_emulation

H, D = 2, 32
VARS = {"B": (1, 4), "T": (1, 256)}
SHAPES = {"q": ("B", H, "T", D), "k": ("B", H, "T", D), "v": ("B", H, "T", D), "mask": ("B", "T")}
LENGTHS = (1, 5, 64, 127, 128, 200)


def attention(xp, q, k, v, mask):
    """MiniLM's attention of split heads (minilm.attention): the scores widened by the float32 mask bias, the
    softmax in float32, its probabilities rounded to the heads' dtype."""
    bias = ((1 - mask) * minilm.MASKED)[:, None, None, :]
    scores = q @ xp.swapaxes(k, 2, 3) * (1 / math.sqrt(D)) + bias
    return minilm.softmax(xp, scores, q.dtype) @ v


def reference(q, k, v, mask, dtype):
    """`attention` in NumPy, float32 rounded to `dtype` where the graph rounds: the scores, their scaling, the
    probabilities and the context."""
    def rounded(x):
        return x.astype(dtype).astype(np.float32)
    q, k, v = (x.astype(np.float32) for x in (q, k, v))
    scores = rounded(rounded(q @ np.swapaxes(k, 2, 3)) * np.float32(dtype(1 / math.sqrt(D))))
    scores = scores + ((1 - mask) * minilm.MASKED)[:, None, None, :]
    e = np.exp(scores - scores.max(-1, keepdims=True))
    return rounded(rounded(e / e.sum(-1, keepdims=True)) @ v)


def _args(dtype, b: int, t: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((b, H, t, D)).astype(dtype) for _ in range(3))
    mask = np.ones((b, t), np.float32)
    mask[-1, max(1, t - 7):] = 0   # the last sequence padded (its last 7 positions, one kept at least)
    return q, k, v, mask


def _traced(dtype, longest: int = 256):
    f = pj.prepare(lambda q, k, v, mask: attention(pnp, q, k, v, mask), vars={**VARS, "T": (1, longest)},
                   shapes=SHAPES)
    return pj.trace(f, *_args(dtype, 2, 40))


def test_an_encoders_attention_is_one_kernel_on_cuda():
    """With the CUDA target's attention tiles the scores, the softmax row and p @ V are one kernel (the mask's bias
    is computed once, for every layer that reads it): no kernel writes the scores. Without (OpenCL, the cpu's
    targets), three."""
    traced = _traced(ml_dtypes.bfloat16)
    assert CUDA_TARGET.fuses_attention and CUDA_HOPPER_TARGET.fuses_attention
    assert not OPENCL_TARGET.fuses_attention and not LLVM.fuses_attention
    three = schedule(list(traced.outputs), list(traced.inputs))
    one = schedule(list(traced.outputs), list(traced.inputs), attention_tiles=True)

    def reductions(sched):
        return [k for k in sched.kernels if any(u.op is Ops.REDUCE for u in k.ast.toposort())]
    assert len(reductions(three)) == 3
    (fused,) = reductions(one)
    assert launch_of(CUDA_TARGET.launched(fused.ast)) == ("attention", 64, 64, "bfloat16")
    assert launch_of(OPENCL_TARGET.launched(reductions(three)[1].ast))[0] == "rows"


def test_the_attention_kernels_accesses_are_proven():
    """The bounds proof runs on the launched attention kernel (its loads: the queries, keys, values and the bias at
    the ranges' values the renderer binds, each inside its range), for every value of B and T."""
    traced = _traced(ml_dtypes.bfloat16)
    sched = schedule(list(traced.outputs), list(traced.inputs), attention_tiles=True)
    (kernel,) = [k for k in sched.kernels if launch_of(CUDA_TARGET.launched(k.ast))[0] == "attention"]
    shapes = [sched.buffers[b].shape for b in kernel.buffers]
    # the store, the values' load and the queries', keys' and bias' loads of each pass (the max, the sum, p @ V)
    assert prove_launched(CUDA_TARGET.launched(kernel.ast), shapes) == 2 + 3 * 3


def test_the_bias_of_a_key_is_staged_in_local_memory():
    """The mask's bias of each key (loaded for a key alone: no query row indexes it) is staged in local memory with
    the keys, once for all the passes (each pass's load of it, moved to p @ V's key range, is one): the passes read it
    from there, none from global memory."""
    traced = _traced(ml_dtypes.bfloat16)
    sched = schedule(list(traced.outputs), list(traced.inputs), attention_tiles=True)
    (kernel,) = [k for k in sched.kernels if launch_of(CUDA_TARGET.launched(k.ast))[0] == "attention"]
    (bias,) = match_attention(kernel.ast).staged
    assert bias.op is Ops.LOAD and bias.dtype == dtypes.float32
    source = CUDA_TARGET.render(CUDA_TARGET.launched(kernel.ast)).source
    passes = source[source.index("pj_cp_async_wait<1>"):]   # (after the copies: the passes, then the results)
    bias_buffer = f"buf{bias.src[0].arg}["   # (its DEFINE_GLOBAL's slot)
    assert "L0s[(kbase + 0)]" in passes and bias_buffer in source and bias_buffer not in passes


def _emulated(sched, inputs: list, values: dict) -> np.ndarray:
    """Every kernel of `sched` run in order through cuda_emulation, its vars at `values`; the output buffer."""
    bufs = {i: a.ravel() for i, a in zip(sched.inputs, inputs)}
    for kernel in sched.kernels:
        src = CUDA_TARGET.render(CUDA_TARGET.launched(kernel.ast))
        spec = sched.buffers[kernel.buffers[0]]
        out = np.zeros(spec.max_size, spec.dtype.np)
        cuda_emulation.run(src, [out] + [bufs[i] for i in kernel.buffers[1:]],
                           var_values={v: values[v] for v in src.var_names})
        bufs[kernel.buffers[0]] = out
    return bufs[sched.outputs[0]]


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
@pytest.mark.parametrize("longest", [128, 256])
@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16], ids=["bf16", "f16"])
def test_the_emulated_attention_kernel_equals_numpy(dtype, longest):
    """One kernel of a var T serves every length up to its largest (1 key; a key block's part; whole blocks; a
    masked tail past the last whole block; more than one block and a tail), batch 2 whose second sequence is padded:
    NumPy's values with the graph's roundings, within the last bit of a 16-bit float (the sums' order differs). Up to
    KEEP_KEYS keys each pass keeps what the next computes too (x = s * scale + bias for the sum's pass, exp(x - max)
    for the probabilities: the scores are computed by the first pass only); beyond, each pass computes its own."""
    traced = _traced(dtype, longest)
    sched = schedule(list(traced.outputs), list(traced.inputs), attention_tiles=True)
    assert [launch_of(CUDA_TARGET.launched(k.ast))[0] for k in sched.kernels] == ["items", "attention"]
    kept = match_attention(sched.kernels[1].ast).kept
    assert (len(kept) == 2 and None not in kept) if longest <= KEEP_KEYS else kept == ()
    for t in (n for n in LENGTHS if n <= longest):
        args = _args(dtype, 2, t, seed=t)
        got = _emulated(sched, list(args), {"B": 2, "T": t})[:2 * H * t * D].astype(np.float32)
        want = reference(*args, dtype)
        np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-2, atol=1e-2 * np.abs(want).max(),
                                   err_msg=f"T = {t}")


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
@pytest.mark.parametrize("key_block", [32, 128])
def test_other_key_blocks_equal_numpy(monkeypatch, request, key_block):
    """attention_tiles.KEY_BLOCK is the launch's (a knob for timing: 32 keys' scores a warp at a time, or 128): the
    kernel it launches equals NumPy at T = 5, 100, 128 of a var T of at most 128."""
    monkeypatch.setattr(attention_tiles, "KEY_BLOCK", key_block)
    targets._launched.cache_clear()   # (launched kernels are memoised: this test's are launched anew, and forgotten)
    request.addfinalizer(targets._launched.cache_clear)
    traced = _traced(ml_dtypes.bfloat16, 128)
    sched = schedule(list(traced.outputs), list(traced.inputs), attention_tiles=True)
    assert launch_of(CUDA_TARGET.launched(sched.kernels[1].ast)) == ("attention", 64, key_block, "bfloat16")
    for t in (5, 100, 128):
        args = _args(ml_dtypes.bfloat16, 2, t, seed=t)
        got = _emulated(sched, list(args), {"B": 2, "T": t})[:2 * H * t * D].astype(np.float32)
        want = reference(*args, ml_dtypes.bfloat16)
        np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-2, atol=1e-2 * np.abs(want).max(),
                                   err_msg=f"T = {t}")


def test_each_key_block_is_a_group_of_copies_where_the_blocks_are_unrolled():
    """Up to KEEP_KEYS keys (the key blocks unrolled) each key block is a group of asynchronous copies (the first
    pass waits for each before its block), then the values': three groups at a T of at most 128. Beyond, the keys
    are one group, the values another."""
    for longest, groups in ((128, 3), (256, 2)):
        traced = _traced(ml_dtypes.bfloat16, longest)
        sched = schedule(list(traced.outputs), list(traced.inputs), attention_tiles=True)
        source = CUDA_TARGET.render(CUDA_TARGET.launched(sched.kernels[1].ast)).source
        assert source.count("pj_cp_async_commit();") == groups, longest


def test_resident_groups_follow_what_a_lane_holds():
    """The launch asks for 6 resident groups (MiniLM's grid in one wave of an H100) where a lane keeps no value
    across passes or keeps them for heads of 32 and a static number of keys (no key guards), 5 at a var T (the
    guards), 4 for heads of 64: Attention.resident_groups, the kernel's __launch_bounds__."""
    static = pj.prepare(lambda q, k, v, mask: attention(pnp, q, k, v, mask), vars={"B": (1, 4)},
                        shapes={**{x: ("B", H, 128, D) for x in "qkv"}, "mask": ("B", 128)})
    rng = np.random.default_rng(6)
    causal_d64 = pj.prepare(lambda q, k, v: causal(pnp, q, k, v), vars={"T": (1, 128)},
                            shapes={x: (2, 2, "T", 64) for x in "qkv"})
    cases = [(pj.trace(static, *_args(ml_dtypes.bfloat16, 2, 128)), 6), (_traced(ml_dtypes.bfloat16, 256), 6),
             (_traced(ml_dtypes.bfloat16, 128), 5),
             (pj.trace(causal_d64, *[rng.standard_normal((2, 2, 9, 64)).astype(ml_dtypes.bfloat16)
                                     for _ in range(3)]), 4)]
    for traced, groups in cases:
        sched = schedule(list(traced.outputs), list(traced.inputs), attention_tiles=True)
        (kernel,) = [k for k in sched.kernels if launch_of(CUDA_TARGET.launched(k.ast))[0] == "attention"]
        assert match_attention(kernel.ast).resident_groups == groups
        source = CUDA_TARGET.render(CUDA_TARGET.launched(kernel.ast)).source
        assert f"__launch_bounds__(128, {groups})" in source


def test_the_passes_round_to_bfloat16_in_one_instruction():
    """The passes' and the probabilities' roundings to bfloat16 (whose NaN bits reach no stored value) are the
    dialect's shorter rounding (render_c.round_to with exact_nan off: CUDA's pj_round_bfloat16_any); the stored
    context's are the exact helper's."""
    traced = _traced(ml_dtypes.bfloat16, 128)
    sched = schedule(list(traced.outputs), list(traced.inputs), attention_tiles=True)
    source = CUDA_TARGET.render(CUDA_TARGET.launched(sched.kernels[1].ast)).source
    body = source[source.index("__global__"):]
    exact = re.findall(r"pj_round_bfloat16\((\w+)\)", body)   # (the stored context's: its accumulators o{y}_{e})
    assert "pj_round_bfloat16_any(" in body and exact and all(re.fullmatch(r"o\d+_\d", v) for v in exact)


def causal(xp, q, k, v):
    """Causal attention of heads of 64 (a decoder's prefill): the float32 scores of later keys -1e30 (a select of the
    query row's and the key's positions, no load), the probabilities rounded to the heads' dtype."""
    steps = xp.arange(q.shape[2])
    scores = (q @ xp.swapaxes(k, 2, 3)).astype(np.float32) * (1 / math.sqrt(q.shape[-1]))
    scores = xp.where(steps[:, None] >= steps[None, :], scores, -1e30)
    e = xp.exp(scores - xp.max(scores, axis=-1, keepdims=True))
    return (e / xp.sum(e, axis=-1, keepdims=True)).astype(q.dtype) @ v


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
def test_a_causal_attention_of_wider_heads_is_one_attention_kernel_and_equals_numpy():
    """Causal attention of heads of 64 and a var T of at most 128: one attention kernel whose passes compare the
    query row with the key (bound to the element's), equal to NumPy's with the graph's roundings at T = 1, 37, 128.
    At most 256 keys its keys and values no longer fit the tile's local memory (attention_tiles.fits): three
    kernels."""
    dtype, b, heads, d = ml_dtypes.bfloat16, 2, 2, 64

    def prepared(longest):
        return pj.prepare(lambda q, k, v: causal(pnp, q, k, v), vars={"T": (1, longest)},
                          shapes={x: (b, heads, "T", d) for x in "qkv"})
    rng = np.random.default_rng(3)
    args = [rng.standard_normal((b, heads, 128, d)).astype(dtype) for _ in range(3)]
    wide = pj.trace(prepared(256), *args)
    assert len(schedule(list(wide.outputs), list(wide.inputs), attention_tiles=True).kernels) == 3
    traced = pj.trace(prepared(128), *args)
    sched = schedule(list(traced.outputs), list(traced.inputs), attention_tiles=True)
    (kernel,) = sched.kernels
    assert launch_of(CUDA_TARGET.launched(kernel.ast))[0] == "attention"
    for t in (1, 37, 128):
        part = [np.ascontiguousarray(a[:, :, :t]) for a in args]
        got = _emulated(sched, part, {"T": t})[:b * heads * t * d].astype(np.float32).reshape(b, heads, t, d)
        q, k, v = (a.astype(np.float32) for a in part)
        scores = (q @ np.swapaxes(k, 2, 3)).astype(dtype).astype(np.float32) * np.float32(1 / math.sqrt(d))
        scores = np.where(np.tril(np.ones((t, t), bool)), scores, np.float32(-1e30))
        e = np.exp(scores - scores.max(-1, keepdims=True))
        want = ((e / e.sum(-1, keepdims=True)).astype(dtype).astype(np.float32) @ v).astype(dtype).astype(np.float32)
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2 * np.abs(want).max(), err_msg=f"T = {t}")


def grouped(xp, q, k, v):
    """Grouped-query attention: q (KV, G, T, d) against k and v (KV, T, d), each key head read by G query heads of T
    rows (the query rows of a key head: G x T, two ranges)."""
    w = (q @ xp.swapaxes(k, 1, 2)[:, None] * (1 / math.sqrt(q.shape[-1]))).astype(np.float32)
    e = xp.exp(w - xp.max(w, axis=-1, keepdims=True))
    return (e / xp.sum(e, axis=-1, keepdims=True)).astype(q.dtype) @ v[:, None]


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
def test_grouped_query_heads_are_one_attention_kernel_and_equal_numpy():
    """Grouped-query attention (3 query heads a key head, heads of 64, a var T of at most 128): one attention kernel
    whose blocks of 64 query rows are taken from the group's rows flattened (G x T: a block may span two query heads,
    which read the same keys), NumPy's values with the graph's roundings at T = 1, 50, 128 (three kernels before:
    the launch took one row range only)."""
    dtype, kv, g, d = ml_dtypes.bfloat16, 2, 3, 64
    f = pj.prepare(lambda q, k, v: grouped(pnp, q, k, v), vars={"T": (1, 128)},
                   shapes={"q": (kv, g, "T", d), "k": (kv, "T", d), "v": (kv, "T", d)})
    rng = np.random.default_rng(4)
    shapes = ((kv, g, 9, d), (kv, 9, d), (kv, 9, d))
    traced = pj.trace(f, *(rng.standard_normal(shape).astype(dtype) for shape in shapes))
    sched = schedule(list(traced.outputs), list(traced.inputs), attention_tiles=True)
    (kernel,) = sched.kernels
    assert launch_of(CUDA_TARGET.launched(kernel.ast))[0] == "attention"
    assert len(match_attention(kernel.ast).context.i) == 2
    for t in (1, 50, 128):
        q, k, v = (rng.standard_normal(shape).astype(dtype) for shape in ((kv, g, t, d), (kv, t, d), (kv, t, d)))
        got = _emulated(sched, [q, k, v], {"T": t})[:kv * g * t * d].astype(np.float32).reshape(kv, g, t, d)
        q32, k32, v32 = (x.astype(np.float32) for x in (q, k, v))
        scores = (q32 @ np.swapaxes(k32, 1, 2)[:, None]).astype(dtype)
        scores = (scores * dtype(1 / math.sqrt(d))).astype(dtype).astype(np.float32)
        e = np.exp(scores - scores.max(-1, keepdims=True))
        p = (e / e.sum(-1, keepdims=True)).astype(dtype).astype(np.float32)
        want = (p @ v32[:, None]).astype(dtype).astype(np.float32)
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2 * np.abs(want).max(), err_msg=f"T = {t}")


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
def test_cross_attention_with_a_bias_of_each_query_and_key_equals_numpy():
    """S queries against T keys (two vars) with a float32 bias of each (query, key): the passes load the bias of a
    query row, so rows past S are left out (not computed from the staged zeros); NumPy's values at (S, T) = (70, 100)
    (a partial key block, a partial query block), (100, 3), (1, 128)."""
    dtype, b, heads, d = ml_dtypes.bfloat16, 2, 2, 32

    def cross(xp, q, k, v, bias):
        w = (q @ xp.swapaxes(k, 2, 3)).astype(np.float32) * 0.25 + bias
        e = xp.exp(w - xp.max(w, axis=-1, keepdims=True))
        return (e / xp.sum(e, axis=-1, keepdims=True)).astype(q.dtype) @ v
    f = pj.prepare(lambda q, k, v, bias: cross(pnp, q, k, v, bias), vars={"S": (1, 100), "T": (1, 128)},
                   shapes={"q": (b, heads, "S", d), "k": (b, heads, "T", d), "v": (b, heads, "T", d),
                           "bias": (b, heads, "S", "T")})
    rng = np.random.default_rng(5)

    def args(queries, keys):
        return [rng.standard_normal(shape).astype(dtype) for shape in
                ((b, heads, queries, d), (b, heads, keys, d), (b, heads, keys, d))] + \
            [rng.standard_normal((b, heads, queries, keys)).astype(np.float32)]
    traced = pj.trace(f, *args(9, 11))
    sched = schedule(list(traced.outputs), list(traced.inputs), attention_tiles=True)
    (kernel,) = sched.kernels
    launched = CUDA_TARGET.launched(kernel.ast)
    assert launch_of(launched)[0] == "attention" and "if (row0)" in CUDA_TARGET.render(launched).source
    for queries, keys in ((70, 100), (100, 3), (1, 128)):
        a = args(queries, keys)
        got = _emulated(sched, a, {"S": queries, "T": keys})[:b * heads * queries * d].astype(np.float32)
        q, k, v = (x.astype(np.float32) for x in a[:3])
        w = (q @ np.swapaxes(k, 2, 3)).astype(dtype).astype(np.float32) * np.float32(0.25) + a[3]
        e = np.exp(w - w.max(-1, keepdims=True))
        want = ((e / e.sum(-1, keepdims=True)).astype(dtype).astype(np.float32) @ v).astype(dtype).astype(np.float32)
        np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-2, atol=1e-2 * np.abs(want).max(),
                                   err_msg=f"S = {queries}, T = {keys}")


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
def test_minilms_attention_layer_is_one_attention_kernel_and_equals_numpy():
    """MiniLM's attention (minilm.attention: one projection for q, k and v, the heads views of it, the output
    projection) in bfloat16 on CUDA: the heads' attention is one attention kernel, which reads the projection's
    views (a row of 1152 a token) in place; the layer equals NumPy's float32 run of the same code (its weights the
    bfloat16 ones widened) within bfloat16's rounding of the layer's values."""
    rng = np.random.default_rng(1)
    lp = tree_cast(minilm.random_params(rng, layers=1), DTYPES["bf16"])["layers"][0]
    weights = [lp[name] for name in ("wqkv", "bqkv", "wo", "bo")]
    b, t = 2, 37
    h = rng.standard_normal((b, t, 384)).astype(ml_dtypes.bfloat16)
    mask = np.ones((b, t), np.float32)
    mask[1, 30:] = 0

    def layer(xp, wqkv, bqkv, wo, bo, h, mask):
        bias = ((1 - mask) * minilm.MASKED)[:, None, None, :]
        return minilm.attention(xp, {"wqkv": wqkv, "bqkv": bqkv, "wo": wo, "bo": bo}, h, bias)
    f = pj.prepare(lambda wqkv, bqkv, wo, bo, h, mask: layer(pnp, wqkv, bqkv, wo, bo, h, mask), vars=VARS,
                   shapes={"h": ("B", "T", 384), "mask": ("B", "T")})
    traced = pj.trace(f, *weights, h, mask)
    sched = schedule(list(traced.outputs), list(traced.inputs), attention_tiles=True)
    launches = [launch_of(CUDA_TARGET.launched(k.ast))[0] for k in sched.kernels]
    assert launches.count("attention") == 1 and "rows" not in launches, launches
    (fused,) = [k for k in sched.kernels if launch_of(CUDA_TARGET.launched(k.ast))[0] == "attention"]
    assert match_attention(fused.ast).score.k.src[0].arg == D
    got = _emulated(sched, [*weights, h, mask], {"B": b, "T": t})[:b * t * 384].astype(np.float32)
    wide = [x.astype(np.float32) for x in (*weights, h)]
    want = layer(np, *wide, mask)
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=3e-2, atol=3e-2 * np.abs(want).max())
