"""The pattern rewriter: UPat matching, rule order, commutative patterns, graph_rewrite to a fixed point."""
from prepjit.uop import Ops, PatternMatcher, UOp, UPat, dtypes, graph_rewrite


def c(v):
    return UOp.const(v)


def add(a, b):
    return UOp(Ops.ADD, dtypes.index, (a, b))


def test_upat_binds_names_and_requires_same_node_for_repeated_name():
    pat = UPat(Ops.ADD, src=(UPat.var("a"), UPat.var("a")))
    n = UOp.variable("n", 0, 3)
    bound = {}
    assert pat.match(add(n, n), bound) and bound["a"] is n
    assert not pat.match(add(n, c(1)), {})


def test_commutative_pattern_tries_both_orders():
    pat = UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar("k")), commutative=True)
    n = UOp.variable("n", 0, 3)
    bound = {}
    assert pat.match(add(c(2), n), bound)
    assert bound["x"] is n and bound["k"].arg == 2
    assert not UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar("k"))).match(add(c(2), n), {})


def test_dtype_and_arg_filters():
    assert UPat(Ops.CONST, dtype=dtypes.int32).match(UOp.const(1, dtypes.int32), {})
    assert not UPat(Ops.CONST, dtype=dtypes.int32).match(UOp.const(1), {})
    assert UPat(Ops.CONST, arg=3).match(c(3), {})
    assert not UPat(Ops.CONST, arg=3).match(c(4), {})


def test_graph_rewrite_runs_to_fixed_point():
    """x + 0 -> x and const folding, applied again on the results until nothing changes."""
    pm = PatternMatcher([
        (UPat(Ops.ADD, src=(UPat.var("x"), UPat(Ops.CONST, arg=0))), lambda x: x),
        (UPat(Ops.ADD, src=(UPat.cvar("a"), UPat.cvar("b"))), lambda a, b: c(a.arg + b.arg)),
    ])
    n = UOp.variable("n", 0, 3)
    e = add(add(add(n, add(c(1), c(-1))), c(0)), add(c(2), c(-2)))
    assert graph_rewrite(e, pm) is n
    deep = c(0)
    for _ in range(3000):  # deep graphs must not hit the recursion limit
        deep = add(deep, c(1))
    assert graph_rewrite(deep, pm).arg == 3000


def test_first_matching_rule_wins_and_none_means_no_match():
    n = UOp.variable("n", 0, 3)
    pm = PatternMatcher([
        (UPat(Ops.DEFINE_VAR), lambda: None),
        (UPat(Ops.DEFINE_VAR, name="v"), lambda v: c(7)),
        (UPat(Ops.DEFINE_VAR, name="v"), lambda v: c(8)),
    ])
    assert graph_rewrite(n, pm).arg == 7


def test_rewrite_is_shared_for_shared_subgraphs():
    calls = []
    pm = PatternMatcher([(UPat(Ops.DEFINE_VAR, name="v"), lambda v: calls.append(v) or c(1))])
    n = UOp.variable("n", 0, 3)
    shared = add(n, n)
    out = graph_rewrite(add(shared, shared), pm)
    assert out is add(add(c(1), c(1)), add(c(1), c(1)))
    assert len(calls) == 1
