"""IndexConstraint: a condition on the vars that every call must meet (an index inside its axis), and its check.

Recorded while tracing (`x[pos]` gives `pos < n` and `-n <= pos`), carried by the plan, and checked on
every call before anything runs; `compile_checks` turns a list of them into one small Python function.
"""
from __future__ import annotations

import attrs

from ..errors import IndexBoundError
from .dtypes import dtypes
from .ops import Ops
from .uop import UOp, render_python

ERROR_KINDS = ("index", "empty")  # IndexConstraint.error_kind: IndexBoundError / ValueError (NumPy's)


@attrs.frozen
class IndexConstraint:
    """`cond` (a bool expression over vars) must hold; `text` spells it, `what` says which index it guards.
    `error_kind` "empty" is a reduction with no identity that needs a non-empty axis (`what` is NumPy's message;
    a violation raises ValueError, as NumPy does), else IndexBoundError."""

    cond: UOp
    text: str
    what: str
    error_kind: str = "index"

    @property
    def var_names(self) -> list[str]:
        return [v.arg[0] for v in self.cond.variables()]

    def error(self, values: dict, sources: dict | None = None) -> Exception:
        parts = []
        for name in self.var_names:
            src = (sources or {}).get(name)
            parts.append(f"{name} = {values.get(name)}" + (f" (from {src})" if src else ""))
        if self.error_kind == "empty":
            return ValueError(f"{self.what}: the constraint {self.text} does not hold for {', '.join(parts)}")
        return IndexBoundError(f"{self.what} is out of bounds: the constraint {self.text} does not hold for "
                               f"{', '.join(parts)}")


def constraint(lhs: UOp, rhs: UOp, strict: bool, what: str) -> IndexConstraint:
    """lhs < rhs (strict) or lhs <= rhs, over vars."""
    cond = UOp(Ops.CMPLT, dtypes.bool, (lhs, rhs if strict else rhs + 1))
    return IndexConstraint(cond, f"{lhs.render()} {'<' if strict else '<='} {rhs.render()}", what)


def compile_checks(constraints, var_names) -> object:
    """positional var values (in `var_names` order) -> the index of the first violated constraint, or -1."""
    if not constraints:
        return lambda v: -1
    slot = {n: i for i, n in enumerate(var_names)}
    lines = ["def check(v):"]
    for i, c in enumerate(constraints):
        lines.append(f"    if not {render_python(c.cond, lambda n: f'v[{slot[n]}]')}: return {i}")
    lines.append("    return -1")
    scope: dict = {}
    exec("\n".join(lines), scope)
    return scope["check"]
