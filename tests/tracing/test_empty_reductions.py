"""min/max/argmin/argmax over an axis that is a var keep NumPy's ValueError when a call makes it empty (a
per-call constraint, checked before anything runs), and the prepared function keeps working."""
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from tests.helpers import assert_matches


@pytest.mark.parametrize("name, message", [("max", "zero-size array to reduction operation maximum"),
                                           ("amin", "zero-size array to reduction operation minimum"),
                                           ("argmax", "attempt to get argmax of an empty sequence"),
                                           ("argmin", "attempt to get argmin of an empty sequence")])
def test_empty_symbolic_axis_raises_value_error(device, name, message):
    f = pj.prepare(lambda x: getattr(pnp, name)(x, axis=1), vars={"n": (0, 8)}, shapes={"x": (3, "n")},
                   device=device)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert_matches(f(x), getattr(np, name)(x, axis=1))
    with pytest.raises(ValueError, match=message) as info:
        f(np.zeros((3, 0), np.float32))
    assert not isinstance(info.value, pj.IndexBoundError)
    assert "n = 0 (from x.shape[1])" in str(info.value)
    with pytest.raises(ValueError, match=message):  # NumPy's own error for the same call
        getattr(np, name)(np.zeros((3, 0), np.float32), axis=1)
    assert_matches(f(x[:, :1]), getattr(np, name)(x[:, :1], axis=1))
    assert f.stats["traces"] == 1


def test_empty_other_axis_and_whole_array(device):
    """An empty axis that is not reduced is fine (NumPy returns an empty result); axis=None reduces all."""
    f = pj.prepare(lambda x: (x.max(axis=1), pnp.min(x)), vars={"r": (0, 4), "c": (1, 5)}, shapes={"x": ("r", "c")},
                   device=device)
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    out = f(x)
    assert_matches(out[0], x.max(axis=1))
    assert_matches(out[1], x.min())
    with pytest.raises(ValueError, match="minimum which has no identity"):
        f(np.zeros((0, 3), np.int32))


def test_static_empty_axis_and_proven_nonempty():
    with pytest.raises(ValueError, match="no identity"):
        pj.prepare(lambda x: x.max(axis=0))(np.zeros((0, 2), np.float32))
    f = pj.prepare(lambda x: x.max(), vars={"n": (1, 8)}, shapes={"x": ("n",)})
    assert_matches(f(np.ones(3, np.float32)), np.float32(1))
    assert not f.plan(np.ones(3, np.float32)).constraints  # n >= 1 proves it: no check per call
    with pytest.raises(ValueError, match="never holds"):
        pj.prepare(lambda x: x.max(), vars={"n": (0, 0)}, shapes={"x": ("n",)})(np.ones(0, np.float32))


def test_saved_plan_keeps_the_error_class(tmp_path):
    f = pj.prepare(lambda x: x.max(axis=0), vars={"n": (0, 8)}, shapes={"x": ("n",)})
    x = np.ones(3, np.float32)
    f.save(tmp_path / "max.pjplan", x)
    g = pj.load(tmp_path / "max.pjplan")
    assert_matches(g(x), x.max(axis=0))
    with pytest.raises(ValueError, match="no identity"):
        g(np.ones(0, np.float32))
