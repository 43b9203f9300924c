"""Pattern rewriting: UPat matches UOp shapes, PatternMatcher applies rules, graph_rewrite runs to a fixed point."""
from __future__ import annotations

from typing import Callable, Iterable

from .dtypes import DType
from .ops import Ops
from .uop import UOp


class UPat:
    """A pattern over UOps: op(s), dtype(s), source patterns, an exact arg, and a name to bind.

    `src=(a, b)` matches in order; `commutative=True` also tries (b, a).
    """

    __slots__ = ("ops", "dtypes", "src", "arg", "name", "commutative")

    def __init__(self, op: Ops | Iterable[Ops] | None = None, dtype: DType | Iterable[DType] | None = None,
                 src: tuple["UPat", ...] | None = None, arg=None, name: str | None = None, commutative=False):
        self.ops = None if op is None else (frozenset([op]) if isinstance(op, Ops) else frozenset(op))
        self.dtypes = None if dtype is None else (frozenset([dtype]) if isinstance(dtype, DType) else frozenset(dtype))
        self.src, self.arg, self.name, self.commutative = src, arg, name, commutative

    @staticmethod
    def var(name: str, dtype=None) -> "UPat":
        return UPat(name=name, dtype=dtype)

    @staticmethod
    def cvar(name: str, dtype=None) -> "UPat":
        return UPat(Ops.CONST, dtype=dtype, name=name)

    def match(self, u: UOp, bound: dict) -> bool:
        if self.ops is not None and u.op not in self.ops:
            return False
        if self.dtypes is not None and u.dtype not in self.dtypes:
            return False
        if self.arg is not None and u.arg != self.arg:
            return False
        if self.name is not None:
            if self.name in bound and bound[self.name] is not u:
                return False
            bound[self.name] = u
        if self.src is None:
            return True
        if len(self.src) != len(u.src):
            return False
        orders = [u.src, u.src[::-1]] if self.commutative and len(u.src) == 2 else [u.src]
        for order in orders:
            trial = dict(bound)
            if all(p.match(s, trial) for p, s in zip(self.src, order)):
                bound.clear()
                bound.update(trial)
                return True
        return False


class PatternMatcher:
    """An ordered list of (UPat, rewrite fn) rules, indexed by op; fn(**bound) returns a UOp or None."""

    def __init__(self, rules: list[tuple[UPat, Callable]]):
        self.rules = rules
        self.by_op: dict[Ops, list] = {}
        for pat, fn in rules:
            for op in (pat.ops if pat.ops is not None else list(Ops)):
                self.by_op.setdefault(op, []).append((pat, fn))

    def __add__(self, other: "PatternMatcher") -> "PatternMatcher":
        return PatternMatcher(self.rules + other.rules)

    def rewrite(self, u: UOp) -> UOp | None:
        for pat, fn in self.by_op.get(u.op, ()):
            bound: dict = {}
            if pat.match(u, bound):
                out = fn(**bound)
                if out is not None and out is not u:
                    return out
        return None


def graph_rewrite(root: UOp, pm: PatternMatcher) -> UOp:
    """Rewrite bottom-up until no rule applies anywhere: children first, then the node, repeatedly."""
    memo: dict[UOp, UOp] = {}

    def visit(node: UOp) -> UOp:
        chain = []
        while node not in memo:
            chain.append(node)
            src = tuple(memo[s] if s in memo else visit(s) for s in node.src)
            rebuilt = node if src == node.src else UOp(node.op, node.dtype, src, node.arg)
            nxt = pm.rewrite(rebuilt)
            if nxt is None:
                memo[rebuilt] = rebuilt
                node = rebuilt
                break
            node = nxt
        out = memo[node]
        for c in chain:
            memo[c] = out
        return out

    for node in root.toposort():  # children before parents keeps recursion shallow
        if node not in memo:
            visit(node)
    return memo[root]
