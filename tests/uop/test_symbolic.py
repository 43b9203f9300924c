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


def test_a_min_times_itself_is_no_nonnegative_factor():
    """poly_min splits a term c * f * min(x, y) into its cases only where the term's other factors are >= 0: in
    min(b, a) * min(b, a) the second min is such a factor (a may be negative), not the one split (hypothesis found
    a * b - min(b, a)^2 bounded below by 0 and max(a * b, min(b, a)^2) simplified to a * b, at a = -6, b = 0)."""
    square = B.smin(A) * B.smin(A)
    env = {"a": -6, "b": 0, "c": 1, "r0": 0, "r1": 0}
    assert (A * B - square).vmin <= _eval(A * B - square, env) == -36
    assert _eval((A * B).smax(square), env) == 36


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


# ---- symbolic shapes that real programs produce ----

L = var("L", 0, 64)


def test_min_max_fold_by_the_difference_of_their_operands():
    assert (L - 1).smin(L) is L - 1          # x[1:] - x[:-1]: the two lengths agree
    assert (L + 2).smax(L) is L + 2
    assert L.smin(L) is L
    assert (n - 1).smin(n - 1).smax(-1) + 1 is n  # x[n-1::-1]: the clamped start of a reversed slice
    assert L - UOp.const(1).smin(L) is (L - 1).smax(0)  # x[1:] of length L: sums move into a min/max that cancels
    assert (L - 1).smax(0).smin(L) is (L - 1).smax(0)    # x[:-1]: each case of the max is <= L
    assert (x + 10).smax(n) is x + 10 and (x + 5).smax(n).op is Ops.MAX


def test_a_constant_stays_out_of_a_min_max():
    """k + 64 * min(max(v, 0), 63) (a layer's offset into a stacked buffer plus a gathered id clamped into its dim)
    keeps its form whatever k: constants merging is not a cancellation that moves the sum into the min."""
    clamped = var("v", -5, 100).smax(0).smin(63)
    for k in (1, 4096):
        assert (clamped * 64 + k).op is Ops.ADD and clamped * 64 + k - k is clamped * 64
    assert L - UOp.const(1).smin(L) is (L - 1).smax(0)  # a term that cancels still moves the sum in


def test_division_by_a_symbolic_monomial():
    assert (n * 2) // (n * 2) is UOp.const(1)
    assert (n * 2) % (n * 2) is UOp.const(0)
    b = var("b", 1, 8)
    assert (b * 60) // (b * 3) is UOp.const(20)       # x.reshape(b, 3, -1) of (b, 3, 4, 5)
    assert (n * 8) // (n * 2) is UOp.const(4)         # concatenate([x, x]).reshape(2 * n, -1) of (n, 4)
    assert (n * b * 6 + b) // b is n * 6 + 1
    assert (n * 4 + 3) // (n * 4) is UOp.const(1) and (n * 4 + 3) % (n * 4) is UOp.const(3)  # 3 < 4n as n >= 1


def test_exact_division_by_a_sum():
    b = var("b", 1, 8)
    assert (b * n + b) // (n + 1) is b               # reshape(-1, n + 1) of (b, n + 1)
    assert (b * n + b) % (n + 1) is UOp.const(0)
    assert (b * n + b + 1) // (n + 1) is not b


def test_gcd_and_nested_mod():
    b = var("b", 0, 7)
    assert (b * 2) // 4 is b // 2
    assert (b * 6 + 2) % 4 is ((b * 3 + 1) % 2) * 2
    assert (x % 12) % 4 is x % 4
    assert (x % n) % n is x % n
    assert (x * 4 - 1) // 4 is x - 1  # floor of a negative remainder
    assert (x * 4 - 1) % 4 is UOp.const(3)


def test_comparisons_fold_by_the_difference():
    assert (L - 1 < L).arg is True
    assert (L < L).arg is False
    assert (L + 1).eq(L + 1).arg is True
    assert (L + 1).ne(L).arg is True
    assert (L * 2).eq(L).op is Ops.CMPEQ  # equal at L = 0 only


def test_provably_lt_is_sound_for_ranges_times_signed_vars():
    """r * s < s * 3 + 1 fails at s = -1, r = 0; a range's end may only replace it where its term's sign is known."""
    s, r = var("s", -5, 5), rng(4)
    assert not provably_lt(r * s, s * 3 + 1)
    assert provably_lt(r * var("t", 0, 5), var("t", 0, 5) * 3 + 1)


def test_simplify_is_memoised_per_node():
    from prepjit.uop import symbolic
    calls = []
    rewrite = symbolic.symbolic_rules.rewrite

    def counting(u):
        calls.append(u)
        return rewrite(u)
    symbolic.symbolic_rules.rewrite = counting
    try:
        w = var("memo_w", 0, 100)
        total = UOp.const(0)
        for i in range(300):  # each + rewrites a bounded number of nodes, not the whole sum again
            total = total + w * (i % 7) + i
        assert len(calls) < 40 * 300
        before = len(calls)
        assert simplify(total) is total and simplify(UOp(Ops.ADD, dtypes.index, (total, UOp.const(0)))) is total
        assert len(calls) - before <= 2
    finally:
        symbolic.symbolic_rules.rewrite = rewrite


def test_a_dropped_expression_built_again_is_not_rewritten_again():
    """A slice's clamped bound built for each of a model's layers and dropped after it: simplify keeps the last
    expressions it rewrote alive (their memos with them), so building it again finds the same node, simplified."""
    from prepjit.uop import symbolic
    calls = []
    rewrite = symbolic.symbolic_rules.rewrite

    def counting(u):
        calls.append(None)  # (not the node: that would keep it alive)
        return rewrite(u)
    symbolic.symbolic_rules.rewrite = counting
    try:
        pos = var("kept_pos", 0, 1023)
        bounds = []
        for _ in range(30):
            bounds.append(simplify((UOp.const(0) + pos + 1).smax(0).smin(1024)))  # (each layer drops its nodes)
            if len(bounds) == 1:
                first = len(calls)
        assert first > 0 and len(calls) == first and all(b is bounds[0] for b in bounds)
    finally:
        symbolic.symbolic_rules.rewrite = rewrite


def test_canonical_order_does_not_depend_on_creation_order():
    p, q = var("ord_p", 0, 9), var("ord_q", 0, 9)
    first = q * 3 + p
    assert p + q * 3 is first
    assert [f.arg[0] for f in first.variables()] == ["ord_p", "ord_q"]
    assert first.render() == "(ord_p+(ord_q*3))"


def test_canonical_forms_are_the_same_in_every_process():
    """Terms sort by structure, not by creation order or hashes: two processes that build an expression's vars
    and terms in different orders (set iteration follows the string hash seed) print the same forms."""
    import os
    import subprocess
    import sys
    code = """
from prepjit.uop import UOp
names = list({f"v{i}" for i in range(12)})
vs = {n: UOp.variable(n, 0, 9) for n in names}
e = UOp.const(0)
for n in names:
    e = e + vs[n] * (int(n[1:]) + 1) + vs[n] * vs["v3"] + vs[n] % 4
print(",".join(names))
print(e.render(), (e // 3).render(), (e % 5).render(), e.smin(vs["v1"] * 200).render())
"""
    outs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout.splitlines() for seed in ("1", "2")]
    assert outs[0][0] != outs[1][0]  # the creation orders differ
    assert outs[0][1] == outs[1][1]


def test_bounds_of_sums_see_through_ranges_and_shared_factors():
    """vmin/vmax of a sum come from its polynomial too, so the bounds proof of kernel indices gets them."""
    b, t = var("B", 1, 32), var("T", 1, 128)
    r = rng(t)
    assert (t - 1 - r).bounds == (0, 127)      # a reversed index: r <= T - 1
    assert (b * t - t).vmin == 0                # T * (B - 1)
    assert (b * t - 1 - (t - 1 - r)).vmin >= 0  # inside a (B, T) buffer
    assert (r * 4 + 3).vmax == 4 * 127 + 3 and (t * 4 - (r * 4 + 3)).vmin == 1


def test_provably_lt_knows_k_times_x_over_k_is_at_most_x():
    """32 * (T // 32) <= T: the upcast's last block ends inside T (it was unknown: T // 32 an opaque atom)."""
    t = UOp.variable("T", 1, 128)
    assert provably_lt((t // 32) * 32 - 1, t)
    assert provably_lt(t - 32, (t // 32) * 32)  # and T - 31 <= 32 * (T // 32)
    assert not provably_lt((t // 32) * 32, t)   # equal when 32 divides T
