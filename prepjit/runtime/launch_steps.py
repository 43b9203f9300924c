"""The launch tree of an ExecutionPlan: what runs, as nodes that each know their launchers and their order.

A plan's PreparedKernels (plan.py: single kernels, LoopLaunches, DynamicLaunches) each build one node of it
(`step(plan, loop_vars)`): a kernel's node is its device launcher (a KernelStep: cpu.py, opencl.py, cuda.py),
a fori_loop's a LoopStep (its even and odd iteration's launchers, the loop var patched per iteration), a loop
the plan runs natively a DynamicStep (dynamic_loop.py). Every node answers

    launchers()  every launcher in it, once
    ordered()    (position in plan.kernels, launcher) for every launch, in execution order, patching loop vars
    group_into(runner, groups, iterations, top)   hands itself to a device's whole-plan runner (the cpu's
                 CPUPlanRunner: group_kernel / group_loop / group_dynamic), which builds its native launches
"""
from __future__ import annotations


class KernelStep:
    """A device launcher as a node of the launch tree (`pk`: its PreparedKernel, set by the plan)."""

    def launchers(self) -> list:
        return [self]

    def ordered(self):
        yield self.pk.id, self

    def group_into(self, runner, groups: list, iterations: dict, top: bool):
        runner.group_kernel(self, groups, iterations, top)


class LoopStep:
    """A fori_loop (`loop`: its LoopLaunches) run from the host: `even` and `odd` are the launchers of an even and
    an odd iteration; the loop var is patched into their `loop_slots` before each iteration."""

    def __init__(self, loop, even: list, odd: list):
        self.loop, self.even, self.odd = loop, even, odd

    def launchers(self) -> list:
        return self.even + self.odd

    def ordered(self):
        loop, even, odd = self.loop, self.even, self.odd
        for k in range(loop.lower, loop.upper):
            for j, launch in enumerate(odd if (k - loop.lower) % 2 else even):
                for slot in launch.loop_slots:
                    launch.set_val(slot, k)
                yield loop.start + (k - loop.lower) * len(even) + j, launch

    def group_into(self, runner, groups: list, iterations: dict, top: bool):
        runner.group_loop(self, groups, iterations)


def launchers(steps) -> list:
    """Every launcher of the nodes `steps`."""
    return [launch for step in steps for launch in step.launchers()]


def ordered_positions(steps):
    """(position in plan.kernels, launcher) for every launch of the nodes `steps`, in execution order."""
    for step in steps:
        yield from step.ordered()
