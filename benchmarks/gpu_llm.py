"""SmolLM2-135M on a GPU in one call (issues 23 and 24): decode with 4-bit weights against prepjit's own bfloat16
decode, and serving 64 concurrent greedy sequences through examples/engine.py against one stream.

    python -m benchmarks.gpu_llm [--device cuda] [--quick] [--out FILE] [--layers N] [--streams N] [--model M]

The weights are random, of SmolLM2-135M's shapes (benchmarks/gpu_models.SMOLLM2; the model file stays off the GPU
machine; `--model tinyllama`: TinyLlama-1.1B's, whose decode moves 8x the bytes, so that its weights' size, not
its ~130 launches, bounds a step), stored the ways examples/models/llama.py reads them: bfloat16 floats, or q4_1 /
q8_0 blocks made by pj.quant.quantize ({kind: blocks}, a row of blocks per output feature, the token table too),
which the plans dequantize inside the kernels that read them (the path of smollm2_generate.py --weights q4_1).
Every row is one JSON line, printed and written to --out:

- `decode_<weights>`: one decode step (llama.prepared's decode plan, position POS of a CONTEXT-token cache,
  computing in --dtype) with weights, KV cache and RoPE tables resident on the device: median ms of synchronised
  calls after warm-up, the plan's kernels per step, its weight bytes, and the logits checked against the same model
  code run by NumPy in float32 on the dequantized weights (cosine, largest difference / largest logit, argmax);
- `decode_q4_1_vs_bf16`: the ratio of the two steps' times (issue 23's goal: at most 0.7);
- `serve_step_b1_vs_b<streams>`: the engine's var-batch decode plan alone at one sequence and at --streams, the KV
  pool resident on the device (as the engine keeps it) and passed as a NumPy array (uploaded by every call, as
  the engine did before it kept the pool on the device): ms per step and the tokens/s ratio;
- `serve_<streams>_vs_1`: examples/engine.py with token ids for prompts (no tokenizer): output tokens/s of a few
  sequences each run alone against all --streams submitted together (greedy, --new-tokens each, prefill
  included), the greedy tokens of the sequences run alone equal to theirs in the batch, and the traces/compiles of
  the engine's plans (one plan for every batch composition: none after warm-up). The engine prefills as many
  prompts per step as its prefill token budget holds (`widest_decode_batch`: the most sequences one decode step
  held);
- `serve_lockstep_<streams>_vs_1`: the engine's plans, pool and block tables driven the way the engine drives them
  but every prompt prefilled first (as many per call as the engine's budget holds), then every decode step over
  all --streams: tokens/s overall and over the decode
  steps against one sequence driven the same way (issue 24's goal, at least 20x, on the decode steps), tokens equal
  to the engine's;
- `serve_padded_buckets`: the same --streams through the engine and in lockstep with its decode step replaced by
  benchmarks/serving_cases.PaddedBuckets (a static plan per power-of-two batch up to --streams, the table padded
  to the whole context), unless --quick or the time budget is spent.

A failed check is recorded in its row ("ok": false) and the script exits with status 1 after writing every row;
a row that raises records its error and the next row runs. `--only decode|serve` runs one group. Most of a first
run's time is compiling: ~30 kernels for the three decode plans, ~180 for the engine's two, ~600 for the seven
padded buckets (on this repository's 2-core CPU host the whole default run takes ~3 minutes, the buckets' prepare
~23 s of it), which start only while less than --budget-s seconds have passed.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import attrs
import numpy as np

import prepjit as pj
from examples import engine as serving
from examples.models import llama
from examples.models.common import DTYPES, tree_cast

from .gpu import median_us
from .gpu_models import CONTEXT, POS, SMOLLM2, TINYLLAMA, cosine
from .serving_cases import PaddedBuckets

SERVE_CONTEXT, BLOCK_SIZE = 256, 16
MODELS = {"smollm2": SMOLLM2, "tinyllama": TINYLLAMA}
COSINE_MIN = {"float32": 0.9999, "bfloat16": 0.995, "float16": 0.998}  # decode logits vs NumPy float32


def _quantized(w, kind: str) -> dict:
    """A float matrix (out, in) as {kind: blocks}, a row of blocks per output feature."""
    return {kind: pj.quant.quantize(w, kind)}


def stored_params(params32: dict, weights: str) -> dict:
    """random_params' float32 tree stored as `weights`: a float dtype name of DTYPES (every array cast, as
    load_params(dtype=...) stores them) or a block format (matrices in blocks, norms in float32, the head tied to
    the token table, as load_params(dtype="q4_1") stores them)."""
    if weights in DTYPES:
        return tree_cast(params32, DTYPES[weights])
    embed = _quantized(params32["embed"], weights)
    blocks = [{name: _quantized(w, weights) if w.ndim == 2 else w for name, w in bp.items()}
              for bp in params32["blocks"]]
    return {"embed": embed, "head": embed, "norm": params32["norm"], "blocks": blocks}


def _bytes(tree) -> int:
    if isinstance(tree, dict):
        # the head tied to the token table is one array, stored once
        return sum(_bytes(v) for k, v in tree.items() if not (k == "head" and v is tree.get("embed")))
    if isinstance(tree, list):
        return sum(_bytes(v) for v in tree)
    return tree.nbytes


def guarded(case: str, measure) -> dict:
    """measure()'s row, or a row saying why it failed: one row's failure (a kernel the device refuses) costs that
    row only in a one-shot run."""
    try:
        return measure()
    except Exception as e:  # noqa: BLE001  (record the failure, measure the next row)
        return failed(case, e)


def failed(case: str, error: Exception) -> dict:
    return {"case": case, "error": f"{type(error).__name__}: {error}"[:2000], "ok": False}


def decode_rows(args, cfg, params32, rng):
    """A row per weight format: the decode step's time, kernels and logits check; then the q4_1/bf16 ratio."""
    dtype = DTYPES[args.dtype]
    shape = (cfg.layers, cfg.kv_heads, CONTEXT, cfg.head_dim)
    k, v = ((rng.standard_normal(shape, np.float32) * 0.5).astype(dtype) for _ in range(2))
    cos, sin = llama.rope_tables(cfg, CONTEXT, dtype)
    device_inputs = [serving.resident(a, args.device) for a in (k, v, cos, sin)]
    reference_inputs = (k.astype(np.float32), v.astype(np.float32), *llama.rope_tables(cfg, CONTEXT))
    _, decode = llama.prepared(cfg, CONTEXT, device=args.device, dtype=dtype)
    rows = {}
    for weights in ("bf16", "q4_1", "q8_0"):
        rows[weights] = guarded(f"decode_{weights}", lambda weights=weights: decode_row(
            args, cfg, decode, stored_params(params32, weights), weights, device_inputs, reference_inputs))
        yield rows[weights]
    ms = {weights: row["ms_per_token"] for weights, row in rows.items() if "ms_per_token" in row}
    if "bf16" in ms and "q4_1" in ms:
        ratio = ms["q4_1"] / ms["bf16"]
        yield {"case": "decode_q4_1_vs_bf16", "ratio": ratio, "goal": 0.7, "met": ratio <= 0.7,
               "q8_0_vs_bf16": ms["q8_0"] / ms["bf16"] if "q8_0" in ms else None, "stats": decode.stats}


def decode_row(args, cfg, decode, params, weights: str, device_inputs, reference_inputs) -> dict:
    """One decode step with `params` on the device: time, kernels, and its logits against NumPy float32 on the
    dequantized weights."""
    ids = np.array([42], np.int64)
    dk, dv, dcos, dsin = device_inputs
    call = (serving.resident(params, args.device), ids, POS, dk, dv, dcos, dsin)
    start = time.perf_counter()
    ours = np.asarray(decode(*call)[0]).astype(np.float64)
    first_s = time.perf_counter() - start
    ms = median_us(lambda: decode(*call), args.reps, warmup=5) / 1e3
    reference = tree_cast(llama.dequantized(params), np.float32)
    ref = np.asarray(llama.decode(np, cfg, reference, ids, POS, *reference_inputs)[0], np.float64)
    agree = cosine(ours, ref)
    plan = decode.plan(*call)
    dtype = np.dtype(DTYPES[args.dtype]).name
    return {"case": f"decode_{weights}", "dtype": dtype, "layers": cfg.layers, "pos": POS, "context": CONTEXT,
            "ms_per_token": ms, "tokens_per_s": 1e3 / ms, "kernels": len(plan.kernels),
            "weight_bytes": _bytes(params), "plan_memory_bytes": plan.memory_bytes, "first_call_s": first_s,
            "cosine_vs_numpy_f32": agree, "max_diff_over_max_logit": float(np.abs(ours - ref).max()
                                                                            / np.abs(ref).max()),
            "same_argmax": int(ours.argmax()) == int(ref.argmax()), "ok": agree >= COSINE_MIN[dtype]}


def _engine(args, cfg, dparams, prompt_tokens: int):
    """examples/engine.py's Engine over device-resident weights, with a pool of exactly the blocks --streams
    requests of `prompt_tokens` + --new-tokens reserve, and no stop ids (every sequence runs to --new-tokens)."""
    per_request = -(-(prompt_tokens + args.new_tokens - 1) // BLOCK_SIZE)
    return serving.Engine(cfg, dparams, stop_ids=(), dtype=DTYPES[args.dtype], device=args.device,
                          context=SERVE_CONTEXT, block_size=BLOCK_SIZE, num_blocks=args.streams * per_request,
                          max_batch=args.streams, prefill_chunk=64)


def generate(engine, prompts, new_tokens: int) -> dict:
    """Every prompt submitted at once, greedy: their tokens, output tokens per wall second (prefill included) and
    the most sequences one decode step held (the engine prefills as many prompts per step as its prefill token
    budget holds, so with fewer new tokens than prefill steps the first sequences end before the last ones
    start)."""
    seq_ids = [engine.submit(p, serving.Sampling(max_tokens=new_tokens)) for p in prompts]
    tokens = {i: [] for i in seq_ids}
    widest = 0
    start = time.perf_counter()
    while engine.busy:
        widest = max(widest, sum(s.prefilled for s in engine.running))
        for event in engine.step():
            tokens[event.seq_id].append(event.token)
    seconds = time.perf_counter() - start
    total = sum(map(len, tokens.values()))
    return {"tokens": [tokens[i] for i in seq_ids], "tokens_per_s": total / seconds, "seconds": seconds,
            "widest_decode_batch": widest}


def lockstep(engine, prompts, new_tokens: int) -> dict:
    """The engine's two plans, pool and tables driven as Engine._prefill/_decode drive them, but every prompt
    prefilled first (one chunk each, as many per call as the engine's prefill budget holds) and then all sequences
    decoded together, so every decode step holds all of them: their greedy tokens, output tokens per second overall
    and over the decode steps."""
    pool, block = engine.pool, engine.pool.block_size
    assert all(len(p) <= engine.chunk for p in prompts), "lockstep prefills a prompt in one chunk"
    tables = [pool.allocate(-(-(len(p) + new_tokens - 1) // block)) for p in prompts]
    tokens = [[] for _ in prompts]
    start = time.perf_counter()
    for group in _prefill_groups(prompts, engine.prefill_tokens):
        steps = [p for j in group for p in range(len(prompts[j]))]
        _, greedy, keys, values = engine.prefill(
            engine.params, np.array([t for j in group for t in prompts[j]], np.int64), np.array(steps, np.int64),
            np.array(steps, np.int64), np.array([tables[j][:1] for j in group for _ in prompts[j]], np.int64),
            np.cumsum([len(prompts[j]) for j in group]) - 1, max(len(prompts[j]) for j in group),
            pool.keys, pool.values, engine.cos, engine.sin)
        pool.write([pool.slot(tables[j], p) for j in group for p in range(len(prompts[j]))], keys, values)
        for j, token in zip(group, np.asarray(greedy)):   # (each logits row's argmax, computed on the device)
            tokens[j].append(int(token))
    decode_start = time.perf_counter()
    for step in range(new_tokens - 1):
        pos = np.array([len(p) + step for p in prompts], np.int64)
        width = max(1, -(-int(pos.max()) // block))
        table = np.array([(blocks + blocks[:1] * width)[:width] for blocks in tables], np.int64)
        _, greedy, keys, values = engine.decode(engine.params, np.array([out[-1] for out in tokens], np.int64), pos,
                                                table, pool.keys, pool.values, engine.cos, engine.sin)
        pool.write([pool.slot(blocks, int(p)) for blocks, p in zip(tables, pos)], keys, values)
        for out, token in zip(tokens, np.asarray(greedy)):
            out.append(int(token))
    end = time.perf_counter()
    for blocks in tables:
        pool.release(blocks)
    count = len(prompts)
    return {"tokens": tokens, "tokens_per_s": count * new_tokens / (end - start),
            "decode_tokens_per_s": count * (new_tokens - 1) / (end - decode_start) if new_tokens > 1 else None}


def _prefill_groups(prompts, budget: int) -> list[list[int]]:
    """The prompts' indices in order, cut into groups of at most `budget` tokens (the engine's prefill calls)."""
    groups, size = [[]], 0
    for i, prompt in enumerate(prompts):
        if groups[-1] and size + len(prompt) > budget:
            groups.append([])
            size = 0
        groups[-1].append(i)
        size += len(prompt)
    return groups


def _plan_stats(engine) -> dict:
    return {name: {k: fn.stats[k] for k in ("traces", "compiles", "plans")}
            for name, fn in (("decode", engine.decode), ("prefill", engine.prefill))}


def _one_plan_a_range(engine, stats: dict, warm_stats: dict) -> bool:
    """Nothing traced or compiled since the warm-up, and one trace and plan for each prepared range of the batch
    (the decode step is two on a GPU with tensor cores: llama_paged.BatchRanges)."""
    ranges = {"decode": len(getattr(engine.decode, "parts", (None,))), "prefill": 1}
    return stats == warm_stats and all(s["traces"] == s["plans"] == ranges[name] for name, s in stats.items())


def serve_rows(args, cfg, params32, rng, deadline: float):
    """The engine at one stream and at --streams (see the module docstring), then the padded buckets."""
    dparams = serving.resident(stored_params(params32, args.serve_weights), args.device)
    prompts = [list(map(int, rng.integers(0, cfg.vocab, args.prompt_tokens))) for _ in range(args.streams)]
    engine = _engine(args, cfg, dparams, args.prompt_tokens)
    start = time.perf_counter()
    engine.warm_up_decode()   # every decode plan (two on a GPU with tensor cores: llama_paged.prepared)
    generate(engine, prompts[:2], 2)  # trace and compile the prefill
    warm_s = time.perf_counter() - start
    warm_stats = _plan_stats(engine)
    yield guarded(f"serve_step_b1_vs_b{args.streams}", lambda: step_row(args, engine))

    alone_index = sorted({0, len(prompts) // 2, len(prompts) - 1})
    alone = [generate(engine, [prompts[i]], args.new_tokens) for i in alone_index]
    batch = generate(engine, prompts, args.new_tokens)
    same = all(run["tokens"][0] == batch["tokens"][i] for i, run in zip(alone_index, alone))
    one = statistics.median(run["tokens_per_s"] for run in alone)
    stats = _plan_stats(engine)
    one_plan = _one_plan_a_range(engine, stats, warm_stats)
    ratio = batch["tokens_per_s"] / one
    shape = {"weights": args.serve_weights, "dtype": args.dtype, "layers": cfg.layers, "streams": args.streams,
             "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens}
    yield {"case": f"serve_{args.streams}_vs_1", **shape, "one_stream_tokens_per_s": one,
           "concurrent_tokens_per_s": batch["tokens_per_s"], "ratio": ratio, "goal": 20, "met": ratio >= 20,
           "widest_decode_batch": batch["widest_decode_batch"], "concurrent_seconds": batch["seconds"],
           "engine_steps": engine.steps, "warm_up_s": warm_s,
           "pool_bytes": 2 * int(np.prod(engine.pool.keys.shape)) * engine.dtype.itemsize,
           "pool_on_device": isinstance(engine.pool.keys, pj.Array),
           "same_tokens_alone_and_batched": same, "sequences_checked": alone_index, "plan_stats": stats,
           "one_plan_a_range_no_recompiles": one_plan, "ok": same and one_plan}

    singles = [lockstep(engine, [prompts[i]], args.new_tokens) for i in alone_index]
    together = lockstep(engine, prompts, args.new_tokens)
    same = all(run["tokens"][0] == together["tokens"][i] == batch["tokens"][i]
               for i, run in zip(alone_index, singles))
    one = statistics.median(run["tokens_per_s"] for run in singles)
    one_decode = statistics.median(run["decode_tokens_per_s"] for run in singles)
    stats = _plan_stats(engine)
    one_plan = _one_plan_a_range(engine, stats, warm_stats)
    yield {"case": f"serve_lockstep_{args.streams}_vs_1", **shape, "one_stream_tokens_per_s": one,
           "concurrent_tokens_per_s": together["tokens_per_s"], "ratio": together["tokens_per_s"] / one,
           "one_stream_decode_tokens_per_s": one_decode,
           "concurrent_decode_tokens_per_s": together["decode_tokens_per_s"],
           "decode_ratio": together["decode_tokens_per_s"] / one_decode, "goal": 20,
           "met": together["decode_tokens_per_s"] / one_decode >= 20,
           "same_tokens_as_engine": same, "plan_stats": stats, "one_plan_a_range_no_recompiles": one_plan,
           "ok": same and one_plan}

    if args.quick or time.perf_counter() > deadline:
        yield {"case": "serve_padded_buckets", "skipped": "--quick" if args.quick else "time budget spent"}
        return
    yield guarded("serve_padded_buckets", lambda: padded_row(args, engine, prompts, batch, together))


def step_row(args, engine) -> dict:
    """The var-batch decode plan alone: ms per step at 1 and --streams sequences, each midway through its new
    tokens with the blocks it needs, the KV pool resident on the device (as the engine keeps it) and a NumPy array
    (uploaded by every call on a GPU device)."""
    position = min(SERVE_CONTEXT - 1, args.prompt_tokens + args.new_tokens // 2)
    width = -(-position // BLOCK_SIZE)
    pools = {"device_pool": tuple(serving.resident(p, args.device) for p in (engine.pool.keys, engine.pool.values)),
             "host_pool": (np.asarray(engine.pool.keys), np.asarray(engine.pool.values))}
    cos, sin = serving.resident(engine.cos, args.device), serving.resident(engine.sin, args.device)
    row = {"case": f"serve_step_b1_vs_b{args.streams}", "position": position}
    for where, (pool_k, pool_v) in pools.items():
        ms = {}
        for b in (1, args.streams):
            table = (np.arange(b * width).reshape(b, width) % engine.pool.total).astype(np.int64)
            call = (engine.params, np.arange(b, dtype=np.int64) + 100, np.full(b, position, np.int64), table,
                    pool_k, pool_v, cos, sin)
            ms[b] = median_us(lambda call=call: engine.decode(*call), args.reps, warmup=3) / 1e3
        row.update({f"{where}_step_ms_b1": ms[1], f"{where}_step_ms_b{args.streams}": ms[args.streams],
                    f"{where}_tokens_per_s_ratio": args.streams * ms[1] / ms[args.streams]})
    row["kernels"] = len(engine.decode.plan(*call).kernels)
    return row


def padded_row(args, engine, prompts, batch, together) -> dict:
    """The same --streams requests through the engine and in lockstep with PaddedBuckets (power-of-two static
    batches up to --streams) for its decode step: tokens/s, plans, compiles, prepare time; its tokens must equal the
    var batch's."""
    buckets = tuple(2 ** i for i in range(args.streams.bit_length()) if 2 ** i < args.streams) + (args.streams,)
    var_decode, padded = engine.decode, PaddedBuckets(engine, buckets)
    start = time.perf_counter()
    padded.prepare_all(engine)
    prepare_s = time.perf_counter() - start
    engine.decode = padded
    try:
        run = generate(engine, prompts, args.new_tokens)
        steps = lockstep(engine, prompts, args.new_tokens)
    finally:
        engine.decode = var_decode
    same = run["tokens"] == batch["tokens"] and steps["tokens"] == together["tokens"]
    return {"case": "serve_padded_buckets", "buckets": buckets, "tokens_per_s": run["tokens_per_s"],
            "var_batch_tokens_per_s": batch["tokens_per_s"],
            "var_batch_vs_padded": batch["tokens_per_s"] / run["tokens_per_s"],
            "lockstep_decode_tokens_per_s": steps["decode_tokens_per_s"],
            "lockstep_var_batch_vs_padded": together["decode_tokens_per_s"] / steps["decode_tokens_per_s"],
            "prepare_s": prepare_s, "plans": len(padded.plans), "traces": padded.prepared.stats["traces"],
            "compiles": padded.prepared.stats["compiles"],
            "memory_bytes": sum(p.memory_bytes for p in padded.plans.values()), "same_tokens": same, "ok": same}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and new tokens, no padded buckets")
    parser.add_argument("--out", default="benchmarks/results/gpu-llm.jsonl", help="the JSON lines, one per row")
    parser.add_argument("--model", choices=tuple(MODELS), default="smollm2", help="the random weights' shapes")
    parser.add_argument("--layers", type=int, default=None, help="keep the first N blocks (CPU tests)")
    parser.add_argument("--vocab", type=int, default=None, help="a smaller vocabulary (CPU tests)")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="bf16", help="compute dtype, KV cache included")
    parser.add_argument("--serve-weights", choices=("bf16", "f32", "q4_1", "q8_0"), default="bf16",
                        help="how the engine's weights are stored")
    parser.add_argument("--streams", type=int, default=64, help="concurrent sequences of the serving rows")
    parser.add_argument("--new-tokens", type=int, default=None, help="per sequence (default 32, 8 with --quick)")
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--reps", type=int, default=None, help="timed calls per figure (default 30, 5 --quick)")
    parser.add_argument("--budget-s", type=float, default=270, help="skip the padded buckets past this time")
    parser.add_argument("--only", choices=("decode", "serve"), default=None)
    args = parser.parse_args(argv)
    args.new_tokens = args.new_tokens or (8 if args.quick else 32)
    args.reps = args.reps or (5 if args.quick else 30)
    started = time.perf_counter()
    model = MODELS[args.model]
    cfg = attrs.evolve(model, layers=args.layers or model.layers, vocab=args.vocab or model.vocab)
    params32 = llama.random_params(np.random.default_rng(0), cfg)
    meta = {"case": "meta", "command": "python -m benchmarks.gpu_llm " + " ".join(sys.argv[1:] if argv is None
                                                                                 else argv),
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "device": args.device, "platform": platform.platform(),
            "config": attrs.asdict(cfg)}
    rows = []
    groups = {"decode": lambda: decode_rows(args, cfg, params32, np.random.default_rng(1)),
              "serve": lambda: serve_rows(args, cfg, params32, np.random.default_rng(2), started + args.budget_s)}
    with open(args.out, "w") as out:  # a row is written as soon as it is measured: a run cut short keeps them

        def record(row):
            row["elapsed_s"] = time.perf_counter() - started
            rows.append(row)
            print(json.dumps(row), flush=True)
            out.write(json.dumps(row) + "\n")
            out.flush()
        record(meta)
        for name, group in groups.items():
            if args.only not in (None, name):
                continue
            try:
                for row in group():
                    record(row)
            except Exception as e:  # noqa: BLE001  (record the failure, run the other group)
                record(failed(name, e))
    return 0 if all(row.get("ok", True) for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
