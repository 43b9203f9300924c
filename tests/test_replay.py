"""The prepared-call fast path (prepjit/replay.py) on pytree arguments (a model's weights as dicts, lists and
tuples of arrays): later calls skip the full path's signature read, on every device, and anything the key does
not cover (another structure, shape, dtype or layout, a non-array leaf, a bad var) goes to the full path, which
retraces or raises as it always does."""
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp


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
