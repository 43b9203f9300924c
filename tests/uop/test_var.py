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
