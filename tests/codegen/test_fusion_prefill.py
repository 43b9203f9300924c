"""Fusion of a prefill's projections (many rows at once): a normalised operand too large to compute once per call
(fusion.OPERAND_MAX) is materialised, whatever else the rows were computed from."""
import numpy as np

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.uop import Ops


def _rms_norm(xp, x, gain):
    return x / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) + 1e-5) * gain


def test_a_prefills_norm_of_gathered_rows_is_not_recomputed_in_its_projection(device, rng):
    """A prefill's first projection reads the normalised embedding rows of its tokens (up to 1024 rows of 64: more
    than a kernel's own array holds). The gathered table, larger than the weight (SmolLM2's: 49152 x 576 against
    960 x 576; here 16384 x 64 against 48 x 64), is not the projection's weight:
    the projection's kernel reads the normalised rows, it does not compute them (it took the table for its weight,
    one row, and recomputed the norm at each panel of outputs: SmolLM2's qkv projection 3x slower a FLOP than its
    gate/up one). Equal to NumPy."""
    table = rng.standard_normal((16384, 64)).astype(np.float32)
    w = (rng.standard_normal((48, 64)) * 0.2).astype(np.float32)
    gain = rng.standard_normal(64).astype(np.float32)

    def g(xp, tokens, table, gain, w):
        return _rms_norm(xp, table[tokens], gain) @ w.T
    f = pj.prepare(lambda tokens, table, gain, w: g(pnp, tokens, table, gain, w), vars={"T": (1, 1024)},
                   shapes={"tokens": ("T",)}, device=device)
    tokens = rng.integers(0, 16384, 300)
    np.testing.assert_allclose(np.asarray(f(tokens, table, gain, w)), g(np, tokens, table.astype(np.float64), gain, w),
                               rtol=1e-4, atol=1e-4)
    projections = [k.kernel for k in f.plan(tokens, table, gain, w).kernels if "_48" in k.kernel.name]
    assert projections and not any(u.op is Ops.SQRT for k in projections for u in k.scheduled.toposort())
