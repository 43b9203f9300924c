"""The paged decode attention of examples/models/llama_paged.py (its two-part softmax over a sequence's gathered KV
blocks and the token's own key) alone: its values equal NumPy's at one row and at 16 rows of ragged positions, a
row's values do not depend on the other rows of the batch, and on the cpu it is one kernel (llvm_softmax.py), a loop
step per (row, kv head). Every softmax the cpu schedule computes inside its contraction's kernel is lowered so."""
import math

import ml_dtypes
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from examples.models import llama, llama_paged
from examples.models.common import cast
from prepjit.codegen.kernel import parallel_range
from prepjit.codegen.llvm_softmax import softmax_rows
from prepjit.codegen.schedule import schedule
from prepjit.codegen.target import AVX2, AVX512
from prepjit.uop import Ops

KV, GROUP, HD, BLOCK, POOL = 3, 3, 64, 16, 256  # SmolLM2's heads


def _visible(xp, pos, table):
    """Which cached slots (B, 1, NB, block) each row sees: those before its position."""
    nb = table.shape[1]
    slots = xp.arange(nb)[:, None] * BLOCK + xp.arange(BLOCK)[None, :]
    return (slots[None] < pos[:, None, None])[:, None]


def _attention(xp, q, k, v, pos, table, k_pool, v_pool, dtype=np.float32):
    """decode_batch's attention of one layer: q (B, KV, group, 1, hd), the tokens' own k, v (B, KV, hd)."""
    own = cast(xp.einsum("bkgqd,bkd->bkgq", q, k) * (1 / math.sqrt(HD)), np.float32)[..., None]
    visible = _visible(xp, pos, table)
    cached = llama_paged._cached_scores(xp, q, k_pool[table], visible, HD)
    return llama_paged._attend(xp, cached, own, v_pool[table], v[:, :, None], visible, dtype)


def attention(q, k, v, pos, table, k_pool, v_pool):
    return _attention(pnp, q, k, v, pos, table, k_pool, v_pool)


def _prepared(device):
    return pj.prepare(attention, vars={"B": (1, 16), "NB": (1, 16)}, device=device,
                      shapes={"q": ("B", KV, GROUP, 1, HD), "k": ("B", KV, HD), "v": ("B", KV, HD), "pos": ("B",),
                              "table": ("B", "NB")})


def _arguments(rng, rows, nb):
    k_pool, v_pool = rng.standard_normal((2, POOL, KV, BLOCK, HD)).astype(np.float32)
    q = rng.standard_normal((rows, KV, GROUP, 1, HD)).astype(np.float32)
    k, v = rng.standard_normal((2, rows, KV, HD)).astype(np.float32)
    pos = rng.integers(0, nb * BLOCK + 1, rows)  # ragged: 0 (no cached key) up to every slot of the table
    table = np.stack([rng.permutation(POOL)[:nb] for _ in range(rows)])
    return q, k, v, pos, table, k_pool, v_pool


@pytest.mark.parametrize("rows, nb", [(1, 1), (1, 3), (16, 3), (7, 5)])
def test_paged_attention_equals_numpy(device, rng, rows, nb):
    args = _arguments(rng, rows, nb)
    got = np.asarray(_prepared(device)(*args))
    np.testing.assert_allclose(got, _attention(np, *args), rtol=1e-5, atol=1e-5)


def test_a_rows_attention_does_not_depend_on_the_batch(device, rng):
    f = _prepared(device)
    q, k, v, pos, table, k_pool, v_pool = _arguments(rng, 16, 3)
    batched = np.asarray(f(q, k, v, pos, table, k_pool, v_pool))
    for b in (0, 5, 15):
        alone = np.asarray(f(q[b:b + 1], k[b:b + 1], v[b:b + 1], pos[b:b + 1], table[b:b + 1], k_pool, v_pool))
        np.testing.assert_array_equal(alone[0], batched[b])


def test_paged_attention_is_one_kernel_on_the_cpu(rng):
    """The scores, the two-part softmax and p @ V + p_own * v are one kernel on the cpu (llvm_softmax.py: a row's
    scores and probabilities in arrays of its own; was 7 kernels)."""
    args = _arguments(rng, 16, 3)
    names = [row["kernel"] for row in pj.profile(_prepared("cpu"), *args).rows]
    attention_kernels = [n for n in names if "B_" in n]  # (r_1: the gather's per-call check of the table)
    assert len(attention_kernels) == 1, names


def _prepared_decode_attention(dt, max_blocks: int):
    """The paged decode attention prepared on the cpu over a var batch B and table width NB."""
    def traced(q, k, v, pos, table, k_pool, v_pool):
        return _attention(pnp, q, k, v, pos, table, k_pool, v_pool, dt)

    return pj.prepare(traced, vars={"B": (1, 16), "NB": (1, max_blocks)}, device="cpu",
                      shapes={"q": ("B", KV, GROUP, 1, HD), "k": ("B", KV, HD), "v": ("B", KV, HD), "pos": ("B",),
                              "table": ("B", "NB")})


@pytest.mark.parametrize("dtype", [np.float32, "bfloat16"])
def test_one_kernel_equals_numpy_and_a_rows_bits_do_not_depend_on_the_batch(rng, dtype):
    """The one kernel at ragged positions (0, a full block, every slot), float32 and a bfloat16 model's rounding
    of the probabilities (AVX-512's 16 lanes; run the file under PREPJIT_CPU=haswell for AVX2's 8)."""
    dt = np.float32 if dtype is np.float32 else ml_dtypes.bfloat16
    f = _prepared_decode_attention(dt, max_blocks=16)
    args = list(_arguments(rng, 5, 3))
    args[3] = np.array([0, 16, 48, 1, 33])
    got = np.asarray(f(*args), np.float32)
    want = np.asarray(_attention(np, *args, dt), np.float32)
    tol = 1e-5 if dt is np.float32 else 2e-2
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    for b in (0, 2, 4):
        alone = np.asarray(f(*(a[b:b + 1] if i < 5 else a for i, a in enumerate(args))), np.float32)
        np.testing.assert_array_equal(alone[0], got[b])
    names = [row["kernel"] for row in pj.profile(f, *args).rows]
    assert len([n for n in names if "B_" in n]) == 1, names


def _cpu_kernels(fn, *args):
    """The cpu schedule's kernels of `fn` traced at `args`."""
    traced = pj.trace(fn, *args)
    return schedule(list(traced.outputs), list(traced.inputs), pack_contractions=True).kernels


@pytest.mark.parametrize("target, steps", [(AVX512, 16 * KV), (AVX2, 16 * KV * GROUP)], ids=["avx512", "avx2"])
def test_a_loop_step_computes_a_kv_heads_query_rows_together(rng, target, steps):
    """On AVX-512 the kernel's parallel loop has a step per (row, kv head), its GROUP query heads computed together
    (each gathered key and value row loaded once for them; was a step per query head); AVX2's 16 registers do not
    hold their 3 x 8 vectors of p @ V sums: a step per query head."""
    prepared = _prepared("cpu")
    (kernel,) = [k for k in _cpu_kernels(prepared, *_arguments(rng, 16, 3)) if "B_" in k.ast.arg]
    assert parallel_range(softmax_rows(kernel.ast, target)).src[0].vmax == steps


CASES = {  # softmaxes the cpu schedule computes inside their contraction's kernel (softmax_contraction.py)
    "one row": (lambda xp, q, k, v: llama.softmax(xp, q @ k.T) @ v, [(1, 64), (40, 64), (40, 64)]),
    "four rows": (lambda xp, q, k, v: llama.softmax(xp, q @ k.T) @ v, [(4, 64), (40, 64), (40, 64)]),
    "heads": (lambda xp, q, k, v: llama.softmax(xp, q @ xp.swapaxes(k, 1, 2)) @ v,
              [(3, 2, 64), (3, 40, 64), (3, 40, 64)]),
    "a loaded row": (lambda xp, x, v: llama.softmax(xp, x) @ v, [(2, 48), (48, 64)]),  # (48: 3 vectors of 16)
    "100 columns": (lambda xp, q, k, v: llama.softmax(xp, q @ k.T) @ v, [(2, 50), (40, 50), (40, 100)]),
}


@pytest.mark.parametrize("case", CASES)
def test_every_softmax_the_cpu_fuses_into_its_contraction_is_lowered_so(rng, case):
    """The cpu schedule and llvm_softmax agree: its one kernel is lowered by softmax_rows (a kernel it rejected would
    take the generic loop nest, recomputing the softmax for every output: one softmax row was), with NumPy's values
    (the row's sum and p @ V over positions a multiple of the lanes were split into lanes, the columns' too: wrong)."""
    fn, shapes = CASES[case]
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    (kernel,) = _cpu_kernels(lambda *a: fn(pnp, *a), *args)
    assert softmax_rows(kernel.ast, AVX512) is not None
    got = pj.prepare(lambda *a: fn(pnp, *a), device="cpu")(*args)
    np.testing.assert_allclose(np.asarray(got), fn(np, *args), rtol=1e-5, atol=1e-5)


def _chunk_attention(xp, q, k, v, pos, offset, table, k_pool, v_pool, window, dtype=np.float32):
    """prefill_batch's attention of one layer: tokens q (T, KV, group, 1, hd) of chunks side by side, token t the
    offset[t]-th of its chunk, against its cached blocks and, through a window of `window` rows back from its own,
    the keys k and values v (T, KV, hd) of its chunk up to itself: a softmax in two parts, each summing over
    positions of its own."""
    own, v_own, in_chunk = llama_paged.chunk_keys(xp, q, k, v, offset, window, HD)
    visible = _visible(xp, pos - offset, table)
    cached = llama_paged._cached_scores(xp, q, k_pool[table], visible, HD)
    return llama_paged._attend(xp, cached, own, v_pool[table], v_own, visible, dtype, in_chunk)


def chunk_attention(q, k, v, pos, offset, table, k_pool, v_pool, window):
    return _chunk_attention(pnp, q, k, v, pos, offset, table, k_pool, v_pool, window)


def _chunks(rng, sizes, cached, nb):
    """Arguments of chunks of `sizes` tokens after `cached` positions each, tables of `nb` blocks."""
    k_pool, v_pool = rng.standard_normal((2, POOL, KV, BLOCK, HD)).astype(np.float32)
    t = sum(sizes)
    q = rng.standard_normal((t, KV, GROUP, 1, HD)).astype(np.float32)
    k, v = rng.standard_normal((2, t, KV, HD)).astype(np.float32)
    offset = np.concatenate([np.arange(n) for n in sizes])
    pos = offset + np.repeat(cached, sizes)
    table = np.repeat(np.stack([rng.permutation(POOL)[:nb] for _ in sizes]), sizes, axis=0)
    return [q, k, v, pos, offset, table, k_pool, v_pool, max(sizes)]


def test_a_prefill_chunks_attention_is_one_kernel_on_the_cpu(rng):
    """A prefill's attention (the cached blocks' part and the chunk's own window, each over positions of its own) is
    one kernel on the cpu, softmax_rows' (was 9 a layer: the scores, maxes, exponentials, sums and quotients of each
    part in kernels of their own, 17% of a 126-token prefill of SmolLM2); NumPy's values; a chunk's rows have the
    same bits alone (its one block) as beside a chunk with more cached blocks (a wider table)."""
    f = pj.prepare(chunk_attention, vars={"T": (1, 64), "NB": (1, 8), "window": (1, 32)}, device="cpu",
                   shapes={"q": ("T", KV, GROUP, 1, HD), "k": ("T", KV, HD), "v": ("T", KV, HD), "pos": ("T",),
                           "offset": ("T",), "table": ("T", "NB")})
    args = _chunks(rng, [5, 19], np.array([7, 40]), 3)
    (kernel,) = [k.kernel.scheduled for k in f.plan(*args).kernels if "T_" in k.kernel.name]  # (r_1: the check)
    assert softmax_rows(kernel, AVX512) is not None
    got = np.asarray(f(*args))
    np.testing.assert_allclose(got, _chunk_attention(np, *args), rtol=1e-5, atol=1e-5)
    alone = [a[:5] if i < 6 else a for i, a in enumerate(args)]
    alone[5] = alone[5][:, :1]
    np.testing.assert_array_equal(np.asarray(f(*alone)), got[:5])


@pytest.mark.parametrize("dtype", [np.float32, "bfloat16"])
def test_a_prefill_rows_bits_do_not_depend_on_the_window_or_the_table(rng, dtype):
    """The engine prefills several prompts a call, the window (var) the longest chunk's, the table the widest: a
    5-token chunk's rows have the same bits at windows 5, 8, 19, 33 and 64 and with tables of 1 to 40 blocks (the
    positions past its own only add exact zeros). Was: windows of 8 and more changed the last bits of ~10% of the
    float32 values (the window's row sum, a reassociated sum over a var trip count, which LLVM vectorises only from
    8 positions: its order followed the window). float32 and a bfloat16 model's rounded probabilities; run the file
    under PREPJIT_CPU=haswell for AVX2's 8 lanes."""
    dt = np.float32 if dtype is np.float32 else ml_dtypes.bfloat16

    def traced(q, k, v, pos, offset, table, k_pool, v_pool, window):
        return _chunk_attention(pnp, q, k, v, pos, offset, table, k_pool, v_pool, window, dt)

    f = pj.prepare(traced, vars={"T": (1, 64), "NB": (1, 40), "window": (1, 64)}, device="cpu",
                   shapes={"q": ("T", KV, GROUP, 1, HD), "k": ("T", KV, HD), "v": ("T", KV, HD), "pos": ("T",),
                           "offset": ("T",), "table": ("T", "NB")})
    for cached, nb in ((0, 1), (7, 1), (40, 3)):
        args = _chunks(rng, [5], np.array([cached]), nb)
        want = np.asarray(f(*args), np.float32)
        np.testing.assert_allclose(want, np.asarray(_chunk_attention(np, *args, dt), np.float32), rtol=2e-2 if
                                   dt is not np.float32 else 1e-5, atol=2e-2 if dt is not np.float32 else 1e-5)
        for window in (8, 19, 33, 64):
            np.testing.assert_array_equal(np.asarray(f(*args[:-1], window), np.float32), want, f"window {window}")
        for width in (8, 17, 40):
            wider = list(args)
            wider[5] = np.concatenate([args[5], np.repeat(rng.integers(0, POOL, (1, width - nb)), 5, 0)], axis=1)
            np.testing.assert_array_equal(np.asarray(f(*wider), np.float32), want, f"{width} blocks")


@pytest.mark.parametrize("dtype", [np.float32, "bfloat16"])
def test_a_decode_rows_bits_do_not_depend_on_the_table(rng, dtype):
    """A decode row's bits are the same with its table alone (3 blocks) and padded to the batch's widest (8 to 40
    blocks: positions it does not see, exact zeros)."""
    dt = np.float32 if dtype is np.float32 else ml_dtypes.bfloat16
    f = _prepared_decode_attention(dt, max_blocks=40)
    args = list(_arguments(rng, 5, 3))
    args[3] = np.array([0, 16, 48, 1, 33])
    want = np.asarray(f(*args), np.float32)
    for width in (8, 17, 40):
        wider = list(args)
        wider[4] = np.concatenate([args[4], rng.integers(0, POOL, (5, width - 3))], axis=1)
        np.testing.assert_array_equal(np.asarray(f(*wider), np.float32), want, f"{width} blocks")
