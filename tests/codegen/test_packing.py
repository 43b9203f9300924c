"""Packing of large contractions' column operands (codegen/packing.py): packed plans equal NumPy. Each test of a
packed plan checks that its contractions read the copies of pack kernels (shapes that pack on AVX2, AVX-512 and
NEON-sized vectors alike)."""
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen import packing
from prepjit.codegen.packing import pack_contraction
from prepjit.codegen.schedule import schedule
from prepjit.codegen.target import AVX2, AVX512


def _close(got, want, dtype=np.float32):
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(np.asarray(got), want, rtol=tol, atol=tol)


def _assert_packed(plan, contractions: int):
    """`plan` is `contractions` contractions, each run after a pack kernel and reading the copy it writes."""
    kernels = list(plan.kernels)
    assert [k.ast.arg.split("_")[0] for k in kernels] == ["pack", "r"] * contractions, [k.ast.arg for k in kernels]
    for pack, contraction in zip(kernels[::2], kernels[1::2]):
        assert pack.buffer_indices[pack.output_indices[0]] in contraction.buffer_indices
        assert pack.id in contraction.dependencies


def test_large_matmul_packs_its_column_operand_first(rng):
    a, b = rng.standard_normal((128, 96)).astype(np.float32), rng.standard_normal((96, 64)).astype(np.float32)
    f = pj.prepare(lambda a, b: a @ b, device="cpu")
    _assert_packed(f.plan(a, b), 1)
    _close(f(a, b), a @ b)


def test_small_contractions_are_not_packed(rng):
    a, b = rng.standard_normal((8, 96)).astype(np.float32), rng.standard_normal((96, 64)).astype(np.float32)
    assert len(pj.prepare(lambda a, b: a @ b, device="cpu").plan(a, b).kernels) == 1


@pytest.mark.parametrize("m,k,n,transposed", [
    (64, 64, 64, False), (200, 100, 96, False), (65, 130, 1008, False), (100, 64, 48, False),
    (65, 130, 1000, True), (70, 67, 33, True),   # columns in a peeled tail: packed where b.T gathers them
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_packed_matmul_shapes(rng, m, k, n, transposed, dtype):
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if transposed else (k, n)).astype(dtype)
    f = pj.prepare((lambda a, b: a @ b.T) if transposed else (lambda a, b: a @ b), device="cpu")
    _assert_packed(f.plan(a, b), 1)
    _close(f(a, b), a @ (b.T if transposed else b), dtype)


def test_packed_transposed_and_padded_operands(rng):
    a, b = rng.standard_normal((96, 80)).astype(np.float32), rng.standard_normal((64, 80)).astype(np.float32)
    f = pj.prepare(lambda a, b: (a @ b.T, a @ pnp.pad(b.T[:70], ((5, 5), (0, 0)))), device="cpu")
    _assert_packed(f.plan(a, b), 2)
    got_t, got_pad = f(a, b)
    _close(got_t, a @ b.T)
    _close(got_pad, a @ np.pad(b.T[:70], ((5, 5), (0, 0))))


def test_packed_batched_matmuls(rng):
    x = rng.standard_normal((3, 70, 64)).astype(np.float32)
    w = rng.standard_normal((64, 48)).astype(np.float32)
    ws = rng.standard_normal((3, 64, 48)).astype(np.float32)
    f = pj.prepare(lambda x, w, ws: (x @ w, x @ ws), device="cpu")
    _assert_packed(f.plan(x, w, ws), 2)
    got_shared, got_batched = f(x, w, ws)
    _close(got_shared, x @ w)
    _close(got_batched, x @ ws)


def test_packed_einsum_over_two_axes(rng):
    a = rng.standard_normal((80, 8, 16)).astype(np.float32)
    b = rng.standard_normal((8, 16, 64)).astype(np.float32)
    f = pj.prepare(lambda a, b: pnp.einsum("ikl,klj->ij", a, b), device="cpu")
    _assert_packed(f.plan(a, b), 1)
    _close(f(a, b), np.einsum("ikl,klj->ij", a, b))


def test_packed_symbolic_batch_rows(rng):
    w = rng.standard_normal((64, 96)).astype(np.float32)
    f = pj.prepare(lambda x, w: pnp.maximum(x @ w, 0) @ w.T, vars={"n": (1, 300)}, shapes={"x": ("n", 64)},
                   device="cpu")
    _assert_packed(f.plan(np.zeros((1, 64), np.float32), w), 2)   # packed for the most rows, run for any
    for n in (1, 63, 300):
        x = rng.standard_normal((n, 64)).astype(np.float32)
        _close(f(x, w), np.maximum(x @ w, 0) @ w.T)


@pytest.mark.parametrize("dtype", [np.float32, "bfloat16"])
def test_a_decode_batch_reads_its_weight_unpacked(rng, dtype):
    """x @ W with the rows a var of at most 64 (a decode batch, mostly a few rows): no copy of W per call."""
    import ml_dtypes
    w = rng.standard_normal((576, 1536)).astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    f = pj.prepare(lambda x, w: x @ w, vars={"B": (1, 64)}, shapes={"x": ("B", 576)}, device="cpu")
    plan = f.plan(np.zeros((1, 576), np.float32), w)
    assert len(plan.kernels) == 1 and plan.memory_bytes == 0
    for n in (1, 5, 64):
        x = rng.standard_normal((n, 576)).astype(np.float32)
        _close(f(x, w), x @ w.astype(np.float32))


def test_column_operand_strided_along_the_columns_is_packed_even_for_short_reductions(rng):
    """Attention scores q @ k.T over heads of 32: k's values for consecutive output columns lie a row of 384
    apart, so the blocked kernel would gather them; packing makes them contiguous (reduction of only 32)."""
    q, k = (rng.standard_normal((2, 128, 384)).astype(np.float32) for _ in range(2))
    heads = lambda x: pnp.swapaxes(x.reshape(2, 128, 12, 32), 1, 2)  # noqa: E731
    f = pj.prepare(lambda q, k: heads(q) @ pnp.swapaxes(heads(k), 2, 3), device="cpu")
    _assert_packed(f.plan(q, k), 1)
    qh, kh = (x.reshape(2, 128, 12, 32).transpose(0, 2, 1, 3) for x in (q, k))
    _close(f(q, k), qh @ kh.transpose(0, 1, 3, 2))


def test_row_operand_across_the_reduction_is_packed_along_it(rng, monkeypatch):
    """A weight gradient h.T @ delta: h's values for a block's rows lie along its rows and a row of h apart
    from step to step, so for AVX2's 6-row blocks h.T is copied contiguous along the reduction (in runs
    clamped at a symbolic end); AVX-512's 8-row blocks read it as it is."""
    h, d = rng.standard_normal((64, 96)).astype(np.float32), rng.standard_normal((64, 80)).astype(np.float32)
    traced = pj.trace(lambda h, d: h.T @ d, h, d)
    (kernel,) = schedule(list(traced.outputs), list(traced.inputs)).kernels  # unpacked
    packs = {t: [pack.arg for pack, _ in pack_contraction(kernel.ast, 3, t)[1]] for t in (AVX2, AVX512)}
    assert packs == {AVX2: ["pack_5_64_16", "pack_96_64"], AVX512: ["pack_5_64_16"]}
    monkeypatch.setattr(packing, "ROW_PACK_BLOCK_ROWS", 64)  # this host's blocks, whatever their rows, pack h.T
    f = pj.prepare(lambda h, d: h.T @ d, vars={"n": (0, 300)}, shapes={"h": ("n", 96), "d": ("n", 80)}, device="cpu")
    assert "pack_96_n" in [k.ast.arg for k in f.plan(h, d).kernels]
    for n in (0, 1, 7, 9, 64, 299, 300):
        h, d = rng.standard_normal((n, 96)).astype(np.float32), rng.standard_normal((n, 80)).astype(np.float32)
        _close(f(h, d), h.T @ d)
