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
