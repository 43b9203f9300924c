"""Integer floor division, modulo and shifts by a constant in the LLVM renderer (codegen/llvm_ir.py
positive_divmod, shift): one instruction or a few instead of NumPy's checks for a zero or -1 divisor and a shift
past the width, with NumPy's results for every integer type, on scalars and in a vector's lanes."""
import functools

import numpy as np
import pytest

import prepjit as pj

INT_DTYPES = (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)


def _by_constants(a):
    negative = (a // -4, a % -4) if a.dtype.kind == "i" else ()  # (the generic division)
    return (a // 1, a % 1, a // 4, a % 4, a // 16, a % 16, a // 3, a % 3, a // 12, a % 12, *negative,
            a << 3, a >> 2, a >> 0)


def _values(dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    edges = {info.min, info.min + 1, info.min + 3, -17, -16, -13, -12, -5, -4, -3, -1, 0, 1, 3, 4, 5, 11, 12, 13,
             16, 17, info.max - 4, info.max - 1, info.max}
    return np.array(sorted(v for v in edges if info.min <= v <= info.max), dtype)


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_division_modulo_and_shifts_by_a_constant_match_numpy(dtype):
    a = _values(dtype)
    with np.errstate(all="ignore"):
        want = _by_constants(a)
        got = pj.prepare(_by_constants, device="cpu")(a)
    for n, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(np.asarray(g), w, err_msg=f"output {n}")


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_in_a_contractions_vector_lanes(dtype):
    """The same in a contraction's epilogue, which the renderer computes in vector lanes (x @ w is 0 there, so
    the operand's values reach the divisions as they are; the results folded into one output: one kernel)."""
    a, x, w = np.resize(_values(dtype), 64), np.zeros((5, 24), np.float32), np.ones((24, 64), np.float32)

    def f(x, w, a):
        return functools.reduce(lambda total, out: total * 3 + out, _by_constants((x @ w).astype(dtype) + a))
    prepared = pj.prepare(f, device="cpu")
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(np.asarray(prepared(x, w, a)), f(x, w, a))
    (kernel,) = prepared.plan(x, w, a).kernels
    assert f"{'ashr' if np.dtype(dtype).kind == 'i' else 'lshr'} <" in kernel.kernel.source  # in vectors


def test_a_power_of_two_divisor_is_a_shift_and_a_mask():
    f = pj.prepare(lambda i: i // 16 * 100 + i % 16, device="cpu")
    i = np.arange(-40, 40, dtype=np.int64)
    np.testing.assert_array_equal(np.asarray(f(i)), i // 16 * 100 + i % 16)
    sources = [k.kernel.source for k in f.plan(i).kernels]
    assert not any(op in s for s in sources for op in ("sdiv", "srem", "icmp eq")), sources
    assert any("ashr" in s for s in sources) and any("and " in s for s in sources), sources
