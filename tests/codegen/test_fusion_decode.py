"""Fusion rules that cut a decode step's kernel count: a one-element reduction (RMSNorm's mean of squares) is a
prologue of the kernel that reads it; a row written into a cache at a uniform index is read as a
select by the kernel that reads the cache (no copy of the cache, no kernel writing the row); a model computing in
bfloat16 (casts around its norms, softmax and SiLU, each result rounded) fuses like the float32 one."""
import ml_dtypes
import numpy as np
import pytest

import prepjit as pj
import prepjit.numpy as pnp
from examples.models import llama
from examples.models.common import tree_cast
from prepjit.codegen.fused_reductions import PROLOGUE_MAX
from prepjit.codegen.fusion import choose_materialized
from prepjit.codegen.render_llvm import render_llvm
from prepjit.codegen.schedule import schedule
from prepjit.uop import Ops


def _launches(f, *args) -> list[str]:
    return [row["kernel"] for row in pj.profile(f, *args).rows]


def _attend(xp, cache, row, q, pos):
    """q (heads, group, d) against cache[:, :pos + 1] with row `pos` replaced by `row` (heads, d)."""
    if hasattr(cache, "at"):
        keys = cache[:, :pos + 1].at[:, pos].set(row)
    else:
        keys = cache[:, :pos + 1].copy()
        keys[:, pos] = row
    return q @ xp.swapaxes(keys, 1, 2)


@pytest.mark.parametrize("pos", [0, 6, 15])
def test_cache_row_update_is_read_in_place(device, rng, pos):
    cache = rng.standard_normal((3, 16, 8)).astype(np.float32)
    row, q = rng.standard_normal((3, 8)).astype(np.float32), rng.standard_normal((3, 2, 8)).astype(np.float32)
    f = pj.prepare(lambda c, r, q, pos: _attend(pnp, c, r, q, pos), vars={"pos": (0, 15)}, device=device)
    np.testing.assert_allclose(np.asarray(f(cache, row, q, pos)), _attend(np, cache, row, q, pos), rtol=1e-5,
                               atol=1e-5)
    names = _launches(f, cache, row, q, pos)
    assert len(names) == 1, names  # was 3: the cache's live rows copied, the row written, then the contraction
    np.testing.assert_allclose(cache, cache.copy())  # the caller's cache is untouched


@pytest.mark.parametrize("i", [-1, 0, 2])
def test_a_combining_update_at_a_traced_index_wraps_negatives(device, rng, i):
    x, r = rng.standard_normal((5, 4)).astype(np.float32), rng.standard_normal(5).astype(np.float32)

    def g(x, r, i):
        return (x.at[:, i].add(r) * 2).sum(axis=0)
    want = x.copy()
    want[:, i] += r
    f = pj.prepare(g, device=device)
    np.testing.assert_allclose(np.asarray(f(x, r, np.int64(i))), (want * 2).sum(axis=0), rtol=1e-5, atol=1e-5)
    names = _launches(f, x, r, np.int64(i))
    assert len(names) == 2 and not any(n.startswith("S_") for n in names), names  # the sum, the index's range flag


def test_updates_at_varying_indices_still_get_their_kernel(device, rng):
    x, r = rng.standard_normal((6, 3)).astype(np.float32), rng.standard_normal((2, 3)).astype(np.float32)
    ids = np.array([4, 1])
    f = pj.prepare(lambda x, r, ids: x.at[ids].set(r).sum(axis=1), device=device)
    want = x.copy()
    want[ids] = r
    np.testing.assert_allclose(np.asarray(f(x, r, ids)), want.sum(axis=1), rtol=1e-5, atol=1e-5)
    assert any(name.startswith("S_") for name in _launches(f, x, r, ids))


def _rms_norm(xp, x, gain):
    return x / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) + 1e-5) * gain


@pytest.mark.parametrize("n", [576, PROLOGUE_MAX, PROLOGUE_MAX + 64])
def test_a_one_element_reduction_is_its_readers_prologue(device, rng, n):
    """RMSNorm of one row: the mean of squares is computed once at the start of the kernel that scales the row
    (was 2 kernels: the sum, then the scaled row); past PROLOGUE_MAX elements it keeps its own kernel."""
    x, gain = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    f = pj.prepare(lambda x, g: _rms_norm(pnp, x, g), device=device)
    np.testing.assert_allclose(np.asarray(f(x, gain)), _rms_norm(np, x, gain), rtol=1e-5, atol=1e-5)
    assert len(_launches(f, x, gain)) == (1 if n <= PROLOGUE_MAX else 2)


def test_one_element_reductions_feed_each_other_as_prologues(device, rng):
    """A sum read by the elements of another sum's operand: both are prologues of the one kernel that reads them."""
    x = rng.standard_normal((8, 16)).astype(np.float32)

    def g(xp, x):
        centred = x - x.sum() / x.size
        return centred / xp.sqrt((centred * centred).sum())
    f = pj.prepare(lambda x: g(pnp, x), device=device)
    np.testing.assert_allclose(np.asarray(f(x)), g(np, x), rtol=1e-5, atol=1e-5)
    assert len(_launches(f, x)) == 1


def test_the_llvm_prologue_runs_before_the_parallel_loop():
    """The LLVM renderer computes a one-element reduction once per call, before the loop over the outputs (on
    1ca55e1 inside it, once per output: RMSNorm of 16384 floats took 13 ms instead of 50 us)."""
    x = np.ones(576, np.float32)
    traced = pj.trace(lambda x: x / pnp.sqrt((x * x).sum()), x)
    (kernel,) = schedule(list(traced.outputs), list(traced.inputs), pack_contractions=True).kernels
    loop_starts = [line.split(",")[0] for line in render_llvm(kernel.ast).source.splitlines()
                   if line.strip().startswith("store i64 0,") or line.strip().startswith("store i64 %start,")]
    assert [s.strip() for s in loop_starts] == ["store i64 0", "store i64 %start"]  # the sum's loop, then the outputs'


def _decode_launches(device, dtype):
    """The kernels of SmolLM2's decode step in `dtype` with two blocks (SmolLM2's sizes, a small vocabulary, random
    weights, 256 positions), its logits checked against NumPy float32 (bfloat16's tolerance)."""
    cfg = llama.Config(layers=2, dim=576, ff=1536, heads=9, kv_heads=3, vocab=256, context=256, rope_theta=1e5,
                       eps=1e-5)
    rng = np.random.default_rng(0)
    params = llama.random_params(rng, cfg)
    cos, sin = llama.rope_tables(cfg, cfg.context, dtype)
    shape = (cfg.layers, cfg.kv_heads, cfg.context, cfg.head_dim)
    k, v = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    _, decode = llama.prepared(cfg, cfg.context, device=device, dtype=dtype)
    args = (params, np.array([42], np.int64), 200, k, v, cos, sin)
    logits = np.asarray(decode(*args)[0]).astype(np.float32)
    want = llama.decode(np, cfg, params, np.array([42]), 200, k.astype(np.float32), v.astype(np.float32), cos, sin)[0]
    np.testing.assert_allclose(logits, want, rtol=0.1, atol=0.1 * np.abs(want).max())
    return _launches(decode, *args)


def test_a_bfloat16_decode_step_has_the_float32_ones_kernels(device):
    """Casts to and from bfloat16 do not cut kernels: a reduction rounded to bfloat16 is fused as the reduction is
    (softmax's exp is recomputed in its one kernel, not materialised: was 2 kernels), and a widened bfloat16 value
    is materialised narrow, never as a float32 copy next to it (the residual stream: was 2 kernels)."""
    import ml_dtypes
    f32, bf16 = _decode_launches(device, np.float32), _decode_launches(device, ml_dtypes.bfloat16)
    assert len(bf16) == len(f32), (bf16, f32)


def test_a_decode_block_is_seven_kernels(device):
    """SmolLM2's decode step, 2 blocks: the normalised row is computed in the projection reading it (its mean of
    squares the kernel's prologue), SiLU(gate) * up in the down projection, q's and k's RoPE in the scores (k's
    where it is written into the cache's row, and in the stacked new keys): 7 kernels a block, 18 in all (was 12 a
    block, 29; 8 and 20 while k's RoPE had a kernel). On the cpu the kernels compute those operands once per call
    into arrays of their own (operand_prologue.py; before it the cpu kept them materialised: 29). Attention is one
    kernel (softmax_contraction.py; on the cpu llvm_softmax.py: was 3 a block, 18 in all): 14, the last down
    projection a kernel of its own (its sums are no softmax scores, SCORE_MAX: in the head's kernel, whose final norm
    reads it, each work-group computed it, twice; 13 kernels, the cpu's step 1.3 -> 3-5.6 ms)."""
    import ml_dtypes
    for dtype in (np.float32, ml_dtypes.bfloat16):
        names = _decode_launches(device, dtype)
        assert len(names) == 14, names


def _rope(xp, x, cos, sin):
    return llama.rope(xp, x, cos, sin)


def _two_layers(xp, xs, ws, caches, cos, sin, pos, dtype=np.float32):
    """Each layer's key row k = RoPE(x @ w) written into its cache at `pos` and read by its scores against q = x;
    the new key rows stacked (a decode step's attention, keys only), the projection rounded to `dtype`."""
    scores, keys = [], []
    for layer in range(2):
        qk = (xs[layer] @ ws[layer]).astype(dtype)  # q and k side by side, as a model's fused projection
        k = _rope(xp, qk[192:].reshape(3, 64), cos[pos], sin[pos])
        keys.append(k)
        q = qk[:192].reshape(3, 1, 64)
        scores.append(_attend(xp, caches[layer], k, q, pos))
    return xp.stack(scores), xp.stack(keys)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_keys_rope_is_computed_where_the_cache_row_is_read(device, rng, dtype):
    """k's RoPE, read by the scores (through the cache's new row) and by the stacked new keys, is computed in those
    kernels: the projection and the scores a layer, and the two stacks (was 3 a layer: RoPE's index mask, shared by
    its two halves, and in bfloat16 the rounded projection that q and k slice, counted as values other kernels would
    recompute, so k's RoPE had a kernel of its own)."""
    import ml_dtypes
    dt = np.dtype(getattr(ml_dtypes, dtype, dtype))
    xs, ws = rng.standard_normal((2, 192)).astype(np.float32), rng.standard_normal((2, 192, 384)).astype(np.float32)
    caches = rng.standard_normal((2, 3, 16, 64)).astype(dt)
    cos, sin = llama.rope_tables(llama.Config(layers=1, dim=192, ff=8, heads=3, kv_heads=3, vocab=8, context=16,
                                              rope_theta=1e4, eps=1e-5), 16, dt)
    f = pj.prepare(lambda xs, ws, c, cos, sin, pos: _two_layers(pnp, xs, ws, c, cos, sin, pos, dt),
                   vars={"pos": (0, 15)}, device=device)
    tol = 1e-4 if dt == np.float32 else 0.05
    for pos in (0, 9):
        got = f(xs, ws, caches, cos, sin, pos)
        want = _two_layers(np, xs.astype(np.float64), ws.astype(np.float64), caches.astype(np.float64),
                           cos.astype(np.float64), sin.astype(np.float64), pos)
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g).astype(np.float64), w, rtol=tol, atol=tol * np.abs(w).max())
    names = _launches(f, xs, ws, caches, cos, sin, 9)
    assert len(names) == 6, names


def test_a_normalised_row_is_computed_in_the_matvec_reading_it(device, rng):
    """RMSNorm of one row into a projection: one kernel (was 2: the norm, the matvec; on the cpu until its matvecs
    computed such an operand as a prologue)."""
    x, gain = rng.standard_normal(576).astype(np.float32), rng.standard_normal(576).astype(np.float32)
    w = (rng.standard_normal((576, 960)) * 0.05).astype(np.float32)

    def g(xp, x, gain, w):
        return (_rms_norm(xp, x, gain)) @ w
    f = pj.prepare(lambda x, gain, w: g(pnp, x, gain, w), device=device)
    np.testing.assert_allclose(np.asarray(f(x, gain, w)), g(np, x, gain, w), rtol=1e-4, atol=1e-4)
    assert len(_launches(f, x, gain, w)) == 1


@pytest.mark.parametrize("operand", ["norm", "swiglu"])
def test_each_row_of_a_var_batch_fuses_as_one_row(device, rng, operand):
    """A projection of a var batch of rows reads each row's normalised values (the row's mean of squares its
    prologue) or SiLU(gate) * up computed in it, as a one-row projection does: one kernel on the cpu for every row
    count (was 3 for the norm: the sums, the normalised rows, the product; 2 for SiLU); equal to NumPy everywhere."""
    w = (rng.standard_normal((960, 576)) * 0.05).astype(np.float32)
    gain = rng.standard_normal(576).astype(np.float32)

    def g(xp, x, gain, w):
        if operand == "norm":
            return _rms_norm(xp, x, gain) @ w.T
        gate, up = x, x[:, ::-1] * gain
        return gate / (1 + xp.exp(-gate)) * up @ w.T
    f = pj.prepare(lambda x, gain, w: g(pnp, x, gain, w), vars={"B": (1, 16)}, shapes={"x": ("B", 576)},
                   device=device)
    for rows in (1, 5, 16):
        x = rng.standard_normal((rows, 576)).astype(np.float32)
        np.testing.assert_allclose(np.asarray(f(x, gain, w)), g(np, x.astype(np.float64), gain, w), rtol=1e-4,
                                   atol=1e-4)
    if device == "cpu":  # GPUs materialise the rows: a row kernel would recompute them at each weight element
        assert len(_launches(f, x, gain, w)) == 1


def _invariant_nested(ast) -> list:
    """The reductions of kernel `ast` nested in another whose loop they do not depend on (computed again at each
    iteration of it where the kernel computes them inline), but a softmax row's (a row max, the reductions it reads
    and those reading it: softmax_contraction.py's fused attention holds the row once a work-group in local memory,
    which test_softmax_contraction checks)."""
    softmax = set()
    for node in ast.toposort():
        if node.op is Ops.REDUCE and node.arg is Ops.MAX:
            softmax |= set(node.toposort())
    softmax |= {n for n in ast.toposort() if n.op is Ops.REDUCE and softmax & set(n.toposort())}
    found = []
    for outer in ast.toposort():
        if outer.op is Ops.REDUCE:
            loop = set(outer.src[1:])
            found += [inner for inner in outer.src[0].toposort() if inner.op is Ops.REDUCE and inner is not outer
                      and inner not in softmax and not loop & {n for n in inner.src[0].toposort() if n.op is Ops.RANGE}]
    return found


def test_a_batched_decode_block_fuses_as_a_one_row_block(device):
    """llama_paged's decode step of a var batch B (SmolLM2's sizes, 2 blocks, a pool of 256 blocks): outside
    attention each block is the one-row step's four projections (qkv reading the normalised rows, wo, gate/up reading
    the normalised rows, down reading SiLU(gate) * up; q's RoPE computed in the scores), 11 kernels a block on the
    cpu (was 19: each norm's sums and normalised rows, SiLU(gate) * up and q's RoPE had kernels), and the paged
    attention's two-part softmax one kernel (llvm_softmax.py; was 7): 5 kernels a block, plus its returned keys and
    values (each stacked over the layers: 2 kernels for all layers, not 2 a layer); its logits, keys and values
    equal NumPy's for 1 and 3 rows."""
    from examples.models import llama_paged
    cfg = llama.Config(layers=2, dim=576, ff=1536, heads=9, kv_heads=3, vocab=256, context=256, rope_theta=1e5,
                       eps=1e-5)
    rng = np.random.default_rng(0)
    params = llama.random_params(rng, cfg)
    cos, sin = llama.rope_tables(cfg, cfg.context)
    k_pool, v_pool = rng.standard_normal((2, cfg.layers, 256, cfg.kv_heads, 16, cfg.head_dim)).astype(np.float32)
    decode, _ = llama_paged.prepared(cfg, context=256, block_size=16, max_batch=16, max_chunk=32, device=device)
    for ids, pos in (([42], [7]), ([1, 2, 3], [5, 40, 17])):
        ids, pos = np.array(ids), np.array(pos)
        table = np.stack([rng.permutation(256)[:3] for _ in ids])
        args = (params, ids, pos, table, k_pool, v_pool, cos, sin)
        want = llama_paged.decode_batch(np, cfg, *args)
        for got, w in zip(decode(*args), want):
            np.testing.assert_allclose(np.asarray(got), w, rtol=1e-3, atol=1e-3 * np.abs(w).max())
    if device != "cpu":
        return
    names = _launches(decode, *args)
    one_row = _decode_launches(device, np.float32)
    assert [n for n in names if "3_3_" not in n][:8] == ["r_B_960_1", "r_B_576", "r_B_3072_1", "r_B_576"] * 2, names
    assert [n for n in one_row if "3_3_" not in n][:8] == ["r_1_960_1", "r_576", "r_1_3072_1", "r_576"] * 2, one_row
    assert len(names) == 5 * cfg.layers + 4 + 2, names  # + the layers' new keys (RoPE) and values (returned)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_a_gpu_batched_decode_never_computes_a_rows_norm_inside_a_projection(device, dtype):
    """On a GPU a batched decode step (llama_paged, up to 64 rows) computes each norm's rows in a kernel of their
    own: no kernel computes a reduction inside another's loop that it does not depend on, which its many-row kernels
    would compute again at each weight element (in bfloat16 the gate/up projection computed the row's mean of
    squares at each of its 576 terms: 8 ms a call at one row on an H100, a step 245 ms). The cpu computes such a
    row's value once per row (operand_prologue.py): not checked there."""
    if device == "cpu":
        pytest.skip("the cpu's kernels compute a row's prologue once per row")
    from examples.models import llama_paged
    cfg = llama.Config(layers=1, dim=576, ff=1536, heads=9, kv_heads=3, vocab=49152, context=256, rope_theta=1e5,
                       eps=1e-5)   # (SmolLM2's vocabulary: the token table is then the largest array a projection reads)
    rng = np.random.default_rng(0)
    params = tree_cast(llama.random_params(rng, cfg), dtype)
    cos, sin = llama.rope_tables(cfg, cfg.context, dtype)
    k_pool, v_pool = rng.standard_normal((2, cfg.layers, 64, cfg.kv_heads, 16, cfg.head_dim)).astype(dtype)
    decode, _ = llama_paged.prepared(cfg, context=256, block_size=16, max_batch=64, max_chunk=32, device=device,
                                     dtype=dtype)
    args = (params, np.array([42]), np.array([7]), np.array([[3]]), k_pool, v_pool, cos, sin)
    recomputed = {k.kernel.name for k in decode.plan(*args).kernels if _invariant_nested(k.kernel.scheduled)}
    assert not recomputed, recomputed


@pytest.mark.parametrize("limit", [None, 1 << 16])
def test_a_gpu_projection_gets_its_operand_computed_once_where_its_work_groups_would_repeat_much(
        device, rng, monkeypatch, limit):
    """On a GPU (the C-style kernels: row_values) a one-row projection's work-groups of MATVEC_WARPS outputs each
    compute a streamed operand (SwiGLU's SiLU(gate) * up) once; where that repeats more than GROUP_RECOMPUTE_MAX ops
    in all (a 1B model's down projection of 2048 outputs over 8192: 42M, its kernel 55 us on an H100 for 10 MB of
    4-bit weights) the operand is materialised instead (one small kernel). SmolLM2's sizes stay fused under the
    default limit; a limit below theirs (`limit`) materialises the product. The cpu computes such an operand once
    per call (operand_prologue.py): its decisions never count work-groups. Equal to NumPy either way."""
    from prepjit.codegen import fusion
    if limit is not None:
        monkeypatch.setattr(fusion, "GROUP_RECOMPUTE_MAX", limit)
    w = (rng.standard_normal((576, 1536)) * 0.05).astype(np.float32)
    gate, up = rng.standard_normal((2, 1536)).astype(np.float32)

    def g(xp, gate, up, w):
        return gate / (1 + xp.exp(-gate)) * up @ w.T
    traced = pj.trace(lambda gate, up, w: g(pnp, gate, up, w), gate, up, w)
    for row_values in (False, True):
        chosen = choose_materialized(list(traced.outputs), row_values=row_values)
        assert bool(chosen) == (row_values and limit is not None), chosen
        assert all(n.shape == (1536,) and n.op is Ops.MUL for n in chosen), chosen
    f = pj.prepare(lambda gate, up, w: g(pnp, gate, up, w), device=device)
    np.testing.assert_allclose(np.asarray(f(gate, up, w)), g(np, gate, up, w), rtol=1e-4, atol=1e-4)
