"""A load test of an OpenAI-compatible server (examples/serve.py, vLLM's, llama.cpp's): streamed completions from
N concurrent clients in a closed loop, or sent at a rate in an open loop (Poisson arrivals); prints requests/s,
output tokens/s, time to first token and inter-token latency (p50, p99).

    python examples/serve.py --port 8000 &
    python examples/load_test.py --url http://127.0.0.1:8000 --concurrency 16 --requests 64 --max-tokens 64
    python examples/load_test.py --rate 4 --requests 40 --json            # one JSON line of figures
    python examples/load_test.py --serve "--layers 4" --concurrency 4     # starts examples/serve.py itself

Output tokens are the server's `usage.completion_tokens` (stream_options.include_usage); the time to first token
is from sending a request to its first chunk of text, an inter-token latency the time between two chunks of text
divided by the tokens between them (one per chunk, unless text was held back). CPU time per output token: the
client's own (this process), and with examples/serve.py its event loop's, its engine worker's and its other threads'
(the plans' native workers), from its /metrics: what the server's threads take from the plans' cores a token.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shlex
import socket
import ssl
import subprocess
import sys
import time
import urllib.parse

import numpy as np

PROMPT = "Once upon a time, in a small village by the sea, there lived"
SERVE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "serve.py")
READ_TIMEOUT_S = 600  # a response that takes longer than this is an error


class Connection(asyncio.Protocol):
    """One HTTP/1.1 connection (kept alive between requests) that reads a response as its bytes arrive, in the
    transport's callback: no task woken, no await a piece (the client shares the server's cores when both run on
    one machine). The body is framed by chunks, a Content-Length or the connection's end; a 200 answer's body is
    read as server-sent events, each parsed (JSON) when its last byte has come, at that piece's arrival time."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop, self.transport, self.closed = loop, None, False
        self.result: asyncio.Future | None = None
        self.reusable = False

    def connection_made(self, transport):
        self.transport = transport

    def request(self, target: str, host: str, body: bytes) -> asyncio.Future:
        """POST body (JSON) to target: a future of {"chunks": the times of the events with text, "tokens": the
        usage's completion tokens} or {"error"}; `reusable` then says whether the connection may take another."""
        self.result, self.reusable = self.loop.create_future(), False
        self.framing = None  # once the head is read: "chunked", "length" or "close" (the body ends with the connection)
        self.head, self.wire, self.events, self.error_body = b"", b"", b"", b""
        self.status, self.remaining, self.keep, self.times, self.tokens = 0, 0, False, [], 0
        self.transport.write(f"POST {target} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                             f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        return self.result

    def data_received(self, data: bytes):
        now = time.perf_counter()
        if self.result is None or self.result.done():
            return
        try:
            if self.framing is None:
                self.head += data
                if b"\r\n\r\n" not in self.head:
                    return
                head, data = self.head.split(b"\r\n\r\n", 1)
                self._read_head(head)
            if self.framing == "chunked":
                self._chunks(data, now)
            elif self.framing == "length":
                data = data[:self.remaining]
                self.remaining -= len(data)
                self._content(data, now)
                if not self.remaining:
                    self._body_end()
            else:
                self._content(data, now)
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:  # not HTTP, chunks or JSON
            self._finish({"error": f"bad response: {e!r}"})

    def connection_lost(self, exc):
        self.closed = True
        if self.result is not None and not self.result.done():
            if self.framing == "close":
                self._body_end()
            else:
                self._finish({"error": f"the connection closed mid-response ({exc or 'EOF'})"})

    def _read_head(self, head: bytes):
        status_line, *lines = head.decode("latin-1").split("\r\n")
        self.status = int(status_line.split()[1])
        fields = {k.strip().lower(): v.strip().lower() for k, _, v in (line.partition(":") for line in lines)}
        self.keep = status_line.startswith("HTTP/1.1") and fields.get("connection") != "close"
        if "chunked" in fields.get("transfer-encoding", ""):
            self.framing = "chunked"
        elif "content-length" in fields:
            self.framing, self.remaining = "length", int(fields["content-length"])
            if not self.remaining:
                self._body_end()
        else:
            self.framing, self.keep = "close", False

    def _chunks(self, data: bytes, now: float):
        """The body's chunks in data (and what was left of the last piece)."""
        wire = self.wire + data
        while (line_end := wire.find(b"\r\n")) >= 0:
            size, start = int(wire[:line_end].split(b";")[0], 16), line_end + 2
            if not size:  # the last chunk: its (empty) trailer section ends the body
                if wire.startswith(b"\r\n", start) or b"\r\n\r\n" in wire[start:]:
                    return self._body_end()
                break
            if len(wire) < start + size + 2:
                break
            self._content(wire[start:start + size], now)
            wire = wire[start + size + 2:]
        self.wire = wire

    def _content(self, data: bytes, now: float):
        if self.status != 200:
            self.error_body += data
            return
        *events, self.events = (self.events + data).replace(b"\r\n", b"\n").split(b"\n\n")
        for event in events:
            for line in event.split(b"\n"):
                if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                    continue
                chunk = json.loads(line[5:])
                if "error" in chunk:
                    return self._finish({"error": chunk["error"]["message"]})
                if chunk.get("usage"):
                    self.tokens = chunk["usage"]["completion_tokens"]
                if chunk["choices"] and chunk["choices"][0]["text"]:
                    self.times.append(now)

    def _body_end(self):
        self.reusable = self.keep
        if self.status != 200:
            return self._finish({"error": f"HTTP {self.status}: {self.error_body.decode(errors='replace')[:200]}"})
        self._finish({"chunks": self.times, "tokens": self.tokens})

    def _finish(self, outcome: dict):
        if not self.result.done():
            self.result.set_result(outcome)


class Client:
    """Streamed completions from one server over kept-alive connections (http or https)."""

    def __init__(self, url: str):
        parts = urllib.parse.urlsplit(url)
        self.https, self.host = parts.scheme == "https", parts.hostname
        self.port = parts.port or (443 if self.https else 80)
        self.netloc, self.prefix = parts.netloc, parts.path.rstrip("/")
        self.idle: list[Connection] = []

    async def post(self, path: str, body: dict) -> dict:
        """{"start", "end", "chunks", "tokens"} or {"start", "error"}."""
        loop = asyncio.get_running_loop()
        raw = json.dumps(body).encode()
        start = time.perf_counter()
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed:
                break
        else:
            _, conn = await loop.create_connection(lambda: Connection(loop), self.host, self.port,
                                                   ssl=ssl.create_default_context() if self.https else None)
        try:
            outcome = await asyncio.wait_for(conn.request(self.prefix + path, self.netloc, raw), READ_TIMEOUT_S)
        except asyncio.TimeoutError:
            outcome = {"error": f"no whole response within {READ_TIMEOUT_S} s"}
        if conn.reusable and not conn.closed:
            self.idle.append(conn)
        else:
            conn.transport.close()
        return {"start": start, **outcome, **({} if "error" in outcome else {"end": time.perf_counter()})}

    def close(self):
        for conn in self.idle:
            conn.transport.close()
        self.idle.clear()


async def one_request(client: Client, body: dict) -> dict:
    """A streamed completion: its start, the times of its chunks of text, its output tokens, or its error."""
    try:
        return await client.post("/v1/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})
    except OSError as e:
        return {"start": time.perf_counter(), "error": f"cannot connect: {e}"}


async def run(url: str, body: dict, requests: int, concurrency: int | None, rate: float | None, seed: int = 0):
    """Every request's record and the wall time: `concurrency` clients each sending its next request when the last
    is answered, or requests sent at `rate` per second (exponential gaps) however many are in flight."""
    client = Client(url)
    try:
        start = time.perf_counter()
        if rate is None:
            remaining = iter(range(requests))

            async def sender():
                return [await one_request(client, body) for _ in remaining]
            results = [r for rs in await asyncio.gather(*(sender() for _ in range(concurrency))) for r in rs]
        else:
            rng, tasks = random.Random(seed), []
            for _ in range(requests):
                tasks.append(asyncio.create_task(one_request(client, body)))
                await asyncio.sleep(rng.expovariate(rate))
            results = await asyncio.gather(*tasks)
        return results, time.perf_counter() - start
    finally:
        client.close()


def summary(results: list, seconds: float) -> dict:
    """requests/s, output tokens/s, TTFT and ITL p50/p99 (milliseconds) of the answered requests."""
    done = [r for r in results if "error" not in r]
    ttft = [(r["chunks"][0] - r["start"]) * 1e3 for r in done if r["chunks"]]
    itl = [gap * 1e3 / max(1, (r["tokens"] - 1) / max(1, len(r["chunks"]) - 1)) for r in done
           for gap in np.diff(r["chunks"])]
    tokens = sum(r["tokens"] for r in done)

    def pct(values, q):
        return float(np.percentile(values, q)) if values else None
    return {"requests": len(results), "errors": len(results) - len(done), "seconds": seconds,
            "requests_per_s": len(done) / seconds, "output_tokens": tokens, "output_tokens_per_s": tokens / seconds,
            "ttft_ms_p50": pct(ttft, 50), "ttft_ms_p99": pct(ttft, 99), "itl_ms_p50": pct(itl, 50),
            "itl_ms_p99": pct(itl, 99), "first_errors": [r["error"] for r in results if "error" in r][:3]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def served(serve_args: str, startup_s: float = 600):
    """examples/serve.py started in a subprocess with these flags on a free port, until it answers /health:
    its URL; stopped afterwards."""
    port = free_port()
    process = subprocess.Popen([sys.executable, SERVE, "--port", str(port), *shlex.split(serve_args)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_s
        while not _healthy(url):
            if process.poll() is not None:
                raise RuntimeError(f"the server exited ({process.returncode}): {process.stderr.read()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not answer /health within {startup_s:.0f} s")
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()


def _healthy(url: str) -> bool:
    import urllib.request
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


# the counters of CPU seconds in examples/serve.py's /metrics
SERVER_CPU = {"event_loop": "serve_event_loop_cpu_seconds_total",
              "engine_worker": "serve_engine_worker_cpu_seconds_total", "process": "process_cpu_seconds_total"}


def scrape(url: str) -> dict:
    """The server's /metrics samples without labels ({name: value}); {} when it has none."""
    import urllib.request
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
            lines = r.read().decode().splitlines()
    except OSError:
        return {}
    return {name: float(value) for name, value in (line.split(" ", 1) for line in lines
                                                    if line and not line.startswith("#") and "{" not in line)}


def load_test(url: str, *, requests: int, concurrency: int | None = None, rate: float | None = None,
              max_tokens: int = 64, prompt: str = PROMPT, model: str = "smollm2", temperature: float = 0.0) -> dict:
    """The figures of one load test; with examples/serve.py also its mean engine step meanwhile (what the server
    adds to a token is the inter-token latency less it) and its threads' CPU time per output token."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature}
    before = scrape(url)
    cpu_start = time.process_time()
    results, seconds = asyncio.run(run(url, body, requests, concurrency, rate))
    client_cpu = time.process_time() - cpu_start
    figures = {"url": url, "concurrency": concurrency, "rate": rate, "max_tokens": max_tokens,
               **summary(results, seconds)}
    after, key = scrape(url), "serve_engine_step_seconds_total"
    if key in before and key in after and after["serve_engine_steps_total"] > before["serve_engine_steps_total"]:
        figures["engine_step_ms_mean"] = 1e3 * (after[key] - before[key]) / (
            after["serve_engine_steps_total"] - before["serve_engine_steps_total"])
    tokens = figures["output_tokens"]
    if tokens:
        figures["client_cpu_ms_per_token"] = 1e3 * client_cpu / tokens
        if all(name in before and name in after for name in SERVER_CPU.values()):
            spent = {part: 1e3 * (after[name] - before[name]) / tokens for part, name in SERVER_CPU.items()}
            spent["other_threads"] = spent.pop("process") - spent["event_loop"] - spent["engine_worker"]
            figures["server_cpu_ms_per_token"] = spent
    return figures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the server (without /v1)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--concurrency", type=int, default=None, help="clients in a closed loop (default 1)")
    mode.add_argument("--rate", type=float, default=None, help="requests per second, Poisson arrivals (open loop)")
    parser.add_argument("--requests", type=int, default=None, help="requests in all (default: 4 per client, or 32)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--serve", default=None, metavar="FLAGS",
                        help="start examples/serve.py with these flags on a free port and test it (ignores --url)")
    parser.add_argument("--json", action="store_true", help="print one JSON line of figures")
    args = parser.parse_args(argv)
    concurrency = args.concurrency or (None if args.rate else 1)
    if (concurrency is not None and concurrency < 1) or (args.rate is not None and args.rate <= 0):
        parser.error("--concurrency must be at least 1 and --rate above 0")
    requests = args.requests or (4 * concurrency if concurrency else 32)
    with served(args.serve) if args.serve is not None else contextlib.nullcontext(args.url) as url:
        figures = load_test(url, requests=requests, concurrency=concurrency, rate=args.rate,
                            max_tokens=args.max_tokens, prompt=args.prompt, model=args.model,
                            temperature=args.temperature)
    if args.json:
        print(json.dumps(figures))
    else:
        how = f"{concurrency} concurrent clients" if concurrency else f"{args.rate:g} requests/s (Poisson)"
        print(f"{figures['requests']} requests ({how}, max_tokens {args.max_tokens}) in {figures['seconds']:.2f} s, "
              f"{figures['errors']} errors")
        print(f"  {figures['requests_per_s']:.2f} requests/s, {figures['output_tokens_per_s']:.1f} output tokens/s")
        if figures["ttft_ms_p50"] is not None:
            print(f"  time to first token  p50 {figures['ttft_ms_p50']:8.1f} ms   p99 {figures['ttft_ms_p99']:8.1f} ms")
        if figures["itl_ms_p50"] is not None:
            print(f"  inter-token latency  p50 {figures['itl_ms_p50']:8.1f} ms   p99 {figures['itl_ms_p99']:8.1f} ms")
        if "engine_step_ms_mean" in figures:
            print(f"  the server's engine steps took {figures['engine_step_ms_mean']:.1f} ms on average (prefill "
                  "steps included)")
        if "server_cpu_ms_per_token" in figures:
            print("  CPU ms per output token: " + ", ".join(f"server {part.replace('_', ' ')} {ms:.3f}" for part, ms
                                                            in figures["server_cpu_ms_per_token"].items()) +
                  f", client {figures['client_cpu_ms_per_token']:.3f}")
        for error in figures["first_errors"]:
            print(f"  error: {error}")
    return 1 if figures["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
