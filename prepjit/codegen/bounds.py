"""The bounds proof: every load and store index of a kernel lies in [0, size) of its buffer, for every var value.

Run on the kernel as launched (its target's passes applied, targets.py) right before rendering. A buffer's size is the product of its live
(symbolic) shape, so caller arrays, empty ones included, are covered like intermediates. A load from a select of
buffers (BUFFER_SELECT: buffer_select.py) is proven inside each buffer it may read (uop.ops.buffers_of).

An index is bounded by symbolic expressions of the vars: `upper(e)` gives options, each a list of
expressions whose maximum is >= e (any one option is a valid bound), `lower(e)` the same from below.
Loop ranges are bounded by their end (an access inside a loop only runs when the loop does, so its end
is >= 1), mins, maxes and wheres combine their operands' options, and `facts` sharpen atoms: the load's
gate (a gated load reads nothing where its gate is false), the condition of an enclosing where, the
plan's index constraints (checked on every call before anything runs) and `end >= 1` for every
enclosing range. Facts are linear inequalities `expr >= 0` turned into bounds for each atom with a
unit coefficient. The last step checks with interval bounds (vmin) that `size - 1 - bound >= 0` and
`bound >= 0`, both simplified to polynomials first so that symbolic sizes cancel.
"""
from __future__ import annotations

import functools
import itertools

from ..errors import CompileError
from ..uop import Ops, UOp, simplify
from ..uop.ops import buffers_of
from ..uop.symbolic import _mono_key, from_poly, mono_div, poly, poly_min, provably_lt, relax_divisions
from .facts import Facts, facts_of, ge0_terms, has_loop_or_data, is_int, linear

MAX_OPTIONS = 12       # bound options kept per node
MAX_OPTION_TERMS = 32  # expressions per option (a max of that many)
MAX_FACT_DEPTH = 2     # facts are expanded through facts this deep (facts refer to each other)
MAX_NONNEG_DEPTH = 3   # a bound's terms are shown >= 0 through their own bounds this deep
MAX_NESTING = 120      # bounds worked out inside one another (Python's stack holds ~3 frames each)
MAX_SPLITS = 4         # mins and maxes of vars split into cases per access (2**MAX_SPLITS cases at most)
MAX_ASSIGNMENTS = 16   # an access not proven otherwise is proven at each of its vars' values when they have few
MAX_WORK = 40_000      # bounds worked out plus sums and products built, per access (and again for its assignments)


class _OutOfWork(Exception):
    """The proof of one access spent its MAX_WORK: that access is not proven (a bound cut short proves nothing)."""


def _options(opts: list, upper: bool) -> list:
    """The best few options: distinct, fewest terms first, none whose terms include another option's
    (a max over more terms is no tighter), of single terms differing by a constant only the tightest."""
    best: dict = {}
    kept: list = []
    for o in sorted((list(dict.fromkeys(o)) for o in opts), key=len):
        if len(o) > MAX_OPTION_TERMS or any(set(k) <= set(o) for k in kept):
            continue
        if len(o) == 1:
            p = poly(o[0])
            shape, c = frozenset((k, v) for k, v in p.items() if k), p.get((), 0)
            if shape in best:
                if best[shape][0] <= c if upper else best[shape][0] >= c:
                    continue
                kept[best[shape][1]] = o
                best[shape] = (c, best[shape][1])
                continue
            best[shape] = (c, len(kept))
        kept.append(o)
    return kept[:MAX_OPTIONS]


def _relax_divisions(e: UOp, upper: bool) -> UOp | None:
    """`e` with each term c * f * (x // k) replaced by its bound (symbolic.relax_divisions), or None."""
    relaxed = relax_divisions(poly(e), upper)
    return None if relaxed is None else simplify(from_poly(relaxed, e.dtype))


@functools.lru_cache(maxsize=1 << 16)
def _polynomial(u: UOp) -> bool:
    return all(x.op in (Ops.CONST, Ops.DEFINE_VAR, Ops.ADD, Ops.SUB, Ops.MUL) for x in u.toposort())


class _Prover:
    def __init__(self):
        self.memo: dict = {}
        self.active: set = set()  # the bounds and checks being worked out (a cycle gives up on its node)
        self.work = MAX_WORK  # what the access being proven may still spend (in_bounds sets it)

    def _spend(self, amount: int):
        self.work -= amount
        if self.work < 0:
            raise _OutOfWork

    def _combine(self, a: list, b: list, fn, upper: bool) -> list:
        """Options of fn(x, y) from options of x and of y, the pairs of better-ranked options first."""
        pairs = sorted(((i, j) for i in range(len(a)) for j in range(len(b))), key=lambda ij: ij[0] + ij[1])
        self._spend(sum(len(a[i]) * len(b[j]) for i, j in pairs))
        return _options([[simplify(fn(x, y)) for x in a[i] for y in b[j]] for i, j in pairs], upper)

    def bound(self, e: UOp, facts: Facts, upper: bool, depth: int = 0) -> list:
        key = (e, facts.ge0, upper, depth)
        if key not in self.memo:
            if key in self.active or len(self.active) > MAX_NESTING:
                return [[UOp.const(e.vmax if upper else e.vmin)]]
            self._spend(1)
            self.active.add(key)
            try:
                self.memo[key] = self._bound(e, facts, upper, depth)
            finally:
                self.active.discard(key)
        return self.memo[key]

    def _bound(self, e: UOp, facts: Facts, upper: bool, depth: int) -> list:
        exact = not has_loop_or_data(e)
        opts = [[e]] if exact else []
        if exact and (e.op in (Ops.CONST, Ops.DEFINE_VAR) and e not in facts.atoms
                      or _polynomial(e) and not any(v in facts.var_atoms for v in e.variables())):
            return opts
        if depth < MAX_FACT_DEPTH and e in facts.atoms:
            for b in facts.atoms[e][1 if upper else 0]:
                opts += self.bound(b, facts, upper, depth + 1)
        if e.op is not Ops.DEFINE_VAR:
            opts += self._structural(e, facts, upper, depth)
        relaxed = _relax_divisions(e, upper) if e.op in (Ops.ADD, Ops.MUL) else None
        if relaxed is not None:
            opts += self.bound(relaxed, facts, upper, depth)
        if e.op is Ops.ADD:
            opts += self._factored(e, facts, upper, depth)
        return _options(opts, upper)

    def _factored(self, e: UOp, facts: Facts, upper: bool, depth: int) -> list:
        """Bounds of a sum r * c + rest with a range r in several terms (n*r - r = r * (n - 1)): bounding the
        terms apart loses that they share r; c free of loops and data, of known sign."""
        p = poly(e)
        for r in dict.fromkeys(f for m in p for f in m if f.op is Ops.RANGE):
            with_r = {m: c for m, c in p.items() if r in m}
            if len(with_r) < 2:
                continue
            coef = from_poly({mono_div(m, (r,)): c for m, c in with_r.items()}, e.dtype)
            if has_loop_or_data(coef):
                continue
            rest = from_poly({m: c for m, c in p.items() if m not in with_r}, e.dtype)
            sign = 1 if self.nonneg(coef, facts) else -1 if self.nonneg(-coef, facts) else 0
            if sign == 0:
                continue
            r_opts = self.bound(r, facts, upper == (sign > 0), depth)
            return self._combine([[simplify(x * coef) for x in o] for o in r_opts], self.bound(rest, facts, upper, depth),
                            lambda x, y: x + y, upper)
        return []

    def _structural(self, e: UOp, facts: Facts, upper: bool, depth: int) -> list:
        op, s = e.op, e.src
        b = functools.partial(self.bound, facts=facts, depth=depth)
        if op in (Ops.CONST, Ops.DEFINE_VAR):
            return [[e]]
        if op is Ops.RANGE:
            if not upper:
                return [[UOp.const(0)]]
            return _options([[simplify(x - 1) for x in o] for o in b(s[0], upper=True)], True)
        if op is Ops.ADD:
            return self._combine(b(s[0], upper=upper), b(s[1], upper=upper), lambda x, y: x + y, upper)
        if op is Ops.SUB:
            return self._combine(b(s[0], upper=upper), b(s[1], upper=not upper), lambda x, y: x - y, upper)
        if op is Ops.MUL:
            return self._mul(e, facts, upper, depth)
        # floor division and modulo; the renderers give x // 0 == x % 0 == 0 (NumPy's integer rule)
        divisor_free = op in (Ops.IDIV, Ops.MOD) and not has_loop_or_data(s[1])
        if divisor_free and not upper and self.nonneg(s[1], facts) and (op is Ops.MOD or self.nonneg(s[0], facts)):
            opts = [[UOp.const(0)]]  # x % d >= 0 and (x >= 0) x // d >= 0 for d >= 0
            if op is Ops.IDIV and self.nonneg(s[1] - 1, facts):
                opts += [[simplify(x // s[1]) for x in o] for o in b(s[0], upper=False)]
            return _options(opts, upper)
        positive = divisor_free and self.nonneg(s[1] - 1, facts)
        if op is Ops.IDIV and positive:
            return _options([[self._quotient(x, s[1], facts) for x in o] for o in b(s[0], upper=upper)], upper)
        if op is Ops.MOD and positive:  # floor modulo: in [0, d - 1]
            own = [o for o in b(s[0], upper=True)] if self.nonneg(s[0], facts) else []
            return _options([[simplify(s[1] - 1)]] + own, True)
        if op in (Ops.MAX, Ops.MIN):
            either = (op is Ops.MIN) == upper  # min <= each operand; max >= each operand
            a, c = b(s[0], upper=upper), b(s[1], upper=upper)
            return _options(a + c, upper) if either else _options([oa + oc for oa in a for oc in c], upper)
        if op is Ops.WHERE and is_int(e):
            t = self.bound(s[1], facts.with_terms(ge0_terms(s[0], True)), upper, depth)
            f = self.bound(s[2], facts.with_terms(ge0_terms(s[0], False)), upper, depth)
            return _options([ot + of for ot in t for of in f], upper)
        if op is Ops.CAST and is_int(s[0]) and e.dtype.is_int and \
                e.dtype.min() <= s[0].dtype.min() and s[0].dtype.max() <= e.dtype.max():
            return b(s[0], upper=upper)
        return [[UOp.const(e.vmax if upper else e.vmin)]]

    def _quotient(self, x: UOp, d: UOp, facts: Facts) -> UOp:
        """x // d for d >= 1: with x = q * d + r (term by term), q when 0 <= r < d and q - 1 when -d <= r < 0.
        d is a factor, or a constant multiple k * m of one monomial m (4n - 1 = 2 * (2n) - 1)."""
        q: dict = {}
        r: dict = {}
        dp = poly(d)
        (dm, dk), = dp.items() if len(dp) == 1 else (((d,), 1),)
        for m, c in poly(x).items():  # the terms with d as a factor make q * d
            rest = mono_div(m, dm) if dk > 0 and c % dk == 0 else None
            if rest is None:
                r[m] = r.get(m, 0) + c
            else:
                q[rest] = q.get(rest, 0) + c // dk
        if q and d.op is not Ops.CONST:
            q, r = from_poly(q, x.dtype), from_poly(r, x.dtype)
            if self.nonneg(r, facts) and self.nonneg(d - 1 - r, facts):
                return simplify(q)
            if self.nonneg(-1 - r, facts) and self.nonneg(r + d, facts):
                return simplify(q - 1)
        return simplify(x // d)

    def _mul(self, e: UOp, facts: Facts, upper: bool, depth: int) -> list:
        a, c = e.src
        b = functools.partial(self.bound, facts=facts, depth=depth)
        if c.op is Ops.CONST or not has_loop_or_data(c) and a.op is not Ops.CONST:
            pass
        else:
            a, c = c, a
        out = []
        if c.op is Ops.CONST and a.op is Ops.IDIV and a.src[1].op is Ops.CONST and a.src[1].arg > 0 \
                and c.arg % a.src[1].arg == 0:  # c * (x // k), k | c:  k * (x // k) in [x - k + 1, x]
            k, x = a.src[1].arg, a.src[0]
            tight = upper == (c.arg > 0)
            out += [[simplify((y if tight else y - k + 1) * (c.arg // k)) for y in o] for o in b(x, upper=tight)]
        if not has_loop_or_data(c):  # a * c with c free of loops and data: bound a, keep c when its sign is known
            if c.vmin >= 0:
                out += [[simplify(x * c) for x in o] for o in b(a, upper=upper)]
            elif c.vmax <= 0:
                out += [[simplify(x * c) for x in o] for o in b(a, upper=not upper)]
            if not has_loop_or_data(a) and a.vmin >= 0 and c.op is not Ops.CONST:
                out += [[simplify(a * x) for x in o] for o in b(c, upper=upper)]
        elif upper and self.nonneg(a, facts) and self.nonneg(c, facts):
            out += self._combine(b(a, upper=True), b(c, upper=True), lambda x, y: x * y, True)
        elif not upper and self.nonneg(a, facts) and self.nonneg(c, facts):
            out += [[UOp.const(0)]]
        return _options(out, upper) or [[UOp.const(e.vmax if upper else e.vmin)]]

    def nonneg(self, e: UOp, facts: Facts, depth: int = 0) -> bool:
        """Whether e >= 0 for every var value in bounds (given the facts)."""
        e = simplify(e)
        if e.vmin >= 0:
            return True
        if depth >= MAX_NONNEG_DEPTH:
            return False
        key = ("nonneg", e, facts.ge0, depth)
        if key not in self.memo:
            if key in self.active or len(self.active) > MAX_NESTING:
                return False
            self.active.add(key)
            try:
                self.memo[key] = any(all(x is not e and self.nonneg(x, facts, depth + 1) for x in o)
                                     for o in self.bound(e, facts, upper=False))
            finally:
                self.active.discard(key)
        return self.memo[key]

    def in_bounds(self, index: UOp, size: UOp, terms: frozenset, splits: int = 0,
                  halves: tuple = ("lower", "upper")) -> tuple[bool, str]:
        """Whether 0 <= index (half "lower") and index < size ("upper"); a min or max of vars is split into its
        two cases (correlated uses), for the halves not proven without it. An access (splits == 0) may spend
        MAX_WORK on this, and MAX_WORK more on its assignments (_at_each_value)."""
        if splits == 0:
            self.work = MAX_WORK
        if any(not has_loop_or_data(t) and simplify(t).vmax < 0 for t in terms):  # the facts contradict: never runs
            return True, ""
        facts = facts_of(terms)
        if facts.contradictory:  # the gate is never true (an index into an empty axis): the access never happens
            return True, ""
        failed = tuple(h for h in halves if not self._half(index, size, facts, h))
        if not failed:
            return True, ""
        why = "may be negative" if failed[0] == "lower" else f"may reach the buffer's size {size.render()}"
        if self.work < 0:
            why += f" (not proven within the proof's work limit, MAX_WORK = {MAX_WORK})"
        choice = next((u for u in _outside_ranges(index, size, *terms) if u.op in (Ops.MIN, Ops.MAX)
                       and not has_loop_or_data(u)), None) if splits < MAX_SPLITS else None
        if choice is None:
            return (True, "") if splits == 0 and self._at_each_value(index, size, terms, failed) else (False, why)
        a, b = choice.src
        keep = {r: r for x in (index, size, *terms) for r in _ranges(x)}  # ranges (and their ends) stay
        for pick, other in ((a, b), (b, a)):  # min(a, b) = a when b - a >= 0; max(a, b) = a when a - b >= 0
            fact = linear(other, pick) if choice.op is Ops.MIN else linear(pick, other)
            sub = {**keep, choice: pick}
            case_terms = frozenset(linear(t.substitute(sub)) for t in terms) | {fact}
            ok, why = self.in_bounds(simplify(index.substitute(sub)), simplify(size.substitute(sub)),
                                     case_terms, splits + 1, failed)
            if not ok:
                return (True, "") if splits == 0 and self._at_each_value(index, size, terms, failed) else (False, why)
        return True, ""

    def _at_each_value(self, index: UOp, size: UOp, terms: frozenset, halves: tuple) -> bool:
        """Whether the access is in bounds at every assignment of its vars, when they have MAX_ASSIGNMENTS or
        fewer (a var of a few values: the facts each gives, a loop that is empty at n = 0, are plain numbers)."""
        found = {v for x in (index, size, *terms) for v in x.variables()}
        variables = sorted(found, key=lambda v: v.arg[0])
        count = 1
        for v in variables:
            count *= v.arg[2] - v.arg[1] + 1
        if not variables or count > MAX_ASSIGNMENTS:
            return False
        self.work = MAX_WORK
        for values in itertools.product(*(range(v.arg[1], v.arg[2] + 1) for v in variables)):
            sub = {v: UOp.const(x) for v, x in zip(variables, values)}
            fixed = frozenset(linear(simplify(t.substitute(sub))) for t in terms)
            if not self.in_bounds(simplify(index.substitute(sub)), simplify(size.substitute(sub)), fixed, MAX_SPLITS,
                                  halves)[0]:
                return False
        return True

    def _half(self, index: UOp, size: UOp, facts: Facts, half: str) -> bool:
        """One half of in_bounds without case splits: interval bounds first (no facts needed), then the bounds;
        False once the access's work is spent."""
        try:
            if half == "lower":
                return poly_min(poly(index)) >= 0 or self.nonneg(index, facts) or _past_a_fact(index, facts)
            return provably_lt(index, size) or _past_a_fact(size - 1 - index, facts) or \
                any(all(self.nonneg(size - 1 - x, facts) for x in o) for o in self.bound(index, facts, upper=True))
        except _OutOfWork:
            return False


def _past_a_fact(e: UOp, facts: Facts) -> bool:
    """e >= 0 because e - f >= 0 everywhere for a fact f >= 0: a gate `4*r0 + r1 < 4` bounds the index
    `4*r0 + r1 + 8` below a size of 12 as a whole, where bounds of its ranges one by one cannot."""
    return any(poly_min(poly(e - f)) >= 0 for f in facts.ge0)


def _outside_ranges(*roots: UOp) -> list[UOp]:
    """The nodes under `roots`, not looking inside a range (its end is part of the range)."""
    out, seen, stack = [], set(), list(roots)
    while stack:
        u = stack.pop()
        if u in seen:
            continue
        seen.add(u)
        out.append(u)
        if u.op is not Ops.RANGE:
            stack.extend(u.src)
    return out


@functools.lru_cache(maxsize=1 << 14)
def _ranges(u: UOp) -> tuple[UOp, ...]:
    return tuple(x for x in u.toposort() if x.op is Ops.RANGE)


def _enclosing_ranges(ast: UOp) -> dict:
    """Per access, the ranges whose loops surely enclose it: the kernel's loop ranges (the renderers compute
    every store's value inside the whole loop nest), and a reduce's ranges for values read only inside it."""
    loops = [u for u in ast.toposort() if u.op is Ops.RANGE and u.arg[1] in ("loop", "serial")]
    inside: dict = {}  # node -> frozenset of reduce ranges around every use seen
    stack = [(s, frozenset()) for s in ast.src]
    while stack:
        u, ranges = stack.pop()
        if u in inside and inside[u] <= ranges:
            continue
        ranges = inside[u] & ranges if u in inside else ranges
        inside[u] = ranges
        if u.op is Ops.REDUCE:
            stack.append((u.src[0], ranges | frozenset(u.src[1:])))
            stack.extend((x, ranges) for x in u.src[1:])
        else:
            stack.extend((x, ranges) for x in u.src)
    return {u: loops + sorted(r, key=lambda x: x.arg) for u, r in inside.items() if u.op in (Ops.LOAD, Ops.STORE)}


def buffer_size(shape: tuple) -> UOp:
    size = UOp.const(1)
    for d in shape:
        size = size * d
    return simplify(size)


def _opaque_loads(exprs: list) -> list:
    """`exprs` with each outermost load replaced by a placeholder load (the i-th distinct one, in order): the
    proof knows a loaded value by its dtype only, so accesses that differ only inside their loads' indices
    (an upcast gather's lanes) share one proof."""
    loads: dict = {}
    for e in exprs:
        for u in _outside_loads(e):
            loads.setdefault(u, UOp(Ops.LOAD, u.dtype, (u.src[0], UOp.const(len(loads)))))
    return [e.substitute(loads) if loads else e for e in exprs]


def _outside_loads(root: UOp) -> list[UOp]:
    """The loads under `root` that no other load's index holds, in a fixed order."""
    out, seen, stack = [], set(), [root]
    while stack:
        u = stack.pop()
        if u in seen:
            continue
        seen.add(u)
        if u.op is Ops.LOAD:
            out.append(u)
        else:
            stack.extend(reversed(u.src))
    return out


def prove_kernel(ast: UOp, shapes: list[tuple], constraints=()) -> int:
    """Check every access of kernel `ast` (slot i has live shape shapes[i]); return how many were proven.

    `constraints` are bool expressions over the vars known true on every run (checked before it).
    Raises CompileError naming the kernel, the access and its index when one cannot be proven.
    An access whose index's interval bounds (vmin, vmax: every var at its bounds, every range in [0, end)) lie in
    [0, smallest size) is proven at once (SmolLM2's prefill: the embedding gather's 108 clamped reads, the weights'
    static indices). The others are grouped first: identical ones (loads made opaque) are proven once, and ungated
    ones of one buffer whose indices differ by a constant only at their smallest and largest offsets (the facts are
    the same, so every offset in between lies between those two); an upcast's lanes, whose indices differ in the
    constants inside their mins and maxes, are proven at once with those constants as vars over their range.
    """
    sizes = [buffer_size(s) for s in shapes]

    def shape_and_size(slot) -> tuple:
        # a kernel's own array (DEFINE_LOCAL, arg (number, elements): operand_prologue.py) has the size it names
        return ((slot[1],), buffer_size((slot[1],))) if type(slot) is tuple else (shapes[slot], sizes[slot])

    base = frozenset(t for c in constraints for t in ge0_terms(c, True))
    enclosing = _enclosing_ranges(ast)
    groups: dict = {}  # (slot, lane template, opaque gate, facts) -> {lane constants: {offset: access}}
    count = 0
    for u in ast.toposort():
        if u.op not in (Ops.LOAD, Ops.STORE):
            continue
        index = simplify(u.src[1])  # facts and index in one canonical form
        gated = 2 if u.op is Ops.LOAD else 3  # LOAD: (buffer, index[, gate]); STORE: (buffer, index, value[, gate])
        gate = simplify(u.src[gated]) if len(u.src) > gated else None
        slots = [b.arg for b in buffers_of(u.src[0])]  # a select of buffers reads one: its index lies in each
        count += len(slots)
        if gate is not None and gate.op is Ops.CONST and not gate.arg:  # never runs
            continue
        # those whose size holds the index's interval bounds at every var value: proven without the facts
        slots = [s for s in slots if not (index.vmin >= 0 and index.vmax < shape_and_size(s)[1].vmin)]
        if not slots:
            continue
        terms = set(base)
        for r in (*_ranges(u.src[1]), *(_ranges(u.src[gated]) if gate is not None else ()), *enclosing[u]):
            terms.add(linear(r.src[0], None, -1))  # an access inside a loop runs only when the loop does
        opaque = [simplify(e) for e in _opaque_loads([index] + ([gate] if gate is not None else []))]
        offset = 0
        if gate is None:
            p = poly(opaque[0])
            offset, opaque[0] = p.get((), 0), from_poly({m: k for m, k in p.items() if m}, index.dtype)
        else:
            terms |= set(ge0_terms(opaque[1], True))
        template, lanes = _lane_template(opaque[0]) if gate is None else (opaque[0], ())
        known = frozenset(t for t in terms if t.op is not Ops.CONST or t.arg < 0)
        for slot in slots:
            key = (slot, template, *opaque[1:], known)
            groups.setdefault(key, {}).setdefault(lanes, {}).setdefault(offset, (u, index, gate, opaque[0]))
    prover = _Prover()
    for (slot, template, *gate_part, terms), by_lanes in groups.items():
        shape, size = shape_and_size(slot)
        if len(by_lanes) > 1 and _lanes_in_bounds(prover, template, by_lanes, size, terms):
            continue
        for accesses in by_lanes.values():  # one lane at a time (or the general proof failed)
            _prove_offsets(prover, ast, accesses, size, terms, not gate_part, slot, shape)
    return count


def _lane_template(e: UOp) -> tuple[UOp, tuple[int, ...]]:
    """`e` with the constant term of each operand of the mins and maxes among its monomials' factors replaced
    by a placeholder var (`hole.i`), and those constants in order: an upcast's lanes T * min(8*r + k, T - 1),
    k = 0..7, have one template. No user var has such a name (not an identifier). Built in the order of e's
    monomials and factors, not sorted again (no new sort keys): a cheap key, not a canonical form."""
    p = poly(e)
    if not any(f.op in (Ops.MIN, Ops.MAX) for m in p for f in m):
        return e, ()
    consts: list[int] = []
    templated: dict = {}
    out = None
    for m in sorted(p, key=_mono_key):
        term = None
        for f in m:
            if f.op in (Ops.MIN, Ops.MAX) and f not in templated:
                operands = []
                for x in f.src:
                    q = poly(x)
                    rest = from_poly({k: c for k, c in q.items() if k}, x.dtype)
                    operands.append(UOp(Ops.ADD, x.dtype, (rest, UOp.variable(f"hole.{len(consts)}", 0, 0))))
                    consts.append(q.get((), 0))
                templated[f] = UOp(f.op, f.dtype, tuple(operands))
            f = templated.get(f, f)
            term = f if term is None else UOp(Ops.MUL, e.dtype, (term, f))
        if term is None:
            term = UOp.const(p[m], e.dtype)
        elif p[m] != 1:
            term = UOp(Ops.MUL, e.dtype, (term, UOp.const(p[m], e.dtype)))
        out = term if out is None else UOp(Ops.ADD, e.dtype, (out, term))
    return out, tuple(consts)


def _lanes_in_bounds(prover: _Prover, template: UOp, by_lanes: dict, size: UOp, terms: frozenset) -> bool:
    """Whether every lane of a group is in bounds at once: the template with each constant that differs between
    lanes a var over their range (`lane.i`; a constant all share stays one), at the smallest and largest offset
    of all of them. False sends the lanes to be proven one by one."""
    subs = {}
    for i, values in enumerate(zip(*by_lanes)):
        lo, hi = min(values), max(values)
        subs[UOp.variable(f"hole.{i}", 0, 0)] = UOp.const(lo) if lo == hi else UOp.variable(f"lane.{i}", lo, hi)
    general = simplify(template.substitute(subs))
    offsets = {o for accesses in by_lanes.values() for o in accesses}
    return all(prover.in_bounds(general + o, size, terms)[0] for o in sorted({min(offsets), max(offsets)}))


def _prove_offsets(prover: _Prover, ast: UOp, accesses: dict, size: UOp, terms: frozenset, ungated: bool,
                   slot: int, shape: tuple):
    """Prove accesses {offset: (access, index, gate, opaque index less its offset)} that differ only in their
    constant offset (the same facts: every offset between the smallest and the largest is covered), or raise."""
    for offset in sorted({min(accesses), max(accesses)}):
        u, index, gate, rest = accesses[offset]
        ok, why = prover.in_bounds(rest + offset if ungated else rest, size, terms)
        if not ok:
            kind = "load from" if u.op is Ops.LOAD else "store to"
            gated = f" under gate {gate.render()}" if gate is not None else ""
            raise CompileError(f"kernel {ast.arg}: cannot prove the {kind} buffer slot {slot} in bounds: index "
                               f"{index.render()}{gated} {why} (shape {shape}); refusing to compile it")


_proof_cache: dict = {}


def prove_launched(launched: UOp, shapes: list[tuple], constraints=()) -> int:
    """prove_kernel on a kernel as launched (targets.Target.launched: what is rendered and runs), memoised:
    fori_loop iterations and repeated prepares share one proof."""
    key = (launched, tuple(tuple(s) for s in shapes), tuple(constraints))
    if key not in _proof_cache:
        if len(_proof_cache) > 4096:
            _proof_cache.clear()
        _proof_cache[key] = prove_kernel(launched, shapes, constraints)
    return _proof_cache[key]
