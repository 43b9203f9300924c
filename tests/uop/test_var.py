"""Var and BoundVar: the public symbolic variables."""
import pytest

import prepjit as pj


def test_var_fields_and_uop():
    n = pj.Var("n", 1, 1024)
    assert (n.name, n.min, n.max) == ("n", 1, 1024)
    assert n.uop.vmin == 1 and n.uop.vmax == 1024
    assert n.uop is pj.Var("n", 1, 1024).uop


def test_min_greater_than_max_is_value_error():
    with pytest.raises(ValueError, match="min 5 > max 4"):
        pj.Var("n", 5, 4)
    assert pj.Var("n", 4, 4).min == 4


def test_bad_name_is_value_error():
    with pytest.raises(ValueError):
        pj.Var("not a name", 0, 1)


def test_bind_returns_bound_var():
    b = pj.Var("n", 1, 1024).bind(8)
    assert isinstance(b, pj.BoundVar)
    assert (b.name, b.value) == ("n", 8)


@pytest.mark.parametrize("value", [0, 1025, -3])
def test_bind_outside_bounds_raises(value):
    with pytest.raises(pj.VarBoundError) as info:
        pj.Var("n", 1, 1024).bind(value)
    assert isinstance(info.value, pj.VarError) and isinstance(info.value, ValueError)
    msg = str(info.value)
    assert "'n'" in msg and str(value) in msg and "[1, 1024]" in msg


def test_bind_endpoints_are_inclusive():
    n = pj.Var("n", 1, 1024)
    assert n.bind(1).value == 1 and n.bind(1024).value == 1024


def test_bind_rejects_non_ints():
    with pytest.raises(TypeError):
        pj.Var("n", 0, 9).bind(2.5)
    with pytest.raises(TypeError):
        pj.Var("n", 0, 9).bind(True)


@pytest.mark.parametrize("make", [lambda: pj.Var("n", 0, 2**63), lambda: pj.Var("n", -2**64, 0),
                                  lambda: pj.Var("n", 5, 4), lambda: pj.Var("not a name", 0, 1),
                                  lambda: pj.Var("n", 0, 10.5), lambda: pj.Var("n", "0", 9),
                                  lambda: pj.Var("n", False, 9)])
def test_spec_mistakes_are_var_errors(make):
    """Bounds beyond int64, min > max, a bad name, a bound that is not an int: pj.VarError (a ValueError)."""
    with pytest.raises(pj.VarError) as info:
        make()
    assert isinstance(info.value, ValueError) and isinstance(info.value, pj.PrepjitError)


def test_numpy_integer_bounds_become_ints():
    import numpy as np
    n = pj.Var("n", np.int32(1), np.int64(9))
    assert type(n.min) is int and type(n.max) is int and n == pj.Var("n", 1, 9)


@pytest.mark.parametrize("vars_", [{"n": (0, 2**64)}, {"n": (4, 1)}, {"n": (1,)}, {"n": pj.Var("m", 1, 2)}, "n",
                                   {"n": (1, 2.5)}])
def test_prepare_spec_mistakes_are_var_errors(vars_):
    with pytest.raises(pj.VarError):
        pj.prepare(lambda x: x, vars=vars_, shapes={"x": ("n",)})


def test_two_vars_of_one_name_in_shapes_are_a_var_error():
    with pytest.raises(pj.VarError, match="two different vars"):
        pj.prepare(lambda x, y: x + y, shapes={"x": (pj.Var("n", 1, 4),), "y": (pj.Var("n", 1, 8),)})
