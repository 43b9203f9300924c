"""The cuda device's launch queue and CUDA graph replay with the driver stubbed (tests/runtime/cuda_stub.py): a plan
queued as one unit (`run_all`), a graph built the second time a sequence is seen, and each replay updating exactly
the nodes whose grid or argument bytes changed since they were set, with what the launch holds then."""
import struct

from .cuda_stub import launcher, stub_device


def packed(*words) -> bytes:
    return struct.pack(f"<{len(words)}q", *words)


def plan_of_three(device):
    """A fixed kernel, one whose grid follows its var (size 10 * n), and one more fixed kernel."""
    return (launcher(device, 1, [0x1000, 0x2000], static_size=8),
            launcher(device, 2, [0x2000], vals=[3], size_fn=lambda v: (10 * v[0],)),
            launcher(device, 3, [0x3000], static_size=4))


def replay(device, launches):
    device.driver.calls.clear()
    device.run_all(launches)
    device.synchronize()
    return device.driver.calls


def test_the_second_sight_of_a_plan_builds_a_graph_whose_replays_update_only_changed_nodes():
    device = stub_device()
    a, b, c = launches = plan_of_three(device)
    assert replay(device, launches) == [("launch", 1, 2, packed(0x1000, 0x2000)), ("launch", 2, 8, packed(0x2000, 3)),
                                        ("launch", 3, 1, packed(0x3000))]
    assert replay(device, launches) == [("graph",)] and device.stats["graphs_built"] == 1
    assert replay(device, launches) == [("graph",)]
    a.buffer_ptrs[1] = 0x2000      # the address it holds: nothing changes
    b.set_val(0, 3)
    assert replay(device, launches) == [("graph",)]
    b.set_val(0, 5)                # its grid follows: 50 / 4 -> 13 blocks
    a.buffer_ptrs[0] = 0x4000
    assert replay(device, launches) == [("update", 1, 2, packed(0x4000, 0x2000)), ("update", 2, 13, packed(0x2000, 5)),
                                        ("graph",)]
    c.buffer_ptrs[0] = 0x5000      # changed and changed back before the replay: its node is set again, to the same
    c.buffer_ptrs[0] = 0x3000
    assert replay(device, launches) == [("update", 3, 1, packed(0x3000)), ("graph",)]
    assert replay(device, launches) == [("graph",)]
    assert device.stats["node_updates"] == 3 and not any(x.queued for x in launches)


def test_a_kernel_that_waits_for_the_grids_before_it_follows_by_a_programmatic_edge():
    """Hopper's programmatic dependent launch: a node whose kernel waits (its cubin's pj_waits_for_earlier_grids)
    follows the node before by a programmatic edge (released as that grid's blocks have started), any other by a
    completion edge; without PREPJIT_CUDA_PROGRAMMATIC=1 (device.programmatic off) every edge is a completion edge."""
    for programmatic in (True, False):
        device = stub_device(programmatic=programmatic)
        launches = [launcher(device, 1, [0x1000], static_size=8, waits=True),
                    launcher(device, 2, [0x2000], static_size=8, waits=True),
                    launcher(device, 3, [0x3000], static_size=8),
                    launcher(device, 4, [0x4000], static_size=8, waits=True)]
        replay(device, launches)
        replay(device, launches)
        late = "programmatic" if programmatic else "completion"
        assert device.driver.edges == [(1, 2, late), (2, 3, "completion"), (3, 4, late)]
        assert device.stats["programmatic_edges"] == (2 if programmatic else 0)


def test_a_launch_of_no_blocks_is_left_out_and_its_sequence_is_another_graph():
    device = stub_device()
    launches = plan_of_three(device)
    launches[1].set_val(0, 0)
    assert [call[1] for call in replay(device, launches)] == [1, 3]
    assert replay(device, launches) == [("graph",)]
    launches[1].set_val(0, 1)
    assert [call[1:3] for call in replay(device, launches)] == [(1, 2), (2, 3), (3, 1)]   # first sight of (a, b, c)


def test_launches_left_queued_are_launched_before_the_plan_is_queued_again():
    device = stub_device()
    launches = plan_of_three(device)
    device.run_all(launches)       # a call that never reached its sync
    assert all(x.queued for x in launches)
    device.run_all(launches)
    assert len(device._pending) == 3 and [call[1] for call in device.driver.calls] == [1, 2, 3]
    device.synchronize()           # the same sequence again: from its graph
    assert [call[:2] for call in device.driver.calls] == [("launch", 1), ("launch", 2), ("launch", 3), ("graph",)]


def test_patching_a_queued_launch_launches_the_queue_first_with_the_old_arguments():
    device = stub_device()
    launches = plan_of_three(device)
    device.run_all(launches)
    launches[1].set_val(0, 7)
    assert device.driver.calls[1] == ("launch", 2, 8, packed(0x2000, 3)) and not device._pending


def test_without_graphs_each_launch_goes_to_the_stream_at_once():
    device = stub_device(use_graphs=False)
    launches = plan_of_three(device)
    for _ in range(3):
        assert [call[0] for call in replay(device, launches)] == ["launch"] * 3
