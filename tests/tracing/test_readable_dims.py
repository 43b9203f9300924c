"""Symbolic dims print as their expressions inside a trace, and a float32 array meeting a NumPy float64 scalar
promotes as NumPy 2 does (PREPJIT_LOG=compiles says so)."""
import logging

import numpy as np

import prepjit as pj
import prepjit.numpy as pnp
from tests.helpers import assert_matches


def test_symbolic_shape_prints_its_expressions():
    seen = []

    def f(x, pos):
        seen.extend([repr(x.shape), str(x.shape[0] + 1), f"{x.size}", repr(pos), repr(x.shape[0] > 2), repr(x.sum())])
        return x

    pj.prepare(f, vars={"n": (1, 8), "pos": (0, 7)}, shapes={"x": ("n", 4)})(np.ones((2, 4), np.float32), 1)
    assert seen[:4] == ["(n, 4)", "(n+1)", "(n*4)", "pos"]
    assert seen[4] == "Tracer(shape=(), dtype=bool)" and seen[5] == "Tracer(shape=(), dtype=float32)"


def test_user_error_message_shows_the_dims():
    def f(x):
        if x.shape[1] != 4:  # a static dim: plain Python
            raise ValueError("unreachable")
        raise ValueError(f"expected a square input, got {x.shape}")

    try:
        pj.prepare(f, vars={"n": (1, 8)}, shapes={"x": ("n", 4)})(np.ones((2, 4), np.float32))
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        assert "got (n, 4)" in str(e)
    else:
        raise AssertionError("the function raised nothing")


def test_numpy_float64_scalar_widens_as_numpy2(caplog):
    x = np.ones((2, 4), np.float32)

    def f(x):
        return x / np.sqrt(x.shape[-1]), x * np.float32(2), x + 1.5, np.float64(3) * x

    with caplog.at_level(logging.INFO, logger="prepjit"):
        out = pj.prepare(f)(x)
    for got, ref in zip(out, f(x)):
        assert_matches(got, ref)
    assert [np.asarray(o).dtype for o in out] == [np.float64, np.float32, np.float32, np.float64]
    widened = [r.getMessage() for r in caplog.records if "float64 scalar" in r.getMessage()]
    assert len(widened) == 2 and "true_divide of a float32 array of shape (2, 4)" in widened[0]
