"""ExecutionPlan and PreparedKernel: introspection, owned-buffer I/O, execute_with_vars validation."""
import attrs
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.uop import Ops

SEED_FIELDS = ["id", "ast", "kernel", "device", "buffer_indices", "output_indices", "vals", "fixedvars",
               "dependencies", "buffer_ptrs", "buffer_ids", "runtime_vars"]
R = np.random.default_rng(0)
XMAX = R.standard_normal((16, 8)).astype(np.float32)
W = R.standard_normal((8, 12)).astype(np.float32)


def make_plan(device):
    @pj.prepare(vars={"n": (1, 16), "pos": (0, 11)}, shapes={"x": ("n", 8)}, device=device)
    def f(x, w, pos):
        return pnp.tanh(x @ w)[:, :pos + 1] * 2

    return f, f.plan(XMAX[:3], W, 4)


def ref(n, pos):
    return (np.tanh(XMAX[:n] @ W)[:, :pos + 1] * 2).astype(np.float32)


def test_prepared_kernel_has_exactly_the_seed_fields(device):
    _, plan = make_plan(device)
    assert [f.name for f in attrs.fields(pj.PreparedKernel)] == SEED_FIELDS
    assert len(plan.kernels) == 2   # x @ w reduced into an intermediate, then tanh, slice and scale read it
    for i, k in enumerate(plan.kernels):
        assert isinstance(k, pj.PreparedKernel) and isinstance(k.kernel, pj.CachedKernel)
        assert k.device == device and k.id == i
        assert len(k.vals) == len(k.kernel.var_names)
        assert len(k.buffer_ptrs) == len(k.buffer_indices) == len(k.buffer_ids)
        assert k.output_indices == sorted({u.src[0].arg for u in k.ast.toposort() if u.op is Ops.STORE})
        assert k.dependencies == [e.id for e in plan.kernels[:i] if _conflicts(e, k)]
        names = [rv.name for rv in k.runtime_vars]
        assert names == sorted(set(v.arg[0] for v in k.ast.variables()))
        assert all(isinstance(rv, pj.RuntimeVar) for rv in k.runtime_vars)


def test_plan_introspection(device):
    _, plan = make_plan(device)
    assert plan.vars == {"n": (1, 16), "pos": (0, 11)}
    assert len(plan.inputs) == 2 and len(plan.outputs) == 1
    assert all(0 <= b < len(plan.buffers) for b in plan.inputs + plan.outputs)
    assert [k.dependencies for k in plan.kernels] == [[], [0]]
    text = str(plan)
    for word in ("kernel", "device", "buffers", "vars", "fixedvars", device, plan.kernels[0].kernel.name):
        assert word in text
    assert "define void" in plan.kernels[0].kernel.source or device != "cpu"


def test_write_input_execute_with_vars_read_output(device):
    _, plan = make_plan(device)
    plan.write_input(1, W)
    for n, pos in [(5, 3), (16, 11), (1, 0)]:
        plan.write_input(0, XMAX[:n])
        plan.execute_with_vars({"n": n, "pos": pos})
        out = plan.read_output(0)
        assert out.shape == (n, pos + 1)
        np.testing.assert_allclose(out, ref(n, pos), rtol=1e-4, atol=1e-5)
    # bindings stay for the next execute()
    plan.write_input(0, XMAX[:1] * 0)
    plan.execute()
    np.testing.assert_allclose(plan.read_output(0), np.zeros((1, 1), np.float32))


@pytest.mark.parametrize("bad,error,words", [
    ({"m": 3}, pj.VarError, ["'m'", "unknown"]),
    ({"n": 17}, pj.VarBoundError, ["'n'", "17", "[1, 16]"]),
    ({"n": 0}, pj.VarBoundError, ["'n'", "0", "[1, 16]"]),
    ({"n": 4, "pos": 12}, pj.VarBoundError, ["'pos'", "12", "[0, 11]"]),
    ({"pos": 3, "zz": 1}, pj.VarError, ["'zz'"]),
    ({"n": 2.5}, pj.VarError, ["'n'"]),
])
def test_execute_with_vars_validates_everything_first(device, bad, error, words):
    _, plan = make_plan(device)
    plan.write_input(1, W)
    plan.write_input(0, XMAX[:5])
    plan.execute_with_vars({"n": 5, "pos": 3})
    before = plan.read_output(0)
    vals_before = [list(k.vals) for k in plan.kernels]
    with pytest.raises(error) as info:
        plan.execute_with_vars(bad)
    assert all(w in str(info.value) for w in words), str(info.value)
    assert [list(k.vals) for k in plan.kernels] == vals_before
    assert plan.bindings == {"n": 5, "pos": 3}
    np.testing.assert_array_equal(plan.read_output(0), before)
    plan.write_input(0, XMAX[:7])
    plan.execute_with_vars({"n": 7, "pos": 2})
    np.testing.assert_allclose(plan.read_output(0), ref(7, 2), rtol=1e-4, atol=1e-5)


def test_missing_var_changes_nothing(device):
    _, plan = make_plan(device)
    fresh_vals = [list(k.vals) for k in plan.kernels]
    assert plan.bindings == {}
    with pytest.raises(pj.VarError, match="pos"):
        plan.execute_with_vars({"n": 3})
    assert plan.bindings == {} and [list(k.vals) for k in plan.kernels] == fresh_vals


def test_vals_are_patched_positionally(device):
    _, plan = make_plan(device)
    plan.write_input(0, XMAX[:9])
    plan.write_input(1, W)
    plan.execute_with_vars({"n": 9, "pos": 6})
    for k in plan.kernels:
        assert k.vals == [{"n": 9, "pos": 6}[name] for name in k.kernel.var_names]


def fori_plan(device):
    @pj.prepare(vars={"n": (1, 8)}, shapes={"x": ("n",)}, device=device)
    def f(x):
        return pj.fori_loop(0, 4, lambda i, c: c * 2 + i, x)
    return f, f.plan(np.ones(3, np.float32))


def test_fixed_vars_cannot_be_supplied(device):
    _, plan = fori_plan(device)
    assert "i" not in plan.vars and plan.vars == {"n": (1, 8)}
    with pytest.raises(pj.VarError, match="'i'"):
        plan.execute_with_vars({"n": 3, "i": 1})
    assert plan.bindings == {}
    plan.write_input(0, np.ones(3, np.float32))
    plan.execute_with_vars({"n": 3})
    want = np.ones(3, np.float32)
    for i in range(4):
        want = want * 2 + i
    np.testing.assert_allclose(plan.read_output(0), want)
    body = [k for k in plan.kernels if k.fixedvars]
    assert [k.fixedvars for k in body] == [{"i": k} for k in range(4)]
    assert all(k.vals[k.kernel.var_names.index("i")] == k.fixedvars["i"] for k in body)


def test_write_input_checks_dtype_and_capacity(device):
    _, plan = make_plan(device)
    with pytest.raises(pj.SignatureError):
        plan.write_input(0, XMAX.astype(np.float64))
    with pytest.raises(pj.SignatureError):
        plan.write_input(0, np.ones((17, 8), np.float32))


def _conflicts(a, b) -> bool:
    """Whether kernel b (later) must wait for kernel a: read-after-write, write-after-read or write-after-write."""
    wa, wb = {a.buffer_indices[i] for i in a.output_indices}, {b.buffer_indices[i] for i in b.output_indices}
    ra, rb = set(a.buffer_indices) - wa, set(b.buffer_indices) - wb
    return bool(wa & rb or ra & wb or wa & wb)


def test_dependencies_order_every_conflicting_pair(device):
    """A kernel depends (transitively) on every earlier kernel it conflicts with, so any executor honouring
    `dependencies` is correct; the loop here makes write-after-read hazards on its ping-pong buffers."""
    @pj.prepare(device=device)
    def f(x, y):
        return pj.fori_loop(0, 4, lambda i, c: (c[0] * 2, c[1] + c[0].sum()), (x, y))

    plan = f.plan(np.ones(3, np.float32), np.ones(2, np.float32))
    before = {}
    for k in plan.kernels:
        before[k.id] = set(k.dependencies).union(*(before[d] for d in k.dependencies))
    for j, later in enumerate(plan.kernels):
        for earlier in plan.kernels[:j]:
            if _conflicts(earlier, later):
                assert earlier.id in before[later.id], (earlier.id, later.id)


def test_a_long_fori_loop_keeps_one_kernel_per_iteration_built_on_access(device):
    """plan.kernels is a Sequence of one PreparedKernel per iteration (with its fixedvars), built when read: the
    plan holds the loop body once, not an object per iteration."""
    @pj.prepare(vars={"n": (1, 8)}, shapes={"x": ("n",)}, device=device)
    def f(x):
        return pj.fori_loop(3, 20_003, lambda i, acc: acc * 0.5 + (i % 7), x)

    x = np.arange(5, dtype=np.float32)
    plan = f.plan(x)
    assert len(plan.kernels) >= 20_000 and len(plan.kernels.segments) < 10
    start = next(k.id for k in plan.kernels if k.fixedvars)
    width = sum(k.fixedvars.get("i") == 3 for k in plan.kernels[start:start + 10])
    for r in (0, 1, 2, 10_000, 19_999):
        k = plan.kernels[start + r * width]
        assert k.id == start + r * width and k.fixedvars == {"i": 3 + r}
        assert k.vals[k.kernel.var_names.index("i")] == 3 + r
        window = plan.kernels[max(0, k.id - 2 * width):k.id]   # what it conflicts with last: the two iterations before
        assert k.dependencies == [e.id for e in window if _conflicts(e, k)] and k.dependencies
    assert plan.kernels[start + 20_000 * width - 1].fixedvars == {"i": 20_002}
    assert not plan.kernels[start + 20_000 * width:] or not plan.kernels[-1].fixedvars
    want = x.copy()
    for i in range(3, 20_003):
        want = want * np.float32(0.5) + np.float32(i % 7)
    np.testing.assert_allclose(np.asarray(f(x)), want, rtol=1e-5)


def test_launches_read_the_kernels_buffer_ptrs(device):
    """PreparedKernel.buffer_ptrs is what a kernel launches with: pointing the reader of x @ w at w's memory makes
    it read w's first rows where it read the product (execute patches only the I/O slots)."""
    from prepjit.runtime.devices import get_device

    f, plan = make_plan(device)
    product, rest = plan.kernels
    plan.write_input(0, XMAX[:3])
    plan.write_input(1, W)
    plan.execute_with_vars({"n": 3, "pos": 4})
    np.testing.assert_allclose(plan.read_output(0), ref(3, 4), rtol=1e-5, atol=1e-6)
    p_slot = rest.buffer_indices.index(product.buffer_indices[0])
    w_memory = plan.buffers[plan.inputs[1]].memory
    rest.buffer_ptrs[p_slot] = get_device(device).handle(w_memory)
    assert rest.buffer_ptrs[p_slot] == w_memory.ptr  # the address it launches with
    plan.execute()
    expected = (np.tanh(W.reshape(-1)[:36].reshape(3, 12))[:, :5] * 2).astype(np.float32)
    np.testing.assert_allclose(plan.read_output(0), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(f(XMAX[:3], W, 4), expected, rtol=1e-5, atol=1e-6)  # a prepared call's replay too


def test_str_plan_describes_each_loop_once(device):
    """str(plan): each segment of plan.kernels describes itself: a fori_loop unrolled in the plan is one line and
    its first two iterations' rows (not one row per launch), a loop run natively its parts, with every kernel."""
    f = pj.prepare(lambda xs: pj.fori_loop(0, 50, lambda t, h: h * 0.5 + xs[t].sum(0), pnp.zeros(4, pnp.float32)),
                   device=device)
    plan = f.plan(np.ones((50, 3, 4), np.float32))
    lines = str(plan).splitlines()
    assert sum("fori_loop t in [0, 50)" in line for line in lines) == 1
    kernel_rows = [line for line in lines if line.split()[0].isdigit() and device in line.split()]
    assert len(plan.kernels) > 100 and len(kernel_rows) < 10
    assert {k.kernel.name for k in plan.kernels} <= {line.split()[1] for line in kernel_rows}
    g = pj.prepare(lambda x: pj.while_loop(lambda h: h.sum() < 100, lambda h: h * 2, x), device=device)
    text = str(g.plan(np.ones(4, np.float32)))
    assert "while_loop" in text and "body_even:" in text and "pred_odd:" in text
