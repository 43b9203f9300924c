"""The LLVM renderer's reductions (codegen/llvm_reductions.py): a softmax row's loop over a var count of positions
(decode attention over a KV cache) asks for the keys' and values' rows ahead (prefetch_positions); its values stay
NumPy's."""
import re

import numpy as np

import prepjit as pj
import prepjit.numpy as pnp
from examples.models import llama
from prepjit.codegen.llvm_reductions import LINE_BYTES, PREFETCH_BYTES

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
