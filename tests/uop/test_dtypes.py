"""Dtypes of the IR and NumPy 2 (NEP 50) promotion."""
import itertools
import os
import subprocess
import sys

import numpy as np
import pytest

from prepjit.uop import dtypes, promote, to_dtype

NAMES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
         "float64"]


@pytest.mark.parametrize("a,b", list(itertools.combinations_with_replacement(NAMES, 2)))
def test_promotion_of_arrays_matches_numpy(a, b):
    want = np.result_type(np.dtype(a), np.dtype(b))
    assert promote((to_dtype(a), False), (to_dtype(b), False)).np == want


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("scalar", [True, 3, 2.5])
def test_promotion_with_python_scalars_matches_numpy(name, scalar):
    want = (np.zeros(1, name) + scalar).dtype if not (name == "bool" and isinstance(scalar, bool)) else np.dtype(bool)
    kind = dtypes.bool if isinstance(scalar, bool) else dtypes.int64 if isinstance(scalar, int) else dtypes.float64
    assert promote((to_dtype(name), False), (kind, True)).np == want


def test_to_dtype_accepts_numpy_and_names():
    assert to_dtype(np.float32) is dtypes.float32
    assert to_dtype("f4") is dtypes.float32
    assert to_dtype(np.dtype("int8")) is dtypes.int8
    assert to_dtype(bool) is dtypes.bool
    with pytest.raises(TypeError):
        to_dtype(np.complex64)


def test_bfloat16_is_ml_dtypes_bfloat16():
    import ml_dtypes

    import prepjit.numpy as pnp
    assert pnp.bfloat16 is ml_dtypes.bfloat16
    for spelling in (ml_dtypes.bfloat16, np.dtype(ml_dtypes.bfloat16), "bfloat16", dtypes.bfloat16):
        assert to_dtype(spelling) is dtypes.bfloat16
    assert dtypes.bfloat16.np == np.dtype(ml_dtypes.bfloat16) and dtypes.bfloat16.itemsize == 2
    assert dtypes.bfloat16.compute is dtypes.float16.compute is dtypes.float32 and dtypes.float64.compute is dtypes.float64


def test_importing_prepjit_leaves_ml_dtypes_until_a_bfloat16_needs_it():
    """ml_dtypes' import takes ~1 s (0.7.0): prepjit and a float32 call do without it; pnp.bfloat16 imports it."""
    code = ("import sys, numpy as np, prepjit as pj, prepjit.numpy as pnp\n"
            "out = pj.prepare(lambda x: x * 2)(np.ones(3, np.float32))\n"
            "assert 'ml_dtypes' not in sys.modules, 'imported early'\n"
            "import ml_dtypes\n"
            "assert pnp.bfloat16 is ml_dtypes.bfloat16\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PREPJIT_CACHE="0"))
    assert done.returncode == 0, done.stderr


# JAX's lattice wherever bfloat16 takes part: integers and bool below every float, bf16 and f16 meet at f32
JAX_WITH_BF16 = {"bool": "bfloat16", "int8": "bfloat16", "int64": "bfloat16", "uint32": "bfloat16",
                 "float16": "float32", "bfloat16": "bfloat16", "float32": "float32", "float64": "float64"}


@pytest.mark.parametrize("other", list(JAX_WITH_BF16))
def test_bfloat16_promotes_as_in_jax(other):
    bf16, dt = to_dtype("bfloat16"), to_dtype(other)
    want = to_dtype(JAX_WITH_BF16[other])
    assert promote((bf16, False), (dt, False)) is want and promote((dt, False), (bf16, False)) is want


@pytest.mark.parametrize("scalar", [dtypes.bool, dtypes.int64, dtypes.float64])
def test_python_scalars_keep_bfloat16(scalar):
    assert promote((dtypes.bfloat16, False), (scalar, True)) is dtypes.bfloat16


def test_limits_are_numpy_s(monkeypatch):
    """... computed from the bits: every integer node's bounds ask for them, and np.iinfo is slow to build."""
    iinfo = np.iinfo
    monkeypatch.setattr(np, "iinfo", None)
    assert (dtypes.int32.min(), dtypes.uint16.max()) == (-2 ** 31, 2 ** 16 - 1)
    monkeypatch.setattr(np, "iinfo", iinfo)
    for d in (dtypes.bool, dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint16,
              dtypes.uint32, dtypes.uint64, dtypes.float16, dtypes.float32):
        limits = (False, True) if d == dtypes.bool else (float("-inf"), float("inf")) if d.is_float else \
            (int(np.iinfo(d.np).min), int(np.iinfo(d.np).max))
        assert (d.min(), d.max()) == limits and type(d.min()) is type(limits[0]), d
