"""VarTable: a plan's vars in one place, one bounds record and one int64 value slot per var.

Bounds: one RuntimeVar (a uop Var under the seed's field names) per DEFINE_VAR the plan's UOps hold. A var a
call supplies (a plan var) has one; a name the plan fixes itself per kernel (a fori_loop's counter, a shared
buffer offset) may have other bounds in other kernels' ASTs, so records are kept per DEFINE_VAR and
`PreparedKernel.runtime_vars` lists the records of its AST's vars (shared objects, not copies).

Values: `values`, one ctypes int64 array: a slot per plan var (in `names` order), then one per loop the plan
runs natively (its counter, written each iteration). Every reader reads it: `plan.bindings` and
`PreparedKernel.vals` are views over it, a native loop's bounds are evaluated on it, and the launchers'
argument blocks (the kernels' calling convention: each kernel's own int64s in its `var_names` order) are
written from it right before kernels run (the cpu's natively, from the slots' addresses: cpu_replay.py).
"""
from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence

from ..uop import UOp
from ..uop.var import Var


class RuntimeVar(Var):
    """A var's (name, min_val, max_val), the seed's RuntimeVar: a Var (`min`/`max`, `check`) read off a DEFINE_VAR."""

    __slots__ = ()

    def __init__(self, name: str, min_val: int, max_val: int):
        super().__init__(name, min_val, max_val)

    @property
    def min_val(self) -> int:
        return self.min

    @property
    def max_val(self) -> int:
        return self.max


class VarTable:
    """The vars of one plan. `names`: the plan vars, sorted (a call supplies each); `fixed`: the names the plan
    gives values itself (fixedvars, loop counters); `slot[name]`: where a plan var or native loop counter's
    value is in `values`; `unbound`: the plan vars no value was given yet; `sources`: where calls read each
    var (an argument, a shape), for messages."""

    def __init__(self, defines, fixed=(), loops=()):
        loops = sorted(set(loops))
        self.records = {u: RuntimeVar.of(u) for u in defines}
        self.fixed = frozenset(fixed) | frozenset(loops)
        plan_vars: dict[str, RuntimeVar] = {}
        for rv in self.records.values():
            if rv.name not in self.fixed and plan_vars.setdefault(rv.name, rv) != rv:
                raise ValueError(f"var {rv.name!r} has bounds [{plan_vars[rv.name].min}, {plan_vars[rv.name].max}] "
                                 f"in one place of the plan and [{rv.min}, {rv.max}] in another")
        self.names = tuple(sorted(plan_vars))
        self.var = {n: plan_vars[n] for n in self.names}
        self.slot = {n: i for i, n in enumerate(self.names + tuple(loops))}
        self.values = (ctypes.c_int64 * max(1, len(self.slot)))(*(self.var[n].min for n in self.names))
        self.address = ctypes.addressof(self.values)
        self.unbound = set(self.names)
        self.sources: dict[str, str] = {}
        self.bounds = Bounds(self)
        self.bindings = Bindings(self)

    def bind(self, values: dict[str, int]):
        """Set plan vars (validated) by name."""
        for name, value in values.items():
            self.values[self.slot[name]] = value
        self.unbound.difference_update(values)

    def bind_all(self, values: tuple):
        """Set every plan var (validated), in `names` order."""
        self.values[:len(values)] = values
        if self.unbound:
            self.unbound.clear()

    def runtime_vars(self, ast: UOp) -> list[RuntimeVar]:
        """The records of the vars reachable from `ast`, sorted by name."""
        return [self.records[u] for u in ast.variables()]

    def kernel_vals(self, var_names: tuple, fixedvars: dict) -> "KernelVals":
        return KernelVals(self, var_names, fixedvars)


class KernelVals(Sequence):
    """A kernel's var values in its `var_names` order (PreparedKernel.vals), read on access: a name in its
    `fixedvars` (the kernel's own dict) from there, any other from the plan's VarTable."""

    __slots__ = ("table", "names", "fixed")

    def __init__(self, table: VarTable, names: tuple, fixed: dict):
        self.table, self.names, self.fixed = table, names, fixed

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self.names)))]
        name = self.names[i]
        if name in self.fixed:
            return self.fixed[name]
        return self.table.values[self.table.slot[name]]

    def __eq__(self, other):
        return list(self) == list(other) if isinstance(other, (list, tuple, KernelVals)) else NotImplemented

    __hash__ = None

    def __repr__(self) -> str:
        return repr(list(self))


class Bounds(Mapping):
    """plan.vars: plan var name -> (min, max), read off its RuntimeVar."""

    def __init__(self, table: VarTable):
        self._table = table

    def __getitem__(self, name: str) -> tuple[int, int]:
        rv = self._table.var[name]
        return rv.min, rv.max

    def __iter__(self):
        return iter(self._table.names)

    def __len__(self) -> int:
        return len(self._table.names)

    def __repr__(self) -> str:
        return repr(dict(self))


class Bindings(Mapping):
    """plan.bindings: plan var name -> its value, for the vars a value was given (by any call or
    execute_with_vars), read from the VarTable's values."""

    def __init__(self, table: VarTable):
        self._table = table

    def __getitem__(self, name: str) -> int:
        table = self._table
        if name not in table.var or name in table.unbound:
            raise KeyError(name)
        return table.values[table.slot[name]]

    def __iter__(self):
        table = self._table
        return (n for n in table.names if n not in table.unbound)

    def __len__(self) -> int:
        return len(self._table.names) - len(self._table.unbound)

    def __repr__(self) -> str:
        return repr(dict(self))
