"""bfloat16 and float16 end to end (API.md "Low precision"), against NumPy with ml_dtypes and JAX's rules, on every
device: promotion (JAX's lattice), elementwise ops within one rounding of float32, reductions and contractions
accumulated in float32 and rounded once, preferred_element_type= and precision=, and grad, vmap, fori_loop,
random, saved plans and the disk cache on bfloat16."""
import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp

BF16 = ml_dtypes.bfloat16


def bf16(x) -> np.ndarray:
    return np.asarray(x, np.float32).astype(BF16)


def assert_rounded_once(got, want_f32, dtype=BF16):
    """`got` (of `dtype`) within one rounding of the float32 result `want_f32`: at most one ulp of `dtype` away
    (float32 results that differ in their last bits may round to neighbours)."""
    got = np.asarray(got)
    assert got.dtype == np.dtype(dtype)
    want = np.asarray(want_f32, np.float32)
    ulp = np.abs(want.astype(dtype).astype(np.float32)) * (2.0 ** -7 if dtype == BF16 else 2.0 ** -10)
    np.testing.assert_array_less(np.abs(got.astype(np.float32) - want), ulp + 1e-30 + 1e-6 * (ulp == 0))


@pytest.mark.parametrize("source", ["float64", "int32", "int64"])
def test_casts_to_float16_round_once(device, source):
    """A double (or an integer) rounds to float16 once, as NumPy rounds it (and JAX): not through float32 first,
    which makes 1 + 2**-11 + 2**-30 a tie and gives 1.0 where the nearest float16 is 1 + 2**-10."""
    rng = np.random.default_rng(6)
    if source == "float64":
        ties = 2.0 ** np.arange(-24, 16) * (1 + 2.0 ** -11)  # halfway between two float16s (subnormals included)
        x = np.concatenate([ties, ties * (1 + 2.0 ** -40), ties * (1 - 2.0 ** -40), -ties * (1 + 2.0 ** -30),
                            [0.0, -0.0, 65504.0, 65520.0, 65520.0 * (1 - 2.0 ** -30), 1e300, -np.inf, np.nan],
                            rng.standard_normal(5000) * 2.0 ** rng.integers(-30, 17, 5000)])
    else:
        x = np.concatenate([rng.integers(-70000, 70000, 5000), [2**11 + 1, 2**12 + 2 + 1, -(2**13 + 4), 65519,
                                                                   65520, 2**40 + 1]]).astype(source)
    got = np.asarray(pj.prepare(lambda a: a.astype(pnp.float16), device=device)(x))
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    nan = np.isnan(want)  # (a NaN's payload is the device's)
    assert np.array_equal(np.isnan(got), nan) and np.array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])


@pytest.mark.parametrize("other,want", [(np.int32, BF16), (np.int8, BF16), (np.bool_, BF16), (np.float16, np.float32),
                                        (np.float32, np.float32), (np.float64, np.float64), (BF16, BF16)])
def test_promotion_follows_jax(device, other, want):
    x = bf16([1.5, -2.25, 3.0])
    y = np.array([1, 0, 2]).astype(other)
    f = pj.prepare(lambda a, b: (a + b, b * a, a < b), device=device)
    s, p, c = f(x, y)
    assert s.dtype == p.dtype == np.dtype(want) and c.dtype == np.bool_
    wide = x.astype(np.float64) + y.astype(np.float64)
    np.testing.assert_array_equal(np.asarray(s), wide.astype(np.float32).astype(want))


def test_python_scalars_keep_the_array_dtype(device):
    x = bf16([1.0, 2.5, -3.0])
    out = pj.prepare(lambda a: (a + 1, a * 2.5, 1.0 - a, a ** 2), device=device)(x)
    assert all(o.dtype == BF16 for o in out)
    np.testing.assert_array_equal(np.asarray(out[1]), bf16(x.astype(np.float32) * 2.5))


@pytest.mark.parametrize("name", ["exp", "tanh", "sqrt", "log1p", "sin", "reciprocal", "divide", "arctan2"])
@pytest.mark.parametrize("dtype", [BF16, np.float16])
def test_elementwise_within_one_rounding_of_float32(device, name, dtype):
    rng = np.random.default_rng(3)
    x = (rng.random(200) * 4 + 0.01).astype(dtype)
    y = (rng.random(200) * 4 + 0.01).astype(dtype)
    fn = getattr(pnp, name)
    binary = name in ("divide", "arctan2")
    got = pj.prepare(lambda a, b: fn(a, b) if binary else fn(a), device=device)(x, y)
    ref = getattr(np, name)(*((x.astype(np.float32), y.astype(np.float32)) if binary else (x.astype(np.float32),)))
    assert_rounded_once(got, ref, dtype)


def test_sums_accumulate_in_float32(device):
    total = pj.prepare(lambda: pnp.ones(20000, pnp.bfloat16).sum(), device=device)()
    assert total.dtype == BF16 and float(np.asarray(total)) == float(bf16(20000))  # 19968; NumPy's stops at 256
    rng = np.random.default_rng(4)
    x = bf16(rng.standard_normal((6, 3000)))
    f = pj.prepare(lambda a: (a.sum(axis=1), a.mean(axis=0), a.max(axis=1), pnp.var(a, axis=1),
                              a.sum(axis=1, dtype=pnp.float32)), device=device)
    s, m, mx, v, s32 = f(x)
    wide = x.astype(np.float32)
    assert_rounded_once(s, wide.sum(1))
    assert_rounded_once(m, wide.mean(0))
    np.testing.assert_array_equal(np.asarray(mx), x.max(1))
    assert_rounded_once(v, wide.var(1))
    assert s32.dtype == np.float32 and np.allclose(np.asarray(s32), wide.sum(1), rtol=1e-5, atol=1e-4)


def test_float16_variance_does_not_overflow(device):
    x = (np.random.default_rng(5).standard_normal(4000) * 100).astype(np.float16)
    with np.errstate(over="ignore"):
        assert np.isinf(np.var(x))  # NumPy squares the deviations in float16
    got = pj.prepare(lambda a: (pnp.var(a), pnp.std(a)), device=device)(x)
    assert_rounded_once(got[0], np.var(x.astype(np.float32)), np.float16)
    assert_rounded_once(got[1], np.std(x.astype(np.float32)), np.float16)


def test_softmax_and_layernorm_sums_in_float32(device):
    x = bf16(np.random.default_rng(6).standard_normal((4, 2000)) * 3)

    def softmax_layernorm(a):
        e = pnp.exp(a - a.max(axis=-1, keepdims=True))
        mu = a.mean(axis=-1, keepdims=True)
        return e / e.sum(axis=-1, keepdims=True), (a - mu) / pnp.sqrt(pnp.var(a, axis=-1, keepdims=True) + 1e-5)

    sm, ln = pj.prepare(softmax_layernorm, device=device)(x)
    assert sm.dtype == ln.dtype == BF16
    w = x.astype(np.float32)
    e = bf16(np.exp(bf16(w - w.max(-1, keepdims=True)).astype(np.float32))).astype(np.float32)  # rounded per op
    np.testing.assert_allclose(np.asarray(sm).astype(np.float32), e / e.sum(-1, keepdims=True), rtol=2 ** -7)
    np.testing.assert_allclose(np.asarray(sm).astype(np.float32).sum(-1), 1.0, rtol=0.02)
    ref_ln = (w - w.mean(-1, keepdims=True)) / np.sqrt(w.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(np.asarray(ln).astype(np.float32), ref_ln, rtol=2 ** -6, atol=0.02)


@pytest.mark.parametrize("dtype", [BF16, np.float16])
def test_contractions_accumulate_in_float32(device, dtype):
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((5, 700)).astype(dtype), rng.standard_normal((700, 3)).astype(dtype)
    c = rng.standard_normal((2, 700, 3)).astype(dtype)
    f = pj.prepare(lambda a, b, c: (a @ b, pnp.einsum("ik,bkj->bij", a, c), pnp.dot(a, b), pnp.tensordot(a, b, 1),
                                    pnp.matmul(a, b, preferred_element_type=pnp.float32)), device=device)
    mm, es, dt, td, wide = f(a, b, c)
    ref = a.astype(np.float32) @ b.astype(np.float32)
    for got in (mm, dt, td):
        assert_rounded_once(got, ref, dtype)
    assert_rounded_once(es, np.einsum("ik,bkj->bij", a.astype(np.float32), c.astype(np.float32)), dtype)
    assert wide.dtype == np.float32
    np.testing.assert_allclose(np.asarray(wide), ref, rtol=1e-5, atol=1e-4)


def test_preferred_element_type_narrows_and_widens(device):
    a = np.random.default_rng(8).standard_normal((4, 64)).astype(np.float32)
    f = pj.prepare(lambda x: (pnp.matmul(x, x.T, preferred_element_type=pnp.bfloat16),
                              pnp.einsum("ij,kj->ik", x, x, preferred_element_type=np.float64),
                              pnp.dot(x.astype(pnp.int8), x.T.astype(pnp.int8), preferred_element_type=np.int32)),
                   device=device)
    narrow, wide, ints = f(a)
    assert_rounded_once(narrow, a @ a.T)
    assert wide.dtype == np.float64 and np.allclose(np.asarray(wide), a.astype(np.float64) @ a.T, rtol=1e-6)
    i8 = a.astype(np.int8)
    assert ints.dtype == np.int32 and np.array_equal(np.asarray(ints), i8.astype(np.int32) @ i8.T.astype(np.int32))


def test_precision_choices_and_default(device, monkeypatch):
    a = np.random.default_rng(9).standard_normal((8, 16)).astype(np.float32)
    exact = np.asarray(pj.prepare(lambda x: x @ x.T, device=device)(a))
    for p in ("highest", "tf32", "bf16", "float32", "tensorfloat32", "bfloat16"):
        got = pj.prepare(lambda x: pnp.matmul(x, x.T, precision=p), device=device)(a)
        np.testing.assert_allclose(np.asarray(got), exact, rtol=1e-2, atol=1e-2)  # a device may round to tf32/bf16
    with pj.default_matmul_precision("tf32"):
        np.testing.assert_allclose(np.asarray(pj.prepare(lambda x: x @ x.T, device=device)(a)), exact, rtol=1e-2,
                                   atol=1e-2)
    with pytest.raises(ValueError, match="precision"):
        with pj.default_matmul_precision("fastest"):
            pass
    f = pj.prepare(lambda x: pnp.dot(x, x.T, precision="tf64"), device=device)
    with pytest.raises(ValueError, match="tf64"):
        f(a)
    monkeypatch.setenv("PREPJIT_DEFAULT_MATMUL_PRECISION", "nope")
    with pytest.raises(ValueError, match="PREPJIT_DEFAULT_MATMUL_PRECISION"):
        pj.prepare(lambda x: pnp.einsum("ij,kj->ik", x, x), device=device)(a)
    monkeypatch.setenv("PREPJIT_DEFAULT_MATMUL_PRECISION", "bf16")
    np.testing.assert_allclose(np.asarray(pj.prepare(lambda x: x @ x.T, device=device)(a)), exact, rtol=1e-2,
                               atol=1e-2)
    monkeypatch.delenv("PREPJIT_DEFAULT_MATMUL_PRECISION")
    assert np.array_equal(np.asarray(pj.prepare(lambda x: x @ x.T, device=device)(a)), exact)  # still works


def test_grad_vmap_and_loops_on_bfloat16(device):
    x = bf16(np.linspace(-2, 2, 12).reshape(3, 4))
    g = pj.prepare(pj.grad(lambda a: (a * a * 3).sum()), device=device)(x)
    assert g.dtype == BF16
    np.testing.assert_array_equal(np.asarray(g), bf16(bf16(x.astype(np.float32) * 3).astype(np.float32) * 2))
    rows = pj.prepare(pj.vmap(lambda r: (r * 2).sum()), device=device)(x)
    assert rows.dtype == BF16
    np.testing.assert_array_equal(np.asarray(rows), bf16((x.astype(np.float32) * 2).sum(1)))
    looped = pj.prepare(lambda a: pj.fori_loop(0, 5, lambda i, c: c * 1.5 + 1, a), device=device)(x)
    want = x
    for _ in range(5):
        want = bf16(bf16(want.astype(np.float32) * 1.5).astype(np.float32) + 1)
    assert looped.dtype == BF16 and np.array_equal(np.asarray(looped), want)


def test_random_normal_in_bfloat16(device):
    """Drawn as JAX does, from a uniform with bfloat16's 7 bits of mantissa (so about 2**8 distinct values)."""
    got = pj.prepare(lambda k: pj.random.normal(k, (20000,), pnp.bfloat16), device=device)(pj.random.key(0))
    assert got.dtype == BF16
    x = np.asarray(got).astype(np.float32)
    assert np.isfinite(x).all() and abs(x.mean()) < 0.03 and abs(x.std() - 1) < 0.03
    assert len(np.unique(x)) >= 100 and np.array_equal(x.astype(BF16).astype(np.float32), x)


def test_saved_plan_round_trip_on_bfloat16(device, tmp_path):
    f = pj.prepare(lambda a, b: (a @ b + 1).sum(axis=0), device=device)
    rng = np.random.default_rng(10)
    a, b = bf16(rng.standard_normal((6, 32))), bf16(rng.standard_normal((32, 5)))
    path = str(tmp_path / "bf16.pjplan")
    f.save(path, a, b)
    g = pj.load(path)
    out = g(a, b)
    assert out.dtype == BF16 and np.array_equal(np.asarray(out).view(np.uint16), np.asarray(f(a, b)).view(np.uint16))
    assert g.stats["compiles"] == 0


_CACHE_SCRIPT = """
import json, sys
import ml_dtypes, numpy as np
import prepjit as pj
f = pj.prepare(lambda a, b: (a @ b).astype(ml_dtypes.bfloat16) * 3, device=sys.argv[1])
rng = np.random.default_rng(0)
out = f(rng.standard_normal((4, 16)).astype(ml_dtypes.bfloat16), rng.standard_normal((16, 4)).astype(np.float32))
print(json.dumps({"stats": f.stats, "bits": np.asarray(out).view(np.uint16).tolist()}))
"""


def test_disk_cache_on_bfloat16(device, tmp_path, frozen_code):
    env = {**os.environ, "PREPJIT_CACHE_DIR": str(tmp_path / "cache"), "PREPJIT_CACHE": "1",
           "PYTHONPATH": str(frozen_code)}
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", _CACHE_SCRIPT, device], env=env, cwd=frozen_code,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        runs.append(json.loads(out.stdout))
    first, second = runs
    assert first["stats"]["compiles"] >= 1 and second["stats"]["compiles"] == 0
    assert second["stats"]["disk_hits"] == first["stats"]["compiles"] and first["bits"] == second["bits"]
