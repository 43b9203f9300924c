"""Shared assertions: a prepared result equals NumPy's (shape, dtype and values)."""
import numpy as np

import prepjit as pj


def assert_matches(out, ref, rtol=1e-5, atol=1e-6, check_dtype=True):
    """`out` (a pj.Array) has `ref`'s shape and dtype, and its values within float32 elementwise tolerance."""
    assert isinstance(out, pj.Array), f"expected a pj.Array, got {type(out).__name__}"
    got, ref = np.asarray(out), np.asarray(ref)
    assert got.shape == ref.shape, f"shape {got.shape} != NumPy's {ref.shape}"
    if check_dtype:
        assert got.dtype == ref.dtype, f"dtype {got.dtype} != NumPy's {ref.dtype}"
    if ref.dtype.kind == "f":
        np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol)
    else:
        np.testing.assert_array_equal(got, ref)


def check_op(fn, *args, device="cpu", **kwargs):
    """`fn(xp, *args)` prepared with xp = prepjit.numpy equals it run with xp = numpy."""
    import prepjit.numpy as pnp
    prepared = pj.prepare(lambda *a: fn(pnp, *a), device=device)
    assert_matches(prepared(*args), fn(np, *args), **kwargs)
