"""The prepared-call fast path (prepjit/jit/replay.py) on pytree arguments (a model's weights as dicts, lists and
tuples of arrays): later calls skip the full path's signature read, on every device, and anything the key does
not cover (another structure, shape, dtype or layout, a non-array leaf) goes to the full path, which retraces or
raises as it always does; a bad scalar var raises the full path's error from the fast path (tests/test_call_reader.py)."""
import os

import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from tests.conftest import DEVICES


def model(xp, params, x, pos):
    h = x
    for layer in params["layers"]:
        w, b = layer["w"], layer["b"]
        h = xp.tanh(h @ w + b)
    scale, shift = params["norm"]
    return (h * scale + shift)[:, :pos + 1]


def weights(rng, layers=3, d=8):
    return {"layers": [{"w": rng.standard_normal((d, d)).astype(np.float32), "b": rng.standard_normal(d).astype(np.float32)}
                       for _ in range(layers)],
            "norm": (np.float32(1.5) * np.ones(d, np.float32), rng.standard_normal(d).astype(np.float32)),
            "unused": None}


def prepared(device):
    return pj.prepare(lambda params, x, pos: model(pnp, params, x, pos), vars={"pos": (0, 7)}, device=device)


def counting_reads(f, monkeypatch) -> list:
    reads = []
    real = f.signature.read

    def read(args, kwargs):
        reads.append(1)
        return real(args, kwargs)
    monkeypatch.setattr(f.signature, "read", read)
    return reads


def test_pytree_calls_take_the_fast_path_and_match_numpy(device, rng, monkeypatch):
    f = prepared(device)
    reads = counting_reads(f, monkeypatch)
    params, x = weights(rng), rng.standard_normal((4, 8)).astype(np.float32)
    for pos in (3, 0, 7, 5):
        np.testing.assert_allclose(np.asarray(f(params, x, pos)), model(np, params, x, pos), rtol=1e-5, atol=1e-5)
    assert len(reads) == 1 and f.stats["traces"] == 1 and f.stats["replays"] == 4
    params["layers"][1]["w"] = rng.standard_normal((8, 8)).astype(np.float32)   # a leaf swapped in place
    np.testing.assert_allclose(np.asarray(f(params, x, 2)), model(np, params, x, 2), rtol=1e-5, atol=1e-5)
    assert len(reads) == 1
    with pytest.raises(pj.VarBoundError):   # the var after the pytree is still checked before anything runs
        f(params, x, 8)
    np.testing.assert_allclose(np.asarray(f(params, x, 6)), model(np, params, x, 6), rtol=1e-5, atol=1e-5)


def test_a_partial_with_keywords_takes_the_fast_path(device, rng, monkeypatch):
    """functools.partial(fn, xp, scale=...) has keyword-only parameters with defaults (examples/models/llama.py's
    decode plans): positional calls still skip the signature read and use the keywords' values; a call passing a
    keyword goes to the full path."""
    import functools

    def scaled(xp, params, x, pos, scale=1.0, shift=None):
        return model(xp, params, x, pos) * scale + (0 if shift is None else shift)
    f = pj.prepare(functools.partial(scaled, pnp, scale=2.0, shift=0.5), vars={"pos": (0, 7)}, device=device)
    reads = counting_reads(f, monkeypatch)
    params, x = weights(rng), rng.standard_normal((4, 8)).astype(np.float32)
    for pos in (3, 0, 7):
        np.testing.assert_allclose(np.asarray(f(params, x, pos)), scaled(np, params, x, pos, 2.0, 0.5),
                                   rtol=1e-5, atol=1e-5)
    assert len(reads) == 1 and f.stats["replays"] == 3
    np.testing.assert_allclose(np.asarray(f(params, x, 2, scale=3.0)), scaled(np, params, x, 2, 3.0, 0.5),
                               rtol=1e-5, atol=1e-5)
    assert len(reads) == 2


def test_what_the_key_does_not_cover_goes_to_the_full_path(device, rng, monkeypatch):
    f = prepared(device)
    params, x = weights(rng), rng.standard_normal((4, 8)).astype(np.float32)
    f(params, x, 1)
    reads = counting_reads(f, monkeypatch)

    def check(p, n_reads, traces):
        np.testing.assert_allclose(np.asarray(f(p, x, 4)), model(np, p, x, 4), rtol=1e-5, atol=1e-5)
        assert (len(reads), f.stats["traces"]) == (n_reads, traces)
    check(params, 0, 1)
    check({**params, "layers": params["layers"][:2]}, 1, 2)                     # another structure: a new trace
    check({**params, "norm": list(params["norm"])}, 2, 3)                       # a list is not a tuple
    transposed = {**params, "layers": [dict(lp, w=np.ascontiguousarray(lp["w"].T).T) for lp in params["layers"]]}
    check(transposed, 3, 3)                                                     # strided leaves: the full path
    check({**params, "unused": 2.0}, 4, 4)                                      # a non-array leaf is static
    doubled = {**params, "norm": tuple(v.astype(np.float64) for v in params["norm"])}
    check(doubled, 5, 5)                                                        # another dtype
    with pytest.raises(pj.SignatureError):
        f({**params, "layers": [dict(lp, w=lp["w"].astype(np.complex64)) for lp in params["layers"]]}, x, 1)
    check(params, 6, 5)   # the first key still replays on the fast path (the refused call was one read)


def _trees(draw_leaf):
    """Hypothesis strategy: a dict / list / tuple pytree of arrays (and Nones) nested up to 3 levels deep."""
    from hypothesis import strategies as st
    leaves = st.one_of(draw_leaf, st.none())
    return st.recursive(leaves, lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3)), max_leaves=6)


def _arrays():
    from hypothesis import strategies as st
    return st.builds(lambda shape, dtype, seed: np.random.default_rng(seed).integers(-4, 5, shape).astype(dtype),
                     st.sampled_from([(2,), (3,), (2, 2)]), st.sampled_from([np.float32, np.int32]),
                     st.integers(0, 1000))


def _leaf_sums(tree):
    """Every array leaf's sum times its position (so a leaf read from the wrong place shows), in flatten order."""
    from prepjit.tracing.pytree import flatten
    leaves = [x for x in flatten(tree, lambda x: hasattr(x, "shape"))[0]]
    return [x.sum() * (i + 1) for i, x in enumerate(leaves)]


@pytest.mark.parametrize("device", DEVICES)
def test_random_pytrees_replay_their_own_leaves(device):
    """Random pytrees, called in a random order through one prepared function: every call (fast path or not)
    returns what NumPy computes from that call's own leaves, and calls with a key seen before take the fast
    path (counted: most examples have some)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    fast_calls = []

    @settings(max_examples=int(os.environ.get("PREPJIT_FUZZ_TREES", "100")), deadline=None,
              suppress_health_check=[HealthCheck.too_slow], derandomize="PREPJIT_FUZZ_TREES" not in os.environ)
    @given(st.lists(_trees(_arrays()), min_size=1, max_size=4), st.lists(st.integers(0, 3), min_size=2, max_size=8))
    def check(trees, order):
        f = pj.prepare(lambda t: _leaf_sums(t) + [pnp.zeros(())], device=device)
        for k in order:
            tree = trees[k % len(trees)]
            before = f.signature.read
            reads = []
            f.signature.read = lambda *a: reads.append(1) or before(*a)
            got = f(tree)
            f.signature.read = before
            fast_calls.append(not reads)
            want = _leaf_sums(tree)
            assert len(got) == len(want) + 1
            for g, w in zip(got, want):
                np.testing.assert_array_equal(np.asarray(g), w)
    check()
    assert sum(fast_calls) > len(fast_calls) // 4, (sum(fast_calls), len(fast_calls))


@pytest.mark.skipif("opencl" not in DEVICES, reason="needs a second device")
def test_the_device_variable_is_read_on_every_call(monkeypatch):
    f = pj.prepare(lambda x: x * 2)
    x = np.arange(4, dtype=np.float32)
    monkeypatch.delenv("PREPJIT_DEVICE", raising=False)
    assert [f(x).device for _ in range(2)] == ["cpu", "cpu"]          # the second on the fast path
    monkeypatch.setenv("PREPJIT_DEVICE", "opencl")
    assert [f(x).device for _ in range(2)] == ["opencl", "opencl"]
    monkeypatch.delenv("PREPJIT_DEVICE")
    assert f(x).device == "cpu"
    np.testing.assert_array_equal(np.asarray(f(x)), x * 2)


def test_a_layer_dict_changed_between_calls_replays_or_reads_like_the_full_path(device, rng, monkeypatch):
    """A model's layers (dicts whose values are all NumPy arrays, or all pj.Arrays: containers.walk reads such a
    dict in one map; from the second call a reader compiled for the structure reads it) changed in place between
    calls: each call returns what NumPy computes from its own leaves;
    a leaf of another dtype, shape, layout or class (a NumPy scalar for a 0-d array, an ndarray subclass, None,
    a pj.Array among NumPy arrays) or a dict with other keys reads through the full path, and a deleted pj.Array
    raises."""
    def fn(layers, x):
        return [(x * layer["w"]).sum() + layer["b"] for layer in layers]

    f = pj.prepare(lambda layers, x: fn(layers, x) + [pnp.zeros(())], device=device)
    on_device = pj.prepare(lambda a: a * 1, device=device)
    reads = counting_reads(f, monkeypatch)
    layers = [{"w": rng.standard_normal(8).astype(np.float32), "b": np.asarray(np.float32(k))} for k in range(3)]
    x = rng.standard_normal(8).astype(np.float32)

    def check(n_reads):
        got = f(layers, x)
        for g, w in zip(got, fn(layers, x)):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-5)
        assert len(reads) == n_reads, (len(reads), n_reads)
    check(1)
    check(1)                                                        # the fast path
    layers[1]["w"] = rng.standard_normal(8).astype(np.float32)      # a leaf swapped: new values, same key
    check(1)
    layers[2]["b"] = np.float32(5.0)                                # a NumPy scalar for a 0-d array
    check(2)
    check(3)                                                        # (not remembered: the full path each call)
    layers[2]["b"] = np.asarray(np.float32(6.0))
    check(3)                                                        # back to the first key
    layers[0]["w"].shape = (2, 4)                                   # reshaped in place: the full path
    with pytest.raises(pj.TraceError):
        f(layers, x)
    layers[0]["w"].shape = (8,)
    check(4)
    layers[0]["w"] = layers[0]["w"].astype(np.float64)              # another dtype
    check(5)
    layers[0]["w"] = np.stack([layers[0]["w"].astype(np.float32)] * 2, 1)[:, 0]  # strided: the full path copies
    check(6)
    check(7)
    layers[0]["w"] = np.ascontiguousarray(layers[0]["w"])
    check(7)
    layers[1]["w"] = layers[1]["w"].view(np.recarray)               # an ndarray subclass
    check(8)
    check(9)
    layers[1]["w"] = np.asarray(layers[1]["w"])
    check(9)
    layers[1]["extra"] = None                                       # another key
    check(10)
    check(10)
    del layers[1]["extra"]
    layers[1]["w"] = on_device(layers[1]["w"])      # a pj.Array among NumPy arrays
    check(11)
    check(11)
    layers[1] = {k: on_device(v) for k, v in layers[1].items()}   # all pj.Arrays
    check(12)
    check(12)
    donate = pj.prepare(lambda a: a + 1, device=device, donate_argnums=0)
    donate(layers[1]["w"])
    with pytest.raises(pj.DeletedArrayError):
        f(layers, x)


@pytest.mark.parametrize("scalar_var", [False, True])
def test_a_gpu_calls_outputs_are_allocated_together(device, monkeypatch, scalar_var):
    """On a device with its own memory a replayed call's outputs come from one `_pool_alloc_all` (the cuda device
    enters pycuda's context once for them: outside the main thread each entry pushes and pops it), with or
    without a scalar var read anew; the results are NumPy's."""
    if device == "cpu":
        pytest.skip("the cpu's outputs are host arrays")
    from prepjit.runtime.devices import get_device
    memory, batches = get_device(device), []
    allocate = memory._pool_alloc_all
    monkeypatch.setattr(memory, "_pool_alloc_all", lambda sizes: batches.append(list(sizes)) or allocate(sizes))
    if scalar_var:
        f = pj.prepare(lambda x, k: (x + k, x * k, pnp.sum(x)), vars={"k": (0, 9)}, device=device)
    else:
        f = pj.prepare(lambda x, k: (x + 2, x * 2, pnp.sum(x)), device=device)
    x = np.arange(6, dtype=np.float32)
    f(x, 2)  # (the first call reads its signature: the full path)
    batches.clear()
    for k in (2, 3) if scalar_var else (2, 2):
        out = f(x, k)
        np.testing.assert_array_equal(out[0], x + k)
        np.testing.assert_array_equal(out[1], x * k)
        assert float(out[2]) == x.sum()
    # (the 0-d sum: at least MIN_BYTES; cuda's single allocations -- a NumPy input's upload -- come through
    # _pool_alloc_all too, one size each)
    assert [sizes for sizes in batches if len(sizes) > 1] == [[24, 24, 16]] * 2


def _prefill_like(xp, params, ids, table, window):
    """The engine's prefill call in small: weights in a container, arrays whose dims are vars (T tokens, NB
    table entries), a scalar var."""
    h = xp.tanh(params["emb"][ids] @ params["w"])
    return h[:, :window] + xp.sum(table, axis=1, keepdims=True)


PREFILL_VARS = {"T": (1, 16), "NB": (1, 4), "window": (1, 8)}
PREFILL_SHAPES = {"params": {"emb": (32, 8), "w": (8, 8)}, "ids": ("T",), "table": ("T", "NB")}


def _prefill_call(rng, tokens, entries=2, window=8):
    return (rng.integers(0, 32, tokens).astype(np.int64), rng.integers(0, 9, (tokens, entries)).astype(np.int64),
            window)


def test_calls_of_other_lengths_replay_one_key_and_check_every_dim(device, rng, monkeypatch):
    """Calls whose arrays' var dims change from call to call (a serving engine's prompt lengths and table widths)
    replay the one key the first call learned, reading those dims from the shapes; what the key does not fix is
    still checked on every call: dims that disagree, dims out of their vars' bounds, the weights' static shapes
    and dtypes (a weight swapped for one of another shape between two calls of different lengths)."""
    f = pj.prepare(lambda params, ids, table, window: _prefill_like(pnp, params, ids, table, window),
                   vars=PREFILL_VARS, shapes=PREFILL_SHAPES, device=device)
    params = {"emb": rng.standard_normal((32, 8)).astype(np.float32),
              "w": rng.standard_normal((8, 8)).astype(np.float32)}
    reads = counting_reads(f, monkeypatch)

    def check(ids, table, window, n_reads):
        want = _prefill_like(np, params, ids, table, window)
        np.testing.assert_allclose(np.asarray(f(params, ids, table, window)), want, rtol=1e-5, atol=1e-5)
        assert len(reads) == n_reads, (len(reads), n_reads)
    for tokens, entries, window in [(5, 2, 8), (3, 2, 8), (5, 1, 4), (16, 4, 1), (1, 3, 8)]:
        check(*_prefill_call(rng, tokens, entries, window), 1)
    ids, table, _ = _prefill_call(rng, 5)
    with pytest.raises(pj.SignatureError, match=r"var 'T' disagrees: ids.shape\[0\] = 5 but table.shape\[0\] = 4"):
        f(params, ids, table[:4].copy(), 8)
    with pytest.raises(pj.VarBoundError, match=r"'NB' = 5 \(from table.shape\[1\]\) is outside its bounds \[1, 4\]"):
        f(params, ids, np.zeros((5, 5), np.int64), 8)
    with pytest.raises(pj.VarBoundError, match=r"'T' = 17 \(from ids.shape\[0\]\) is outside its bounds \[1, 16\]"):
        f(params, *_prefill_call(rng, 17))
    assert len(reads) == 1   # (each of these raised from the fast path)
    good_w = params["w"]
    params["w"] = rng.standard_normal((8, 9)).astype(np.float32)   # swapped between calls of two lengths
    with pytest.raises(pj.SignatureError, match=r"params\['w'\].shape\[1\] is 9, but shapes declares it static 8"):
        f(params, *_prefill_call(rng, 7))
    params["w"] = good_w.astype(np.float64)                          # another dtype: a plan of its own
    check(*_prefill_call(rng, 6), 3)
    assert f.stats["traces"] == 2
    params["w"] = good_w
    check(*_prefill_call(rng, 9), 3)                                 # the first key again, at another length
    strided = np.stack([_prefill_call(rng, 4)[0]] * 2, 1)[:, 0]
    check(strided, *_prefill_call(rng, 4)[1:], 4)                    # a strided array: the full path copies it
    on_device = pj.prepare(lambda a: a * 1, device=device)
    ids, table, window = _prefill_call(rng, 7)
    want = _prefill_like(np, params, ids, table, window)
    for _ in range(2):   # pj.Arrays where the var dims are: the first call learns their key, the second replays
        np.testing.assert_allclose(np.asarray(f(params, on_device(ids), on_device(table), window)), want,
                                   rtol=1e-5, atol=1e-5)
    assert len(reads) == 5 and f.stats["traces"] == 2
