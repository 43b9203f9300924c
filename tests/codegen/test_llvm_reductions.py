"""The LLVM renderer's reductions (codegen/llvm_reductions.py): a softmax row's loop over a var count of positions
(decode attention over a KV cache) asks for the keys' and values' rows ahead (prefetch_positions), and a RoPE'd
query's dot over a head is unrolled where its steps gate its loads (GATED_STEPS); its values stay NumPy's."""
import re

import numpy as np

import prepjit as pj
import prepjit.numpy as pnp
from examples.models import llama
from prepjit.codegen.llvm_reductions import LINE_BYTES, PREFETCH_BYTES
from prepjit.codegen.llvm_softmax import softmax_rows
from prepjit.codegen.render_llvm import render_llvm
from prepjit.codegen.target import AVX2

HEADS, HD = 3, 64


def _attention(xp, q, k, v):
    """One query row a head over the first n cached positions: q (HEADS, 1, HD), k, v (HEADS, n, HD)."""
    return llama.softmax(xp, q @ xp.swapaxes(k, 1, 2) * (1 / np.sqrt(HD))) @ v


def test_a_softmax_rows_fill_asks_for_the_keys_and_values_rows_ahead(rng):
    """The fill of the row's scores over the cached keys asks for each key row's four lines PREFETCH_BYTES
    ahead into every cache level, and for the value rows p @ V reads later at the same positions into L2."""
    f = pj.prepare(lambda q, k, v: _attention(pnp, q, k, v), vars={"n": (1, 1024)}, device="cpu",
                   shapes={"q": (HEADS, 1, HD), "k": (HEADS, "n", HD), "v": (HEADS, "n", HD)})
    q = rng.standard_normal((HEADS, 1, HD)).astype(np.float32)
    k, v = rng.standard_normal((2, HEADS, 300, HD)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(f(q, k, v)), _attention(np, q, k, v), rtol=1e-5, atol=1e-6)
    plan = f.plan(q, k, v)
    (kernel,) = [pk for pk in plan.kernels if "llvm.prefetch" in pk.kernel.source]
    src = kernel.kernel.source
    slot_of = {plan.inputs[i]: name for i, name in enumerate("qkv")}
    buffers = {f"p{n}": slot_of.get(kernel.buffer_indices[int(slot)])
               for n, slot in re.findall(r"%p(\d+) = getelementptr float, ptr %buf(\d+), i64", src)}
    asked = re.findall(r"%(p\d+) = getelementptr i8, ptr %(p\d+), i64 (\d+)\n"
                       r"  call void @llvm\.prefetch\.p0\(ptr %\1, i32 0, i32 (\d), i32 1\)", src)
    lines = [PREFETCH_BYTES + at for at in range(0, HD * 4, LINE_BYTES)]
    # (AVX2's dot products of 8 steps are a loop: lane_sum's prefetch_streams asks for the key rows' blocks too)
    assert {(buffers[base], int(at), int(locality)) for _, base, at, locality in asked} >= {
        *(("k", at, 3) for at in lines), *(("v", at, 2) for at in lines)}, src


def test_a_ropes_query_has_no_masked_loads_left_on_avx2(rng):
    """The scores of a RoPE'd query over the cached keys, rendered for AVX2: the dot over a 64-element head is 8 steps
    of 8 lanes, and the query's rotated half is read through loads gated by the step. The steps are unrolled
    (GATED_STEPS), so once LLVM has optimised the kernel as the cpu device does every gate is a constant and no
    masked load is left (rolled, each step built its masks at run time for every key: 8 masked loads stayed in
    SmolLM2's decode attention, its query rotated again for each key). Values equal NumPy's."""
    import llvmlite.binding as llvm

    from prepjit.runtime.devices import get_device
    from prepjit.runtime.llvm_compile import optimised_module

    def roped(xp, q, k, v, cos, sin):
        return _attention(xp, llama.rope(xp, q, cos, sin), k, v)
    f = pj.prepare(lambda q, k, v, cos, sin: roped(pnp, q, k, v, cos, sin), vars={"n": (1, 1024)}, device="cpu",
                   shapes={"q": (HEADS, 1, HD), "k": (HEADS, "n", HD), "v": (HEADS, "n", HD), "cos": (1, HD),
                           "sin": (1, HD)})
    q = rng.standard_normal((HEADS, 1, HD)).astype(np.float32)
    k, v = rng.standard_normal((2, HEADS, 300, HD)).astype(np.float32)
    cos, sin = (rng.uniform(-1, 1, (1, HD)).astype(np.float32) for _ in range(2))
    np.testing.assert_allclose(np.asarray(f(q, k, v, cos, sin)), roped(np, q, k, v, cos, sin), rtol=1e-5, atol=1e-6)
    (kernel,) = [pk for pk in f.plan(q, k, v, cos, sin).kernels if "llvm.prefetch" in pk.kernel.source]
    ir = render_llvm(softmax_rows(kernel.kernel.scheduled, AVX2), AVX2).source  # as the cpu's passes on AVX2
    assert "call <8 x float> @llvm.masked.load" in ir  # the rotated half's gated loads, as rendered
    machine = get_device("cpu").target_machine
    module = optimised_module(llvm, machine, ir)  # as the kernel is compiled
    assert "call <8 x float> @llvm.masked.load" not in str(module)
