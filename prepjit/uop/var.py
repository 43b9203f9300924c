"""Var: a named symbolic integer with inclusive bounds, and BoundVar, a var with a value."""
from __future__ import annotations

import functools

import attrs

from ..errors import VarBoundError, VarError
from .uop import UOp


@attrs.frozen
class Var:
    """A symbolic variable `name` in [min, max] (inclusive), usable in shapes and as a scalar argument."""

    name: str
    min: int
    max: int

    def __attrs_post_init__(self):
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise VarError(f"Var name must be an identifier, got {self.name!r}")
        for bound in ("min", "max"):
            value = getattr(self, bound)
            if isinstance(value, bool) or not hasattr(value, "__index__"):
                raise VarError(f"Var {self.name!r}: {bound} must be an int, got {value!r}")
            object.__setattr__(self, bound, int(value))  # (a NumPy integer becomes a Python int)
        if self.min > self.max:
            raise VarError(f"Var {self.name!r}: min {self.min} > max {self.max}")
        if not (-2**63 <= self.min and self.max < 2**63):
            raise VarError(f"Var {self.name!r}: bounds [{self.min}, {self.max}] do not fit int64 (kernels take vars "
                           "as 64-bit ints)")

    @classmethod
    def of(cls, define_var: UOp) -> "Var":
        """The var a DEFINE_VAR UOp stands for (its arg is (name, min, max)): the inverse of `uop`."""
        name, lo, hi = define_var.arg
        return cls(name, lo, hi)

    @functools.cached_property
    def uop(self) -> UOp:
        """The DEFINE_VAR UOp of this var: the IR carries the bounds in its arg, for vmin/vmax (built once a Var: a
        call reads it for every var dim of every array argument)."""
        return UOp.variable(self.name, self.min, self.max)

    def check(self, value: int, where: str = "") -> int:
        if not self.min <= value <= self.max:
            src = f" (from {where})" if where else ""
            raise VarBoundError(f"var {self.name!r} = {value}{src} is outside its bounds [{self.min}, {self.max}]")
        return value

    def bind(self, value: int) -> "BoundVar":
        if isinstance(value, bool) or not isinstance(value, int) and not hasattr(value, "__index__"):
            raise TypeError(f"Var {self.name!r} binds to an int, got {type(value).__name__}")
        return BoundVar(self, self.check(int(value)))


@attrs.frozen
class BoundVar:
    """A Var together with a value inside its bounds."""

    var: Var
    value: int

    @property
    def name(self) -> str:
        return self.var.name
