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
