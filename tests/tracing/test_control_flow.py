"""pj.cond, pj.switch, pj.while_loop, pj.scan and pj.fori_loop over var bounds, against Python/NumPy references,
on static and symbolic shapes (one trace for every value), and their TraceErrors."""
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen.dynamic_loop import DynamicLoop


def _close(a, b):
    np.testing.assert_allclose(np.asarray(a), b, rtol=1e-5, atol=1e-5)


# ---- fori_loop over var bounds: a loop the plan runs natively ----
def test_fori_loop_to_a_scalar_var_is_compiled_once_for_every_count(device):
    @pj.prepare(vars={"n": (0, 40)}, device=device)
    def f(x, n):
        return pj.fori_loop(0, n, lambda i, c: c * 2 + x[i % 4], pnp.zeros(3, np.float32))
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    for n in (0, 1, 2, 5, 8):
        ref = np.zeros(3, np.float32)
        for i in range(n):
            ref = ref * 2 + x[i % 4]
        _close(f(x, n), ref)
    assert f.stats["traces"] == 1 and f.stats["plans"] == 1
    plan = f.plan(x, 3)
    assert any(isinstance(seg, DynamicLoop) for seg in plan.spec.kernels.segments)
    assert len(plan.kernels) < 8 and "i" not in plan.vars  # each body kernel listed once; the loop var is the plan's
    with pytest.raises(pj.VarError, match="fixed"):
        plan.execute_with_vars({"i": 1})
    plan.write_input(0, x)  # the plan API runs the loop for the bound count too
    for n in (5, 0, 2):
        plan.execute_with_vars({"n": n})
        _close(plan.read_output(0), np.asarray(f(x, n)))


def test_fori_loop_over_a_symbolic_dim_reads_the_loop_var_rows(device, rng):
    """x[i] for i < x.shape[0]: the index constraint holds for every count (checked at i = n - 1, not at the
    var's maximum), and the bounds proof knows i < n inside the loop."""
    @pj.prepare(vars={"n": (0, 32)}, shapes={"x": ("n", 5)}, device=device)
    def f(x):
        return pj.fori_loop(0, x.shape[0], lambda i, c: c * 0.5 + x[i], pnp.zeros(5, np.float32))
    for n in (0, 1, 7, 32):
        x = rng.standard_normal((n, 5)).astype(np.float32)
        ref = np.zeros(5, np.float32)
        for i in range(n):
            ref = ref * 0.5 + x[i]
        _close(f(x), ref)
    assert f.stats["traces"] == 1


def test_fori_loop_with_var_lower_bound_and_nested_triangular_loop(device):
    @pj.prepare(vars={"a": (0, 10), "b": (0, 10)}, device=device)
    def f(x, a, b):
        def outer(i, c):
            return pj.fori_loop(0, i + 1, lambda j, d: d + (i * 10 + j), c)
        return pj.fori_loop(a, b, outer, x)
    x = np.zeros((), np.int64)
    for a, b in ((0, 0), (2, 5), (0, 10), (7, 3)):
        ref = sum(i * 10 + j for i in range(a, b) for j in range(i + 1))
        assert int(np.asarray(f(x, a, b))) == ref
    assert f.stats["traces"] == 1


def test_fori_loop_over_a_var_may_fail_an_index_only_when_the_loop_runs(device):
    @pj.prepare(vars={"n": (0, 8)}, device=device)
    def f(x, n):
        return pj.fori_loop(0, n, lambda i, c: c + x[i + 2], pnp.zeros((), np.float32))
    x = np.arange(5, dtype=np.float32)
    _close(f(x, 3), x[2:5].sum())
    _close(f(x, 0), 0.0)
    with pytest.raises(pj.IndexBoundError):
        f(x, 4)
    _close(f(x, 2), x[2:4].sum())  # the prepared function keeps working


def test_static_fori_loop_keeps_one_kernel_per_iteration():
    f = pj.prepare(lambda x: pj.fori_loop(0, 3, lambda i, c: c + i, x))
    plan = f.plan(np.zeros(2, np.float32))
    assert [k.fixedvars["i"] for k in plan.kernels if k.fixedvars] == [0, 1, 2]


def test_fori_loop_with_data_bounds_is_a_while_loop(device):
    @pj.prepare(device=device)
    def f(x, k):
        return pj.fori_loop(0, k.sum(), lambda i, c: c + i, pnp.zeros((), np.int64))
    for k in ([0, 0], [3, 0], [2, 4]):
        kk = np.array(k, np.int64)
        assert int(np.asarray(f(np.zeros(1), kk))) == sum(range(int(kk.sum())))
    assert f.stats["traces"] == 1


# ---- while_loop ----
def test_while_loop_runs_until_the_predicate_on_the_data_is_false(device):
    @pj.prepare(device=device)
    def collatz_steps(x):
        def body(s):
            v, k = s
            return pnp.where(v % 2 == 0, v // 2, 3 * v + 1), k + 1
        return pj.while_loop(lambda s: s[0] != 1, body, (x, np.int64(0)))

    def ref(v):
        k = 0
        while v != 1:
            v, k = (v // 2 if v % 2 == 0 else 3 * v + 1), k + 1
        return k
    for v in (1, 2, 6, 27):
        _, k = collatz_steps(np.array(v, np.int64))
        assert int(np.asarray(k)) == ref(v)
    assert collatz_steps.stats["traces"] == 1


def test_while_loop_on_a_symbolic_shape_with_an_array_carry(device, rng):
    @pj.prepare(vars={"n": (1, 64)}, shapes={"x": ("n",)}, device=device)
    def normalize(x):
        return pj.while_loop(lambda c: pnp.abs(c).max() > 1.0, lambda c: c * 0.5, x)
    for n in (1, 5, 64):
        x = (rng.standard_normal(n) * 20).astype(np.float32)
        ref = x.copy()
        while np.abs(ref).max() > 1.0:
            ref = ref * 0.5
        _close(normalize(x), ref)
    assert normalize.stats["traces"] == 1


def test_while_loop_nested_in_a_fori_loop(device):
    @pj.prepare(vars={"n": (0, 6)}, device=device)
    def f(x, n):
        def outer(i, c):
            return pj.while_loop(lambda v: v < (i + 1) * 10, lambda v: v + 3, c)
        return pj.fori_loop(0, n, outer, x)
    for n in range(5):
        v = 0
        for i in range(n):
            while v < (i + 1) * 10:
                v += 3
        assert int(np.asarray(f(np.zeros((), np.int64), n))) == v


def test_while_loop_errors():
    x = np.ones(3, np.float32)
    with pytest.raises(pj.TraceError, match="boolean scalar"):
        pj.prepare(lambda x: pj.while_loop(lambda c: c > 0, lambda c: c - 1, x))(x)
    with pytest.raises(pj.TraceError, match="structure"):
        pj.prepare(lambda x: pj.while_loop(lambda c: c.sum() > 0, lambda c: (c, c), x))(x)
    with pytest.raises(pj.TraceError, match="int32"):
        pj.prepare(lambda x: pj.while_loop(lambda c: c.sum() > 0, lambda c: c.astype(np.int32), x))(x)
    with pytest.raises(pj.TraceError, match="never end"):
        pj.prepare(lambda x: pj.while_loop(lambda c: True, lambda c: c, x))(x)
    _close(pj.prepare(lambda x: pj.while_loop(lambda c: False, lambda c: c * 2, x))(x), x)


# ---- cond and switch ----
def test_cond_on_data_and_on_a_symbolic_dim(device, rng):
    @pj.prepare(vars={"n": (1, 16)}, shapes={"x": ("n", 3)}, device=device)
    def f(x):
        a = pj.cond(x.sum() > 0, lambda v: v * 2, lambda v: v - 1.0, x)
        b = pj.cond(x.shape[0] > 4, lambda: x[:1] * 0 + 7, lambda: x[:1])
        c = pj.cond(x[0, 0], lambda v: v + 1, lambda v: v, x.sum(0))  # a number: nonzero is true
        return a, b, c
    for n in (1, 4, 9):
        x = rng.standard_normal((n, 3)).astype(np.float32)
        if n == 4:
            x[0, 0] = 0
        a, b, c = f(x)
        _close(a, x * 2 if x.sum() > 0 else x - 1)
        _close(b, x[:1] * 0 + 7 if n > 4 else x[:1])
        _close(c, x.sum(0) + 1 if x[0, 0] else x.sum(0))
    assert f.stats["traces"] == 1


def test_cond_selects_without_leaking_the_other_branch():
    f = pj.prepare(lambda x: pj.cond(x.min() > 0, lambda v: pnp.log(v), lambda v: v * 0, x))
    _close(f(np.array([-1.0, 2.0])), [0.0, 0.0])
    _close(f(np.array([1.0, 2.0])), np.log([1.0, 2.0]))


def test_cond_with_a_static_predicate_traces_both_branches_and_runs_one():
    calls = []

    def branch(k):
        def fun(v):
            calls.append(k)
            return v + k
        return fun
    f = pj.prepare(lambda x, p: pj.cond(p, branch(1), branch(2), x))
    _close(f(np.zeros(2), True), [1, 1])
    _close(f(np.zeros(2), False), [2, 2])
    assert sorted(calls) == [1, 1, 2, 2]
    assert len(f.plan(np.zeros(2), True).kernels) == 1


def test_cond_branch_gather_flags_count_only_when_chosen():
    f = pj.prepare(lambda t, ids, p: pj.cond(p > 0, lambda: t[ids], lambda: t[:2] * 0))
    t, bad = np.arange(5.0), np.array([0, 9])
    _close(f(t, bad, np.int64(0)), [0, 0])
    with pytest.raises(pj.IndexBoundError):
        f(t, bad, np.int64(1))
    _close(f(t, np.array([4, 1]), np.int64(1)), [4, 1])


def test_cond_errors():
    x = np.ones(3, np.float32)
    with pytest.raises(pj.TraceError, match="same shapes"):
        pj.prepare(lambda x: pj.cond(x.sum() > 0, lambda: x, lambda: x[:2]))(x)
    with pytest.raises(pj.TraceError, match="same dtypes"):
        pj.prepare(lambda x: pj.cond(x.sum() > 0, lambda: x, lambda: x.astype(np.int32)))(x)
    with pytest.raises(pj.TraceError, match="same structure"):
        pj.prepare(lambda x: pj.cond(x.sum() > 0, lambda: (x, x), lambda: x))(x)
    with pytest.raises(pj.TraceError, match="scalar"):
        pj.prepare(lambda x: pj.cond(x > 0, lambda: x, lambda: -x))(x)
    # a Python scalar takes the other branch's dtype, as JAX's weak types do
    out = pj.prepare(lambda x: pj.cond(x.sum() > 0, lambda: x.sum(), lambda: 0.0))(x)
    assert out.dtype == np.float32


def test_switch_clamps_the_index(device):
    branches = [lambda v: v, lambda v: v + 10, lambda v: -v]

    @pj.prepare(vars={"k": (-5, 5)}, device=device)
    def by_var(x, k):
        return pj.switch(k, branches, x)

    @pj.prepare(device=device)
    def by_data(x, k):
        return pj.switch(k, branches, x)
    x = np.arange(3.0, dtype=np.float32)
    for k in range(-2, 5):
        ref = branches[min(max(k, 0), 2)](x)
        _close(by_var(x, k), ref)
        _close(by_data(x, np.int32(k)), ref)
        _close(pj.prepare(lambda x: pj.switch(k, branches, x))(x), ref)
    assert by_var.stats["traces"] == 1 and by_data.stats["traces"] == 1
    with pytest.raises(pj.TraceError, match="integer"):
        pj.prepare(lambda x: pj.switch(x.sum(), branches, x))(x)
    with pytest.raises(ValueError):
        pj.switch(0, [], x)


# ---- scan ----
def _scan_ref(f, init, xs, reverse=False):
    c, ys = init, [None] * len(xs)
    for t in (reversed(range(len(xs))) if reverse else range(len(xs))):
        c, ys[t] = f(c, xs[t])
    return c, np.array(ys)


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_over_a_symbolic_leading_axis(device, rng, reverse):
    def step(c, x):
        c = c * 0.9 + x
        return c, (c * c).sum()

    @pj.prepare(vars={"t": (1, 20)}, shapes={"xs": ("t", 4)}, device=device)
    def f(xs, h):
        return pj.scan(step, h, xs, reverse=reverse)
    for t in (1, 3, 20):
        xs, h = rng.standard_normal((t, 4)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
        c, ys = f(xs, h)
        rc, rys = _scan_ref(step, h, xs, reverse)
        _close(c, rc)
        _close(ys, rys)
    assert f.stats["traces"] == 1


def test_scan_pytrees_length_and_cumsum(device):
    xs = {"a": np.arange(6.0).reshape(3, 2), "b": np.arange(3, dtype=np.int64)}
    f = pj.prepare(lambda xs: pj.scan(lambda c, x: (c + x["a"], {"s": c.sum() + x["b"]}), np.zeros(2), xs),
                   device=device)
    c, ys = f(xs)
    _close(c, xs["a"].sum(0))
    _close(ys["s"], [0 + 0, 1 + 1, 6 + 2])
    g = pj.prepare(lambda x: pj.scan(lambda c, _: (c * 2, c), x, None, length=4), device=device)
    c, ys = g(np.ones(2))
    _close(c, [16, 16])
    _close(ys, [[1, 1], [2, 2], [4, 4], [8, 8]])


def test_scan_errors():
    x = np.ones((3, 2))
    with pytest.raises(pj.TraceError, match="leading sizes"):
        pj.prepare(lambda x: pj.scan(lambda c, v: (c, v), 0.0, (x, x[:2])))(x)
    with pytest.raises(pj.TraceError, match="no xs"):
        pj.prepare(lambda x: pj.scan(lambda c, v: (c, c), x, None))(x)
    with pytest.raises(pj.TraceError, match="pair"):
        pj.prepare(lambda x: pj.scan(lambda c, v: c, x[0], x))(x)


# ---- the hint for Python control flow on a var ----
def test_python_if_on_a_var_dim_suggests_cond_and_while_loop():
    @pj.prepare(vars={"n": (1, 64)}, shapes={"x": ("n", 3)})
    def f(x):
        if x.shape[0] > 8:
            return x
        return -x
    with pytest.raises(pj.TraceError, match=r"var\(s\) n.*pj\.cond.*pj\.while_loop"):
        f(np.ones((3, 3), np.float32))


# ---- the generic launch order (GPU devices, the profiler) and the GPU renderers ----
def _collatz(x, n):
    def outer(i, c):
        return pj.while_loop(lambda v: v[0] != 1, lambda v: (pnp.where(v[0] % 2 == 0, v[0] // 2, 3 * v[0] + 1),
                                                             v[1] + 1), (c[0] + i, c[1]))
    return pj.fori_loop(0, n, outer, (x, np.int64(0)))


def test_profile_runs_loops_in_the_generic_order_and_times_each_listed_kernel():
    f = pj.prepare(_collatz, vars={"n": (0, 8)})
    x = np.array(6, np.int64)
    v, steps = f(x, 5)
    prof = pj.profile(f, x, 5)
    assert len(prof.rows) == len(f.plan(x, 5).kernels)
    ref, k = 6, 0
    for i in range(5):
        ref += i
        while ref != 1:
            ref, k = (ref // 2 if ref % 2 == 0 else 3 * ref + 1), k + 1
    assert int(np.asarray(v)) == ref and int(np.asarray(steps)) == k


def test_loop_kernels_render_for_the_gpu_devices():
    from prepjit.codegen.schedule import schedule
    from prepjit.codegen.targets import TARGETS
    traced = pj.trace(pj.prepare(_collatz, vars={"n": (0, 8)}), np.array(6, np.int64), 5)
    sched = schedule(list(traced.outputs) + [f for f, _ in traced.flags], list(traced.inputs))
    assert any(isinstance(seg, DynamicLoop) for seg in sched.kernels.segments)
    for language in ("cuda", "opencl"):
        for ast in sched.kernels.asts():
            assert TARGETS[language].render(TARGETS[language].launched(ast)).source


# ---- saved plans ----
def _nested(xs, n):
    def outer(i, c):
        return pj.while_loop(lambda s: s[1] < i + 2, lambda s: (s[0] * 0.5 + xs[s[1] % xs.shape[0]], s[1] + 1),
                             (c, np.int64(0)))[0]
    return pj.scan(lambda h, x: (h + x, h.sum()), pj.fori_loop(0, n, outer, pnp.zeros(3, np.float32)), xs)


def test_loops_the_plan_runs_are_saved_and_loaded(tmp_path, rng):
    f = pj.prepare(_nested, vars={"n": (0, 8), "t": (1, 16)}, shapes={"xs": ("t", 3)})
    xs = rng.standard_normal((5, 3)).astype(np.float32)
    path = tmp_path / "loops.pjplan"
    f.save(path, xs, 4)
    for recompile in (False, True):
        g = pj.load(path, recompile=recompile)
        for args in ((xs, 4), (xs[:2], 7), (xs[:1], 0)):
            for got, want in zip(g(*args), f(*args)):
                _close(got, np.asarray(want))
        assert g.stats["traces"] == 0


def test_forged_loop_conditions_and_var_bounds_are_refused(tmp_path):
    """A file must not let the bounds proof assume what calls do not check: a loop's index condition dropped
    from the constraints, or a loop var narrower than its bounds, is a PlanFileError."""
    from prepjit.runtime import datafile
    from prepjit.jit.saved import KIND, VERSION
    f = pj.prepare(lambda x, n: pj.fori_loop(0, n, lambda i, c: c + x[i + 1], pnp.zeros((), np.float32)),
                   vars={"n": (0, 8)})
    x = np.arange(6, dtype=np.float32)
    path = tmp_path / "p.pjplan"
    f.save(path, x, 3)
    _close(pj.load(path)(x, 3), x[1:4].sum())
    meta, payload = datafile.unpack(path.read_bytes(), KIND, VERSION)
    assert meta["constraints"] and any("dloop" in k for k in meta["kernels"] if isinstance(k, dict))

    def forged(edit):
        m, _ = datafile.unpack(path.read_bytes(), KIND, VERSION)
        edit(m)
        bad = tmp_path / "bad.pjplan"
        bad.write_bytes(datafile.pack(KIND, VERSION, m, payload))
        return bad

    def narrow(m):
        loop = next(k["dloop"] for k in m["kernels"] if isinstance(k, dict) and "dloop" in k)
        loop[2] = 20  # upper bound 20: i reaches 19, beyond the var's [0, 7]
    for edit in (lambda m: m.update(constraints=[]), narrow):
        with pytest.raises(pj.PlanFileError):
            pj.load(forged(edit), recompile=True)


def test_an_index_in_a_loop_over_var_bounds_is_checked_only_when_the_loop_runs(tmp_path):
    """x[pos] in the body of fori_loop(0, n): pos must be in range when n > 0, not when the loop does not run."""
    f = pj.prepare(lambda x, n, pos: pj.fori_loop(0, n, lambda i, c: c + x[pos], pnp.zeros((), np.float32)),
                   vars={"n": (0, 8), "pos": (0, 20)})
    x = np.arange(5, dtype=np.float32)
    _close(f(x, 3, 4), 12.0)
    _close(f(x, 0, 9), 0.0)
    with pytest.raises(pj.IndexBoundError):
        f(x, 1, 9)
    f.save(tmp_path / "p.pjplan", x, 3, 4)
    g = pj.load(tmp_path / "p.pjplan", recompile=True)
    _close(g(x, 0, 9), 0.0)
    _close(g(x, 2, 1), 2.0)


def test_lax_map_and_fori_loop_unroll(rng):
    xs = rng.standard_normal((4, 3))
    f = pj.prepare(lambda xs: pj.lax.map(lambda x: (x * x).sum(), xs), vars={"n": (1, 8)}, shapes={"xs": ("n", 3)})
    _close(f(xs), (xs * xs).sum(1))
    _close(f(xs[:2]), (xs[:2] * xs[:2]).sum(1))
    assert f.stats["traces"] == 1
    _close(pj.prepare(lambda x: pj.fori_loop(0, 3, lambda i, c: c * 2, x, unroll=2))(np.ones(2)), [8, 8])
