"""NumPy's `initial=` and `where=` of sum / prod / max / min (and amax / amin and the array methods) and `where=` of
mean / var / std / all / any against NumPy: an empty axis reduces to `initial`, a non-empty one is combined with it;
`where=False` elements are left out."""
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from tests.helpers import assert_matches

f32 = np.float32
X = np.arange(6, dtype=f32).reshape(2, 3) - 2
EMPTY = np.zeros((0, 2), f32)
MASK = np.array([[True, False, True], [False, False, True]])

CASES = [  # (call as fn(numpy-like module, x), x)
    (lambda m, x: m.max(x, axis=0, initial=-5.0), EMPTY),
    (lambda m, x: m.min(x, axis=0, initial=-5.0), EMPTY),
    (lambda m, x: m.amax(x, axis=1, initial=1.5), X),
    (lambda m, x: m.amin(x, axis=1, initial=1.5, keepdims=True), X),
    (lambda m, x: x.max(initial=10), X),
    (lambda m, x: x.min(axis=0, initial=-1, where=np.array([True, False, True])), X),
    (lambda m, x: m.sum(x, axis=0, initial=3), EMPTY),
    (lambda m, x: m.sum(x, initial=3, where=MASK), X),
    (lambda m, x: x.sum(axis=1, where=MASK), X),
    (lambda m, x: m.prod(x, axis=1, initial=2), X),
    (lambda m, x: x.prod(axis=0, initial=2, where=np.array([False, True])), EMPTY),
    (lambda m, x: m.max(x, initial=2.5), np.array([1, 2])),        # cast to the array's dtype, as NumPy does
    (lambda m, x: m.sum(x, initial=1000), np.array([1, 2], np.int8)),  # sums int8 in int64
    (lambda m, x: m.max(x, initial=0), np.array([1.0, np.nan])),    # NaN propagates
    (lambda m, x: m.max(x, initial=0.0, where=np.array([True, False])), np.array([1.0, np.nan])),
    (lambda m, x: m.max(x, initial=True), np.array([True, False])),
    (lambda m, x: m.min(x, initial=False), np.array([True, True])),
    (lambda m, x: m.sum(x, initial=True), np.array([True])),
    (lambda m, x: m.sum(x, axis=1, initial=3, keepdims=True), np.zeros((2, 0))),
    (lambda m, x: m.max(x, initial=np.array(7.0)), np.array([1.0, 2.0])),
    (lambda m, x: m.max(x, where=False, initial=0), np.array([1.0, 2.0])),
    (lambda m, x: m.max(x, initial=0.5), np.float32(3)),
    (lambda m, x: np.max(x, axis=0, initial=-5.0), EMPTY),  # NumPy's function calls the traced array's method
    (lambda m, x: np.sum(x, axis=0, initial=4.0, where=np.array([False, True])), EMPTY + 1),
    (lambda m, x: m.mean(x, axis=1, where=MASK), X),
    (lambda m, x: m.mean(x, where=np.array([True, False, True])), X),  # the mask broadcasts along the rows
    (lambda m, x: x.mean(axis=0, keepdims=True, where=MASK), np.arange(6).reshape(2, 3)),  # ints: float64
    (lambda m, x: np.mean(x, axis=0, where=MASK), X),
    (lambda m, x: m.all(x, axis=1, where=MASK), X > -1),
    (lambda m, x: m.any(x, axis=0, where=MASK), X > 1),
    (lambda m, x: x.all(where=np.array([False, True, True])), X),      # numbers: nonzero is True
    (lambda m, x: np.any(x, axis=1, keepdims=True, where=MASK), X == 0),
    (lambda m, x: m.var(x, axis=1, where=MASK), X),
    (lambda m, x: m.var(x, where=np.array([True, False, True]), ddof=1), X),
    (lambda m, x: x.std(axis=0, keepdims=True, where=MASK), np.arange(6).reshape(2, 3)),  # ints: float64
    (lambda m, x: np.std(x, axis=1, where=MASK, ddof=1), X),      # a row of one: ddof leaves no divisor (inf)
    (lambda m, x: m.var(x, axis=0, where=MASK), X.astype(np.float16)),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_matches_numpy(case):
    fn, x = CASES[case]
    assert_matches(pj.prepare(lambda x: fn(pnp, x))(x), fn(np, x))


@pytest.mark.parametrize("fn, x, error", [
    (lambda m, x: m.max(x, where=MASK), X, ValueError),               # max has no identity: where= needs initial=
    (lambda m, x: m.sum(x, where=np.array([1, 0, 1])), X, TypeError),  # an int mask: NumPy's 'safe' cast refuses it
    (lambda m, x: m.max(x, initial=np.array([1, 2])), X, ValueError),
    (lambda m, x: m.max(x, initial=1000), np.array([1, 2], np.int8), OverflowError),
    (lambda m, x: m.max(x, initial=-1), np.array([1, 2], np.uint8), OverflowError),
    (lambda m, x: m.max(x, axis=0), EMPTY, ValueError),
    (lambda m, x: m.mean(x, where=np.array([1, 0, 1])), X, TypeError),
    (lambda m, x: m.var(x, where=np.array([1, 0, 1])), X, TypeError),
    (lambda m, x: m.all(x, where=np.array([1, 0, 1])), X, TypeError),
])
def test_errors_match_numpy(fn, x, error):
    with pytest.raises(error):
        fn(np, x)
    with pytest.raises(error):
        pj.prepare(lambda x: fn(pnp, x))(x)


def test_symbolic_axis_that_may_be_empty(device):
    """With initial= an empty symbolic axis is no error: no emptiness constraint is recorded."""
    f = pj.prepare(lambda x: (pnp.max(x, axis=0, initial=-5.0), pnp.min(x, axis=0, initial=5.0, where=x > 0)),
                   vars={"n": (0, 8)}, shapes={"x": ("n", 2)}, device=device)
    for n in (0, 1, 3):
        x = np.arange(2 * n, dtype=f32).reshape(n, 2) - 2
        got = f(x)
        assert_matches(got[0], np.max(x, axis=0, initial=-5.0))
        assert_matches(got[1], np.min(x, axis=0, initial=5.0, where=x > 0))
    assert f.plan(np.zeros((0, 2), f32)).constraints == ()
    with pytest.raises(ValueError, match="no identity"):
        pj.prepare(lambda x: pnp.max(x, axis=0), vars={"n": (0, 8)}, shapes={"x": ("n", 2)})(np.zeros((0, 2), f32))


def test_gradient_with_initial():
    g = pj.grad(lambda x: pnp.max(x, initial=2.0) + pnp.sum(x, initial=1.0, where=x > 0))
    assert_matches(g(np.array([1.0, 3.0, -1.0], f32)), np.array([1.0, 2.0, 0.0], f32))
