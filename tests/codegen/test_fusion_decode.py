"""Fusion rules that cut a decode step's kernel count: a row written into a cache at a uniform index is read as a
select by the kernel that reads the cache (no copy of the cache, no kernel writing the row)."""
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp


def _launches(f, *args) -> list[str]:
    return [row["kernel"] for row in pj.profile(f, *args).rows]


def _attend(xp, cache, row, q, pos):
    """q (heads, group, d) against cache[:, :pos + 1] with row `pos` replaced by `row` (heads, d)."""
    if hasattr(cache, "at"):
        keys = cache[:, :pos + 1].at[:, pos].set(row)
    else:
        keys = cache[:, :pos + 1].copy()
        keys[:, pos] = row
    return q @ xp.swapaxes(keys, 1, 2)


@pytest.mark.parametrize("pos", [0, 6, 15])
def test_cache_row_update_is_read_in_place(device, rng, pos):
    cache = rng.standard_normal((3, 16, 8)).astype(np.float32)
    row, q = rng.standard_normal((3, 8)).astype(np.float32), rng.standard_normal((3, 2, 8)).astype(np.float32)
    f = pj.prepare(lambda c, r, q, pos: _attend(pnp, c, r, q, pos), vars={"pos": (0, 15)}, device=device)
    np.testing.assert_allclose(np.asarray(f(cache, row, q, pos)), _attend(np, cache, row, q, pos), rtol=1e-5,
                               atol=1e-5)
    names = _launches(f, cache, row, q, pos)
    assert len(names) == 1, names  # was 3: the cache's live rows copied, the row written, then the contraction
    np.testing.assert_allclose(cache, cache.copy())  # the caller's cache is untouched


@pytest.mark.parametrize("i", [-1, 0, 2])
def test_a_combining_update_at_a_traced_index_wraps_negatives(device, rng, i):
    x, r = rng.standard_normal((5, 4)).astype(np.float32), rng.standard_normal(5).astype(np.float32)

    def g(x, r, i):
        return (x.at[:, i].add(r) * 2).sum(axis=0)
    want = x.copy()
    want[:, i] += r
    f = pj.prepare(g, device=device)
    np.testing.assert_allclose(np.asarray(f(x, r, np.int64(i))), (want * 2).sum(axis=0), rtol=1e-5, atol=1e-5)
    names = _launches(f, x, r, np.int64(i))
    assert len(names) == 2 and not any(n.startswith("S_") for n in names), names  # the sum, the index's range flag


def test_updates_at_varying_indices_still_get_their_kernel(device, rng):
    x, r = rng.standard_normal((6, 3)).astype(np.float32), rng.standard_normal((2, 3)).astype(np.float32)
    ids = np.array([4, 1])
    f = pj.prepare(lambda x, r, ids: x.at[ids].set(r).sum(axis=1), device=device)
    want = x.copy()
    want[ids] = r
    np.testing.assert_allclose(np.asarray(f(x, r, ids)), want.sum(axis=1), rtol=1e-5, atol=1e-5)
    assert any(name.startswith("S_") for name in _launches(f, x, r, ids))
