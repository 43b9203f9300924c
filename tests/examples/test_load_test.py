"""examples/load_test.py's HTTP client without a server: a response read as its bytes arrive, whatever pieces they
come in (HTTP/1.1 chunks, Content-Length, the connection's end), each event of text timed by the piece that
completed it, the connection kept for the next request only when the response allows it."""
import asyncio
import itertools
import json

from examples import load_test


class Transport:
    def __init__(self):
        self.sent, self.closed = b"", False

    def write(self, data):
        self.sent += data

    def close(self):
        self.closed = True


def sse(payload) -> bytes:
    return b"data: " + (payload if isinstance(payload, bytes) else json.dumps(payload).encode()) + b"\n\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def text_event(text, finish=None):
    return sse({"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": text,
                                                                          "finish_reason": finish}]})


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
EVENTS = [text_event("Once"), text_event(""), text_event(" upon", "length"),
          sse({"id": "cmpl-1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 3}}), sse(b"[DONE]")]


def connection(monkeypatch):
    """A Connection on a fake transport and a clock that counts the pieces received (perf_counter's calls)."""
    loop = asyncio.new_event_loop()
    conn = load_test.Connection(loop)
    conn.connection_made(Transport())
    clock = itertools.count()
    monkeypatch.setattr(load_test.time, "perf_counter", lambda: next(clock))
    return conn


def test_events_are_timed_by_the_piece_that_completes_them(monkeypatch):
    conn = connection(monkeypatch)
    result = conn.request("/v1/completions", "h:1", b"{}")
    assert conn.transport.sent.startswith(b"POST /v1/completions HTTP/1.1\r\nHost: h:1\r\n")
    assert conn.transport.sent.endswith(b"Content-Length: 2\r\n\r\n{}")
    # piece 0: the head, a chunk of the first event's start and half of the next chunk; 1: the rest of the first
    # event and the empty-text event; 2: the rest
    first = chunk(EVENTS[0][:10]) + chunk(EVENTS[0][10:])
    wire = [HEAD + first[:20], first[20:] + chunk(EVENTS[1]),
            b"".join(chunk(e) for e in EVENTS[2:]) + b"0\r\n\r\n"]
    for piece in wire:
        conn.data_received(piece)
    assert result.result() == {"chunks": [1, 2], "tokens": 3} and conn.reusable


def test_a_response_read_a_byte_at_a_time_then_the_next_on_the_same_connection(monkeypatch):
    """The chunked body's last CRLF coming alone must not be taken for the next response's head; an error answer
    with a Content-Length and "Connection: close" is an error and leaves the connection unusable; a body that ends
    with the connection (HTTP/1.0) is read to its end."""
    conn = connection(monkeypatch)
    wire = HEAD + b"".join(chunk(e.replace(b"\n\n", b"\r\n\r\n")) for e in EVENTS) + b"0\r\n\r\n"  # CRLF lines
    result = conn.request("/v1/completions", "h", b"{}")
    for i in range(len(wire) - 2):
        conn.data_received(wire[i:i + 1])
    assert not result.done()  # (a next request now would take the last CRLF for its answer's)
    conn.data_received(wire[-2:])
    assert result.result()["tokens"] == 3 and len(result.result()["chunks"]) == 2 and conn.reusable
    body = json.dumps({"error": {"message": "bad"}}).encode()
    result = conn.request("/v1/completions", "h", b"{}")
    conn.data_received(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body))
    assert not result.done()
    conn.data_received(body)
    assert result.result() == {"error": f"HTTP 400: {body.decode()}"} and not conn.reusable
    old = load_test.Connection(asyncio.new_event_loop())
    old.connection_made(Transport())
    result = old.request("/v1/completions", "h", b"{}")
    old.data_received(b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + b"".join(EVENTS[:3]))
    old.connection_lost(None)
    assert len(result.result()["chunks"]) == 2 and not old.reusable


def test_an_error_event_or_a_cut_connection_is_the_requests_error(monkeypatch):
    conn = connection(monkeypatch)
    result = conn.request("/v1/completions", "h", b"{}")
    conn.data_received(HEAD + chunk(EVENTS[0]) + chunk(sse({"error": {"message": "the engine failed"}})))
    assert result.result() == {"error": "the engine failed"} and not conn.reusable
    conn = connection(monkeypatch)
    result = conn.request("/v1/completions", "h", b"{}")
    conn.data_received(HEAD + chunk(EVENTS[0]))
    conn.connection_lost(ConnectionResetError("reset"))
    assert "closed mid-response" in result.result()["error"] and conn.closed
