"""The server's pieces that need no server (examples/openai_api.py, examples/serve.py): text streamed a token at a
time (UTF-8 and stop strings held back), a stream's SSE chunks byte for byte the envelopes' JSON, and the mailbox
through which the engine's worker thread hands calls to the event loop."""
import asyncio
import json
import os
import threading

import pytest

pytest.importorskip("aiohttp", reason="aiohttp not installed (pip install -e '.[examples]')")

from examples import openai_api, serve

from .test_serve import ByteCodec


def test_text_stream_holds_back_broken_utf8_and_stop_prefixes():
    codec = ByteCodec()
    stream_ = openai_api.TextStream(codec, stop=("STOP",))
    pieces = [stream_.add(b) for b in "é ST".encode()]
    assert [p for p, _ in pieces] == ["", "é", " ", "", ""]  # é's two bytes held together; "ST" may begin STOP
    assert stream_.add(ord("O")) == ("", False) and stream_.add(ord("P")) == ("", True)
    assert stream_.text == "é "
    other = openai_api.TextStream(codec, stop=("STOP",))
    for b in b"a ST":
        other.add(b)
    assert other.finish() == "ST" and other.text == "a ST"  # ended otherwise: the held text is released


def test_the_mailbox_runs_the_worker_calls_in_order_with_one_wake_until_drained():
    loop = asyncio.new_event_loop()
    box, got = serve.Mailbox(loop), []
    try:
        for i in range(3):
            box.call(got.append, i)
        assert os.read(box.read_fd, 64) == b"\0" and got == []  # one wake for the three calls, none run yet
        os.write(box.write_fd, b"\0")
        worker = threading.Thread(target=lambda: [box.call(got.append, i) for i in range(3, 2000)])
        worker.start()
        worker.join()
        loop.run_until_complete(asyncio.sleep(0.05))
        assert got == list(range(2000)) and not box.woken
    finally:
        box.close()
        loop.close()


@pytest.mark.parametrize("chat", [False, True])
def test_chunk_events_are_the_envelopes_json_byte_for_byte(chat):
    events = openai_api.ChunkEvents("cmpl-\u00e9\"x", 'smol"lm\n', chat, 1700000000)
    cases = [([openai_api.completion_choice(0, 'a "quoted" \u00e9\U0001f600 \\ text', None, chat, True)], {}),
             ([openai_api.completion_choice(3, None, "stop", chat, True, first=True)], {}),
             ([], {"usage": openai_api.usage(5, 7)})]
    for choices, extra in cases:
        envelope = openai_api.envelope("cmpl-\u00e9\"x", 'smol"lm\n', chat, True, choices, 1700000000, **extra)
        assert events.event(choices, **extra) == openai_api.sse(envelope)
        assert json.loads(events.event(choices, **extra)[len(b"data: "):]) == envelope


@pytest.mark.parametrize("chat", [False, True])
def test_a_pieces_event_is_its_choices_event_byte_for_byte(chat):
    """ChunkEvents.piece (a format made once a response) against event([completion_choice(...)]): texts with quotes,
    escapes, % signs, characters beyond ASCII, none; every finish reason; a head with % signs."""
    events = openai_api.ChunkEvents("cmpl-%d\"x", "smol%slm", chat, 1700000000)
    for text in ('a "quoted" %s %% \u00e9\U0001f600 \\ \n\x01 text', " word", "", None):
        for finish in (None, "stop", "length"):
            for index in (0, 12):
                want = events.event([openai_api.completion_choice(index, text, finish, chat, True)])
                assert events.piece(index, text, finish) == want


class Transport:
    """What SseWriter writes to: the bytes, and whether the connection is closing."""

    def __init__(self):
        self.wire, self.closing = b"", False

    def write(self, data):
        self.wire += data

    def is_closing(self):
        return self.closing


def unchunk(wire: bytes) -> bytes:
    """The body of HTTP/1.1 chunks (each whole)."""
    body = b""
    while wire:
        size_line, wire = wire.split(b"\r\n", 1)
        size = int(size_line, 16)
        assert size and wire[size:size + 2] == b"\r\n", wire[:80]
        body, wire = body + wire[:size], wire[size + 2:]
    return body


def streamed_choices(stop=(), chunked=True, count=1):
    """(Choices, its sequences, the transport its SseWriter writes to, the cancelled sequences), not yet attached."""
    from examples.engine import Sampling
    loop = asyncio.new_event_loop()
    cancelled = []
    choices = serve.Choices(count, ByteCodec(), stop, ByteCodec.stop_ids, serve.Metrics(), cancelled.append,
                            0.0, loop)
    seqs = [serve.Sequence(i, [1], Sampling(8), choices, loop.create_future()) for i in range(count)]
    transport = Transport()
    writer = serve.SseWriter(transport, chunked, openai_api.ChunkEvents("cmpl-1", "m", False, 0), False, None)
    return choices, seqs, transport, writer, cancelled


def test_a_stream_written_a_token_at_a_time_is_cut_at_a_stop_string_across_tokens():
    """The events a stream's tokens write straight to its transport (one HTTP/1.1 chunk each): the text of every
    token but what may begin the stop string, "STO" released once "x" shows it is none, the text before "STOP" and
    finish "stop" last; the sequence is cancelled and the request ended; later events write nothing. The tokens
    taken before the writer is attached (the handler not yet streaming) come first."""
    from examples.engine import Event
    choices, (seq,), transport, writer, cancelled = streamed_choices(stop=("STOP",))
    tokens = list("é aSTOx STOP more".encode())
    for token in tokens[:3]:
        choices.take(seq, Event(0, token, None))
    assert transport.wire == b""
    choices.attach(writer.piece)
    for token in tokens[3:]:
        choices.take(seq, Event(0, token, None))
    events = unchunk(transport.wire).split(b"\n\n")
    assert events[-1] == b"" and all(e.startswith(b"data: ") for e in events[:-1])
    pieces = [json.loads(e[len(b"data: "):])["choices"][0] for e in events[:-1]]
    assert [p["text"] for p in pieces] == ["é", " ", "a", "STOx", " ", ""]
    assert [p["finish_reason"] for p in pieces] == [None] * 5 + ["stop"]
    assert cancelled == [seq] and seq.done and choices.ended.result() is None
    assert choices.metrics.requests == {"stop": 1} and seq.generated == len("é aSTOx STOP".encode())


def test_a_stream_ends_with_the_error_that_stops_it_and_take_never_raises():
    """A client gone (the transport closing) ends the request with ConnectionResetError, an engine failure with
    itself: `take` runs inside the mailbox's drain and must not raise; what comes after is ignored. Without chunks
    (an HTTP/1.0 client) the events are written as they are."""
    from examples.engine import Event
    choices, (seq,), transport, writer, _ = streamed_choices(chunked=False)
    choices.attach(writer.piece)
    choices.take(seq, Event(0, ord("a"), None))
    assert transport.wire.startswith(b"data: {") and transport.wire.endswith(b"\n\n")
    transport.closing = True
    choices.take(seq, Event(0, ord("b"), None))
    assert isinstance(choices.ended.result(), ConnectionResetError)
    choices.take(seq, Event(0, ord("c"), "length"))
    assert transport.wire.count(b"data: ") == 1 and not seq.done
    choices, (first, second), transport, writer, _ = streamed_choices(count=2)
    choices.attach(writer.piece)
    failure = serve.EngineFailure("the engine failed: injected")
    choices.take(first, Event(0, ord("a"), "length"))
    choices.take(second, failure)
    assert choices.ended.result() is failure and choices.remaining == 1
