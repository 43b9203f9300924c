"""The fast path's native check of a call's container arrays (prepjit/runtime/array_check.py): it accepts arrays
with the recorded dtypes, shapes and strides and refuses any change, and a prepared call whose container array
changed in place after its key was learnt replays (or traces) for the array as it is now."""
import numpy as np
import pytest

import prepjit as pj
from prepjit.runtime.array_check import same_arrays_entry
from prepjit.runtime.devices import get_device


@pytest.fixture
def address():
    address = get_device("cpu").same_arrays_address
    if not address:
        pytest.skip("the native array check's self-test failed here (another NumPy or CPython layout)")
    return address


def test_the_check_accepts_the_same_parts_and_refuses_each_change(address):
    w = np.zeros((4, 6), np.float32)
    arrays = (w, w[:, ::2], np.zeros((), np.float64), np.zeros((2, 3, 5), np.int8))
    check = same_arrays_entry(address, arrays, [1, 2, 3, 4])
    items = ("not read", *arrays)
    assert check(items) is items
    copies = ("x", *(np.ones(a.shape, a.dtype) for a in arrays[:1]), np.ones((4, 6), np.float32)[:, ::2],
              *(np.ones(a.shape, a.dtype) for a in arrays[2:]))
    assert check(copies) is copies
    changes = [w.reshape(6, 4), w.reshape(24), w.reshape(1, 4, 6), np.asfortranarray(w), w.view(np.int32),
               w.astype(np.float64), w[:3], w[:, :5]]
    for changed in changes:
        other = ("x", changed, *arrays[1:])
        assert check(other) is not other, (changed.shape, changed.strides, changed.dtype)
    last = ("x", *arrays[:3], np.zeros((2, 3, 6), np.int8))
    assert check(last) is not last
    moved = np.zeros((4, 6), np.float32)
    moved.shape = (6, 4)  # in place: the same object, another shape
    assert check(("x", moved, *arrays[1:]))[1] is not moved


def test_a_container_array_reshaped_in_place_replays_for_its_new_shape():
    f = pj.prepare(lambda params, x: params["w"] * x)
    params = {"w": np.arange(6, dtype=np.float32), "b": np.ones(2, np.float32)}
    x = np.float32(2)
    for _ in range(3):  # walked twice, then read by the compiled reader and checked natively
        np.testing.assert_array_equal(np.asarray(f(params, x)), params["w"] * 2)
    params["w"].shape = (2, 3)
    out = np.asarray(f(params, x))
    assert out.shape == (2, 3)
    np.testing.assert_array_equal(out, params["w"] * 2)
    params["w"].shape = (6,)
    np.testing.assert_array_equal(np.asarray(f(params, x)), params["w"] * 2)
    params["w"] = params["w"].view(np.int32)  # the same memory, another dtype
    np.testing.assert_array_equal(np.asarray(f(params, x)), params["w"] * np.float32(2))
