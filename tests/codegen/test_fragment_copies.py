"""How a tensor-core tile's operands are copied into local memory (fragment_copies.py): a chunk of a plain, aligned
operand by one asynchronous copy, tested against k's end only where a slice can pass it (k no multiple of the slices'
depth, or sets of work-items that split k); a slice's chunks under one test, each at a place computed once; the
products equal NumPy's on the CUDA emulation either way."""
import ml_dtypes
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from examples.models import minilm
from examples.models.common import DTYPES, numpy_namespace, tree_cast
from prepjit.codegen import fragment_copies, render_fragments
from prepjit.codegen.gpu_launch import launch_of
from prepjit.codegen.render_cuda import render_cuda
from prepjit.codegen.schedule import schedule
from prepjit.codegen.targets import CUDA_HOPPER_TARGET
from prepjit.uop import Ops, UOp, dtypes

from . import cuda_emulation
from .test_render_fragments import emulate, float32_kernel, strided_narrow_kernel


@pytest.mark.parametrize("k, tested", [(64, False), (40, True)])
def test_whole_slices_copy_without_testing_k(k, tested):
    src = render_cuda(strided_narrow_kernel(dtypes.bfloat16, 128, 96, k), (128, 64, 1, "bfloat16")).source
    assert "pj_cp_async16(dst, src)" in src
    assert (f"gk + 8 <= {k}LL" in src) == tested and ("if (okA0)" in src) != tested


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
@pytest.mark.parametrize("wgmma", [False, True], ids=["mma_sync", "wgmma"])
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "unaligned"])
def test_whole_slices_compute_the_matmul(wgmma, offset):
    """k = 96 (three whole slices), a batch of 2; both operands one element into their buffers (no aligned chunk:
    element copies) or not, a along k and b along its columns, then both transposed."""
    for a_t in (False, True):
        ast = strided_narrow_kernel(dtypes.bfloat16, 130, 72, 96, a_t, a_t, batch=2, offset=offset)
        emulate(ast, ml_dtypes.bfloat16, 130, 72, 96, a_t, a_t, batch=2, offset=offset,
                tile=(128, 64, 1, "bfloat16"), wgmma=wgmma)


@pytest.mark.parametrize("k, whole", [(64, ""), (40, " && ((kt + ahead) + 1) * 32 <= 40LL")])
def test_a_slices_chunks_are_copied_under_one_test(k, whole, monkeypatch):
    """A 128 x 64 tile of aligned bfloat16 operands: each slice's chunks of an operand are copied by cp.async under
    one test of the work-item's chunks (okA, and the slice inside k where k has a partial slice), each chunk a
    constant further than the work-item's first (a rows along k: 32 rows of 32 elements; b's 64-element blocks: 16
    rows of 64), the chunk-by-chunk code kept for the other slices; with ONE_TEST_A_SLICE off, none of it."""
    ast = strided_narrow_kernel(dtypes.bfloat16, 128, 96, k)
    src = render_cuda(ast, (128, 64, 1, "bfloat16")).source
    assert f"if (okA{whole})" in src and f"if (okB{whole})" in src
    assert "const bool okA = okA0 && okA1 && okA2 && okA3;" in src
    assert "pj_cp_async16(into + dstA + 3072, srcA3 + (kt + ahead) * (32LL));" in src
    assert "pj_cp_async16(into + dstB + 1024, srcB1 + (kt + ahead) * (3072LL));" in src
    assert "pj_cp_async16(dst, src)" in src   # (the chunk-by-chunk copies: unaligned chunks, a partial slice)
    monkeypatch.setattr(fragment_copies, "ONE_TEST_A_SLICE", False)
    off = render_cuda(ast, (128, 64, 1, "bfloat16")).source
    assert "into" not in off and "okA =" not in off and "pj_cp_async16(dst, src)" in off


def test_chunks_without_a_common_step_keep_a_place_each():
    """Where a work-item's chunks are not a constant apart (a tf32 128 x 128 tile's 256 work-items, a along its rows: a
    chunk's 32 rows further wrap past a 16-row stage unevenly), each keeps its own place (b along k: a constant
    apart); one chunk (a 128 x 256 tile's a along its rows) needs none further."""
    src = render_cuda(float32_kernel(200, 136, 40, "tf32", True, True), (128, 128, 1, "tf32")).source
    assert "const int dstA1 = " in src and "into + dstA1, srcA1" in src and "const int dstB = " in src
    ast = strided_narrow_kernel(dtypes.bfloat16, 200, 272, 64, True, True)
    src = render_cuda(ast, (128, 256, 1, "bfloat16")).source
    assert "const int dstA = " in src and "const int dstA0 = " not in src and "into + dstA + 0, srcA0" in src


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
@pytest.mark.parametrize("wgmma", [False, True], ids=["mma_sync", "wgmma"])
def test_copies_under_one_test_equal_the_copies_a_chunk_each(wgmma, monkeypatch):
    """The same products, bit for bit, with a slice's copies under one test and with a test a chunk, and NumPy's (a
    partial slice at k = 104, ragged rows and columns, both operands along k / their columns, then both transposed;
    aligned, then b one element into its buffer: its chunks copied element by element, a's still under one test)."""
    rng = np.random.default_rng(0)
    m, n, k = 152, 80, 104
    for a_t, offset in ((False, 0), (True, 0), (False, 1)):
        a = rng.standard_normal((k, m) if a_t else (m, k), np.float32).astype(ml_dtypes.bfloat16)
        b = rng.standard_normal((n, k) if a_t else (k, n), np.float32).astype(ml_dtypes.bfloat16)
        ast = strided_narrow_kernel(dtypes.bfloat16, m, n, k, a_t, a_t)
        if offset:   # (b's view one element in: its own index + 1)
            ast = ast.substitute({x: UOp(Ops.LOAD, x.dtype, (x.src[0], x.src[1] + offset), x.arg)
                                  for x in ast.toposort() if x.op is Ops.LOAD and x.src[0].arg == 2})
        outs = []
        for one in (True, False):
            monkeypatch.setattr(fragment_copies, "ONE_TEST_A_SLICE", one)
            src = render_cuda(ast, (128, 64, 1, "bfloat16"))
            assert ("if (okA && " in src.source) == one and ("if (okB && " in src.source) == one
            out = np.zeros(m * n, np.float32)
            cuda_emulation.run(src, [out, a.ravel().view(np.uint16),
                                     np.concatenate([np.zeros(offset, ml_dtypes.bfloat16), b.ravel()]).view(np.uint16)],
                               True, wgmma)
            outs.append(out)
        np.testing.assert_array_equal(outs[0], outs[1])
        want = (a.T if a_t else a).astype(np.float32) @ (b.T if a_t else b).astype(np.float32) + 1
        np.testing.assert_allclose(outs[0].reshape(m, n), want, rtol=1e-5, atol=1e-4 * np.sqrt(k))


@pytest.mark.skipif(not cuda_emulation.available(), reason="needs clang++ (the CPU emulation of CUDA kernels)")
def test_minilms_layer_is_bit_equal_with_the_copies_and_descriptors_of_before(monkeypatch):
    """MiniLM's encoder layer in bfloat16 (b 2 x t 64: QKV, the attention kernel, out-proj, LayerNorm, FFN up + GELU,
    down, LayerNorm), every kernel as the CUDA target launches it run in order on the emulation as for sm_90a: its
    four projection tiles copy both operands under one test a slice (both are plain aligned loads: the LayerNorm's
    rows, the attention's context, the GELU's, the weights), and the layer's bits equal those with a test a chunk and
    each descriptor from its address (ONE_TEST_A_SLICE, DESCRIPTORS_ONCE off), and NumPy's within bfloat16."""
    rng = np.random.default_rng(2)
    lp = tree_cast(minilm.random_params(rng, layers=1), DTYPES["bf16"])["layers"][0]
    b, t = 2, 64
    h = rng.standard_normal((b, t, 384)).astype(ml_dtypes.bfloat16)
    mask = np.ones((b, t), np.float32)
    mask[1, 50:] = 0
    names = sorted(lp)

    def layer(xp, h, mask, *weights):
        bias = ((1 - mask) * minilm.MASKED)[:, None, None, :]
        return minilm.encoder_layer(xp, dict(zip(names, weights)), h, bias)
    traced = pj.trace(pj.prepare(lambda h, mask, *w: layer(pnp, h, mask, *w)), h, mask, *(lp[n] for n in names))
    sched = schedule(list(traced.outputs), list(traced.inputs), attention_tiles=True)
    outs = []
    for on in (True, False):
        monkeypatch.setattr(fragment_copies, "ONE_TEST_A_SLICE", on)
        monkeypatch.setattr(render_fragments, "DESCRIPTORS_ONCE", on)
        bufs = {i: a.ravel() for i, a in zip(sched.inputs, [h, mask, *(lp[n] for n in names)])}
        tiles = 0
        for kernel in sched.kernels:
            launched = CUDA_HOPPER_TARGET.launched(kernel.ast)
            src = CUDA_HOPPER_TARGET.render(launched)
            if launch_of(launched)[0] == "tile":
                tiles += 1
                assert ("if (okA)" in src.source and "if (okB)" in src.source) == on, src.name
            spec = sched.buffers[kernel.buffers[0]]
            out = np.zeros(spec.max_size, spec.dtype.np)
            cuda_emulation.run(src, [out] + [bufs[i] for i in kernel.buffers[1:]], wgmma=True)
            bufs[kernel.buffers[0]] = out
        assert tiles == 4
        outs.append(bufs[sched.outputs[0]])
    np.testing.assert_array_equal(outs[0], outs[1])
    want = layer(numpy_namespace(), h.astype(np.float32), mask, *(lp[n].astype(np.float32) for n in names))
    got = outs[0][:want.size].astype(np.float32).reshape(want.shape)
    np.testing.assert_allclose(got, want, rtol=5e-2, atol=5e-2 * np.abs(want).max())
