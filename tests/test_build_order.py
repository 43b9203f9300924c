"""The order a plan's kernels are built in (jit/planner.py _outsized_first): a kernel far larger than the others (a
stack of every layer's rows) is optimised, rendered and submitted first, so that its long compile runs beside the
others' instead of alone at the plan's end; the others keep their plan order."""
import logging

import numpy as np

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.jit import planner

OUTSIZED = planner.OUTSIZED


def _stacked_last(x, y):
    sums = [(x * k).sum(axis=1) for k in range(1, 5)]
    return (*sums, pnp.stack([pnp.exp(x[i]) * y[i] + pnp.sqrt(pnp.abs(y[i])) for i in range(24)]))


def _build_order(monkeypatch, outsized: int, columns: int) -> list[str]:
    """The kernels compiled, in build order, for a new plan (`columns`: shapes no earlier plan had)."""
    monkeypatch.setattr(planner, "OUTSIZED", outsized)
    monkeypatch.setenv("PREPJIT_CACHE", "0")   # every kernel compiled, none loaded from an earlier test's
    compiled = []

    class Compiles(logging.Handler):
        def emit(self, record):
            if record.msg.startswith("compile %s on %s"):
                compiled.append(record.args[0])
    log, handler = logging.getLogger("prepjit"), Compiles()
    log.addHandler(handler)
    level = log.level
    log.setLevel(logging.INFO)   # (setLevel: the logger's cached answers to isEnabledFor are cleared)
    try:
        x = np.random.default_rng(columns).standard_normal((24, columns)).astype(np.float32)
        out = pj.prepare(_stacked_last, device="cpu")(x, x)
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    want = np.stack([np.exp(x[i]) * x[i] + np.sqrt(np.abs(x[i])) for i in range(24)])
    np.testing.assert_allclose(np.asarray(out[-1]), want, rtol=1e-5)
    return compiled


def test_an_outsized_kernel_is_built_first(monkeypatch):
    assert _build_order(monkeypatch, 10 ** 6, 37) == ["r_24"] * 4 + ["E_24_37"]   # the plan's order: the stack last
    assert _build_order(monkeypatch, OUTSIZED, 41) == ["E_24_41"] + ["r_24"] * 4


def _layers(x, ws):
    for w in ws:   # identical layers: one kernel AST each, emitted once per layer
        x = pnp.tanh(x @ w)
    return x.sum(axis=1)


def test_a_repeated_layers_kernels_compile_while_the_rest_is_scheduled(monkeypatch):
    """A kernel the schedule emits a second time (the next identical layer's) is submitted to the compilers at once,
    before the rest of the plan is scheduled; every distinct kernel is still compiled once."""
    from prepjit.runtime.devices import get_device
    monkeypatch.setenv("PREPJIT_CACHE", "0")
    device, events = get_device("cpu"), []
    parallel, schedule = device.compile_parallel, planner.schedule

    def compile_parallel(count):
        submit = parallel(count)
        return lambda name, source: (events.append(name), submit(name, source))[1]

    def scheduled(*args, **kwargs):
        out = schedule(*args, **kwargs)
        events.append("scheduled")
        return out
    monkeypatch.setattr(device, "compile_parallel", compile_parallel)
    monkeypatch.setattr(planner, "schedule", scheduled)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 43)).astype(np.float32)
    ws = [rng.standard_normal((43, 43)).astype(np.float32) / 8 for _ in range(6)]
    f = pj.prepare(_layers, device="cpu")
    out = f(x, ws)
    want = x
    for w in ws:
        want = np.tanh(want @ w)
    np.testing.assert_allclose(np.asarray(out), want.sum(axis=1), rtol=1e-4, atol=1e-5)
    assert "scheduled" in events and events.index("scheduled") > 0   # a compile went out before the schedule's end
    assert len(events) - 1 == f.stats["compiles"] == len(set(f.plan(x, ws).spec.kernels.asts()))
