"""Fusion decisions: a value several kernels read is computed once when recomputing it costs more."""
import math

import ml_dtypes
import numpy as np

import prepjit as pj
import prepjit.numpy as pnp
from prepjit.codegen.fusion import choose_materialized
from prepjit.codegen.schedule import schedule
from prepjit.uop import Ops, dtypes


def chain(a, b, steps):
    for _ in range(steps):
        a = a - a.sum() * 0.01 + b
    return a


def _schedule(fn, *args):
    traced = pj.trace(fn, *args)
    return traced, schedule(list(traced.outputs), list(traced.inputs))


def test_single_reader_values_are_always_inlined():
    x = np.ones((64, 64), np.float32)
    traced, sched = _schedule(lambda x: (x * 2 + 1).sum(axis=1), x)
    assert choose_materialized(list(traced.outputs)) == set()
    assert len(sched.kernels) == 1


def test_large_shared_chain_values_are_materialised(device, rng):
    a, b = (rng.random(100_000).astype(np.float32) for _ in range(2))
    traced, sched = _schedule(lambda a, b: chain(a, b, 10), a, b)
    assert choose_materialized(list(traced.outputs))  # the running value feeds a sum and the next step
    f = pj.prepare(device=device)(lambda a, b: chain(a, b, 10))
    want = chain(a, b, 10)
    np.testing.assert_allclose(np.asarray(f(a, b)), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_small_chains_stay_fused_but_kernels_stay_bounded(device, rng):
    a, b = (rng.random(16).astype(np.float32) for _ in range(2))
    _, short = _schedule(lambda a, b: chain(a, b, 10), a, b)
    assert len(short.kernels) == 1  # the ten sums are one kernel's prologues, in order: recomputing 16 elements is
    # cheaper (on 1ca55e1: ten reductions and the result, 11 kernels)
    g = pj.prepare(lambda a, b: chain(a, b, 10), device=device)
    np.testing.assert_allclose(np.asarray(g(a, b)), chain(a, b, 10), rtol=1e-5, atol=1e-5)
    _, long = _schedule(lambda a, b: chain(a, b, 80), a, b)
    biggest = max(len(k.ast.toposort()) for k in long.kernels)
    assert biggest < 200  # without materialising, the last kernel inlines all 80 steps (over 400 nodes)
    f = pj.prepare(lambda a, b: chain(a, b, 80), device=device)
    np.testing.assert_allclose(np.asarray(f(a, b)), chain(a, b, 80), rtol=1e-4, atol=1e-4)


def _ops(kernel):
    return {u.op for u in kernel.ast.toposort()}


def _gelu_ffn(x, w1, b1, w2, b2):
    h = x @ w1 + b1
    return (h * 0.5 * (1 + pnp.erf(h * np.float32(0.7071067811865476)))) @ w2 + b2


def test_contraction_operand_is_materialised_not_recomputed_per_column(device, rng):
    """GELU of an up-projection feeds a down-projection that reads each of its values once per output
    column: the erf runs in one kernel (the up-projection's, as its epilogue), the down-projection reads
    a buffer, and each projection is one kernel with its bias."""
    x = rng.standard_normal((16, 32)).astype(np.float32)
    w1, w2 = rng.standard_normal((32, 64)).astype(np.float32), rng.standard_normal((64, 32)).astype(np.float32)
    b1, b2 = rng.standard_normal(64).astype(np.float32), rng.standard_normal(32).astype(np.float32)
    _, sched = _schedule(_gelu_ffn, x, w1, b1, w2, b2)
    assert len(sched.kernels) == 2
    up, down = sched.kernels
    assert Ops.ERF in _ops(up) and Ops.REDUCE in _ops(up)
    assert Ops.ERF not in _ops(down) and Ops.REDUCE in _ops(down)
    f = pj.prepare(device=device, vars={"n": (1, 64)}, shapes={"x": ("n", None)})(_gelu_ffn)
    h = x @ w1 + b1
    want = (h * 0.5 * (1 + np.vectorize(math.erf)(h * 0.7071067811865476))).astype(np.float32) @ w2 + b2
    np.testing.assert_allclose(np.asarray(f(x, w1, b1, w2, b2)), want, rtol=1e-4, atol=1e-4)


def test_relu_operand_of_a_contraction_is_computed_once(rng):
    x = rng.standard_normal((64, 16)).astype(np.float32)
    w = rng.standard_normal((16, 64)).astype(np.float32)
    _, sched = _schedule(lambda x, w: pnp.maximum(x @ w + 1, 0) @ w.T, x, w)
    assert [Ops.MAX in _ops(k) for k in sched.kernels] == [True, False]


def test_value_broadcast_into_a_reduction_is_materialised(device, rng):
    """exp(a) broadcast along the middle axis of a reduction would be evaluated 64 times per value inlined."""
    a, b = rng.standard_normal((8, 32)).astype(np.float32), rng.standard_normal((64, 32)).astype(np.float32)
    fn = lambda a, b: (pnp.exp(a)[:, None, :] * b[None, :, :]).sum(axis=-1)  # noqa: E731
    _, sched = _schedule(fn, a, b)
    exps = [k for k in sched.kernels if Ops.EXP in _ops(k)]
    assert len(exps) == 1 and Ops.REDUCE not in _ops(exps[0])
    got = pj.prepare(device=device)(fn)(a, b)
    np.testing.assert_allclose(np.asarray(got), (np.exp(a)[:, None, :] * b[None]).sum(-1), rtol=1e-4, atol=1e-4)


def test_reduction_read_element_for_element_is_computed_in_its_reader(device, rng):
    """A bias after a matmul and a reshape of a sum store from the reduction's kernel; so does a row's
    mean read broadcast along the row (x - mean: a work-group per row on GPUs)."""
    x = rng.standard_normal((16, 24)).astype(np.float32)
    w, b = rng.standard_normal((24, 8)).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    _, sched = _schedule(lambda x, w, b: pnp.tanh(x @ w + b), x, w, b)
    assert len(sched.kernels) == 1
    _, sched = _schedule(lambda x: x.sum(axis=1).reshape(4, 4) * 2, x)
    assert len(sched.kernels) == 1
    _, sched = _schedule(lambda x: x - x.mean(axis=1, keepdims=True), x)
    assert len(sched.kernels) == 1
    f = pj.prepare(device=device)(lambda x, w, b: (pnp.tanh(x @ w + b), x.sum(axis=1).reshape(4, 4) * 2))
    got_mm, got_sum = f(x, w, b)
    np.testing.assert_allclose(np.asarray(got_mm), np.tanh(x @ w + b), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got_sum), x.sum(axis=1).reshape(4, 4) * 2, rtol=1e-5, atol=1e-5)


def test_cheap_operand_read_once_per_output_column_is_materialised(rng):
    """A bias add (one op, two loads) read by a contraction with 256 output columns: computed once."""
    x, b = rng.standard_normal((64, 32)).astype(np.float32), rng.standard_normal(32).astype(np.float32)
    w = rng.standard_normal((32, 256)).astype(np.float32)
    traced, sched = _schedule(lambda x, b, w: (x + b) @ w, x, b, w)
    assert len(choose_materialized(list(traced.outputs))) == 1 and len(sched.kernels) == 2
    np.testing.assert_allclose(np.asarray(pj.prepare(lambda x, b, w: (x + b) @ w)(x, b, w)), (x + b) @ w,
                               rtol=1e-4, atol=1e-4)


def test_row_reductions_are_computed_in_the_kernel_that_broadcasts_them(device, rng):
    """Softmax over rows is one kernel: its max and sum are computed once per row before the row's elements
    (llvm loop nests where the row's loops are open, C-style renderers by a work-group per row); reductions
    broadcast down columns keep kernels of their own."""
    x = rng.standard_normal((16, 48)).astype(np.float32)

    def softmax(x):
        e = pnp.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    traced = pj.trace(softmax, x)
    assert len(schedule(list(traced.outputs), list(traced.inputs), pack_contractions=True).kernels) == 1
    assert len(schedule(list(traced.outputs), list(traced.inputs)).kernels) == 1

    def layernorm(x):   # its mean and scale are cheap values of reductions: recomputed, not given buffers
        mu = x.mean(axis=1, keepdims=True)
        return (x - mu) / pnp.sqrt(((x - mu) ** 2).mean(axis=1, keepdims=True) + 1e-5)
    norm = pj.trace(layernorm, x)
    assert len(schedule(list(norm.outputs), list(norm.inputs)).kernels) == 1
    columns = pj.trace(lambda x: x - x.max(axis=0, keepdims=True), x)
    assert len(schedule(list(columns.outputs), list(columns.inputs), pack_contractions=True).kernels) == 2
    e = np.exp(x - x.max(1, keepdims=True))
    f = pj.prepare(vars={"n": (1, 64)}, shapes={"x": ("n", 48)}, device=device)(softmax)
    np.testing.assert_allclose(np.asarray(f(x)), e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)


def _inline_costs(outputs):
    """The largest inline cost any kernel root reaches once the chosen values are cut (loads cost 1)."""
    from prepjit.codegen.fusion import MAX_KERNEL_COST, OP_COST, kernel_roots
    from prepjit.codegen.lower import REALIZED
    from prepjit.uop.ops import ELEMENTWISE
    graph, roots = kernel_roots(outputs)
    chosen = choose_materialized(outputs)
    cost = {}
    for node in reversed(graph):
        own = OP_COST.get(node.op, 1) if node.op in ELEMENTWISE else 0
        cost[node] = own + sum(1 if s.op in REALIZED or s in chosen else cost[s] for s in node.src)
    return max(cost[r] for r in roots), MAX_KERNEL_COST


def test_a_value_read_at_two_places_in_a_chain_is_cut_so_kernels_do_not_double(device):
    def rotate(x, steps=14):  # each step reads the last twice: inlined, the expression has 2**14 loads
        for _ in range(steps):
            x = pnp.concatenate([x[1:], x[:1]])
        return x
    x = np.arange(10, dtype=np.float32)
    traced = pj.trace(pj.prepare(rotate, vars={"n": (1, 10)}, shapes={"x": ("n",)}), x)
    largest, limit = _inline_costs(list(traced.outputs))
    assert largest < 1024
    f = pj.prepare(rotate, vars={"n": (1, 10)}, shapes={"x": ("n",)}, device=device)
    for n in (1, 7, 10):
        want = x[:n]
        for _ in range(14):
            want = np.concatenate([want[1:], want[:1]])
        np.testing.assert_array_equal(np.asarray(f(x[:n])), want)


def test_a_long_elementwise_chain_is_split_into_kernels_of_bounded_size():
    def long(x):
        for i in range(600):
            x = x * 1.0001 + 0.5 if i % 2 else pnp.sin(x)
        return x
    x = np.linspace(-1, 1, 32).astype(np.float32)
    traced = pj.trace(pj.prepare(long), x)
    largest, limit = _inline_costs(list(traced.outputs))
    assert largest <= limit + 32
    f = pj.prepare(long)
    np.testing.assert_allclose(np.asarray(f(x)), long.__wrapped__(x) if hasattr(long, "__wrapped__") else _np_long(x),
                               rtol=1e-4, atol=1e-5)


def _np_long(x):
    for i in range(600):
        x = x * np.float32(1.0001) + np.float32(0.5) if i % 2 else np.sin(x)
    return x


def test_values_read_several_times_at_one_index_are_computed_once_inline():
    """Reading a value thrice at the same index (sin(x * x) + x / 2) computes it once in the kernel: the inline cost
    is the DAG's, not its unfolded tree's (which triples each step), so a 30-step chain stays one kernel."""
    def mix(x):
        for _ in range(30):
            x = pnp.sin(x * x) + x * 0.5
        return x
    x = np.linspace(-1, 1, 64).astype(np.float32)
    traced = pj.trace(pj.prepare(mix), x)
    assert choose_materialized(list(traced.outputs)) == set()
    want = x
    for _ in range(30):
        want = np.sin(want * want) + want * np.float32(0.5)
    f = pj.prepare(mix)
    np.testing.assert_allclose(np.asarray(f(x)), want, rtol=1e-4, atol=1e-5)
    assert len(f.plan(x).kernels) == 1


def test_rows_a_reduction_sums_across_are_stored_by_their_row_kernel(device, rng, monkeypatch):
    """A LayerNorm's rows (16-bit, or float32) summed across the rows by a masked pooling (MiniLM's last layer and
    mean pooling): on the work-group targets the normalised rows are stored by one row kernel computing their mean and
    variance, and the pooling reads them: two kernels, no float32 row buffer in the 16-bit case. Inlined into the
    pooling, whose every iteration is another row, the rows' mean and variance were kernels of their own (three)."""
    from prepjit.codegen import fusion

    def pooled(x, mask):
        wide = x.astype(np.float32)
        centered = wide - pnp.mean(wide, axis=-1, keepdims=True)
        rows = (centered / pnp.sqrt(pnp.mean(centered * centered, axis=-1, keepdims=True) + 1e-5)).astype(x.dtype)
        return pnp.sum(rows * mask[:, :, None], axis=1)
    mask = (rng.random((4, 64)) > 0.3).astype(np.float32)
    for dtype in (ml_dtypes.bfloat16, np.float32):
        x = (rng.standard_normal((4, 64, 96)) * 3 + 1).astype(dtype)
        traced = pj.trace(pooled, x, mask)
        sched = schedule(list(traced.outputs), list(traced.inputs))
        assert len(sched.kernels) == 2
        if dtype != np.float32:
            assert not any(b.dtype == dtypes.float32 and b.max_size == x.size for b in sched.buffers)
        monkeypatch.setattr(fusion, "STORE_ROWS_REDUCED_ACROSS", False)
        assert len(schedule(list(traced.outputs), list(traced.inputs)).kernels) == 3
        monkeypatch.setattr(fusion, "STORE_ROWS_REDUCED_ACROSS", True)
        wide = x.astype(np.float32)
        centered = wide - wide.mean(-1, keepdims=True)
        rows = (centered / np.sqrt((centered * centered).mean(-1, keepdims=True) + 1e-5)).astype(dtype)
        want = (rows.astype(np.float32) * mask[:, :, None]).sum(1)
        got = np.asarray(pj.prepare(pooled, device=device)(x, mask))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=0.02 if dtype != np.float32 else 1e-4)


def _normed_times_unpacked(x, q, scale):
    normed = x / pnp.sqrt((x * x).mean(axis=1, keepdims=True) + 1e-6)
    weight = ((q >> 4) & 15).astype(pnp.float32) * scale - ((q & 15).astype(pnp.float32) * scale)
    return normed @ weight


def test_the_reductions_walk_does_not_enter_what_has_no_reduction_under_it(monkeypatch):
    """fused_reductions' walks (_reductions_read) skip a value with no reduction under it (a quantized weight's
    unpacking: most of a model's walking) and still find each kernel's reductions in the order a full walk does."""
    from prepjit.codegen import fused_reductions as fr
    from prepjit.codegen.fusion import inlined_scatters, kernel_roots
    x = np.ones((4, 32), np.float32)
    q, scale = np.ones((32, 48), np.uint8), np.ones((1, 48), np.float32)
    outputs = list(pj.trace(_normed_times_unpacked, x, q, scale).outputs)
    walk = kernel_roots(outputs)
    under = fr._under(walk[0], Ops.REDUCE_AXIS)
    assert any(not under[n] and n.op in (Ops.SHR, Ops.AND, Ops.CAST) for n in walk[0])   # the unpacking's nodes
    walked, full_walk = [], fr._reductions_read
    read_axes = fr.read_axes

    def recorded(n, axes):
        walked.append(n)
        return read_axes(n, axes)

    def compared(root, materialized, fused, under):
        start = len(walked)
        out = full_walk(root, materialized, fused, under)
        entered = walked[start:]
        assert all(under[n] for n in entered if n is not root)
        assert full_walk(root, materialized, fused, {}) == out   # (entering everything: the same reductions)
        return out
    monkeypatch.setattr(fr, "read_axes", recorded)
    monkeypatch.setattr(fr, "_reductions_read", compared)
    materialized = choose_materialized(outputs, walk=walk, operand_prologues=True)
    fused = fr.fused_reductions(outputs, materialized, rows=True, one_contraction=True,
                                inlined=frozenset(inlined_scatters(outputs, walk=walk)), walk=walk, row_prologues=True)
    assert any(n.op is Ops.REDUCE_AXIS for n in fused) and walked
