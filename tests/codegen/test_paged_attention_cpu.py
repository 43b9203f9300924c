"""The paged decode attention of examples/models/llama_paged.py (its two-part softmax over a sequence's gathered KV
blocks and the token's own key) alone: its values equal NumPy's at one row and at 16 rows of ragged positions, a
row's values do not depend on the other rows of the batch, and on the cpu it is few kernels."""
import math

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


def test_the_own_tokens_term_is_p_at_v_epilogue_on_the_cpu(rng):
    """The token's own term p_own * v (an einsum over its axis of one key: a sum of one product, no contraction)
    is computed as the epilogue of p @ V's register-blocked kernel, not in a kernel adding the two (was 8 kernels at
    the engine's table width of up to 16 blocks)."""
    args = _arguments(rng, 16, 3)
    names = [row["kernel"] for row in pj.profile(_prepared("cpu"), *args).rows]
    attention_kernels = [n for n in names if "B_" in n]  # (r_1: the gather's per-call check of the table)
    assert len(attention_kernels) == 7, names
    assert not any(n.startswith("E_") and n.endswith("_64") for n in names), names
