"""donate_argnums / donate_argnames (jax.jit's): a call writes an output into a donated pj.Array's memory when the
plan can update it in place, and the donated array is invalidated; NumPy arguments are never written."""
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from tests.helpers import assert_matches


def _device_array(x, device):
    return pj.prepare(lambda x: x * 1, device=device)(x)


def test_kv_cache_update_reuses_the_donated_array(device):
    update = pj.prepare(lambda cache, v, pos: cache.at[pos].set(v), vars={"pos": (0, 7)}, donate_argnums=0,
                        device=device)
    cache = _device_array(np.zeros((8, 4), np.float32), device)
    memory = id(cache.buffer)  # (its id: a reference to the memory would keep it from being donated)
    first = update(cache, np.ones(4, np.float32), 3)
    assert id(first.buffer) == memory  # written in place: no new output array
    with pytest.raises(RuntimeError, match="donated"):
        np.asarray(cache)
    with pytest.raises(RuntimeError, match="donated"):
        update(cache, np.ones(4, np.float32), 1)
    assert "<donated>" in repr(cache)
    second = update(first, np.full(4, 2, np.float32), 5)
    expected = np.zeros((8, 4), np.float32)
    expected[3], expected[5] = 1, 2
    assert_matches(second, expected)
    assert id(second.buffer) == memory and update.stats["traces"] == 1


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
    memory = id(c.buffer)
    out = both(c)
    assert_matches(out[0], x + 1)
    assert_matches(out[1], x * 3)
    assert target is not None and id(out[target].buffer) == memory


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


def test_a_donated_array_is_deleted(device):
    """As in JAX, a donated array is consumed: reading it, or passing it to any prepared function, raises
    pj.DeletedArrayError (a RuntimeError) saying it was donated; is_deleted() says so."""
    step = pj.prepare(lambda x: x + 1, donate_argnums=0, device=device)
    other = pj.prepare(lambda x: x * 2, device=device)
    x = np.arange(4, dtype=np.float32)
    a = _device_array(x, device)
    assert not a.is_deleted()
    out = step(a)
    assert a.is_deleted() and not out.is_deleted()
    for use in (a.numpy, lambda: np.asarray(a), lambda: a + 1, lambda: step(a), lambda: other(a), lambda: other(a)):
        with pytest.raises(pj.DeletedArrayError, match="donated") as error:
            use()
        assert isinstance(error.value, RuntimeError)
    assert_matches(out, x + 1)


def test_an_exported_numpy_view_is_not_changed(device):
    """np.asarray(a) of a cpu array is a view of its memory: while that view lives, a donation of `a` is not
    usable (as JAX's: an external reference), so the call writes a new array and `a` stays valid. (On a GPU the
    view is a host copy: the donation goes ahead.)"""
    step = pj.prepare(lambda x: x * 2 + 1, donate_argnums=0, device=device)
    x = np.arange(6, dtype=np.float32)
    a = _device_array(x, device)
    view = np.asarray(a)
    derived = a.reshape(2, 3)  # ndarray methods give views too
    out = step(a)
    assert view.tolist() == x.tolist() and derived.ravel().tolist() == x.tolist()
    assert_matches(out, x * 2 + 1)
    if device != "cpu":
        assert a.is_deleted()
        return
    assert not a.is_deleted()
    assert_matches(a, x)
    del view, derived
    memory = id(a.buffer)
    again = step(a)  # no view left: donated
    assert a.is_deleted() and id(again.buffer) == memory
    assert_matches(again, x * 2 + 1)


def test_a_failed_call_leaves_the_donated_array_intact(device):
    """An out-of-range gather id raises IndexBoundError after the kernels ran: the donated array keeps its
    values and stays usable, as if the bad call never happened (docs/errors.md)."""
    f = pj.prepare(lambda x, table, ids: x + table[ids], vars={"k": (1, 8)}, shapes={"x": ("k",), "ids": ("k",)},
                   donate_argnums=0, device=device)
    table = np.arange(5, dtype=np.float32) * 10
    x = np.arange(3, dtype=np.float32)
    a = _device_array(x, device)
    with pytest.raises(pj.IndexBoundError):
        f(a, table, np.array([0, 9, 1]))
    assert not a.is_deleted()
    assert_matches(a, x)
    assert_matches(f(a, table, np.array([4, 0, 1])), x + table[[4, 0, 1]])


def test_concurrent_readers_see_old_values_or_the_deleted_error(device):
    """A thread reading the donated array (a host copy, or another prepared call) while the donating call runs
    sees the old values or pj.DeletedArrayError, never the new values or a mix."""
    import threading

    size = 1 << 21
    step = pj.prepare(lambda x: x + 1, donate_argnums=0, device=device)
    double = pj.prepare(lambda x: x * 2, device=device)
    bad = []
    for k in range(12):
        a = _device_array(np.full(size, k, np.float32), device)
        started, done = threading.Event(), threading.Event()

        def read(a=a, k=k, started=started, done=done):
            reads = (lambda: a.numpy(), lambda: double(a).numpy() / 2)
            n = 0
            while not done.is_set():
                try:
                    seen = reads[n % 2]()
                except pj.DeletedArrayError:
                    seen = None
                n += 1
                started.set()
                if seen is not None and not (seen == k).all():
                    bad.append((k, np.unique(seen)[:4]))
        reader = threading.Thread(target=read)
        reader.start()
        try:
            started.wait()
            step(a)
        finally:
            done.set()
            reader.join()
    assert not bad, bad[:3]



def test_the_copy_a_scatter_starts_from_is_not_run_in_place(device):
    """cache.at[pos].set(v) is a copy of cache into the output, then the scatter of v. Donated, the output is the
    cache's own memory, so the copy has nothing to do: the call runs only the scatter (the profile's copy row: no
    time, no bytes). A NumPy cache, and a donated cache also read through another argument (so not written in
    place), are copied. Results equal NumPy's."""
    update = pj.prepare(lambda cache, rows, pos: cache.at[pos].set(rows[0]), vars={"pos": (0, 7)},
                        donate_argnums=0, device=device)
    rows = np.ones((1, 4), np.float32)
    cache = _device_array(np.zeros((8, 4), np.float32), device)
    copy, scatter = pj.profile(update, cache, rows, 3).rows
    assert cache.is_deleted()
    assert (copy["time_s"], copy["bytes"]) == (0.0, 0) and scatter["bytes"] == 2 * rows.nbytes
    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    a = _device_array(x, device)
    for args in ((x, rows), (a, a)):
        copy, scatter = pj.profile(update, *args, 3).rows
        assert copy["time_s"] > 0 and copy["bytes"] == 2 * x.nbytes  # read and written
    assert not a.is_deleted()
    expected, cache = x.copy(), _device_array(x, device)
    memory = id(cache.buffer)
    for pos in (3, 5, 0):
        cache = update(cache, np.full((1, 4), pos, np.float32), pos)
        expected[pos] = pos
    assert id(cache.buffer) == memory
    assert_matches(cache, expected)
    assert_matches(update(a, a, 7), np.concatenate([x[:7], x[:1]]))
    assert_matches(a, x)


def test_an_output_written_in_place_allocates_nothing(device, monkeypatch):
    """A donation taken gives its output the argument's memory: no new output is allocated (a KV pool does not
    need twice its size on the device). When another donation of the same call cannot be taken (the memory is
    referenced) and its output's allocation then fails, the call raises before running, and the argument already
    taken is given back: valid, unchanged."""
    from prepjit.runtime.devices import get_device
    step = pj.prepare(lambda x, y: (x + 1, y * 2), donate_argnums=(0, 1), device=device)
    x = np.arange(6, dtype=np.float32)
    a, b = _device_array(x, device), _device_array(x, device)
    allocated = []
    real = get_device(device).new_output
    monkeypatch.setattr(get_device(device), "new_output", lambda *spec: allocated.append(spec) or real(*spec))
    first, second = step(a, b)
    assert allocated == [] and a.is_deleted() and b.is_deleted()
    assert_matches(first, x + 1)
    assert_matches(second, x * 2)

    def out_of_memory(*spec):
        raise MemoryError("no device memory left")
    monkeypatch.setattr(get_device(device), "new_output", out_of_memory)
    held = second.buffer  # referenced: `second` cannot be donated
    with pytest.raises(MemoryError):
        step(first, second)
    assert not first.is_deleted() and not second.is_deleted()
    assert_matches(first, x + 1)
    del held
    monkeypatch.setattr(get_device(device), "new_output", real)
    assert_matches(step(first, second)[1], x * 4)


def test_a_known_donating_call_takes_the_fast_path(device, monkeypatch):
    """A donating call of a known key (its first call went through the full path) replays on the fast path
    (replay.py: no Signature.read), as the serving engine's KV store does every step, with every check of the
    full path: the donated memory is taken (the result is written into it), a scalar var out of its bounds
    raises VarBoundError, a deleted argument DeletedArrayError naming it, a donated array referenced elsewhere is
    not taken (its result gets new memory) and an array passed twice is not written."""
    from tests.test_replay import counting_reads
    store = pj.prepare(lambda pool, rows, pos: pool.at[pos].set(pnp.stack(rows)), vars={"pos": (0, 6)},
                       donate_argnums=0, device=device)
    expected = np.zeros((8, 2, 4), np.float32)
    zeros = _device_array(np.zeros(4, np.float32), device)
    pool = store(_device_array(expected, device), [zeros, zeros], 0)  # the full path: learned
    reads = counting_reads(store, monkeypatch)
    memory = id(pool.buffer)
    for pos in (3, 5, 1):
        rows = [_device_array(np.full(4, pos + k, np.float32), device) for k in (0, 1)]
        old, pool = pool, store(pool, rows, pos)
        expected[pos] = [[pos] * 4, [pos + 1] * 4]
        assert old.is_deleted() and id(pool.buffer) == memory
    assert reads == [] and len(store._fast_calls.calls) == 1 and store.stats["traces"] == 1
    assert_matches(pool, expected)
    with pytest.raises(pj.VarBoundError):
        store(pool, rows, 7)
    with pytest.raises(pj.DeletedArrayError, match="pool is a pj.Array that has been deleted"):
        store(old, rows, 2)
    with pytest.raises(pj.DeletedArrayError, match=r"rows\[1\] is a pj.Array that has been deleted"):
        store(pool, [rows[0], old], 2)
    assert not pool.is_deleted()
    held = pool.buffer  # referenced: not taken
    reads.clear()
    out = store(pool, rows, 6)
    assert reads == [] and not pool.is_deleted() and id(out.buffer) != memory
    expected[6] = [[1] * 4, [2] * 4]  # (the rows of pos 1)
    assert_matches(out, expected)
    assert_matches(pool, np.concatenate([expected[:6], np.zeros((2, 2, 4), np.float32)]))
    del held

    add = pj.prepare(lambda x, y: x + y[::-1], donate_argnums=0, device=device)
    x = np.arange(5, dtype=np.float32)
    add(_device_array(x, device), _device_array(x, device))  # the full path: learned
    reads = counting_reads(add, monkeypatch)
    a = _device_array(x, device)
    assert_matches(add(a, a), x + x[::-1])  # passed twice: not written
    assert reads == [] and not a.is_deleted()
    assert_matches(a, x)
