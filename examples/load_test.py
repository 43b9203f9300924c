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
import subprocess
import sys
import time

import aiohttp
import numpy as np

PROMPT = "Once upon a time, in a small village by the sea, there lived"
SERVE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "serve.py")


async def one_request(session, url: str, body: dict) -> dict:
    """A streamed completion: its start, the times of its chunks of text, its output tokens, or its error."""
    start = time.perf_counter()
    times, tokens, partial = [], 0, b""
    async with session.post(url + "/v1/completions", json={**body, "stream": True,
                                                           "stream_options": {"include_usage": True}}) as r:
        if r.status != 200:
            return {"start": start, "error": f"HTTP {r.status}: {(await r.text())[:200]}"}
        # the lines of each piece of the body as it arrives (one await a piece, not one a line: the client shares
        # the server's cores when both run on one machine)
        async for piece in r.content.iter_any():
            now = time.perf_counter()
            *lines, partial = (partial + piece).split(b"\n")
            for line in lines:
                if not line.startswith(b"data: ") or line.rstrip() == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return {"start": start, "error": chunk["error"]["message"]}
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                if chunk["choices"] and chunk["choices"][0]["text"]:
                    times.append(now)
    return {"start": start, "end": time.perf_counter(), "chunks": times, "tokens": tokens}


async def run(url: str, body: dict, requests: int, concurrency: int | None, rate: float | None, seed: int = 0):
    """Every request's record and the wall time: `concurrency` clients each sending its next request when the last
    is answered, or requests sent at `rate` per second (exponential gaps) however many are in flight."""
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        start = time.perf_counter()
        if rate is None:
            remaining = iter(range(requests))

            async def client():
                return [await one_request(session, url, body) for _ in remaining]
            results = [r for rs in await asyncio.gather(*(client() for _ in range(concurrency))) for r in rs]
        else:
            rng, tasks = random.Random(seed), []
            for _ in range(requests):
                tasks.append(asyncio.create_task(one_request(session, url, body)))
                await asyncio.sleep(rng.expovariate(rate))
            results = await asyncio.gather(*tasks)
        return results, time.perf_counter() - start


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
