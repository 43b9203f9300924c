"""Property tests of the simplifier: a simplified expression equals the original at sampled var values.

Random expression trees of + - * // % min max (and < ==) over constants and 2-3 vars whose bounds include
negative values, built raw and simplified, and built with the UOp operators (which simplify as they go);
every form is evaluated with Python's floor semantics (those of the kernels) at var values drawn inside the
bounds. The bounds (vmin/vmax) and the proofs (provably_lt) are checked against the same values.
"""
import operator

from hypothesis import given, settings, strategies as st

from prepjit.uop import Ops, UOp, dtypes, provably_lt, simplify

VARS = [UOp.variable("a", -7, 9), UOp.variable("b", 0, 12), UOp.variable("c", 1, 6)]
RANGE = UOp(Ops.RANGE, dtypes.index, (VARS[2] + 1,), (0, "loop"))  # r in [0, c]: its end is symbolic
LEAVES = VARS + [RANGE]
PY = {Ops.ADD: operator.add, Ops.SUB: operator.sub, Ops.MUL: operator.mul, Ops.IDIV: operator.floordiv,
      Ops.MOD: operator.mod, Ops.MAX: max, Ops.MIN: min, Ops.CMPLT: operator.lt, Ops.CMPEQ: operator.eq}
ARITH = [Ops.ADD, Ops.SUB, Ops.MUL, Ops.MAX, Ops.MIN]


def evaluate(u: UOp, env: dict):
    memo = {}
    for node in u.toposort():
        if node.op is Ops.CONST:
            memo[node] = node.arg
        elif node.op in (Ops.DEFINE_VAR, Ops.RANGE):
            memo[node] = env[node]
        elif node.op is Ops.CAST:
            memo[node] = int(memo[node.src[0]])
        else:
            memo[node] = PY[node.op](*(memo[s] for s in node.src))
    return memo[u]


def _divisors(sub):
    """Never zero: positive constants and vars, negative constants, and sub-expressions forced >= 1."""
    return st.one_of(st.integers(1, 12).map(UOp.const), st.integers(-6, -1).map(UOp.const),
                     st.just(VARS[2]), st.just(VARS[2] * 3), st.just(VARS[2] + VARS[1]),
                     sub.map(lambda e: UOp(Ops.MAX, dtypes.index, (e, UOp.const(1)))))


def _tree(depth):
    leaf = st.one_of(st.sampled_from(LEAVES), st.integers(-9, 9).map(UOp.const))
    if depth == 0:
        return leaf
    sub = _tree(depth - 1)
    arith = st.tuples(st.sampled_from(ARITH), sub, sub).map(lambda t: UOp(t[0], dtypes.index, (t[1], t[2])))
    divmod_ = st.tuples(st.sampled_from([Ops.IDIV, Ops.MOD]), sub, _divisors(sub)).map(
        lambda t: UOp(t[0], dtypes.index, (t[1], t[2])))
    return st.one_of(leaf, arith, divmod_)


def _with_operators(u: UOp) -> UOp:
    """The same expression built with the UOp operators (each simplifies its new node)."""
    memo = {}
    for node in u.toposort():
        if not node.src or node.op is Ops.RANGE:
            memo[node] = node
            continue
        a, b = (memo[s] for s in node.src)
        memo[node] = {Ops.ADD: a.__add__, Ops.SUB: a.__sub__, Ops.MUL: a.__mul__, Ops.IDIV: a.__floordiv__,
                      Ops.MOD: a.__mod__, Ops.MAX: a.smax, Ops.MIN: a.smin}[node.op](b)
    return memo[u]


envs = st.fixed_dictionaries({v: st.integers(v.arg[1], v.arg[2]) for v in VARS}).flatmap(
    lambda env: st.integers(0, env[VARS[2]]).map(lambda r: {**env, RANGE: r}))


@settings(max_examples=400, deadline=None)
@given(_tree(4), st.lists(envs, min_size=6, max_size=6))
def test_simplified_equals_original(raw, samples):
    simple, built = simplify(raw), _with_operators(raw)
    assert simplify(simple) is simple  # a fixed point
    for env in samples:
        want = evaluate(raw, env)
        assert evaluate(simple, env) == want, (raw.render(), simple.render(), env)
        assert evaluate(built, env) == want, (raw.render(), built.render(), env)
        assert simple.vmin <= want <= simple.vmax, (simple.render(), simple.bounds, env)
        assert raw.vmin <= want <= raw.vmax, (raw.render(), raw.bounds, env)


@settings(max_examples=300, deadline=None)
@given(_tree(3), _tree(3), st.lists(envs, min_size=8, max_size=8))
def test_proofs_and_comparisons_hold(a, b, samples):
    lt = provably_lt(a, b)
    folded = {op: simplify(UOp(op, dtypes.bool, (a, b))) for op in (Ops.CMPLT, Ops.CMPEQ)}
    folded.update({op: simplify(UOp(op, dtypes.index, (a, b))) for op in (Ops.MAX, Ops.MIN)})
    for env in samples:
        va, vb = evaluate(a, env), evaluate(b, env)
        assert not lt or va < vb, (a.render(), b.render(), env)
        for op, f in folded.items():
            assert evaluate(f, env) == PY[op](va, vb), (op, a.render(), b.render(), f.render(), env)


SMALL = [UOp.variable("sa", -3, 2), UOp.variable("sb", 0, 3), UOp.variable("sc", 1, 3)]
SMALL_RANGE = UOp(Ops.RANGE, dtypes.index, (SMALL[2] + 1,), (0, "loop"))  # in [0, sc]
monomials = st.lists(st.sampled_from(SMALL + [SMALL_RANGE]), max_size=3)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(-4, 4), monomials), min_size=1, max_size=5), st.integers(-6, 6))
def test_poly_min_is_a_lower_bound_everywhere(terms, const):
    """Checked at every point of small domains: range terms of either sign, products with signed vars."""
    import itertools
    e = UOp.const(const)
    for c, factors in terms:
        for f in factors:
            c = f * c
        e = e + c
    lhs = UOp.const(0)
    proven = provably_lt(lhs, e)  # 0 < e everywhere
    lowest = min(evaluate(e, {SMALL[0]: a, SMALL[1]: b, SMALL[2]: c, SMALL_RANGE: r})
                 for a, b, c in itertools.product(range(-3, 3), range(0, 4), range(1, 4)) for r in range(c + 1))
    assert not proven or lowest > 0, (e.render(), lowest)
    assert e.vmin <= lowest, (e.render(), e.bounds, lowest)


DIVS = [(SMALL[0] + SMALL[1]) // 2, SMALL[1] // 3, (SMALL_RANGE - SMALL[2]) // 2, (SMALL[0] * SMALL[2]) // 3]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(-3, 3), st.sampled_from(range(len(DIVS))), monomials), min_size=1, max_size=3),
       st.lists(st.tuples(st.integers(-4, 4), monomials), max_size=3), st.integers(-6, 6))
def test_poly_min_with_divisions_is_a_lower_bound_everywhere(divided, terms, const):
    """Terms c * k * f * (x // k) (relaxed by poly_min through k * (x // k) in [x - k + 1, x]) next to x's own
    terms, so that they can cancel: checked at every point of small domains."""
    import itertools
    e = UOp.const(const)
    for c, i, factors in divided:
        d = DIVS[i]
        term = d * (c * d.src[1].arg)
        for f in factors:
            term = term * f
        e = e + term + (-c) * d.src[0]  # x - k * (x // k) in [0, k - 1]
    for c, factors in terms:
        for f in factors:
            c = f * c
        e = e + c
    proven = provably_lt(UOp.const(0), e)
    lowest = min(evaluate(e, {SMALL[0]: a, SMALL[1]: b, SMALL[2]: c, SMALL_RANGE: r})
                 for a, b, c in itertools.product(range(-3, 3), range(0, 4), range(1, 4)) for r in range(c + 1))
    assert not proven or lowest > 0, (e.render(), lowest)
