"""donate_argnums / donate_argnames (jax.jit's): a call writes an output into a donated pj.Array's memory when the
plan can update it in place, and the donated array is invalidated; NumPy arguments are never written."""
import numpy as np
import pytest

import prepjit as pj
from tests.helpers import assert_matches


def _device_array(x, device):
    return pj.prepare(lambda x: x * 1, device=device)(x)


def test_kv_cache_update_reuses_the_donated_array(device):
    update = pj.prepare(lambda cache, v, pos: cache.at[pos].set(v), vars={"pos": (0, 7)}, donate_argnums=0,
                        device=device)
    cache = _device_array(np.zeros((8, 4), np.float32), device)
    memory = cache.buffer
    first = update(cache, np.ones(4, np.float32), 3)
    assert first.buffer is memory  # written in place: no new output array
    with pytest.raises(RuntimeError, match="donated"):
        np.asarray(cache)
    with pytest.raises(RuntimeError, match="donated"):
        update(cache, np.ones(4, np.float32), 1)
    assert "<donated>" in repr(cache)
    second = update(first, np.full(4, 2, np.float32), 5)
    expected = np.zeros((8, 4), np.float32)
    expected[3], expected[5] = 1, 2
    assert_matches(second, expected)
    assert second.buffer is memory and update.stats["traces"] == 1


def test_numpy_arguments_are_never_written(device):
    update = pj.prepare(lambda cache, v, pos: cache.at[pos].set(v), vars={"pos": (0, 7)}, donate_argnames="cache",
                        device=device)
    cache = np.zeros((8, 4), np.float32)
    out = update(cache, np.ones(4, np.float32), 2)
    assert not cache.any() and np.asarray(out)[2].tolist() == [1, 1, 1, 1]


def test_only_in_place_updates_reuse_the_memory(device):
    """x * 2 + 1 reads each element where it writes it: done in place. x[::-1] + 1 reads elsewhere and a result
    of another shape cannot take the memory: those donations are ignored and the array stays valid. With two
    results, the one computed after every other read of x takes its memory."""
    x = np.arange(6, dtype=np.float32)
    inplace = pj.prepare(lambda x: x * 2 + 1, donate_argnums=0, device=device)
    a = _device_array(x, device)
    assert inplace.plan(a).donation_target(0) == 0
    assert_matches(inplace(a), x * 2 + 1)
    with pytest.raises(RuntimeError, match="donated"):
        a.numpy()
    for fn, ref in ((lambda x: x[::-1] + 1, x[::-1] + 1), (lambda x: x.sum(keepdims=True), x.sum(keepdims=True))):
        f = pj.prepare(fn, donate_argnums=0, device=device)
        b = _device_array(x, device)
        assert f.plan(b).donation_target(0) is None
        assert_matches(f(b), ref)
        assert_matches(b, x)  # not donated after all: still valid
    both = pj.prepare(lambda x: (x + 1, x * 3), donate_argnums=0, device=device)
    c = _device_array(x, device)
    target = both.plan(c).donation_target(0)
    memory = c.buffer
    out = both(c)
    assert_matches(out[0], x + 1)
    assert_matches(out[1], x * 3)
    assert target is not None and out[target].buffer is memory


def test_an_array_passed_twice_is_not_overwritten(device):
    """f(a, a) donating the first: the second parameter reads the same memory, so nothing is written into it."""
    f = pj.prepare(lambda x, y: x + y[::-1], donate_argnums=0, device=device)
    x = np.arange(5, dtype=np.float32)
    a = _device_array(x, device)
    assert f.plan(a, a).donation_target(0) == 0
    assert_matches(f(a, a), x + x[::-1])
    assert_matches(a, x)


def test_donate_argument_errors():
    with pytest.raises(ValueError, match="donate_argnums 3"):
        pj.prepare(lambda x: x, donate_argnums=3)
    with pytest.raises(ValueError, match="donate_argnames names 'y'"):
        pj.prepare(lambda x: x, donate_argnames="y")
