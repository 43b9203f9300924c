"""The GPU devices' whole-plan replay (device_base.DevicePlanRunner): a call's arrays are bound only where a
launcher does not hold their address already, whoever bound it last, and its var values reach the launchers that
read them. On the cuda device with its driver stubbed (tests/runtime/cuda_stub.py) and on opencl."""
import types

import numpy as np
import pytest

import prepjit as pj
from prepjit.runtime import device_base
from prepjit.runtime.devices import unavailable_reason

from .cuda_stub import launcher, stub_device


def stub_plan(device):
    """Two kernels reading input 0 (one of them in two slots) and writing output 1; the second reads var n."""
    first = launcher(device, 1, [0, 0, 0], static_size=4)
    second = launcher(device, 2, [0, 0], vals=[1], size_fn=lambda v: (v[0],))
    second.var_slots = [(0, "n")]
    for launch, outputs in ((first, (2,)), (second, (1,))):
        launch.pk = types.SimpleNamespace(output_indices=outputs)
    io_slots = {0: [(first, 0), (first, 1), (second, 0)], 1: [(first, 2), (second, 1)]}
    table = types.SimpleNamespace(values=[5], slot={"n": 0})
    return device.plan_runner([first, second], [0, 1], io_slots, table, [None, None]), first, second


def addresses(launch) -> list[int]:
    return list(launch.buffer_ptrs)


def test_a_call_binds_only_the_slots_whose_address_changed_and_repairs_any_slot_bound_elsewhere():
    device = stub_device()
    runner, first, second = stub_plan(device)
    runner.run((0x1000, 0x2000))
    assert addresses(first) == [0x1000, 0x1000, 0x2000] and addresses(second) == [0x1000, 0x2000]
    assert second.vals == [5] and second.grid == 2
    bound = (first.version, second.version)
    runner.run((0x1000, 0x2000))
    assert (first.version, second.version) == bound     # nothing bound again
    first.buffer_ptrs[1] = 0x7000                        # another entry of the plan bound one slot of input 0
    runner.run((0x1000, 0x2000))
    assert addresses(first) == [0x1000, 0x1000, 0x2000] and second.version == bound[1]
    runner.run((0x3000, 0x2000))
    assert addresses(first) == [0x3000, 0x3000, 0x2000] and addresses(second) == [0x3000, 0x2000]
    assert device.driver.calls[-1] == ("graph",)


def test_each_launch_gets_the_calls_arrays_and_vars_from_its_graph():
    device = stub_device()
    runner, first, second = stub_plan(device)
    calls = [(5, 0x1000, 0x2000), (5, 0x1000, 0x2000), (9, 0x3000, 0x2000), (9, 0x3000, 0x4000), (9, 0x3000, 0x4000)]
    updated = [None, set(), {1, 2}, {1, 2}, set()]   # (the first call launches on the stream)
    for (n, x, out), nodes in zip(calls, updated):
        runner.values[0] = n
        device.driver.calls.clear()
        runner.run((x, out))
        expected = {1: (1, np.array([x, x, out]).tobytes()), 2: (-(-n // 4), np.array([x, out, n]).tobytes())}
        if nodes is None:
            assert {call[1]: call[2:] for call in device.driver.calls} == expected
        else:
            assert device.driver.calls[-1] == ("graph",)
            assert {call[1]: call[2:] for call in device.driver.calls[:-1]} == {k: expected[k] for k in nodes}


opencl = pytest.mark.skipif(unavailable_reason("opencl") is not None,
                            reason=f"opencl: {unavailable_reason('opencl')}")


@opencl
def test_opencl_replays_with_resident_arrays_bind_only_what_changed(monkeypatch):
    f = pj.prepare(lambda x, w, s: (x * w).sum(axis=1) + s, device="opencl")
    to_device = pj.prepare(lambda x: x + 0, device="opencl")
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((6, 5)).astype(np.float32) for _ in range(2)]
    w = rng.standard_normal(5).astype(np.float32)
    dx = [to_device(x) for x in xs]
    binds = []
    setitem = device_base.BufferSlots.__setitem__
    monkeypatch.setattr(device_base.BufferSlots, "__setitem__",
                        lambda self, slot, handle: (binds.append(slot), setitem(self, slot, handle)))
    counts = []
    for k in (0, 0, 0, 1, 1, 0):
        binds.clear()
        out = f(dx[k], w, np.float32(k))
        np.testing.assert_allclose(np.asarray(out), (xs[k] * w).sum(axis=1) + k, rtol=1e-5)
        counts.append(len(binds))
    # (the first call goes through the full path; the output's pooled memory may move between calls)
    assert max(counts[1], counts[2], counts[4]) <= 1 and counts[3] >= 1 and counts[5] >= 1, counts
