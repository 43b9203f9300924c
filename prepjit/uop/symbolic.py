"""Simplification of integer (index) expressions: constant folding, polynomial normal form, div/mod folding.

Index expressions are kept as sums of monomials with integer coefficients, so that what
static shapes produce folds to plain affine forms: `(x//c)*c + x%c -> x`,
`(a*c + r)//c -> a` when `0 <= r < c`, and likewise for symbolic divisors.
"""
from __future__ import annotations

import functools
import operator

from .dtypes import dtypes
from .ops import Ops
from .rewrite import PatternMatcher, UPat, graph_rewrite
from .uop import UOp

Poly = dict  # {monomial (sorted tuple of factor UOps): int coefficient}; () is the constant term

_FOLD = {Ops.ADD: operator.add, Ops.SUB: operator.sub, Ops.MUL: operator.mul, Ops.MAX: max, Ops.MIN: min,
         Ops.CMPLT: operator.lt, Ops.CMPEQ: operator.eq, Ops.CMPNE: operator.ne,
         Ops.AND: operator.and_, Ops.OR: operator.or_, Ops.XOR: operator.xor}


def _sortkey(u: UOp) -> str:
    return u.render()


def poly(u: UOp) -> Poly:
    """The polynomial normal form of an integer expression."""
    if u.op is Ops.CONST:
        return {(): u.arg} if u.arg else {}
    if u.op in (Ops.ADD, Ops.SUB):
        a, b = poly(u.src[0]), poly(u.src[1])
        sign = 1 if u.op is Ops.ADD else -1
        out = dict(a)
        for m, c in b.items():
            out[m] = out.get(m, 0) + sign * c
        return {m: c for m, c in out.items() if c}
    if u.op is Ops.MUL:
        a, b = poly(u.src[0]), poly(u.src[1])
        out: Poly = {}
        for ma, ca in a.items():
            for mb, cb in b.items():
                m = tuple(sorted(ma + mb, key=_sortkey))
                out[m] = out.get(m, 0) + ca * cb
        return {m: c for m, c in out.items() if c}
    return {(u,): 1}


def from_poly(p: Poly, dtype=dtypes.index) -> UOp:
    out = None
    for m in sorted((m for m in p if m), key=lambda m: [_sortkey(f) for f in m]):
        term = functools.reduce(lambda a, b: UOp(Ops.MUL, dtype, (a, b)), m)
        if p[m] != 1:
            term = UOp(Ops.MUL, dtype, (term, UOp.const(p[m], dtype)))
        out = term if out is None else UOp(Ops.ADD, dtype, (out, term))
    c = p.get((), 0)
    if out is None:
        return UOp.const(c, dtype)
    return out if c == 0 else UOp(Ops.ADD, dtype, (out, UOp.const(c, dtype)))


def upper_bound(u: UOp) -> UOp:
    """An expression >= u: each loop range with a positive coefficient replaced by its end - 1."""
    p = poly(u)
    subs = {}
    for m, c in p.items():
        for f in m:
            if f.op is Ops.RANGE:
                subs[f] = f.src[0] - 1 if c > 0 else UOp.const(0)
    return simplify(u.substitute(subs)) if subs else u


def provably_lt(a: UOp, b: UOp) -> bool:
    """True when a < b for every value of the vars and ranges."""
    if (b - a).vmin > 0:
        return True
    return (b - upper_bound(a)).vmin > 0


def _canonical(x: UOp):
    if not x.dtype.is_int:
        return None
    return from_poly(poly(x), x.dtype)


def _merge_divmod(x: UOp):
    """(e//d)*d + e%d -> e, for constant or symbolic d, inside a sum."""
    p = poly(x)
    changed = False
    for m in list(p):
        if len(m) != 1 or m[0].op is not Ops.MOD or m not in p:
            continue
        mod = m[0]
        e, d = mod.src
        div = UOp(Ops.IDIV, x.dtype, (e, d))
        k = p[m]
        dp = poly(UOp(Ops.MUL, x.dtype, (div, d)))
        if all(p.get(dm, 0) == k * dc for dm, dc in dp.items()):
            for dm, dc in dp.items():
                p[dm] -= k * dc
            del p[m]
            for em, ec in poly(e).items():
                p[em] = p.get(em, 0) + k * ec
            p = {mm: c for mm, c in p.items() if c}
            changed = True
    return from_poly(p, x.dtype) if changed else None


def _split_by_divisor(p: Poly, d: UOp):
    """Split a polynomial into (quotient, remainder) with p = d*quotient + remainder, term by term."""
    q: Poly = {}
    r: Poly = {}
    for m, c in p.items():
        if d.op is Ops.CONST:
            qc, rc = divmod(c, d.arg)
            if qc:
                q[m] = qc
            if rc:
                r[m] = rc
        elif d in m:
            rest = list(m)
            rest.remove(d)
            q[tuple(rest)] = q.get(tuple(rest), 0) + c
        else:
            r[m] = c
    return q, r


def _fold_idiv(x: UOp, d: UOp):
    if d.vmin <= 0 or not x.dtype.is_int:
        return None
    if d.op is Ops.CONST and d.arg == 1:
        return x
    if x.op is Ops.IDIV and d.op is Ops.CONST and x.src[1].op is Ops.CONST and x.src[1].arg > 0:
        return x.src[0] // (x.src[1].arg * d.arg)
    q, r = _split_by_divisor(poly(x), d)
    rem = from_poly(r, x.dtype)
    if rem.vmin >= 0 and provably_lt(rem, d):
        return from_poly(q, x.dtype)
    if d.op is Ops.CONST and rem.vmin // d.arg == rem.vmax // d.arg:
        return from_poly(q, x.dtype) + rem.vmin // d.arg
    if q:
        return from_poly(q, x.dtype) + UOp(Ops.IDIV, x.dtype, (rem, d))
    return None


def _fold_mod(x: UOp, d: UOp):
    if d.vmin <= 0 or not x.dtype.is_int:
        return None
    if d.op is Ops.CONST and d.arg == 1:
        return UOp.const(0, x.dtype)
    q, r = _split_by_divisor(poly(x), d)
    rem = from_poly(r, x.dtype)
    if rem.vmin >= 0 and provably_lt(rem, d):
        return rem
    if d.op is Ops.CONST and rem.vmin // d.arg == rem.vmax // d.arg:
        return rem - (rem.vmin // d.arg) * d.arg
    if q:
        return UOp(Ops.MOD, x.dtype, (rem, d))
    return None


def _fold_const(x: UOp):
    if not all(s.op is Ops.CONST for s in x.src) or x.dtype.is_float or x.op not in _FOLD:
        return None
    return UOp.const(_FOLD[x.op](*(s.arg for s in x.src)), x.dtype)


def _fold_by_bounds(x: UOp):
    """Integer/bool nodes whose bounds pin one value become constants."""
    if x.op is Ops.CONST or x.dtype.is_float or x.op in (Ops.DEFINE_VAR, Ops.RANGE, Ops.LOAD, Ops.REDUCE,
                                                          Ops.DEFINE_GLOBAL, Ops.INPUT):
        return None
    lo, hi = x.bounds
    return UOp.const(lo, x.dtype) if lo == hi else None


def _fold_lt(a: UOp, b: UOp):
    if not (a.dtype.is_int and b.dtype.is_int):
        return None
    if provably_lt(a, b):
        return UOp.const(True, dtypes.bool)
    if provably_lt(b, a + 1):
        return UOp.const(False, dtypes.bool)
    return None


_INT = tuple(d for d in dtypes.all if d.is_int)

symbolic_rules = PatternMatcher([
    (UPat((Ops.ADD, Ops.SUB, Ops.MUL), name="x"), lambda x: _fold_const(x) or _canonical(x)),
    (UPat(Ops.ADD, name="x"), _merge_divmod),
    (UPat(Ops.IDIV, src=(UPat.var("x"), UPat.var("d"))), _fold_idiv),
    (UPat(Ops.MOD, src=(UPat.var("x"), UPat.var("d"))), _fold_mod),
    (UPat(Ops.CMPLT, src=(UPat.var("a"), UPat.var("b"))), _fold_lt),
    (UPat((Ops.CMPEQ, Ops.CMPNE, Ops.MAX, Ops.MIN, Ops.AND, Ops.OR, Ops.XOR, Ops.CMPLT), name="x"),
     lambda x: _fold_const(x) or _fold_by_bounds(x)),
    (UPat(Ops.MAX, src=(UPat.var("a"), UPat.var("b"))),
     lambda a, b: a if a.dtype.is_int and a.vmin >= b.vmax else (b if a.dtype.is_int and b.vmin >= a.vmax else None)),
    (UPat(Ops.MIN, src=(UPat.var("a"), UPat.var("b"))),
     lambda a, b: a if a.dtype.is_int and a.vmax <= b.vmin else (b if a.dtype.is_int and b.vmax <= a.vmin else None)),
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


def simplify(u: UOp) -> UOp:
    return graph_rewrite(u, symbolic_rules)
