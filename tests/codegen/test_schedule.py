"""Scheduling: which values get buffers, fusion of elementwise work, kernel counts, loop unrolling."""
import numpy as np

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen.schedule import schedule
from prepjit.uop import Ops
from tests.helpers import assert_matches

A = np.arange(12, dtype=np.float32).reshape(3, 4)


def sched(fn, *args, **prepare_kwargs):
    traced = pj.trace(pj.prepare(fn, **prepare_kwargs), *args)
    return schedule(list(traced.outputs), list(traced.inputs))


def test_elementwise_chain_is_one_kernel():
    s = sched(lambda a, b: a * b + 1, A, A)
    assert len(s.kernels) == 1
    assert len(s.buffers) == 3 and s.inputs == (0, 1) and s.outputs == (2,)
    assert s.kernels[0].buffers == (2, 0, 1)


def test_views_are_fused_not_copied():
    s = sched(lambda a: (a.T[::-1] * 2).reshape(2, 6)[:, 1:] + pnp.expand_dims(a, 0).sum(axis=0)[0, 0], A)
    assert sum(1 for k in s.kernels if "r_" not in k.ast.arg) == 1


def test_softmax_over_rows_is_at_most_three_kernels(device):
    def softmax(x):
        e = pnp.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    s = sched(softmax, A)
    assert len(s.kernels) <= 3
    out = pj.prepare(softmax, device=device)(A)
    e = np.exp(A - A.max(1, keepdims=True))
    assert_matches(out, e / e.sum(1, keepdims=True))


def test_reduction_gets_a_buffer_and_matmul_is_one_kernel():
    s = sched(lambda a, b: a @ b, A, A.T.copy())
    assert len(s.kernels) == 1
    assert s.kernels[0].ast.toposort()[-1].op is Ops.SINK
    assert any(u.op is Ops.REDUCE for u in s.kernels[0].ast.toposort())


def test_repeated_output_is_computed_once():
    traced = pj.trace(lambda a: (a + 1, a + 1), A)
    s = schedule(list(traced.outputs), list(traced.inputs))
    assert len(s.kernels) == 1 and s.outputs[0] == s.outputs[1]


def test_buffers_are_sized_for_var_maxima():
    s = sched(lambda x, pos: x[:, :pos + 1] * 2, np.ones((3, 8), np.float32), 2,
              vars={"n": (1, 10), "pos": (0, 7)}, shapes={"x": ("n", 8)})
    out = s.buffers[s.outputs[0]]
    assert out.max_size == 10 * 8
    assert s.buffers[s.inputs[0]].max_size == 10 * 8


def test_fori_loop_unrolls_with_ping_pong_buffers_and_fixedvars():
    s = sched(lambda x: pj.fori_loop(2, 6, lambda i, c: c * 2 + i, x), A)
    body = [k for k in s.kernels if k.fixedvars]
    assert [dict(k.fixedvars) for k in body] == [{"i": k} for k in range(2, 6)]
    assert len({k.ast for k in body}) == 1
    writes = [k.buffers[0] for k in body]
    reads = [k.buffers[1] for k in body]
    assert writes[0] != writes[1] and writes[0] == writes[2]
    assert reads[1:] == writes[:-1]


def test_loop_invariant_reduction_is_hoisted():
    s = sched(lambda x: pj.fori_loop(0, 5, lambda i, c: c + x.sum(), x), A)
    reduces = [k for k in s.kernels if any(u.op is Ops.REDUCE for u in k.ast.toposort())]
    assert len(reduces) == 1 and not reduces[0].fixedvars


def test_a_loop_reading_an_earlier_loop_with_the_same_counter_hoists_it():
    """Two loops in a row whose counters share a name and bounds share the var UOp: the second one's body reads
    the first loop's result (and a sum of it), which must run once, before it, not once per iteration."""
    def f(x):
        first = pj.fori_loop(0, 4, lambda t, c: c * 0.5 + 1, x)
        total = first.sum()
        return pj.fori_loop(0, 4, lambda t, c: c + total, x)
    s = sched(f, A)
    assert len([k for k in s.kernels if any(u.op is Ops.REDUCE for u in k.ast.toposort())]) == 1
    assert len([k for k in s.kernels if k.fixedvars]) == 8  # each loop's body once per iteration, no more
    first = A.copy()
    for _ in range(4):
        first = first * 0.5 + 1
    assert_matches(pj.prepare(f)(A), A + 4 * first.sum(), rtol=1e-5)


def test_a_reduction_only_rounded_is_stored_rounded_on_gpus():
    """A bfloat16 matmul that only another matmul reads (through a head split: the attention's context read by the
    output projection) is stored by its kernel as bfloat16 on the work-group targets (half the bytes; the tile that
    reads it copies a 16-bit operand as it is), as float32 accumulators rounded where read on the cpu."""
    import ml_dtypes
    rng = np.random.default_rng(0)
    x, w1, w2 = (rng.standard_normal(s, np.float32).astype(ml_dtypes.bfloat16) for s in ((64, 32), (32, 48), (48, 16)))

    def fn(x, w1, w2):
        h = x @ w1
        return pnp.swapaxes(h.reshape(8, 8, 48), 0, 1).reshape(64, 48) @ w2
    traced = pj.trace(pj.prepare(fn), x, w1, w2)
    for packed, dtype in ((False, "bfloat16"), (True, "float32")):
        s = schedule(list(traced.outputs), list(traced.inputs), pack_contractions=packed)
        first = next(k for k in s.kernels if s.buffers[k.buffers[0]].max_size == 64 * 48)
        assert s.buffers[first.buffers[0]].dtype == dtype
