"""Simplification of integer (index) expressions: constant folding, polynomial normal form, div/mod folding.

Index expressions are kept as sums of monomials with integer coefficients, so that what
static shapes produce folds to plain affine forms: `(x//c)*c + x%c -> x`,
`(a*c + r)//c -> a` when `0 <= r < c`, and likewise for symbolic divisors (`(2n)//(2n) -> 1`).

Cost stays proportional to what is new: every node caches its polynomial (`poly`) and its simplified
form, so simplifying `a + b` whose operands are simplified runs the rules at the new node only.
Proofs (`provably_lt` and the folds of //, %, min, max and comparisons) are interval bounds of a
polynomial difference in which loop ranges whose term has a known sign are replaced by their extreme
(0 or end - 1) so that symbolic terms cancel: they build no nodes and never recurse into simplify.
"""
from __future__ import annotations

import collections
import math
import operator

from .dtypes import dtypes
from .ops import Ops
from .rewrite import PatternMatcher, UPat
from .uop import UOp

Poly = dict  # {monomial: int coefficient}; a monomial is a tuple of factor UOps sorted by .key, () the constant
_FIXED = object()  # UOp._simple of a node that is its own simplified form (no self-reference, no cycle)

_FOLD = {Ops.ADD: operator.add, Ops.SUB: operator.sub, Ops.MUL: operator.mul, Ops.MAX: max, Ops.MIN: min,
         Ops.CMPLT: operator.lt, Ops.CMPEQ: operator.eq, Ops.CMPNE: operator.ne,
         Ops.AND: operator.and_, Ops.OR: operator.or_, Ops.XOR: operator.xor}
_factor_key = operator.attrgetter("key")


# ---------- polynomials ----------

def poly(u: UOp) -> Poly:
    """The polynomial normal form of an integer expression (cached on the node: do not mutate it)."""
    p = u._poly
    if p is None:
        p = u._poly = _make_poly(u)
    return p


def _make_poly(u: UOp) -> Poly:
    if u.dtype.is_int:
        if u.op is Ops.CONST:
            return {(): u.arg} if u.arg else {}
        if u.op is Ops.ADD:
            return _add(poly(u.src[0]), poly(u.src[1]))
        if u.op is Ops.SUB:
            return _add(poly(u.src[0]), poly(u.src[1]), -1)
        if u.op is Ops.MUL:
            return _mul(poly(u.src[0]), poly(u.src[1]))
    return {(u,): 1}


def _add(a: Poly, b: Poly, scale: int = 1) -> Poly:
    """a + scale * b."""
    out = dict(a)
    for m, c in b.items():
        v = out.get(m, 0) + scale * c
        if v:
            out[m] = v
        else:
            out.pop(m, None)
    return out


def _mul(a: Poly, b: Poly) -> Poly:
    out: Poly = {}
    for ma, ca in a.items():
        for mb, cb in b.items():
            m = mb if not ma else ma if not mb else tuple(sorted(ma + mb, key=_factor_key))
            out[m] = out.get(m, 0) + ca * cb
    return {m: c for m, c in out.items() if c}


def mono_div(m: tuple, d: tuple) -> tuple | None:
    """The monomial m / d, or None when d's factors are not all in m."""
    if not d:
        return m
    rest = list(m)
    for f in d:
        if f not in rest:
            return None
        rest.remove(f)
    return tuple(rest)


def _mono_key(m: tuple) -> list:
    return [f._key if f._key is not None else f.key for f in m]


def from_poly(p: Poly, dtype=dtypes.index) -> UOp:
    """The canonical expression of a polynomial: monomials in key order, coefficients last, the constant last."""
    return _build(p, dtype, False)


def _build(p: Poly, dtype, fixed: bool) -> UOp:
    """from_poly; with `fixed`, the sums and products it builds are marked as their own simplified form."""
    def node(op, src):
        u = UOp(op, dtype, src)
        if fixed and u._simple is None:
            u._simple = _FIXED
        return u
    out = None
    for m in sorted((m for m in p if m), key=_mono_key) if len(p) > 1 else (m for m in p if m):
        term = m[0]
        for f in m[1:]:
            term = node(Ops.MUL, (term, f))
        if p[m] != 1:
            term = node(Ops.MUL, (term, UOp.const(p[m], dtype)))
        out = term if out is None else node(Ops.ADD, (out, term))
    c = p.get((), 0)
    if out is None:
        return UOp.const(c, dtype)
    return out if c == 0 else node(Ops.ADD, (out, UOp.const(c, dtype)))


# ---------- bounds of polynomials ----------

def _mono_bounds(m: tuple) -> tuple:
    lo = hi = 1
    for f in m:
        a, b = f.bounds
        c = (lo * a, lo * b, hi * a, hi * b)
        lo, hi = min(c), max(c)
    return lo, hi


def _interval(p: Poly) -> tuple:
    lo = hi = 0
    for m, c in p.items():
        a, b = _mono_bounds(m)
        lo, hi = (lo + c * a, hi + c * b) if c > 0 else (lo + c * b, hi + c * a)
    return lo, hi


def _lower(p: Poly, depth: int = 2):
    """Interval lower bound of p, sharpened by factoring out the nonnegative factor most monomials share:
    p = f * inner + rest >= min(f) * min(inner) or max(f) * min(inner), + min(rest) (`B*T - T` is >= 0)."""
    lo = _interval(p)[0]
    if depth == 0 or len(p) - (() in p) < 2:
        return lo
    counts: dict = {}
    for m in p:
        for f in dict.fromkeys(m):
            counts[f] = counts.get(f, 0) + 1
    shared = [f for f, k in counts.items() if k >= 2 and f.vmin >= 0]
    signs = {c > 0 for m, c in p.items() if m}
    if not shared or len(signs) == 1 and all(f.vmin >= 0 for f in counts):  # one sign, factors >= 0: exact
        return lo
    best = max(shared, key=lambda f: (counts[f], f.key))
    inner: Poly = {}
    rest: Poly = {}
    for m, c in p.items():
        if best in m:
            i = m.index(best)
            inner[m[:i] + m[i + 1:]] = c
        else:
            rest[m] = c
    flo, fhi = best.bounds
    ilo = _lower(inner, depth - 1)
    return max(lo, _lower(rest, depth - 1) + min(flo * ilo, fhi * ilo))


def relax_divisions(p: Poly, upper: bool) -> Poly | None:
    """p with each term c * f * (x // k) (k a positive constant dividing c, f a product of factors >= 0)
    replaced by a bound on the `upper` or lower side: k * (x // k) lies in [x - k + 1, x] (floor division),
    so x's terms can cancel against the rest (`T - 32 * (T // 32) >= 0`). None when no term has one."""
    out: Poly = {}
    changed = False
    for m, c in p.items():
        div = next((f for f in m if f.op is Ops.IDIV and f.src[1].op is Ops.CONST and f.src[1].arg > 0
                    and c % f.src[1].arg == 0), None)
        if div is None or not all(f.vmin >= 0 for f in m if f is not div):
            out[m] = out.get(m, 0) + c
            continue
        k = div.src[1].arg
        rest = list(m)
        rest.remove(div)
        x = poly(div.src[0]) if upper == (c > 0) else _add(poly(div.src[0]), {(): k - 1}, -1)
        out = _add(out, _mul({tuple(rest): c // k}, x))
        changed = True
    return {m: c for m, c in out.items() if c} if changed else None


def _lower_relaxed(p: Poly):
    """_lower of p, or of p with its divisions relaxed (relax_divisions) when that is higher."""
    lo = _lower(p)
    if any(f.op is Ops.IDIV for m in p for f in m):
        relaxed = relax_divisions(p, False)
        if relaxed is not None:
            lo = max(lo, _lower(relaxed))
    return lo


def poly_min(p: Poly, splits: int = 2):
    """A lower bound of p over every var and range value.

    A term c * f * max(a, b) (or min; f a product of factors >= 0) is split into the cases a and b, `splits`
    deep: with c > 0 it is at least the smaller case, with c < 0 at least either (T * T - T * min(8r, T - 1)).
    A term c * rest * ranges whose c * rest is >= 0
    is smallest with its ranges at 0 (so >= 0: dropped); one whose c * rest is <= 0 is smallest with each
    range at its end - 1 (substituted, so that it can cancel against the other terms); the rest is bounded
    by intervals, each division by a constant also relaxed (relax_divisions) where that is tighter.
    """
    lo = _lower_relaxed(p)
    if splits:
        for m, c in p.items():
            f = next((f for f in m if f.op in (Ops.MAX, Ops.MIN) and f.dtype.is_int), None)
            if f is None:
                continue
            others = list(m)
            others.remove(f)   # (one occurrence: in min(a, b) * min(a, b) the other is a factor like any other)
            if not all(g.vmin >= 0 for g in others):
                continue
            rest = {k: v for k, v in p.items() if k != m}
            cases = [poly_min(_add(rest, _mul({tuple(others): 1}, poly(s)), c), splits - 1) for s in f.src]
            return max(lo, min(cases) if (f.op is Ops.MAX) == (c < 0) else max(cases))
    if not any(f.op is Ops.RANGE for m in p for f in m):
        return lo
    q: Poly = {}
    substituted = False
    for m, c in p.items():
        ranges = [f for f in m if f.op is Ops.RANGE]
        term = {m: c}
        if ranges:
            rest = tuple(f for f in m if f.op is not Ops.RANGE)
            a, b = _mono_bounds(rest)
            a, b = (c * a, c * b) if c > 0 else (c * b, c * a)
            if a >= 0:  # its interval is >= 0 as well: dropping it does not sharpen anything
                continue
            if b <= 0:
                substituted, term = True, {rest: c}
                for r in ranges:
                    term = _mul(term, _add(poly(r.src[0]), {(): 1}, -1))
        for tm, tc in term.items():
            q[tm] = q.get(tm, 0) + tc
    return max(lo, _lower_relaxed({m: c for m, c in q.items() if c})) if substituted else lo


def poly_max(p: Poly):
    """An upper bound of p over every var and range value."""
    return -poly_min({m: -c for m, c in p.items()})


def provably_lt(a: UOp, b: UOp) -> bool:
    """True when a < b for every value of the vars and ranges (a sound, bounded check: False may be unknown)."""
    return poly_min(_add(poly(b), poly(a), -1)) > 0


# ---------- rules ----------

def _canonical(x: UOp):
    if not x.dtype.is_int:
        return None
    p = _merge_divmod(poly(x))
    pushed = _push_into_minmax(p, x.dtype)
    if pushed is not None:
        return pushed
    # its sums and products are canonical and their factors simplified (the rewrite's sources are): fixed points
    return _build(p, x.dtype, True)


def _push_into_minmax(p: Poly, dtype) -> UOp | None:
    """rest + c * max(a, b) -> max(rest + c*a, rest + c*b) (min for c < 0; likewise min), when terms other than
    constants cancel: `L - min(1, L)` becomes `max(L - 1, 0)`, the form other expressions of the same length have.
    Constants merging do not count: `k + 64 * min(x, 63)` keeps its form whatever k (a layer's offset into a stacked
    buffer), so the layers' kernels differ only in their constant offsets (offsets.py)."""
    for m, c in p.items():
        if len(m) != 1 or m[0].op not in (Ops.MAX, Ops.MIN) or not m[0].dtype.is_int:
            continue
        rest = {k: v for k, v in p.items() if k != m}
        if not rest:
            continue
        cases = [_add(rest, poly(s), c) for s in m[0].src]
        if sum(map(_terms, cases)) < 2 * _terms(rest) + sum(_terms(poly(s)) for s in m[0].src):
            op = m[0].op if c > 0 else (Ops.MIN if m[0].op is Ops.MAX else Ops.MAX)
            return UOp(op, dtype, tuple(from_poly(q, dtype) for q in cases))
    return None


def _terms(p: Poly) -> int:
    """The number of p's terms other than its constant."""
    return len(p) - (() in p)


def _merge_divmod(p: Poly) -> Poly:
    """k*(e//d)*d + k*(e%d) -> k*e, for constant or symbolic d."""
    merged = True
    while merged:
        merged = False
        for m, k in p.items():
            if len(m) != 1 or m[0].op is not Ops.MOD:
                continue
            e, d = m[0].src
            div = UOp(Ops.IDIV, m[0].dtype, (e, d))
            dp = {tuple(sorted((div,) + dm, key=_factor_key)): k * dc for dm, dc in poly(d).items()}
            if all(p.get(dm) == dc for dm, dc in dp.items()):
                p = _add(_add(_add(p, dp, -1), {m: k}, -1), poly(e), k)
                merged = True
                break
    return p


def _monomial_divisor(d: UOp) -> tuple | None:
    """d as (positive coefficient, monomial), or None when d is a sum."""
    p = poly(d)
    if len(p) != 1:
        return None
    (m, c), = p.items()
    return (c, m) if c > 0 else None


def _split(p: Poly, c_d: int, m_d: tuple) -> tuple[Poly, Poly]:
    """(q, r) with p = (c_d * m_d) * q + r, term by term; coefficients split toward zero, so r's keep their sign."""
    q: Poly = {}
    r: Poly = {}
    for m, c in p.items():
        rest = mono_div(m, m_d)
        qc = 0 if rest is None else (abs(c) // c_d) * (1 if c > 0 else -1)
        if qc:
            q[rest] = qc
        if c - qc * c_d:
            r[m] = c - qc * c_d
    return q, r


def _exact_quotient(p: Poly, d: Poly) -> Poly | None:
    """p / d when the polynomial d divides p exactly (division by leading terms in graded order), else None."""
    def order(m):
        return (len(m), tuple(f.key for f in reversed(m)))
    lead = max(d, key=order)
    q: Poly = {}
    for _ in range(4 * len(p) + 4):
        if not p:
            return q
        m = max(p, key=order)
        mq = mono_div(m, lead)
        if mq is None or p[m] % d[lead]:
            return None
        step = {mq: p[m] // d[lead]}
        q, p = _add(q, step), _add(p, _mul(step, d), -1)
    return None


def _below(r: Poly, d: UOp) -> bool:
    """0 <= r < d."""
    return poly_min(r) >= 0 and poly_min(_add(poly(d), r, -1)) > 0


def _fold_idiv(x: UOp, d: UOp):
    if d.vmin <= 0 or not x.dtype.is_int:
        return None
    if d.op is Ops.CONST and d.arg == 1:
        return x
    if x.op is Ops.IDIV and x.src[1].vmin > 0:
        return UOp(Ops.IDIV, x.dtype, (x.src[0], x.src[1] * d))
    div = _monomial_divisor(d)
    if div is None:  # a sum: exact multiples and small values only
        if _below(poly(x), d):
            return UOp.const(0, x.dtype)
        q = _exact_quotient(poly(x), poly(d))
        return None if q is None else from_poly(q, x.dtype)
    q, r = _split(poly(x), *div)
    rlo, rhi = poly_min(r), poly_max(r)
    if rlo >= 0 and _below(r, d):
        return from_poly(q, x.dtype)
    if d.op is Ops.CONST and rlo // d.arg == rhi // d.arg:
        return from_poly(_add(q, {(): rlo // d.arg}), x.dtype)
    if rhi < 0 and poly_min(_add(r, poly(d))) >= 0:  # -d <= r < 0
        return from_poly(_add(q, {(): -1}), x.dtype)
    g = math.gcd(div[0], *r.values())
    if not q and g == 1:
        return None
    rest = UOp(Ops.IDIV, x.dtype, (from_poly({m: c // g for m, c in r.items()}, x.dtype),
                                   from_poly({div[1]: div[0] // g}, x.dtype)))
    return UOp(Ops.ADD, x.dtype, (from_poly(q, x.dtype), rest)) if q else rest


def _fold_mod(x: UOp, d: UOp):
    if d.vmin <= 0 or not x.dtype.is_int:
        return None
    if d.op is Ops.CONST and d.arg == 1:
        return UOp.const(0, x.dtype)
    div = _monomial_divisor(d)
    if div is None:
        if _below(poly(x), d):
            return x
        return None if _exact_quotient(poly(x), poly(d)) is None else UOp.const(0, x.dtype)
    q, r = _split(poly(x), *div)
    rlo, rhi = poly_min(r), poly_max(r)
    if rlo >= 0 and _below(r, d):
        return from_poly(r, x.dtype)
    if d.op is Ops.CONST and rlo // d.arg == rhi // d.arg:
        return from_poly(_add(r, {(): -(rlo // d.arg) * d.arg}), x.dtype)
    if rhi < 0 and poly_min(_add(r, poly(d))) >= 0:  # -d <= r < 0
        return from_poly(_add(r, poly(d)), x.dtype)
    if len(r) == 1 and next(iter(r.values())) == 1 and len(m := next(iter(r))) == 1 and m[0].op is Ops.MOD:
        inner = m[0].src[1]  # (y % e) % d -> y % d when d divides e
        if inner is d or inner.op is Ops.CONST and d.op is Ops.CONST and inner.arg % d.arg == 0:
            return UOp(Ops.MOD, x.dtype, (m[0].src[0], d))
    g = math.gcd(div[0], *r.values())
    if g > 1:  # (g*a) % (g*b) -> g * (a % b)
        inner = UOp(Ops.MOD, x.dtype, (from_poly({m: c // g for m, c in r.items()}, x.dtype),
                                       from_poly({div[1]: div[0] // g}, x.dtype)))
        return UOp(Ops.MUL, x.dtype, (inner, UOp.const(g, x.dtype)))
    return UOp(Ops.MOD, x.dtype, (from_poly(r, x.dtype), d)) if q else None


def _fold_const(x: UOp):
    if not all(s.op is Ops.CONST for s in x.src) or x.dtype.is_float or x.op not in _FOLD:
        return None
    return UOp.const(_FOLD[x.op](*(s.arg for s in x.src)), x.dtype)


def fold_index_consts(op: Ops, a: UOp, b: UOp) -> UOp | None:
    """`a op b` for two index constants and a sum, difference or product: the constant _fold_const makes of the
    node, without building the node and simplifying it (shape and stride arithmetic is mostly this)."""
    if a.op is Ops.CONST and b.op is Ops.CONST and a.dtype is dtypes.index and b.dtype is dtypes.index and \
            op in _INDEX_FOLD:
        return UOp.const(_FOLD[op](a.arg, b.arg))
    return None


_INDEX_FOLD = (Ops.ADD, Ops.SUB, Ops.MUL)


def _fold_by_bounds(x: UOp):
    """Integer/bool nodes whose bounds pin one value become constants."""
    if x.op is Ops.CONST or x.dtype.is_float or x.op in (Ops.DEFINE_VAR, Ops.RANGE, Ops.LOAD, Ops.REDUCE,
                                                          Ops.DEFINE_GLOBAL, Ops.INPUT):
        return None
    lo, hi = x.bounds
    return UOp.const(lo, x.dtype) if lo == hi else None


def _difference(a: UOp, b: UOp) -> tuple | None:
    """Bounds of a - b for integer a, b (None otherwise)."""
    if not (a.dtype.is_int and b.dtype.is_int):
        return None
    p = _add(poly(a), poly(b), -1)
    return poly_min(p), poly_max(p)


def _fold_lt(a: UOp, b: UOp):
    d = _difference(a, b)
    if d is None:
        return None
    return UOp.const(True, dtypes.bool) if d[1] < 0 else UOp.const(False, dtypes.bool) if d[0] >= 0 else None


def _fold_eq(x: UOp, a: UOp, b: UOp):
    d = _difference(a, b)
    if d is None or not (d[0] == d[1] == 0 or d[0] > 0 or d[1] < 0):
        return None
    return UOp.const((d[0] == 0) == (x.op is Ops.CMPEQ), dtypes.bool)


def _fold_minmax(x: UOp, a: UOp, b: UOp):
    if a is b:
        return a
    d = _difference(a, b)
    if d is None:
        return None
    if d[0] >= 0:  # a >= b
        return a if x.op is Ops.MAX else b
    if d[1] <= 0:
        return b if x.op is Ops.MAX else a
    return None


_INT = tuple(d for d in dtypes.all if d.is_int)

symbolic_rules = PatternMatcher([
    (UPat((Ops.ADD, Ops.SUB, Ops.MUL), name="x"), lambda x: _fold_const(x) or _canonical(x)),
    (UPat(Ops.IDIV, src=(UPat.var("x"), UPat.var("d"))), _fold_idiv),
    (UPat(Ops.MOD, src=(UPat.var("x"), UPat.var("d"))), _fold_mod),
    (UPat((Ops.CMPEQ, Ops.CMPNE, Ops.MAX, Ops.MIN, Ops.AND, Ops.OR, Ops.XOR, Ops.CMPLT), name="x"),
     lambda x: _fold_const(x) or _fold_by_bounds(x)),
    (UPat(Ops.CMPLT, src=(UPat.var("a"), UPat.var("b"))), _fold_lt),
    (UPat((Ops.CMPEQ, Ops.CMPNE), src=(UPat.var("a"), UPat.var("b")), name="x"), _fold_eq),
    (UPat((Ops.MAX, Ops.MIN), src=(UPat.var("a"), UPat.var("b")), name="x"), _fold_minmax),
    (UPat(Ops.AND, dtype=dtypes.bool, src=(UPat.var("x"), UPat.cvar("c")), commutative=True),
     lambda x, c: x if c.arg else c),
    (UPat(Ops.OR, dtype=dtypes.bool, src=(UPat.var("x"), UPat.cvar("c")), commutative=True),
     lambda x, c: c if c.arg else x),
    (UPat(Ops.NOT, src=(UPat.cvar("c", dtypes.bool),)), lambda c: UOp.const(not c.arg, dtypes.bool)),
    (UPat(Ops.WHERE, src=(UPat.cvar("c"), UPat.var("a"), UPat.var("b"))), lambda c, a, b: a if c.arg else b),
    (UPat(Ops.WHERE, src=(UPat.var("c"), UPat.var("a"), UPat.var("a"))), lambda c, a: a),
    (UPat(Ops.CAST, dtype=_INT, src=(UPat.cvar("c", _INT + (dtypes.bool,)),), name="x"),
     lambda x, c: UOp.const(c.arg, x.dtype) if x.dtype.min() <= int(c.arg) <= x.dtype.max() else None),
    (UPat(Ops.CAST, name="x"), lambda x: x.src[0] if x.src[0].dtype == x.dtype else None),
])


# ---------- the memoised rewrite ----------

KEPT_SIMPLIFIED = 1 << 12
_recent: collections.deque = collections.deque(maxlen=KEPT_SIMPLIFIED)  # (simplify: the last expressions it rewrote)


def _done(u: UOp) -> UOp:
    s = u._simple
    return u if s is _FIXED else s


def simplify(u: UOp) -> UOp:
    """The simplified form of u: the symbolic rules applied bottom-up to a fixed point.

    Memoised per node (UOp._simple), so a node is rewritten once for the life of the process and simplifying
    an expression built from simplified parts costs only its new nodes. The last KEPT_SIMPLIFIED expressions
    simplified are kept alive (`_recent`), and their memos with them: an expression built, simplified and
    dropped for each of a model's layers (a slice's clamped bounds `x[l, :, :pos + 1]`, a reshape's index) is
    the same node the next time, not a new one to rewrite again (SmolLM2's decode: ~0.3 ms a slice).
    """
    if u._simple is not None:
        return _done(u)
    _recent.append(u)
    for node in u.postorder(lambda n: n._simple is None):
        src = tuple(_done(s) for s in node.src)
        rebuilt = node if src == node.src else UOp(node.op, node.dtype, src, node.arg)
        if rebuilt._simple is None:
            nxt = symbolic_rules.rewrite(rebuilt)
            out = rebuilt if nxt is None else simplify(nxt)
            rebuilt._simple = _FIXED if out is rebuilt else out
            if out._simple is None:
                out._simple = _FIXED
        if node is not rebuilt:
            out = _done(rebuilt)
            node._simple = _FIXED if out is node else out
    return _done(u)
