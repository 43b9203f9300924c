"""The cpu's inline float32 exp matches NumPy's across the whole range, including NaN, inf and denormals."""
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
