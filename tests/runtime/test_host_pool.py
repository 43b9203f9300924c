"""Pooled large outputs (runtime/host_pool.py) stay fresh: no later call changes an earlier result or a view of it."""
import gc
import threading

import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.runtime.host_pool import MIN_POOLED_BYTES, HostPool, host_pool

LARGE = MIN_POOLED_BYTES // 4 + 1000   # float32 elements: above the pooling threshold, not a whole page


def _scaled():
    return pj.prepare(lambda x, s: x * s, device="cpu")


def _fill(value: float, n: int = LARGE) -> np.ndarray:
    return np.full(n, value, np.float32)


class PoolUse:
    """The shared pool's hand-outs during a test: `reused` counts blocks it handed out again (a block one earlier
    output held), the mechanism whose freshness these tests check; without the pool nothing is reused."""

    def __init__(self, monkeypatch):
        self.seen, self.reused, take = set(), 0, host_pool.take

        def counted(nbytes):
            block = take(nbytes)
            self.reused += block[2] in self.seen
            self.seen.add(block[2])
            return block
        monkeypatch.setattr(host_pool, "take", counted)


@pytest.fixture
def pool_use(monkeypatch):
    return PoolUse(monkeypatch)


def _s(value: float) -> np.ndarray:
    """A 0-d array (a traced input, so every value replays the same plan)."""
    return np.array(value, np.float32)


def test_large_outputs_are_pooled_and_their_blocks_reused():
    f = _scaled()
    first = np.asarray(f(_fill(1.0), _s(2.0)))
    assert type(first.base).__name__ == "_Lease"
    ptr = first.ctypes.data
    del first
    gc.collect()
    again = np.asarray(f(_fill(1.0), _s(3.0)))
    assert again.ctypes.data == ptr          # the dropped output's block came back
    np.testing.assert_array_equal(again, 3.0)


def test_outputs_kept_across_calls_never_change(pool_use):
    f = _scaled()
    kept = [f(_fill(1.0), _s(float(k))) for k in range(6)]
    for k in range(6):
        f(_fill(5.0), _s(7.0))
    for k, out in enumerate(kept):
        np.testing.assert_array_equal(np.asarray(out), float(k))
    assert len({np.asarray(o).ctypes.data for o in kept}) == len(kept)
    assert pool_use.reused >= 5   # the dropped outputs' blocks came back while the kept ones stayed out


@pytest.mark.parametrize("make_view", [
    lambda a: a[10:20],
    lambda a: a[::3],
    lambda a: a.reshape(-1, 8)[:, 1] if a.size % 8 == 0 else a[1:].reshape(-1, 1),
    lambda a: a.view(np.int32),
    lambda a: np.asarray(memoryview(a)),
    lambda a: a[np.newaxis].T,
])
def test_views_outlive_their_array_and_stay_fresh(make_view, pool_use):
    f = _scaled()
    view = make_view(np.asarray(f(_fill(1.0), _s(2.0))))
    expected = view.copy()
    gc.collect()
    for k in range(4):
        f(_fill(9.0), _s(11.0 + k))
    np.testing.assert_array_equal(view, expected)
    assert pool_use.reused >= 3   # later outputs cycled through the pool while the view held its block


def test_an_output_fed_back_as_input_is_not_overwritten(pool_use):
    f = _scaled()
    out = f(_fill(1.0), _s(2.0))
    twice = f(out, _s(2.0))
    np.testing.assert_array_equal(np.asarray(out), 2.0)
    np.testing.assert_array_equal(np.asarray(twice), 4.0)
    chain = _fill(1.0)
    for _ in range(5):
        chain = f(chain, _s(2.0))
    np.testing.assert_array_equal(np.asarray(chain), 32.0)
    assert pool_use.reused >= 3   # the chain's dropped links' blocks were handed out again


def test_symbolic_sizes_and_keyword_calls_stay_fresh(pool_use):
    f = pj.prepare(lambda x: x + 1, vars={"n": (1, 4 * LARGE)}, shapes={"x": ("n",)}, device="cpu")
    kept = {}
    for n in (LARGE, 2 * LARGE, LARGE + 1, 7, LARGE, 3 * LARGE):
        kept[n] = (f(_fill(float(n % 97), n)), float(n % 97) + 1)
        kept[-n] = (f(x=_fill(float(n % 89), n)), float(n % 89) + 1)
        f(_fill(-1.0, n))   # dropped: its block comes back for a later output of its size in pages
    assert pool_use.reused >= 3
    for out, value in kept.values():
        np.testing.assert_array_equal(np.asarray(out), value)


def test_threads_each_see_their_own_results(pool_use):
    f = _scaled()
    errors = []

    def worker(t: int):
        kept = []
        for k in range(8):
            kept.append((f(_fill(float(t)), _s(float(k))), float(t * k)))
            if k % 3 == 0:
                kept.pop(0)   # drop some so blocks cycle through the pool while others are held
        for out, value in kept:
            if not np.array_equal(np.asarray(out), np.full(LARGE, value, np.float32)):
                errors.append((t, value))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert pool_use.reused >= 4   # blocks moved between calls (and threads) while others were held


def test_idle_blocks_are_bounded_oldest_dropped_first():
    pool = HostPool(max_idle_bytes=3 * MIN_POOLED_BYTES)
    arrays = [pool.empty((MIN_POOLED_BYTES // 4 + k,), np.dtype(np.float32)) for k in range(0, 6 * 1024, 1024)]
    del arrays
    gc.collect()
    assert pool.idle_bytes <= 3 * MIN_POOLED_BYTES
    assert pool.idle_bytes == sum(b[0] for b in pool.idle)


def test_small_outputs_are_plain_arrays():
    out = np.asarray(_scaled()(np.ones(16, np.float32), _s(2.0)))
    assert out.flags.owndata
    assert host_pool.empty((4,), np.dtype(np.float64)).flags.owndata


def test_pooled_outputs_of_every_dtype_keep_it():
    """A pooled block's array takes the output's dtype, ml_dtypes' bfloat16 included (its typestr is void)."""
    f = pj.prepare(lambda x: x * 2)
    for dtype in (np.float32, pnp.bfloat16, np.float16, np.int8):
        x = np.ones((1024, 1024), dtype)
        out = np.asarray(f(x))
        owner = out
        while isinstance(owner, np.ndarray):
            owner = owner.base
        assert out.dtype == x.dtype and type(owner).__name__ == "_Lease"   # pooled, in the output's dtype
        np.testing.assert_array_equal(out.astype(np.float32), (x * 2).astype(np.float32))
