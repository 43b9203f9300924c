"""The cpu's native replay entry (runtime/cpu_replay.py): a prepared call reaches its plan through a builtin
function (prepjit_replay_method) where the build allows, else through ctypes; either way the results are NumPy's,
a misaligned input is refused and copied, no reference leaks, and the GIL is free while the plan runs."""
import sys
import sysconfig
import threading
import time

import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.runtime.devices import get_device
from tests.runtime.test_cpu_fast_path import full_path_reads


@pytest.fixture(params=["builtin", "ctypes"])
def entry(request, monkeypatch) -> str:
    """Plans built in the test reach their native program through this entry."""
    cpu = get_device("cpu")
    if request.param == "ctypes":
        monkeypatch.setattr(cpu, "method_address", 0)
    elif not cpu.method_address:
        pytest.skip("the builtin entry's self-test fails on this build (it assumes a GIL build's object header)")
    return request.param


def test_the_builtin_entry_is_used_where_python_has_a_gil():
    assert bool(get_device("cpu").method_address) == (not sysconfig.get_config_var("Py_GIL_DISABLED"))


def test_replays_match_numpy_without_leaking_references(entry, rng, monkeypatch):
    f = pj.prepare(lambda a, b: (a * b + 1, a - b), device="cpu")
    reads = full_path_reads(f, monkeypatch)
    a, b = rng.standard_normal(16).astype(np.float32), rng.standard_normal(16).astype(np.float32)
    f(a, b)
    counts = sys.getrefcount(a), sys.getrefcount(b)
    for _ in range(1000):
        product, difference = f(a, b)
    assert (sys.getrefcount(a), sys.getrefcount(b)) == counts and len(reads) == 1
    np.testing.assert_allclose(np.asarray(product), a * b + 1, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(difference), a - b, rtol=1e-6)
    assert sys.getrefcount(np.asarray(product)) <= 3  # the output is held by the result only (and this call)
    misaligned = np.zeros(16 * 4 + 1, np.uint8)[1:].view(np.float32)
    misaligned[:] = a
    np.testing.assert_allclose(np.asarray(f(misaligned, b)[0]), a * b + 1, rtol=1e-6)  # refused, then copied
    assert len(reads) == 1


def test_the_gil_is_free_while_a_plan_runs(entry, rng):
    def slow(xp, x):
        for _ in range(48):
            x = xp.sin(x) * 1.01 + 0.01
        return x
    f = pj.prepare(lambda x: slow(pnp, x), device="cpu")
    x = rng.standard_normal(1 << 22).astype(np.float32)
    f(x)
    stamps, done = [], threading.Event()

    def tick():
        while not done.is_set():
            stamps.append(time.perf_counter())
            time.sleep(0.0005)
    ticker = threading.Thread(target=tick)
    ticker.start()
    try:
        time.sleep(0.01)
        start = time.perf_counter()
        f(x)
        end = time.perf_counter()
    finally:
        done.set()
        ticker.join()
    assert end - start > 0.05, "the plan ran too briefly to tell"
    middle = [s for s in stamps if start + 0.2 * (end - start) < s < end - 0.2 * (end - start)]
    assert middle, "no other Python thread ran while the plan did"
