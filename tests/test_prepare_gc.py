"""A prepare (trace and plan) runs with Python's cyclic garbage collector paused (planner.gc_paused): its graph
lives until it ends, so collections during it free nothing and each full one walks the whole heap."""
import gc

import numpy as np

import prepjit as pj


def _traced_with(seen: list):
    def f(x):
        seen.append(gc.isenabled())  # the Python body runs while the function is traced
        return x * 2
    return pj.prepare(f)


def test_the_collector_is_paused_while_tracing_and_back_after():
    seen = []
    f = _traced_with(seen)
    assert gc.isenabled()
    np.testing.assert_array_equal(np.asarray(f(np.arange(4.0))), np.arange(4.0) * 2)
    assert seen == [False] and gc.isenabled()


def test_a_collector_the_user_turned_off_stays_off():
    seen = []
    f = _traced_with(seen)
    gc.disable()
    try:
        f(np.arange(3.0))
        assert seen == [False] and not gc.isenabled()
    finally:
        gc.enable()


def test_the_collector_is_back_on_after_a_failed_trace():
    def bad(x):
        raise ValueError("user error")
    f = pj.prepare(bad)
    try:
        f(np.arange(2.0))
    except Exception:  # noqa: BLE001 - any error; what matters is the collector's state after it
        pass
    assert gc.isenabled()


def test_what_a_prepare_built_is_in_the_oldest_generation_after_it():
    """No young collection walks the plan's objects after the prepare (nor promotes them into a full one's work)."""
    f = pj.prepare(lambda x: (x * 3 - 1).max())
    plan = f.plan(np.arange(5.0))
    assert any(o is plan for o in gc.get_objects(generation=2))
