"""Programs on symbolic shapes whose shape arithmetic must simplify to be accepted (compared with NumPy)."""
import numpy as np

import prepjit as pj
import prepjit.numpy as pnp


def _check(f, make, ref, sizes):
    rng = np.random.default_rng(0)
    for n in sizes:
        args = make(n, rng)
        np.testing.assert_allclose(np.asarray(f(*args)), ref(*args), rtol=1e-5, atol=1e-5, err_msg=f"n={n}")


def test_neighbour_difference(device):
    """x[1:] - x[:-1]: lengths min(L, L - 1 + 1) - 1 and L - 1 agree (L >= 0)."""
    f = pj.prepare(lambda x: x[1:] - x[:-1], vars={"L": (0, 64)}, shapes={"x": ("L",)}, device=device)
    _check(f, lambda n, rng: [rng.standard_normal(n).astype(np.float32)], lambda x: x[1:] - x[:-1], [0, 1, 2, 9])


def test_reshape_with_inferred_dim_over_a_symbolic_batch(device):
    f = pj.prepare(lambda x: x.reshape(x.shape[0], 3, -1).sum(-1), vars={"b": (1, 8)}, shapes={"x": ("b", 3, 4, 5)},
                   device=device)
    _check(f, lambda n, rng: [rng.standard_normal((n, 3, 4, 5)).astype(np.float32)],
           lambda x: x.reshape(x.shape[0], 3, -1).sum(-1), [1, 2, 8])


def test_symbolic_quotient_of_equal_products(device):
    """(2n) // (2n) is 1 while tracing, so it can scale a value."""
    f = pj.prepare(lambda x: x * ((2 * x.shape[0]) // (2 * x.shape[0])) + (x.shape[0] * 6) // (x.shape[0] * 3),
                   vars={"n": (1, 16)}, shapes={"x": ("n",)}, device=device)
    _check(f, lambda n, rng: [rng.standard_normal(n).astype(np.float32)], lambda x: x + 2, [1, 5])


def test_reversed_slice_from_a_symbolic_start(device):
    f = pj.prepare(lambda x: x[x.shape[0] - 1::-1] + x, vars={"n": (1, 64)}, shapes={"x": ("n",)}, device=device)
    _check(f, lambda n, rng: [rng.standard_normal(n).astype(np.float32)], lambda x: x[::-1] + x, [1, 2, 7])


def test_concatenate_then_reshape_by_the_doubled_length(device):
    f = pj.prepare(lambda x: pnp.concatenate([x, x]).reshape(2 * x.shape[0], -1) * 2, vars={"n": (1, 32)},
                   shapes={"x": ("n", 4)}, device=device)
    _check(f, lambda n, rng: [rng.standard_normal((n, 4)).astype(np.float32)],
           lambda x: np.concatenate([x, x]) * 2, [1, 3])


def test_reshape_by_a_symbolic_sum(device):
    """(b, n + 1) -> (-1, n + 1): the inferred dim is the exact quotient b of b*n + b by n + 1."""
    def f(y):
        x = pnp.concatenate([y, y[:, :1]], axis=1)
        return x.reshape(-1, x.shape[1]) * 2
    f = pj.prepare(f, vars={"b": (1, 4), "n": (1, 6)}, shapes={"y": ("b", "n")}, device=device)
    _check(f, lambda k, rng: [rng.standard_normal((k, k + 1)).astype(np.float32)],
           lambda y: np.concatenate([y, y[:, :1]], axis=1) * 2, [1, 3])
