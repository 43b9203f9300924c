"""A request's choices on examples/serve.py's event loop: the engine's events for its sequences, as the worker's
mailbox call hands them over, turned at once into text (openai_api.TextStream: detokenised across tokens, stop
strings cut), finish reasons and log-probabilities (`Choices`); a streamed request's server-sent events written to
its connection in that same call (`SseWriter`), a whole one's pieces gathered (`Gathered`).

No task, queue or async generator lies between a token and the socket: the request's handler waits once, for
`Choices.ended`, while the tokens' text goes out from the mailbox's call.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import TYPE_CHECKING

import attrs

import openai_api as api

if TYPE_CHECKING:
    from engine import Sampling

log = logging.getLogger("serve")


class EngineFailure(RuntimeError):
    """The engine (or the embedder) raised: the sequences it was running end with this error."""


@attrs.define(eq=False)
class Sequence:
    """One choice of a request: what the worker submits, and where its results go: `submitted` gets the seq id
    (or why the engine refused the prompt), then its engine Events (or an EngineFailure) go to `choices`."""
    index: int
    prompt: list
    sampling: Sampling
    choices: Choices
    submitted: asyncio.Future
    seq_id: int | None = None
    done: bool = False
    generated: int = 0  # tokens the engine reported


class Choices:
    """The choices of one request, on the event loop. `take(seq, item)` (from the worker's mailbox call) turns an
    engine Event into a piece (index, new text, finish reason or None, [(token, TokenLogprobs)] since the last
    piece) and hands it to `out` (SseWriter.piece or Gathered.piece, set by `attach`; the events before it are held
    and taken then). `ended` gets None once every choice has finished, or the exception that ended them (an
    EngineFailure, the client gone: ConnectionError). `take` never raises: it runs inside the mailbox's drain."""

    def __init__(self, count: int, codec, stop: tuple, stop_ids: frozenset, metrics, cancel, arrived: float,
                 loop: asyncio.AbstractEventLoop):
        self.streams = [api.TextStream(codec, stop) for _ in range(count)]
        self.pending = [[] for _ in range(count)]  # (token, TokenLogprobs) not yet in a piece, per choice
        self.remaining = count
        self.stop_ids, self.metrics, self.cancel, self.arrived = stop_ids, metrics, cancel, arrived
        self.out = None
        self.held: list = []  # (seq, item) taken before `attach`
        self.ended = loop.create_future()

    def attach(self, out):
        """out(index, text, finish, logprobs) receives the pieces from now on, the held ones first."""
        self.out = out
        held, self.held = self.held, []
        for seq, item in held:
            self.take(seq, item)

    def take(self, seq: Sequence, item):
        if self.out is None:
            self.held.append((seq, item))
            return
        if seq.done or self.ended.done():
            return
        try:
            if isinstance(item, Exception):
                raise item
            self._event(seq, item)
        except Exception as e:  # noqa: BLE001 (the handler answers it; the mailbox goes on with other calls)
            if not isinstance(e, (EngineFailure, ConnectionError)):
                log.exception("a request's choices failed")
            self.end(e)

    def _event(self, seq: Sequence, event):
        index = seq.index
        text, stopped = "", False
        if event.token is not None:
            seq.generated += 1
            if seq.generated == 1:
                self.metrics.first_token(time.perf_counter() - self.arrived)
            if not (event.finish == "stop" and event.token in self.stop_ids):
                text, stopped = self.streams[index].add(event.token)
                if event.logprobs is not None:
                    self.pending[index].append((event.token, event.logprobs))
        finish = "stop" if stopped else event.finish
        if finish is None and not text:
            return
        if finish is not None:
            if stopped:
                self.cancel(seq)
            else:
                text += self.streams[index].finish()
            seq.done = True
            self.remaining -= 1
            self.metrics.requests[finish] += 1
        logprobs, self.pending[index] = self.pending[index], []
        self.out(index, text, finish, logprobs)
        if not self.remaining:
            self.end()

    def end(self, error: Exception | None = None):
        """Every choice finished (None) or the request failed (the exception): its handler goes on."""
        if not self.ended.done():
            self.ended.set_result(error)


class Gathered:
    """The pieces of a request answered whole: each choice's text, finish reason and log-probability entries."""

    def __init__(self):
        self.texts, self.finishes = collections.defaultdict(str), {}
        self.entries = collections.defaultdict(list)

    def piece(self, index: int, text: str, finish: str | None, logprobs: list):
        self.texts[index] += text
        if finish is not None:
            self.finishes[index] = finish
        self.entries[index] += logprobs


class SseWriter:
    """A streamed response's server-sent events written straight to its connection's transport, framed as HTTP/1.1
    chunks when the response is chunked (`response.chunked`; aiohttp wrote its headers at prepare() and writes the
    last chunk at write_eof(), which drains the rest). Nothing waits for a slow client (the engine does not either):
    what its socket does not take yet waits in the transport's buffer, at most the stream's events. A closed
    connection raises ConnectionResetError."""

    def __init__(self, transport: asyncio.Transport | None, chunked: bool, events: api.ChunkEvents, chat: bool,
                 formats: list | None):
        self.transport, self.chunked, self.events, self.chat, self.formats = transport, chunked, events, chat, formats

    def write(self, data: bytes):
        transport = self.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client went away")
        transport.write(b"%x\r\n%b\r\n" % (len(data), data) if self.chunked else data)

    def send(self, choices: list, **extra):
        self.write(self.events.event(choices, **extra))

    def piece(self, index: int, text: str, finish: str | None, logprobs: list):
        if self.formats is None:
            self.write(self.events.piece(index, text, finish))
            return
        payload = self.formats[index].payload(logprobs)
        self.send([api.completion_choice(index, text, finish, self.chat, True, logprobs=payload)])
