"""Symbolic integer simplification: affine folding of index expressions, bounds, and soundness."""
import itertools

import pytest
from hypothesis import given, settings, strategies as st

from prepjit.uop import Ops, UOp, dtypes, eval_uop, provably_lt, simplify


def var(name, lo, hi):
    return UOp.variable(name, lo, hi)


def rng(end, axis=0, kind="loop"):
    return UOp(Ops.RANGE, dtypes.index, (UOp.const(end) if isinstance(end, int) else end,), (axis, kind))


x = var("x", 0, 100)
n = var("n", 1, 10)


@pytest.mark.parametrize("c", [2, 3, 4, 7, 64])
def test_div_mod_recombine_to_x(c):
    assert (x // c) * c + x % c is x


def test_div_mod_recombine_symbolic_divisor():
    assert (x // n) * n + x % n is x


def test_range_split_folds():
    r = rng(8)
    assert (r * 4 + 3) // 4 is r
    assert ((r * 4 + 3) % 4).arg == 3


def test_symbolic_divisor_with_inner_range():
    r = rng(n, axis=1)
    assert (x * n + r) // n is x
    assert (x * n + r) % n is r


def test_nested_div_merges():
    assert (x // 2) // 3 is x // 6


def test_mod_of_small_value_is_identity():
    r = rng(5)
    assert r % 5 is r
    assert r // 5 is UOp.const(0)


def test_linear_terms_cancel():
    assert ((x + 3) * 2 - 2 * x).arg == 6
    assert (x - x).arg == 0
    assert (x * 3) // 3 is x


def test_static_reshape_index_is_affine():
    """A (4, 6) -> (24,) -> (4, 6) round trip of indices folds back to the original ranges."""
    r0, r1 = rng(4, 0), rng(6, 1)
    flat = r0 * 6 + r1
    assert (flat // 6) % 4 is r0
    assert flat % 6 is r1


def test_vmin_vmax():
    assert (x * 2 - 5).bounds == (-5, 195)
    assert (x % 7).bounds == (0, 6)
    assert (x // 3).bounds == (0, 33)
    assert rng(8).bounds == (0, 7)
    assert (n * x).bounds == (0, 1000)
    assert x.smax(n).bounds == (1, 100)
    assert x.smin(n).bounds == (0, 10)


def test_comparisons_fold_by_bounds():
    assert (x < 101).arg is True
    assert (x > 100).arg is False
    assert (x >= 0).arg is True
    assert (x < 50).op is Ops.CMPLT


def test_provably_lt_uses_range_ends():
    r = rng(n)
    assert provably_lt(r, n)
    assert not provably_lt(n, r)
    assert provably_lt(r * 4 + 3, n * 4)


def test_max_min_fold_when_ordered():
    assert x.smax(0) is x
    assert x.smin(100) is x
    assert (n - 1).smax(0) is n - 1


def test_bool_of_symbolic_raises_trace_error():
    import prepjit as pj
    with pytest.raises(pj.TraceError, match="not known while tracing"):
        bool(x < 50)
    assert bool(UOp.const(3) < 5)


# ---- soundness: a simplified expression evaluates like the original, for every var and range value ----

A, B, C = var("a", -6, 9), var("b", 0, 7), var("c", 1, 5)
R_SYM, R_STATIC = rng(C, 0), rng(4, 1)  # a range with a symbolic end, and one with a static end
LEAVES = [A, B, C, R_SYM, R_STATIC]
OPS = {"+": Ops.ADD, "-": Ops.SUB, "*": Ops.MUL, "//": Ops.IDIV, "%": Ops.MOD, "max": Ops.MAX, "min": Ops.MIN,
       "<": Ops.CMPLT, "==": Ops.CMPEQ}


def _trees(depth):
    leaves = st.one_of(st.sampled_from(LEAVES), st.integers(-8, 8).map(UOp.const))
    if depth == 0:
        return leaves
    sub = _trees(depth - 1)
    divisor = st.one_of(st.integers(1, 9).map(UOp.const), st.just(C), st.just(C + 2))
    return st.one_of(leaves, st.tuples(st.sampled_from(["+", "-", "*", "max", "min", "<", "=="]), sub, sub),
                     st.tuples(st.sampled_from(["//", "%"]), sub, divisor))


def _build(tree, raw: bool):
    """The expression of a drawn tree: raw nodes (raw=True) or built with the UOp operators (which simplify)."""
    if isinstance(tree, UOp):
        return tree
    op, a, b = tree
    a, b = (x.cast(dtypes.index) for x in (_build(a, raw), _build(b, raw)))
    if raw:
        return UOp(OPS[op], dtypes.bool if op in ("<", "==") else dtypes.index, (a, b))
    return {"+": a.__add__, "-": a.__sub__, "*": a.__mul__, "//": a.__floordiv__, "%": a.__mod__, "max": a.smax,
            "min": a.smin, "<": a.__lt__, "==": a.eq}[op](b)


def _eval(u, env):
    ranges = {R_SYM: UOp.const(env["r0"]), R_STATIC: UOp.const(env["r1"])}
    return eval_uop(u.substitute(ranges), env)


@settings(max_examples=250, deadline=None)
@given(_trees(3))
def test_simplify_is_sound(tree):
    raw = _build(tree, raw=True)
    simple, built = simplify(raw), _build(tree, raw=False)
    for a, b, c in itertools.product(range(-6, 10, 5), range(0, 8, 3), (1, 2, 5)):
        for r0, r1 in ((0, 0), (c - 1, 3)):
            env = {"a": a, "b": b, "c": c, "r0": r0, "r1": r1}
            want = _eval(raw, env)
            assert _eval(simple, env) == want, (raw.render(), simple.render(), env)
            assert _eval(built, env) == want, (raw.render(), built.render(), env)
            assert simple.vmin <= want <= simple.vmax, (simple.render(), simple.bounds, env)


def test_simplify_reaches_fixed_point():
    e = simplify(UOp(Ops.ADD, dtypes.index, (UOp(Ops.MUL, dtypes.index, (x, UOp.const(2))), x)))
    assert simplify(e) is e
    assert e is x * 3
