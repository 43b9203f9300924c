"""pnp.linalg.norm, einsum diagonals (`ii->i`, `ii`, `bii->bi`, `iij`), pad modes edge / wrap / reflect /
symmetric and pnp.outer against NumPy, on every device, static and symbolic shapes."""
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp

VECTOR_ORDS = [None, 2, 1, np.inf, -np.inf, 0, 3, 0.5]
MATRIX_ORDS = [None, "fro", 1, -1, np.inf, -np.inf]


def test_vector_norms(device, rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    x[0, 0] = 0.0
    for ord in VECTOR_ORDS:
        for axis, keepdims in [(1, False), (0, True), (-1, True)]:
            f = pj.prepare(lambda a: pnp.linalg.norm(a, ord=ord, axis=axis, keepdims=keepdims), device=device)
            got, want = np.asarray(f(x)), np.linalg.norm(x, ord=ord, axis=axis, keepdims=keepdims)
            assert got.dtype == want.dtype and got.shape == want.shape, (ord, axis)
            np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=f"ord={ord} axis={axis}")
    v = x[1]
    for ord in VECTOR_ORDS:
        got = np.asarray(pj.prepare(lambda a: pnp.linalg.norm(a, ord), device=device)(v))
        np.testing.assert_allclose(got, np.linalg.norm(v, ord), rtol=1e-5)


def test_matrix_norms(device, rng):
    x = rng.standard_normal((2, 3, 5)).astype(np.float32)
    for ord in MATRIX_ORDS:
        for axis, keepdims in [((1, 2), False), ((2, 0), True)]:
            f = pj.prepare(lambda a: pnp.linalg.norm(a, ord=ord, axis=axis, keepdims=keepdims), device=device)
            got, want = np.asarray(f(x)), np.linalg.norm(x, ord=ord, axis=axis, keepdims=keepdims)
            assert got.shape == want.shape, (ord, axis)
            np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=f"ord={ord} axis={axis}")
        m = x[0]
        got = np.asarray(pj.prepare(lambda a: pnp.linalg.norm(a, ord), device=device)(m))
        np.testing.assert_allclose(got, np.linalg.norm(m, ord), rtol=1e-5)
    for keepdims in (False, True):
        got = np.asarray(pj.prepare(lambda a: pnp.linalg.norm(a, keepdims=keepdims), device=device)(x))
        want = np.linalg.norm(x, keepdims=keepdims)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5)


def test_norm_dtypes_and_errors():
    ints = np.arange(6, dtype=np.int32)
    got = np.asarray(pj.prepare(lambda a: pnp.linalg.norm(a))(ints))
    assert got.dtype == np.float64 and np.isclose(got, np.linalg.norm(ints))
    with pytest.raises(pj.TraceError, match="singular values"):
        pj.prepare(lambda a: pnp.linalg.norm(a, 2))(np.ones((3, 3), np.float32))
    with pytest.raises(ValueError, match="Invalid norm order"):
        pj.prepare(lambda a: pnp.linalg.norm(a, "fro"))(np.ones(3, np.float32))


def test_norm_symbolic():
    f = pj.prepare(vars={"n": (1, 16)}, shapes={"x": ("n", 3)})(
        lambda x: (pnp.linalg.norm(x, axis=0), pnp.linalg.norm(x, np.inf, axis=1), pnp.linalg.norm(x, "fro")))
    for n in (1, 4, 16):
        x = np.linspace(-1, 2, 3 * n, dtype=np.float32).reshape(n, 3)
        wants = (np.linalg.norm(x, axis=0), np.linalg.norm(x, np.inf, axis=1), np.linalg.norm(x, "fro"))
        for got, want in zip(f(x), wants):
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5)
    assert f.stats["traces"] == 1


EINSUMS = [("ii->i", [(4, 4)]), ("ii", [(4, 4)]), ("bii->bi", [(2, 3, 3)]), ("iij->ij", [(3, 3, 2)]),
           ("ii,i->i", [(3, 3), (3,)]), ("iji->j", [(3, 2, 3)]), ("iii->i", [(3, 3, 3)])]


@pytest.mark.parametrize("spec, shapes", EINSUMS, ids=[s for s, _ in EINSUMS])
def test_einsum_diagonals(spec, shapes, device, rng):
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    got = np.asarray(pj.prepare(lambda *a: pnp.einsum(spec, *a), device=device)(*xs))
    np.testing.assert_allclose(got, np.einsum(spec, *xs), rtol=1e-5, atol=1e-6)


def test_einsum_diagonal_symbolic_and_errors():
    f = pj.prepare(vars={"n": (0, 8)}, shapes={"x": ("n", "n")})(
        lambda x: (pnp.einsum("ii->i", x), pnp.einsum("ii", x)))
    for n in (0, 1, 5):
        x = np.arange(n * n, dtype=np.float32).reshape(n, n)
        d, t = f(x)
        np.testing.assert_array_equal(np.asarray(d), np.einsum("ii->i", x))
        np.testing.assert_allclose(np.asarray(t), np.einsum("ii", x))
    assert f.stats["traces"] == 1
    with pytest.raises(pj.TraceError, match="don't match"):
        pj.prepare(lambda x: pnp.einsum("ii->i", x))(np.ones((2, 3), np.float32))


PAD_MODES = ["edge", "wrap", "reflect", "symmetric"]
PAD_WIDTHS = [1, ((1, 2), (0, 3)), ((5, 7), (9, 1)), ((0, 0), (2, 0))]


@pytest.mark.parametrize("mode", PAD_MODES)
def test_pad_modes(mode, device):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    for widths in PAD_WIDTHS:
        got = np.asarray(pj.prepare(lambda a: pnp.pad(a, widths, mode=mode), device=device)(x))
        np.testing.assert_array_equal(got, np.pad(x, widths, mode=mode), err_msg=str(widths))
    one = np.array([[7]], np.int16)
    got = np.asarray(pj.prepare(lambda a: pnp.pad(a, 3, mode), device=device)(one))
    np.testing.assert_array_equal(got, np.pad(one, 3, mode))
    assert got.dtype == np.int16


@pytest.mark.parametrize("mode", PAD_MODES)
def test_pad_modes_symbolic(mode):
    f = pj.prepare(vars={"n": (1, 9)}, shapes={"x": ("n", 2)})(lambda x: pnp.pad(x, ((3, 5), (1, 2)), mode=mode))
    for n in (1, 2, 4, 9):
        x = np.arange(2 * n, dtype=np.float32).reshape(n, 2)
        np.testing.assert_array_equal(np.asarray(f(x)), np.pad(x, ((3, 5), (1, 2)), mode=mode), err_msg=str(n))
    assert f.stats["traces"] == 1


def test_pad_mode_errors():
    with pytest.raises(pj.TraceError, match="minimum of 1"):
        pj.prepare(vars={"n": (0, 9)}, shapes={"x": ("n",)})(lambda x: pnp.pad(x, 2, mode="edge"))(np.ones(3))
    with pytest.raises(pj.TraceError, match="empty axis"):
        pj.prepare(lambda x: pnp.pad(x, 2, mode="wrap"))(np.ones(0))
    with pytest.raises(pj.TraceError, match="not supported"):
        pj.prepare(lambda x: pnp.pad(x, 2, mode="median"))(np.ones(3))


def test_outer(device, rng):
    a, b = rng.standard_normal((2, 3)).astype(np.float32), np.arange(4, dtype=np.int64)
    got = np.asarray(pj.prepare(lambda x, y: pnp.outer(x, y), device=device)(a, b))
    want = np.outer(a, b)
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-6)
