"""The paged decode attention of examples/models/llama_paged.py (its two-part softmax over a sequence's gathered KV
blocks and the token's own key) alone: its values equal NumPy's at one row and at 16 rows of ragged positions, a
row's values do not depend on the other rows of the batch, and on the cpu it is few kernels."""
import math

import ml_dtypes
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from examples.models import llama_paged
from examples.models.common import cast

KV, GROUP, HD, BLOCK, POOL = 3, 3, 64, 16, 256  # SmolLM2's heads


def _attention(xp, q, k, v, pos, table, k_pool, v_pool):
    """decode_batch's attention of one layer: q (B, KV, group, 1, hd), the tokens' own k, v (B, KV, hd)."""
    b, nb = table.shape
    slots = xp.arange(nb)[:, None] * BLOCK + xp.arange(BLOCK)[None, :]
    visible = (slots[None] < pos[:, None, None])[:, None]
    own = cast(xp.einsum("bkgqd,bkd->bkgq", q, k) * (1 / math.sqrt(HD)), np.float32)[..., None]
    cached = llama_paged._cached_scores(xp, q, k_pool[table], visible, HD)
    return llama_paged._attend(xp, cached, own, v_pool[table], v[:, :, None], np.float32)


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


@pytest.mark.parametrize("dtype", [np.float32, "bfloat16"])
def test_one_kernel_equals_numpy_and_a_rows_bits_do_not_depend_on_the_batch(rng, dtype):
    """The one kernel at ragged positions (0, a full block, every slot), float32 and a bfloat16 model's rounding
    of the probabilities (AVX-512's 16 lanes; run the file under PREPJIT_CPU=haswell for AVX2's 8)."""
    dt = np.float32 if dtype is np.float32 else ml_dtypes.bfloat16

    def attention_of(xp, q, k, v, pos, table, k_pool, v_pool):
        b, nb = table.shape
        slots = xp.arange(nb)[:, None] * BLOCK + xp.arange(BLOCK)[None, :]
        visible = (slots[None] < pos[:, None, None])[:, None]
        own = cast(xp.einsum("bkgqd,bkd->bkgq", q, k) * (1 / math.sqrt(HD)), np.float32)[..., None]
        cached = llama_paged._cached_scores(xp, q, k_pool[table], visible, HD)
        return llama_paged._attend(xp, cached, own, v_pool[table], v[:, :, None], dt)

    def traced(q, k, v, pos, table, k_pool, v_pool):
        return attention_of(pnp, q, k, v, pos, table, k_pool, v_pool)

    f = pj.prepare(traced, vars={"B": (1, 16), "NB": (1, 16)}, device="cpu",
                   shapes={"q": ("B", KV, GROUP, 1, HD), "k": ("B", KV, HD), "v": ("B", KV, HD), "pos": ("B",),
                           "table": ("B", "NB")})
    args = list(_arguments(rng, 5, 3))
    args[3] = np.array([0, 16, 48, 1, 33])
    got = np.asarray(f(*args), np.float32)
    want = np.asarray(attention_of(np, *args), np.float32)
    tol = 1e-5 if dt is np.float32 else 2e-2
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    for b in (0, 2, 4):
        alone = np.asarray(f(*(a[b:b + 1] if i < 5 else a for i, a in enumerate(args))), np.float32)
        np.testing.assert_array_equal(alone[0], got[b])
    names = [row["kernel"] for row in pj.profile(f, *args).rows]
    assert len([n for n in names if "B_" in n]) == 1, names
