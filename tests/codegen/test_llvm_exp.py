"""The cpu's inline float32 exp and erf match NumPy's / math's across the whole range, including NaN, inf and
denormals."""
import math

import numpy as np

import prepjit as pj
import prepjit.numpy as pnp


def test_exp_float32_full_range():
    x = np.concatenate([np.linspace(-110, 95, 100001, dtype=np.float32),
                        np.array([np.nan, np.inf, -np.inf, 0, -0.0, 88.72, 88.73, -87.3, -87.4, -103.9], np.float32)])
    out = np.asarray(pj.prepare(lambda x: pnp.exp(x), device="cpu")(x))
    with np.errstate(over="ignore"):
        ref = np.exp(x)
    assert np.array_equal(np.isnan(out), np.isnan(ref)) and np.array_equal(np.isinf(out), np.isinf(ref))
    finite = np.isfinite(ref)
    np.testing.assert_allclose(out[finite], ref[finite], rtol=1e-6, atol=1e-43)


def test_erf_float32_is_inline_and_full_range():
    x = np.concatenate([np.linspace(-6, 6, 120001, dtype=np.float32), np.geomspace(1e-30, 1, 3000).astype(np.float32),
                        -np.geomspace(1e-30, 1, 3000).astype(np.float32),
                        np.array([np.nan, np.inf, -np.inf, 0, -0.0, 0.75, -0.75, 4.0, -4.0], np.float32)])
    f = pj.prepare(lambda x: pnp.erf(x), device="cpu")
    out = np.asarray(f(x))
    assert "erff" not in f.plan(x).kernels[0].kernel.source
    ref = np.array([math.erf(v) if np.isfinite(v) else (np.sign(v) if np.isinf(v) else np.nan) for v in x.tolist()])
    assert np.array_equal(np.isnan(out), np.isnan(ref)) and np.array_equal(np.signbit(out), np.signbit(ref))
    ok = ~np.isnan(ref)
    np.testing.assert_allclose(out[ok], ref[ok], rtol=2e-7, atol=2e-7)
