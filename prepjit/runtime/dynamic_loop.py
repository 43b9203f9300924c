"""Loops an ExecutionPlan runs natively: a fori_loop over var bounds, or a while_loop (codegen/dynamic_loop.py).

`DynamicLaunches` is such a loop's PreparedKernels (each listed once in `plan.kernels`); `DynamicStep` runs
it: for a fori_loop, `upper - lower` iterations at the call's var values with the loop var patched into
its kernels' argument slots; for a while_loop, the predicate kernels then, while the predicate buffer reads
true, the body. Iterations alternate between the even and odd parts (ping-pong carries); a loop that ends
after an odd number of iterations runs the copy part. A while_loop has no iteration limit (as in JAX).
"""
from __future__ import annotations

import attrs

from ..uop import render_python
from ..uop.segments import Run
from .launch_steps import launchers, ordered_positions


@attrs.frozen
class DynamicLaunches(Run):
    """As a Sequence: every PreparedKernel of its parts once (nested loops' expanded in place)."""

    name: str | None
    lower: object
    upper: object
    pred_buffer: int | None
    parts: tuple   # (pred even, body even, pred odd, body odd, copy): tuples of PreparedKernel / DynamicLaunches
    part_names: tuple  # each part's name (str(plan)), as the schedule names them (codegen/dynamic_loop.py)
    flat: tuple = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self):
        object.__setattr__(self, "flat", self.prepared())

    def __len__(self) -> int:
        return len(self.flat)

    def item(self, i: int):
        return self.flat[i]

    def prepared(self) -> tuple:
        """Its PreparedKernels, each once (nested loops' in place)."""
        return tuple(k for part in self.parts for seg in part for k in seg.prepared())

    def describe(self, indent: str = "") -> list:
        """A line naming the loop, then each part's name and its kernels' rows (nested loops' lines), indented."""
        if self.name is None:
            head = f"while_loop, its predicate in buf{self.pred_buffer}:"
        else:
            lower, upper = (b if isinstance(b, int) else b.render() for b in (self.lower, self.upper))
            head = f"fori_loop {self.name} in [{lower}, {upper}), bounds read at run time:"
        rows = [indent + head]
        for name, part in zip(self.part_names, self.parts):
            if part:
                rows += [f"{indent}  {name}:", *(row for seg in part for row in seg.describe(indent + "    "))]
        return rows

    def check_fixed(self, counters: dict | None = None):
        """Its kernels' fixed values in their vars' bounds (its own counter is a var each iteration binds)."""
        for seg in (seg for part in self.parts for seg in part):
            seg.check_fixed(counters)

    def step(self, plan, loop_vars: tuple = ()) -> DynamicStep:
        """The DynamicStep running it in `plan` (inside the loops whose vars are `loop_vars`)."""
        inner = loop_vars + ((self.name,) if self.name else ())
        return DynamicStep(self, [[seg.step(plan, inner) for seg in part] for part in self.parts],
                           plan.var_table.values, plan.var_table.slot, plan.predicate_reader(self.pred_buffer))


class DynamicStep:
    """Runs one DynamicLaunches; `parts` holds each part's steps (launchers, nested DynamicSteps). `env` is the
    plan's VarTable values (loop counters included: bounds may name an outer loop's var), `slot` where each is."""

    def __init__(self, loop: DynamicLaunches, parts: list, env: list, slot: dict, read_pred):
        self.loop, self.parts, self.env, self.read_pred = loop, parts, env, read_pred
        if loop.name is not None:
            spell = lambda n: f"v[{slot[n]}]"  # noqa: E731
            exprs = ", ".join(str(b) if isinstance(b, int) else render_python(b, spell)
                              for b in (loop.lower, loop.upper))
            self.bounds_fn = eval(f"lambda v: ({exprs})")
            self.var_slot = slot[loop.name]
            self.patches = [[(launch, i) for launch in launchers(part) for i, n in
                             enumerate(launch.pk.kernel.var_names) if n == loop.name] for part in (parts[1], parts[3])]

    def launchers(self) -> list:
        return [x for part in self.parts for x in launchers(part)]

    def ordered(self):
        """Its launches in the order the loop runs them, each at its kernel's position."""
        for part in self.parts_in_order():
            yield from ordered_positions(self.parts[part])

    def group_into(self, runner, groups: list, iterations: dict, top: bool):
        runner.group_dynamic(self, groups, iterations)

    def parts_in_order(self):
        """The parts (indices into `parts`) to run, in order: a generator whose consumer runs each part before it
        asks for the next (the predicate buffer is read once its part ran; the loop var is patched first)."""
        odd = 0
        if self.read_pred is None:
            env, patches = self.env, self.patches
            lower, upper = self.bounds_fn(env)
            for k in range(lower, upper):
                env[self.var_slot] = k
                for launch, slot in patches[odd]:
                    launch.set_val(slot, k)
                yield 1 + 2 * odd
                odd ^= 1
        else:
            while True:
                yield 2 * odd
                if not self.read_pred():
                    break
                yield 1 + 2 * odd
                odd ^= 1
        if odd:
            yield 4

