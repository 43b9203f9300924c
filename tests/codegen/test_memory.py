"""Memory planning: intermediates with disjoint lifetimes share allocations, results stay exact."""
import numpy as np

import prepjit as pj
from prepjit.codegen.memory import share_memory
from prepjit.codegen.schedule import schedule


def chain(x):
    s = x.sum(axis=0, keepdims=True)
    for _ in range(4):  # each reduction reads only the previous one, so older ones are dead (column reductions
        s = (x * s).max(axis=0, keepdims=True) * 0.5  # broadcast down the rows: kernels of their own)
    return s


def test_dead_intermediates_share_memory_and_results_match(device, rng):
    f = pj.prepare(vars={"n": (1, 64)}, shapes={"x": ("n", 32)}, device=device)(chain)
    x = rng.standard_normal((7, 32)).astype(np.float32)
    plan = f.plan(x)
    io = set(plan.inputs) | set(plan.outputs)
    own_bytes = sum(b.nbytes for i, b in enumerate(plan.buffers) if i not in io)  # intermediates, unshared
    assert plan.memory_bytes < own_bytes
    for n in (1, 7, 64):
        x = rng.standard_normal((n, 32)).astype(np.float32)
        np.testing.assert_allclose(np.asarray(f(x)), chain(x), rtol=1e-4, atol=1e-5)
    assert f.stats["traces"] == 1


def test_io_staging_memory_is_allocated_only_when_used(rng):
    @pj.prepare(vars={"n": (1, 10**9)}, shapes={"x": ("n", 1024)})
    def double(x):  # at the bound, an input staging buffer would need 4 TB
        return x * 2

    x = rng.standard_normal((3, 1024)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(double(x)), x * 2)
    plan = double.plan(x)
    assert plan.memory_bytes == 0 and not any(b.allocated for b in plan.buffers)
    small = pj.prepare(vars={"n": (1, 8)}, shapes={"x": ("n", 4)})(lambda x: x * 2).plan(x[:2, :4])
    small.write_input(0, x[:2, :4])
    small.execute_with_vars({"n": 2})
    np.testing.assert_array_equal(small.read_output(0), x[:2, :4] * 2)


def test_inputs_outputs_and_overlapping_lifetimes_never_share():
    traced = pj.trace(chain, np.ones((4, 32), np.float32))
    sched = schedule(list(traced.outputs), list(traced.inputs))
    home = share_memory(sched)
    io = set(sched.inputs) | set(sched.outputs)
    assert all(home[b] == b for b in io) and all(home[b] not in io for b in range(len(home)) if b not in io)
    for k, kernel in enumerate(sched.kernels):  # buffers used by one kernel live in distinct allocations
        homes = [home[b] for b in kernel.buffers]
        assert len(set(homes)) == len(homes)
    assert len(set(home)) < len(home)


def test_fori_loop_carries_and_body_buffers_are_not_clobbered(device, rng):
    def body(i, carry):
        x, acc = carry
        x = x - x.sum(axis=0, keepdims=True) * 0.1
        return x, acc + x.max(axis=0)

    def f(x):
        return pj.fori_loop(0, 5, body, (x, x[0] * 0))

    g = pj.prepare(device=device)(f)
    x = rng.standard_normal((6, 3)).astype(np.float32)
    want_x, want_acc = x, x[0] * 0
    for _ in range(5):
        want_x = want_x - want_x.sum(axis=0, keepdims=True) * np.float32(0.1)
        want_acc = want_acc + want_x.max(axis=0)
    got_x, got_acc = g(x)
    np.testing.assert_allclose(np.asarray(got_x), want_x, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(got_acc), want_acc, rtol=1e-5, atol=1e-6)


def test_blocks_share_one_allocation_for_their_largest_buffer():
    """Each block: a medium buffer made before its large one, read after it and by the next block's first kernel (a
    block's qkv around its attention scores). The next block's medium buffer must not take the large allocation its
    large buffer then needs, block after block: the blocks' large buffers share one allocation."""
    from prepjit.codegen.memory import nbytes
    from prepjit.codegen.schedule import BufferSpec, KernelSequence, Schedule, ScheduledKernel
    from prepjit.uop import UOp, dtypes
    big, medium, small = 1 << 20, 1 << 14, 1 << 10
    buffers, kernels, x, last = [BufferSpec(dtypes.float32, (small,), small)], [], 0, 0
    for _ in range(4):
        m, b, out = len(buffers), len(buffers) + 1, len(buffers) + 2
        buffers += [BufferSpec(dtypes.float32, (n,), n) for n in (medium, big, small)]
        ast = UOp.const(0)
        kernels += [ScheduledKernel(ast, (m, x, last)), ScheduledKernel(ast, (b, m)), ScheduledKernel(ast, (out, b, m))]
        x, last = out, m
    sched = Schedule(tuple(buffers), KernelSequence(kernels), (0,), (x,))
    home = share_memory(sched)
    io = {0, x}
    allocations = {}  # home -> its bytes: its largest buffer's (planner.instantiate)
    for b in range(len(buffers)):
        if b not in io:
            allocations[home[b]] = max(allocations.get(home[b], 0), nbytes(buffers[b]))
    assert sum(allocations.values()) < 2 * nbytes(buffers[2])
