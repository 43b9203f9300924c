"""VarTable: one home for a plan's var bounds and values; plan.vars, plan.bindings and PreparedKernel.vals
are views of it, and every replay path (fast calls, execute_with_vars, the profiler, native loops) reads it."""
import numpy as np
import pytest

import prepjit as pj
from prepjit.jit.profiler import timed_call
from prepjit.runtime.var_table import VarTable
from prepjit.uop import UOp


def _f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_runtime_var_is_the_var_record_the_kernels_share():
    rv = pj.RuntimeVar("n", 1, 8)
    assert isinstance(rv, pj.Var) and (rv.name, rv.min_val, rv.max_val) == ("n", 1, 8)
    assert pj.RuntimeVar(name="n", min_val=1, max_val=8) == rv
    with pytest.raises(ValueError):
        pj.RuntimeVar("n", 3, 2)
    v = pj.Var("n", 1, 8)
    assert pj.Var.of(v.uop) == v and pj.RuntimeVar.of(v.uop) == rv

    @pj.prepare(vars={"n": (1, 16)}, shapes={"x": ("n",), "y": ("n",)})
    def f(x, y):
        total = (x * 2).sum()
        return total + y, total  # an output: the sum keeps its own kernel (not the other's prologue)
    plan = f.plan(np.ones(4, np.float32), np.ones(4, np.float32))
    records = [rv for k in plan.kernels for rv in k.runtime_vars]
    assert len(plan.kernels) >= 2 and len(records) >= 2
    assert all(rv is plan.var_table.var["n"] for rv in records)


def test_views_are_read_only_and_follow_every_path(rng):
    @pj.prepare(vars={"n": (1, 32), "pos": (0, 31)}, shapes={"x": ("n",)}, device="cpu")
    def f(x, pos):
        return x[:pos + 1] * 2 + x.sum()
    x = _f32(rng, 32)
    ATOL = 1e-5 * np.abs(x).sum()  # x * 2 + sum can cancel to near zero, where the sum's lane order shows (AVX2 vs AVX-512)
    plan = f.plan(x, 0)
    assert plan.bindings == {} and plan.vars == {"n": (1, 32), "pos": (0, 31)}
    with pytest.raises(TypeError):
        plan.vars["n"] = (0, 1)
    with pytest.raises(TypeError):
        plan.bindings["n"] = 3
    with pytest.raises(TypeError):
        plan.kernels[0].vals[0] = 3

    def check(n, pos):
        assert plan.bindings == {"n": n, "pos": pos}
        for k in plan.kernels:
            assert k.vals == [{"n": n, "pos": pos}[name] for name in k.kernel.var_names]

    for n, pos in [(9, 3), (9, 3), (20, 7), (5, 0)]:  # the first call of a key takes the full path, then the fast one
        np.testing.assert_allclose(np.asarray(f(x[:n], pos)), x[:pos + 1] * 2 + x[:n].sum(), rtol=1e-5, atol=ATOL)
        check(n, pos)
    plan.write_input(0, x[:12])
    plan.execute_with_vars({"n": 12, "pos": 11})  # arguments written from the table, not from a stale call's
    np.testing.assert_allclose(plan.read_output(0), x[:12] * 2 + x[:12].sum(), rtol=1e-5, atol=ATOL)
    check(12, 11)
    np.testing.assert_allclose(np.asarray(f(x[:5], 0)), x[:1] * 2 + x[:5].sum(), rtol=1e-5, atol=ATOL)  # fast again
    check(5, 0)
    info = f.signature.read((x[:7], 2), {})
    out, _ = timed_call(f, f._entry(info), info)  # pj.profile's run: kernel by kernel, given the values first
    np.testing.assert_allclose(np.asarray(out), x[:3] * 2 + x[:7].sum(), rtol=1e-5, atol=ATOL)
    check(7, 2)


def test_a_native_loop_counts_in_the_table(rng):
    @pj.prepare(vars={"n": (1, 16)}, shapes={"x": ("n",)}, device="cpu")
    def f(x):
        return pj.fori_loop(0, x.shape[0], lambda i, c: c * 0.5 + i, x)
    x = _f32(rng, 16)
    for n in (5, 5, 16, 1, 5):
        want = x[:n].copy()
        for i in range(n):
            want = want * np.float32(0.5) + np.float32(i)
        np.testing.assert_allclose(np.asarray(f(x[:n])), want, rtol=1e-5)
    plan = f.plan(x[:5])
    table = plan.var_table
    assert "i" in table.fixed and "i" not in plan.vars and table.values[table.slot["i"]] == 4  # the last iteration's


def test_one_name_with_two_bounds_is_refused_unless_the_plan_fixes_it():
    a, b = UOp.variable("n", 1, 4), UOp.variable("n", 1, 8)
    with pytest.raises(ValueError, match="'n'"):
        VarTable([a, b])
    table = VarTable([a, b, UOp.variable("m", 0, 3)], fixed={"n"})
    assert table.names == ("m",) and table.records[a].max == 4 and table.records[b].max == 8


def test_the_gpu_plan_runner_gives_launchers_the_tables_values():
    """DevicePlanRunner (opencl, cuda) writes each launcher's var slots from the VarTable before it runs."""
    from types import SimpleNamespace

    from prepjit.runtime.device_base import DeviceBase, DevicePlanRunner
    from prepjit.runtime.launch_steps import KernelStep

    class Launch(KernelStep):
        def __init__(self, i, var_slots):
            self.pk, self.var_slots, self.args, self.ran = SimpleNamespace(id=i), var_slots, {}, []

        def set_val(self, slot, value):
            self.args[slot] = value

        def run(self):
            self.ran.append(dict(self.args))

    table = VarTable([UOp.variable("n", 1, 8), UOp.variable("pos", 0, 7)])
    steps = [Launch(0, [(0, "pos")]), Launch(1, [(1, "n"), (0, "pos")])]
    runner = DevicePlanRunner(DeviceBase(), steps, [], {}, table)   # (DeviceBase.run_all: each launcher in order)
    for n, pos in [(5, 2), (8, 0)]:
        table.bind({"n": n, "pos": pos})
        runner.run_launches()
        assert steps[0].ran[-1] == {0: pos} and steps[1].ran[-1] == {0: pos, 1: n}
