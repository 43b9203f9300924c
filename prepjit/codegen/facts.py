"""Facts for the bounds proof (bounds.py): expressions known to be >= 0 where an access runs (its gate, the
enclosing loops' ends, the plan's index constraints), and the bounds they give each atom."""
from __future__ import annotations

import functools

from ..uop import Ops, UOp, simplify
from ..uop.symbolic import from_poly, poly

MAX_ATOM_BOUNDS = 32  # distinct bounds kept per atom and side (the tests' facts have at most 11)


def is_int(u: UOp) -> bool:
    return u.dtype.is_int


def ge0_terms(cond: UOp, truth: bool) -> list[UOp]:
    """Integer expressions that are >= 0 whenever bool `cond` == truth (what can be read off it)."""
    if cond.op is Ops.AND and truth or cond.op is Ops.OR and not truth:
        return ge0_terms(cond.src[0], truth) + ge0_terms(cond.src[1], truth)
    if cond.op is Ops.NOT:
        return ge0_terms(cond.src[0], not truth)
    if cond.op is Ops.CMPLT and all(is_int(s) for s in cond.src):
        a, b = cond.src
        return [linear(b, a, -1)] if truth else [linear(a, b)]
    if cond.op is Ops.CMPEQ and truth and all(is_int(s) for s in cond.src):
        a, b = cond.src
        return [linear(a, b), linear(b, a)]
    return []


@functools.lru_cache(maxsize=1 << 14)
def linear(a: UOp, b: UOp | None = None, c: int = 0) -> UOp:
    """a - b + c as a sum of monomials, not simplified further: what facts are read from (simplify may fold
    a sum into a min or max, which no longer bounds its terms)."""
    p = dict(poly(a))
    for m, k in (poly(b).items() if b is not None else ()):
        p[m] = p.get(m, 0) - k
    out = {(): c}
    for m, k in p.items():  # each factor simplified on its own (matching the simplified index), then expanded
        term = UOp.const(k, a.dtype)
        for f in m:
            term = UOp(Ops.MUL, a.dtype, (term, simplify(f)))
        for tm, tk in poly(term).items():
            out[tm] = out.get(tm, 0) + tk
    return from_poly({m: k for m, k in out.items() if k}, a.dtype)


class Facts:
    """Bounds for atoms, read off expressions known to be >= 0: atom -> (lower bounds, upper bounds).

    `c * atom + rest >= 0` bounds the atom when `rest` is free of loops and data. The work is bounded: _add
    recurses two deep, the pairs of an atom's bounds are taken once, and each atom keeps MAX_ATOM_BOUNDS
    distinct bounds a side (a bound dropped proves less, never something false)."""

    def __init__(self, ge0: frozenset):
        self.ge0 = ge0
        self.atoms: dict[UOp, tuple[list, list]] = {}
        self.var_atoms: set[UOp] = set()  # vars with bounds from facts (expressions of them are not exact)
        self.contradictory = False  # an atom bounded below by a constant above its constant upper bound
        for e in ge0:
            self._add(e, 0)
        for e in ge0:  # c * v + rest >= 0 with loops or data in rest: bound them by their facts, then bound v
            relaxed = self._var_only_upper(e)
            if relaxed is not None:
                self._add(relaxed, 1)
        for atom, (lows, highs) in list(self.atoms.items()):  # an atom's lower bound is at most its upper one
            # one round, over the bounds as they stand: a pair's fact can bound the atom again (a lower bound
            # min(.., n - 1) of n gives n new ones), and pairing those too is a closure that need not end
            lows, highs = tuple(lows), tuple(highs)
            x, k = atom.src if atom.op is Ops.MOD else (None, None)
            if k is not None and k.op is Ops.CONST and k.arg > 0 and x.vmin >= 0:
                for lo in lows:  # x % k >= lo, and x >= x % k for x >= 0: x >= lo (r0 % 2 > 0 gives r0 >= 1)
                    self._add(linear(x, lo), 1)
            if atom.op is Ops.RANGE:
                lows, highs = lows + (UOp.const(0),), highs + (linear(atom.src[0], None, -1),)
            for lo in lows:
                for hi in highs:
                    if lo.op is hi.op is Ops.CONST:
                        self.contradictory |= lo.arg > hi.arg
                    elif not (has_loop_or_data(lo) or has_loop_or_data(hi)):
                        self._add(linear(hi, lo), 1)

    def _var_only_upper(self, e: UOp) -> UOp | None:
        """An expression >= e free of loops and data (each such atom replaced by a fact bound), or None."""
        p, out, changed = poly(e), {}, False
        for m, c in p.items():
            if not any(has_loop_or_data(f) for f in m):
                out[m] = out.get(m, 0) + c
                continue
            bounds = self.atoms.get(m[0], ([], []))[1 if c > 0 else 0] if len(m) == 1 else []
            bound = next((b for b in bounds if not has_loop_or_data(b)), None)
            if bound is None:
                return None
            for bm, bc in poly(bound).items():
                out[bm] = out.get(bm, 0) + bc * c
            changed = True
        return from_poly({m: c for m, c in out.items() if c}, e.dtype) if changed else None

    def with_terms(self, terms) -> "Facts":
        return facts_of(self.ge0 | frozenset(terms))

    def _bound(self, atom: UOp, value: UOp, is_lower: bool):
        bounds = self.atoms.setdefault(atom, ([], []))[0 if is_lower else 1]
        if value not in bounds and len(bounds) < MAX_ATOM_BOUNDS:  # dropping a fact proves less, never wrongly
            bounds.append(value)

    def _add(self, e: UOp, depth: int):
        p = poly(e)
        for m, c in p.items():
            if len(m) != 1 or m[0].op is Ops.CONST:
                continue
            rest = from_poly({k: v for k, v in p.items() if k != m}, e.dtype)
            atom = m[0]
            if atom.op is Ops.MIN and c > 0 and depth < 2:  # c * min(a, b) + rest >= 0: so are a's and b's
                for x in atom.src:
                    self._add(simplify(x * c + rest), depth + 1)
            if has_loop_or_data(rest):  # only bounds free of loops and data: they end the search
                continue
            # c * atom + rest >= 0:  atom >= ceil(-rest / c) (c > 0), atom <= floor(rest / -c) (c < 0)
            self._bound(atom, simplify((c - 1 - rest) // c) if c > 0 else simplify(rest // -c), c > 0)
            if atom.op is Ops.DEFINE_VAR:
                self.var_atoms.add(atom)
            if depth < 2 and c in (1, -1) and atom.op is Ops.IDIV and atom.src[1].op is Ops.CONST \
                    and atom.src[1].arg > 0:
                x, k = atom.src[0], atom.src[1].arg
                # x // k >= t  <=>  x >= t * k;   x // k <= t  <=>  x <= t * k + k - 1
                self._add(simplify(x + rest * k) if c == 1 else simplify(rest * k + (k - 1) - x), depth + 1)
        if depth < 2 and len(p) <= 2 and p.get((), 0) <= -1:  # c * a * b - t >= 0 with a, b >= 0: a, b >= 1
            prods = [(m, c) for m, c in p.items() if m]
            if len(prods) == 1 and prods[0][1] > 0 and len(prods[0][0]) > 1 and all(f.vmin >= 0 for f in prods[0][0]):
                for f in prods[0][0]:
                    self._add(simplify(f - 1), depth + 1)


@functools.lru_cache(maxsize=4096)
def facts_of(ge0: frozenset) -> Facts:
    return Facts(ge0)


@functools.lru_cache(maxsize=1 << 16)
def has_loop_or_data(u: UOp) -> bool:
    return any(x.op in (Ops.RANGE, Ops.LOAD, Ops.REDUCE) for x in u.toposort())
