"""Kernels that differ only in a constant buffer offset (a layer's slice of a stacked array) share one AST,
the offset a fixedvar: one compile for all layers, each launch at its own offset, every offset proven."""
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen import schedule as schedule_module
from prepjit.codegen.offsets import share_offsets, without_starts
from prepjit.codegen.schedule import ScheduledKernel
from prepjit.uop import Ops, UOp, dtypes


def layers(xp, stack, h):
    for layer in range(stack.shape[0]):
        h = xp.tanh(h @ stack[layer])
    return h


@pytest.mark.parametrize("symbolic", [False, True])
def test_layers_share_one_kernel(device, rng, symbolic):
    stack = rng.standard_normal((5, 8, 8)).astype(np.float32) * 0.3
    h = rng.standard_normal((3, 8)).astype(np.float32)
    kwargs = {"vars": {"n": (1, 16)}, "shapes": {"h": ("n", 8)}} if symbolic else {}
    f = pj.prepare(lambda stack, h: layers(pnp, stack, h), device=device, **kwargs)
    np.testing.assert_allclose(np.asarray(f(stack, h)), layers(np, stack, h), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(f(stack, h[:2])), layers(np, stack, h[:2]), rtol=1e-5, atol=1e-6)
    plan = f.plan(stack, h)
    offsets = sorted(v for k in plan.kernels for n, v in k.fixedvars.items() if n.startswith("offset"))
    assert offsets == [64 * layer for layer in range(5)]  # each layer's slice of the stack, one launch each
    assert len({k.kernel for k in plan.kernels}) < 5  # the five layers' kernels are one compiled kernel
    assert "offset" not in " ".join(plan.vars)  # the plan fixes them: a caller never supplies them


def gathered_layers(xp, stack, ids, h):
    """Each layer gathers rows of its slice of the stack (a paged KV cache's k_pool[layer][block_table]): the
    gathered ids clamped into the slice's rows, a min and max in the stack's index."""
    for layer in range(stack.shape[0]):
        h = xp.tanh(h @ stack[layer][ids])
    return h


@pytest.mark.parametrize("gather", [False, True])
def test_layers_lowered_once(monkeypatch, rng, gather):
    """The layers' kernels, each reading its slice of the stack, are lowered once (at the slice's start 0), each
    layer's AST moved from it: exactly the AST the layer's own graph lowers to, and its own reads. Also where the
    slice's index clamps a gathered id (its min and max do not hold the slice's start)."""
    lowered, checked = [], []
    lower_kernel, lower = schedule_module.lower_kernel, schedule_module._Scheduler.lower

    def counted(root, is_buffer):
        lowered.append(root)
        return lower_kernel(root, is_buffer)

    def compared(self, node):
        ast, reads, packed = lower(self, node)
        canon, values, readers = self.canonical(node)
        if without_starts(canon, readers)[1]:
            own, slots = lower_kernel(canon, schedule_module._is_slot)
            assert (own, [values[p.arg[0][1]] for p in slots]) == (ast, reads)
            checked.append(ast)
        return ast, reads, packed
    monkeypatch.setattr(schedule_module, "lower_kernel", counted)
    monkeypatch.setattr(schedule_module._Scheduler, "lower", compared)
    h = rng.standard_normal((3, 8)).astype(np.float32)
    if gather:
        stack, ids = rng.standard_normal((5, 6, 8)).astype(np.float32) * 0.3, np.array([4, 0, 5, 5, 1, 2, 3, 0])
        f = pj.prepare(lambda stack, ids, h: gathered_layers(pnp, stack, ids, h), device="cpu")
        np.testing.assert_allclose(np.asarray(f(stack, ids, h)), gathered_layers(np, stack, ids, h), rtol=1e-5,
                                   atol=1e-6)
    else:
        stack = rng.standard_normal((5, 8, 8)).astype(np.float32) * 0.3
        f = pj.prepare(lambda stack, h: layers(pnp, stack, h), device="cpu")
        np.testing.assert_allclose(np.asarray(f(stack, h)), layers(np, stack, h), rtol=1e-5, atol=1e-6)
    assert len(set(checked)) == 4  # layers 1-4 moved from layer 0's lowering, each its own AST
    assert len(lowered) < 5  # not one lowering per layer


def _copy_kernel(shift: int, name="E_4") -> UOp:
    """out[r] = x[r + shift] for r < 4."""
    r = UOp(Ops.RANGE, dtypes.index, (UOp.const(4),), (0, "loop"))
    src = UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 1), r + shift))
    store = UOp(Ops.STORE, dtypes.bool, (UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0), r, src))
    return UOp(Ops.SINK, dtypes.bool, (store,), name)


def test_gathering_layers_share_one_kernel(device, rng):
    """Layers gathering rows of their slice of the stack (a paged KV cache's k_pool[layer][block_table]: a load
    in the stack's index) share one compiled kernel too, each launch at its layer's offset."""
    stack, ids = rng.standard_normal((5, 6, 8)).astype(np.float32) * 0.3, np.array([4, 0, 5, 5, 1, 2, 3, 0])
    h = rng.standard_normal((3, 8)).astype(np.float32)
    f = pj.prepare(lambda stack, ids, h: gathered_layers(pnp, stack, ids, h), device=device)
    np.testing.assert_allclose(np.asarray(f(stack, ids, h)), gathered_layers(np, stack, ids, h), rtol=1e-5,
                               atol=1e-6)
    plan = f.plan(stack, ids, h)
    offsets = sorted(v for k in plan.kernels for n, v in k.fixedvars.items() if n.startswith("offset"))
    assert offsets == [48 * layer for layer in range(5)]
    assert len({k.kernel for k in plan.kernels}) < 5


def test_offsets_become_bounded_fixedvars():
    kernels = [ScheduledKernel(_copy_kernel(s), (0, i + 1)) for i, s in enumerate((0, 4, 12))]
    out = share_offsets(kernels, lambda k: ((4,), (16,)), taken={"offset1"})
    assert len({k.ast for k in out}) == 1
    (var,) = out[0].ast.variables()
    assert var.arg == ("offset1_1", 0, 12)  # named apart from a var in use, bounded by the offsets seen
    assert [k.fixedvars for k in out] == [(("offset1_1", s),) for s in (0, 4, 12)]


def test_kernels_that_differ_otherwise_stay_apart():
    kernels = [ScheduledKernel(_copy_kernel(0), (0, 1)), ScheduledKernel(_copy_kernel(4, "E_4b"), (0, 2)),
               ScheduledKernel(_copy_kernel(8), (0, 3))]
    # other buffer shapes: not shared (a proof over both offsets could fail where each alone passes)
    out = share_offsets(kernels, lambda k: ((4,), (k.buffers[1] * 8,)), taken=set())
    assert [k.ast for k in out] == [k.ast for k in kernels]
