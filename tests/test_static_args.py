"""static_argnums / static_argnames on pj.prepare (as in jax.jit) and the error for a `vars` that is not a dict."""
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp


class Scale:
    """A hashable array-like value: without static_argnames it would be traced as an array."""

    def __init__(self, v):
        self.v = v

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.v, dtype)

    def __hash__(self):
        return hash(self.v)

    def __eq__(self, other):
        return isinstance(other, Scale) and other.v == self.v


def test_static_argnames_array_like_values_are_part_of_the_signature():
    seen = []

    @pj.prepare(static_argnames=("k",))
    def f(x, k):
        seen.append(type(k))
        return x * float(k.v if isinstance(k, Scale) else k)

    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(f(x, np.float32(2))), x * 2)
    np.testing.assert_array_equal(np.asarray(f(x, np.float32(2))), x * 2)
    assert f.stats["traces"] == 1
    np.testing.assert_array_equal(np.asarray(f(x, np.float32(3))), x * 3)
    assert f.stats["traces"] == 2
    np.testing.assert_array_equal(np.asarray(f(x, k=Scale(5))), x * 5)
    np.testing.assert_array_equal(np.asarray(f(x, Scale(5))), x * 5)
    assert f.stats["traces"] == 3
    assert seen == [np.float32, np.float32, Scale]  # the function sees the value itself, not a traced array


def test_static_argnums_drive_python_control_flow_and_the_fast_path():
    @pj.prepare(static_argnums=1)
    def f(x, n):
        for _ in range(n):  # n is a plain int here
            x = x + 1
        return x

    x = np.zeros(3, np.float32)
    for n in (1, 2, 1, 2, 3, 3):
        np.testing.assert_array_equal(np.asarray(f(x, n)), x + n)
    assert f.stats["traces"] == 3
    g = pj.prepare(lambda x, shape: x.reshape(shape), static_argnums=(-1,))
    assert np.asarray(g(np.arange(6), (2, 3))).shape == (2, 3)
    assert np.asarray(g(np.arange(6), (3, 2))).shape == (3, 2)


def test_static_argument_errors():
    f = pj.prepare(lambda x, k: x * k.sum(), static_argnames="k")
    with pytest.raises(pj.SignatureError, match="static .* hashable"):
        f(np.ones(3, np.float32), np.ones(2, np.float32))
    with pytest.raises(ValueError, match="static_argnums 2"):
        pj.prepare(lambda x, k: x, static_argnums=2)
    with pytest.raises(ValueError, match="static_argnames names 'q'"):
        pj.prepare(lambda x, k: x, static_argnames=["q"])
    with pytest.raises(ValueError, match="also in shapes"):
        pj.prepare(lambda x, k: x, static_argnames=["x"], shapes={"x": ("n",)}, vars={"n": (1, 4)})


@pytest.mark.parametrize("bad", [["n"], "n", ("n", "m")])
def test_vars_must_be_a_dict(bad):
    with pytest.raises(ValueError, match=r"dict of name -> \(min, max\)"):
        pj.prepare(lambda x: x, vars=bad, shapes={"x": ("n",)})


def test_vars_may_still_be_a_list_of_var_objects():
    n = pj.Var("n", 1, 8)
    f = pj.prepare(lambda x: pnp.sum(x), vars=[n], shapes={"x": ("n",)})
    assert float(np.asarray(f(np.ones(5, np.float32)))) == 5.0


def _numpy_scalars():
    import ml_dtypes
    return [np.float64, np.float32, np.float16, np.int64, np.int32, np.uint8, np.bool_, ml_dtypes.bfloat16]


@pytest.mark.parametrize("kind", _numpy_scalars(), ids=lambda t: t.__name__)
def test_numpy_scalars_are_0d_arrays(device, kind):
    """docs/prepare.md: a NumPy scalar is a 0-d array, not a static value, whatever its type (np.float64 is a
    Python float subclass too): a learning rate that changes every step replays one plan, through the full path
    and the fast path alike, and the function sees a traced 0-d array of the scalar's dtype."""
    seen = []

    @pj.prepare(device=device)
    def f(x, lr):
        seen.append((lr.shape, lr.dtype.name))
        return x * lr

    x = np.arange(4, dtype=np.float32)
    for step in range(6):
        value = kind(0.1 * np.cos(step / 10) * 10 if kind is not np.bool_ else step % 2)
        expected = x * np.asarray(value)
        out = f(x, value)
        assert out.dtype == expected.dtype
        np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-2 if expected.dtype.itemsize <= 2 else 1e-6)
    assert f.stats["traces"] == 1 and f.stats["replays"] == 6
    assert seen == [((), np.dtype(kind).name)]
    assert f(x, np.asarray(kind(1))).shape == (4,) and f.stats["traces"] == 1  # a 0-d array is the same signature


def test_numpy_complex_scalars_are_refused_like_complex_arrays():
    f = pj.prepare(lambda x, s: x * s)
    with pytest.raises(pj.SignatureError, match="complex"):
        f(np.ones(2, np.float32), np.complex128(1 + 2j))
    with pytest.raises(pj.SignatureError, match="complex"):
        f(np.ones(2, np.float32), np.ones(2, np.complex64))


def test_numpy_strings_stay_static_values():
    f = pj.prepare(lambda x, mode: x + 1 if mode == "up" else x - 1)
    assert np.asarray(f(np.zeros(2, np.float32), np.str_("up"))).tolist() == [1, 1]
    assert np.asarray(f(np.zeros(2, np.float32), np.str_("down"))).tolist() == [-1, -1]


def test_a_numpy_integer_for_a_scalar_var_is_its_value(device):
    f = pj.prepare(lambda x, pos: x[pos] * 2, vars={"pos": (0, 3)}, device=device)
    x = np.arange(4, dtype=np.float32)
    for pos in (np.int64(2), np.int32(1), 3, np.int64(0), np.int64(2)):
        assert float(np.asarray(f(x, pos))) == 2 * pos
    assert f.stats["traces"] == 1
    with pytest.raises(pj.VarBoundError):
        f(x, np.int64(4))


def test_dtypes_and_classes_are_static_values(device):
    """A dtype argument (np.float16 the class, np.dtype('int32'), pnp.bfloat16) is a static value, as a string is:
    np.float32 the class has an (unbound) __array__ and was read as an array argument (SignatureError)."""
    @pj.prepare(device=device)
    def cast(x, dtype=np.float32):
        return x.astype(dtype)

    x = np.arange(3, dtype=np.float32)
    for dtype in (np.float16, np.dtype("int32"), pnp.bfloat16, np.float16):
        out = np.asarray(cast(x, dtype))
        assert out.dtype == np.dtype(dtype) and out.astype(np.float32).tolist() == [0, 1, 2]
    assert np.asarray(cast(x, dtype=np.int8)).dtype == np.int8
    assert cast.stats["traces"] == 4 and cast.stats["replays"] == 5
