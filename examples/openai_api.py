"""The OpenAI API's side of examples/serve.py: requests read and checked (`ApiError` carries the HTTP status and
the JSON error body), response and stream-chunk shapes, and the text of a sequence as it grows (`TextStream`:
incremental detokenisation that never emits a broken UTF-8 sequence, and `stop` strings held back until they
can no longer match, then cut).

The shapes follow OpenAI's (and vLLM's / llama.cpp's servers): `text_completion`, `chat.completion`,
`chat.completion.chunk`, `list` of `embedding`; errors as {"error": {"message", "type", "param", "code"}}.
"""
from __future__ import annotations

import base64
import json
import time
import uuid

import attrs
import numpy as np

MAX_STOP_STRINGS = 4  # as OpenAI's API
MAX_EMBEDDING_INPUTS = 2048  # as OpenAI's API
MAX_CHOICES = 128  # n, as OpenAI's API
MAX_TOP_LOGPROBS = 20  # top_logprobs (chat) and logprobs (completions), as OpenAI's chat API
ROLES = ("system", "user", "assistant")
ROLE_ALIASES = {"developer": "system"}  # OpenAI's newer name for system instructions (its clients send it)


class ApiError(Exception):
    """A request the server refuses: its HTTP status and the OpenAI-shaped error body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.code = code or {400: "invalid_request", 404: "model_not_found", 503: "overloaded"}.get(status)
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def parse_json(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body must be a JSON object, not {type(body).__name__}", code="invalid_json")
    return body


def _field(body: dict, name: str, kinds: tuple, default=None, required=False):
    """body[name] checked to be one of `kinds` (bool is never a number here); absent or null -> default."""
    value = body.get(name)
    if value is None:
        if required:
            raise ApiError(400, f"'{name}' is required", param=name, code="missing_field")
        return default
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        names = " or ".join(k.__name__.replace("str", "string").replace("int", "integer").replace("float", "number")
                            for k in kinds if not (k is int and float in kinds))   # (an integer is a number)
        article = "an" if names[0] in "aeiou" else "a"
        raise ApiError(400, f"'{name}' must be {article} {names}, not {json.dumps(value)[:80]}", param=name,
                       code="invalid_type")
    return value


@attrs.frozen
class GenerationRequest:
    """A completion or chat request, checked: its prompts as token ids, one choice each."""
    model: str
    prompts: tuple          # of tuples of token ids
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    n: int                  # choices per prompt
    presence_penalty: float
    frequency_penalty: float
    logprobs: int | None    # None: no log-probabilities; k: the sampled tokens' and the k most likely tokens' each
    stop: tuple             # stop strings
    stream: bool
    include_usage: bool     # stream_options.include_usage: a last chunk with the usage
    echo: bool              # completions: the prompt's text before the completion


def check_model(body: dict, served: dict, kind: str) -> str:
    """The request's model name (default: the one served of `kind`), which must be served and of that kind."""
    name = _field(body, "model", (str,), default=next((n for n, k in served.items() if k == kind), None))
    if name is None:
        raise ApiError(404, f"this server has no {kind} model (it has {', '.join(served)})", param="model")
    if name not in served:
        raise ApiError(404, f"the model '{name}' does not exist; this server has {', '.join(served)}", param="model")
    if served[name] != kind:
        raise ApiError(400, f"the model '{name}' serves {served[name]}, not {kind}", param="model",
                       code="wrong_model")
    return name


def _texts_or_token_ids(body: dict, name: str) -> list:
    """OpenAI's `prompt` (completions) or `input` (embeddings): a string, a list of strings, a list of token ids
    (one item) or a list of lists of token ids, as a list of strings and lists of token ids."""
    value = body.get(name)
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(v, str) for v in value):
            return list(value)
        if all(_is_token_id(t) for t in value):
            return [list(value)]
        if all(isinstance(v, list) and v and all(_is_token_id(t) for t in v) for v in value):
            return [list(v) for v in value]
    if value is None:
        raise ApiError(400, f"'{name}' is required", param=name, code="missing_field")
    raise ApiError(400, f"'{name}' must be a string, a list of strings, a list of token ids or a list of lists of "
                        "token ids (none empty)", param=name, code="invalid_type")


def _is_token_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _prompts(body: dict, codec) -> list[list[int]]:
    return [codec.encode(p) if isinstance(p, str) else p for p in _texts_or_token_ids(body, "prompt")]


def _message_text(message, i: int) -> dict:
    if not isinstance(message, dict):
        raise ApiError(400, f"messages[{i}] must be an object with 'role' and 'content'", param="messages")
    role, content = message.get("role"), message.get("content")
    role = ROLE_ALIASES.get(role, role) if isinstance(role, str) else role
    if role not in ROLES:
        raise ApiError(400, f"messages[{i}].role must be one of {', '.join((*ROLES, *ROLE_ALIASES))}, "
                            f"not {json.dumps(role)}",
                       param="messages")
    if isinstance(content, list):  # content parts: only text ones
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise ApiError(400, f"messages[{i}].content: only parts of type 'text' are supported", param="messages")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise ApiError(400, f"messages[{i}].content must be a string or a list of text parts", param="messages")
    return {"role": role, "content": content}


def _chat_prompts(body: dict, codec) -> list[list[int]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list of messages", param="messages",
                       code="missing_field" if messages is None else "invalid_type")
    return [codec.encode(codec.chat_prompt([_message_text(m, i) for i, m in enumerate(messages)]))]


def generation_request(body: dict, *, chat: bool, codec, served: dict, context: int) -> GenerationRequest:
    """A /v1/completions (chat False) or /v1/chat/completions body checked against the served model's context."""
    model = check_model(body, served, "generation")
    prompts = _chat_prompts(body, codec) if chat else _prompts(body, codec)
    longest = max(len(p) for p in prompts)
    if not all(prompts):
        raise ApiError(400, "a prompt is empty", param="prompt")
    if longest >= context:
        raise ApiError(400, f"this model's context is {context} tokens; the prompt has {longest}: at most "
                            f"{context - 1} leave room for one new token", param="messages" if chat else "prompt",
                       code="context_length_exceeded")
    room = context - longest
    key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _field(body, key, (int,), default=room if chat else min(16, room))
    if max_tokens < 1 or max_tokens > room:
        raise ApiError(400, f"'{key}' must be between 1 and {room} (the context of {context} tokens less the "
                            f"prompt's {longest}), not {max_tokens}", param=key, code="invalid_value")
    temperature = float(_field(body, "temperature", (int, float), default=1.0))
    top_p = float(_field(body, "top_p", (int, float), default=1.0))
    if not 0 <= temperature <= 2:
        raise ApiError(400, f"'temperature' must be between 0 and 2, not {temperature}", param="temperature")
    if not 0 < top_p <= 1:
        raise ApiError(400, f"'top_p' must be greater than 0 and at most 1, not {top_p}", param="top_p")
    seed = _field(body, "seed", (int,))
    if seed is not None and not 0 <= seed < 2 ** 63:
        raise ApiError(400, f"'seed' must be between 0 and 2**63 - 1, not {seed}", param="seed")
    stop = _field(body, "stop", (str, list), default=[])
    stop = [stop] if isinstance(stop, str) else stop
    if len(stop) > MAX_STOP_STRINGS or not all(isinstance(s, str) and s for s in stop):
        raise ApiError(400, f"'stop' must be a non-empty string or a list of at most {MAX_STOP_STRINGS} of them",
                       param="stop")
    n = _field(body, "n", (int,), default=1)
    if not 1 <= n <= MAX_CHOICES:
        raise ApiError(400, f"'n' must be between 1 and {MAX_CHOICES}, not {n}", param="n", code="invalid_value")
    best_of = _field(body, "best_of", (int,), default=n)
    if best_of != n:
        raise ApiError(400, f"'best_of' other than n is not supported (best_of {best_of}, n {n})", param="best_of",
                       code="unsupported")
    if _field(body, "logit_bias", (dict,), default={}):
        raise ApiError(400, "'logit_bias' is not supported", param="logit_bias", code="unsupported")
    penalties = {}
    for name in ("presence_penalty", "frequency_penalty"):
        penalties[name] = float(_field(body, name, (int, float), default=0))
        if not -2 <= penalties[name] <= 2:
            raise ApiError(400, f"'{name}' must be between -2 and 2, not {penalties[name]}", param=name,
                           code="invalid_value")
    echo = not chat and _field(body, "echo", (bool,), default=False)
    options = _field(body, "stream_options", (dict,), default={})
    return GenerationRequest(model=model, prompts=tuple(tuple(p) for p in prompts), max_tokens=max_tokens,
                             temperature=temperature, top_p=top_p, seed=seed, n=n, **penalties,
                             logprobs=_chat_logprobs(body) if chat else _completion_logprobs(body, echo),
                             stop=tuple(stop), stream=_field(body, "stream", (bool,), default=False),
                             include_usage=bool(_field(options, "include_usage", (bool,), default=False)),
                             echo=echo)


def _top_count(body: dict, name: str) -> int:
    k = _field(body, name, (int,))
    if not 0 <= k <= MAX_TOP_LOGPROBS:
        raise ApiError(400, f"'{name}' must be between 0 and {MAX_TOP_LOGPROBS}, not {k}", param=name,
                       code="invalid_value")
    return k


def _chat_logprobs(body: dict) -> int | None:
    """Chat's `logprobs` (true: the sampled tokens' log-probabilities) and `top_logprobs` (how many most likely
    tokens each, which needs logprobs true)."""
    wanted = _field(body, "logprobs", (bool,), default=False)
    if body.get("top_logprobs") is None:
        return 0 if wanted else None
    if not wanted:
        raise ApiError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs", code="invalid_value")
    return _top_count(body, "top_logprobs")


def _completion_logprobs(body: dict, echo: bool) -> int | None:
    """Completions' `logprobs`: how many most likely tokens each (0: only the sampled ones'); not with echo (the
    prompt's log-probabilities are not computed)."""
    if body.get("logprobs") is None:
        return None
    if echo:
        raise ApiError(400, "'logprobs' with 'echo' is not supported (the prompt's log-probabilities are not "
                            "computed)", param="logprobs", code="unsupported")
    return _top_count(body, "logprobs")


def embedding_inputs(body: dict, served: dict, *, vocab: int, max_tokens: int) -> tuple[str, list, str]:
    """(model, inputs, encoding_format) of an /v1/embeddings body. An input is a string (tokenized, and truncated to
    `max_tokens` as sentence-transformers does) or a list of token ids, the model's input as it is (as vLLM takes
    them: no special tokens added), each id below `vocab` and at most `max_tokens` of them."""
    model = check_model(body, served, "embeddings")
    inputs = _texts_or_token_ids(body, "input")
    if len(inputs) > MAX_EMBEDDING_INPUTS:
        raise ApiError(400, f"'input' has {len(inputs)} inputs; at most {MAX_EMBEDDING_INPUTS} per request",
                       param="input", code="invalid_value")
    for i, ids in enumerate(inputs):
        if isinstance(ids, str):
            continue
        if len(ids) > max_tokens:
            raise ApiError(400, f"this model takes at most {max_tokens} tokens; input {i} has {len(ids)}",
                           param="input", code="context_length_exceeded")
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ApiError(400, f"input {i} has the token id {bad}, outside the vocabulary (0 to {vocab - 1})",
                           param="input", code="invalid_value")
    encoding = _field(body, "encoding_format", (str,), default="float")
    if encoding not in ("float", "base64"):
        raise ApiError(400, f"'encoding_format' must be 'float' or 'base64', not {encoding!r}", param="encoding_format")
    return model, inputs, encoding


# --- responses ----------------------------------------------------------------------------------------------------

def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_choice(index: int, text: str | None, finish: str | None, chat: bool, stream: bool,
                      first: bool = False, logprobs: dict | None = None) -> dict:
    """One choice of a response (`stream` False) or of a chunk: `text`, `message` or `delta`, and its
    `logprobs` (Logprobs.payload)."""
    if not chat:
        return {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
    if stream:
        delta = ({"role": "assistant", "content": ""} if first else {}) | ({"content": text} if text else {})
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
    return {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
            "finish_reason": finish}


class Logprobs:
    """The `logprobs` of one choice, in OpenAI's shapes, from its tokens' engine.TokenLogprobs: chat's
    {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}, completions' {"tokens", "token_logprobs",
    "top_logprobs" ({token: logprob}), "text_offset"}. A token's string is its own decoded text (a piece of a
    character decodes to U+FFFD, as in vLLM's). `payload(entries)` formats the next tokens, a whole response's or
    a chunk's: completions' text offsets continue from the last call's."""

    def __init__(self, codec, chat: bool):
        self.codec, self.chat, self.offset = codec, chat, 0

    def payload(self, entries: list) -> dict:
        """entries: (token, TokenLogprobs) pairs."""
        if self.chat:
            return {"content": [{**self._token(token, lp.logprob),
                                 "top_logprobs": [self._token(t, p) for t, p in lp.top]} for token, lp in entries]}
        tokens = [self.codec.decode([token]) for token, _ in entries]
        offsets = []
        for text in tokens:
            offsets.append(self.offset)
            self.offset += len(text)
        return {"tokens": tokens, "token_logprobs": [lp.logprob for _, lp in entries],
                "top_logprobs": [{self.codec.decode([t]): p for t, p in lp.top} for _, lp in entries],
                "text_offset": offsets}

    def _token(self, token: int, logprob: float) -> dict:
        text = self.codec.decode([token])
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


def envelope(rid: str, model: str, chat: bool, stream: bool, choices: list, created: int, **extra) -> dict:
    kind = ("chat.completion.chunk" if stream else "chat.completion") if chat else "text_completion"
    return {"id": rid, "object": kind, "created": created, "model": model, "choices": choices, **extra}


def sse(payload) -> bytes:
    """One server-sent event: a JSON payload on a `data:` line."""
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


class ChunkEvents:
    """The server-sent events of one streamed response: `event(choices, **extra)` is sse(envelope(rid, model,
    chat, True, choices, created, **extra)), byte for byte, with the envelope's head (its fields before "choices",
    the same in every chunk) encoded once, not for every token; `piece(index, text, finish)` is the event of one
    choice's piece without logprobs, event([completion_choice(index, text, finish, chat, True)]), from a format of
    that event made once per response (its JSON but the text and the finish reason: ~1/4 of the time a token)."""

    def __init__(self, rid: str, model: str, chat: bool, created: int):
        empty = json.dumps(envelope(rid, model, chat, True, [], created))  # ... "choices": []}
        self.head = b"data: " + empty[:-len("[]}")].encode()
        self.chat, self._formats = chat, {}  # whether the piece has text -> its format (chat's delta differs)

    def event(self, choices: list, **extra) -> bytes:
        tail = "".join(f", {json.dumps(k)}: {json.dumps(v)}" for k, v in extra.items())
        return self.head + (json.dumps(choices) + tail + "}").encode() + b"\n\n"

    def piece(self, index: int, text: str | None, finish: str | None) -> bytes:
        form = self._formats.get(bool(text))
        if form is None:
            form = self._formats[bool(text)] = self._format(bool(text))
        # (json.dumps of a str is encode_basestring_ascii's string, its wrapper skipped)
        return self.head + form % {b"index": index, b"text": json.encoder.encode_basestring_ascii(text or "").encode(),
                                   b"finish": b"null" if finish is None else json.dumps(finish).encode()}

    def _format(self, has_text: bool) -> bytes:
        """The bytes after the head of a piece's event, its index, text and finish reason as %-format fields: the
        event of a piece with marker values, the markers' JSON replaced (no marker's JSON occurs elsewhere in it:
        the head, the only other text, is left out)."""
        index, text, finish = 9876543210123, "\ue000text\ue001", "\ue000finish\ue001"
        event = self.event([completion_choice(index, text if has_text else None, finish, self.chat, True)])
        form = event[len(self.head):].replace(b"%", b"%%")
        for marker, field in ((index, b"%(index)d"), (text, b"%(text)s"), (finish, b"%(finish)s")):
            form = form.replace(json.dumps(marker).encode(), field)
        return form


def embeddings_response(model: str, vectors: np.ndarray, encoding: str, tokens: int) -> dict:
    def encode(v):
        v = np.asarray(v, "<f4")
        return base64.b64encode(v.tobytes()).decode() if encoding == "base64" else v.tolist()
    return {"object": "list", "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "data": [{"object": "embedding", "index": i, "embedding": encode(v)} for i, v in enumerate(vectors)]}


def models_response(served: dict, context: int, created: int) -> dict:
    return {"object": "list", "data": [{"id": name, "object": "model", "created": created, "owned_by": "prepjit",
                                        **({"max_model_len": context} if kind == "generation" else {})}
                                       for name, kind in served.items()]}


def now() -> int:
    return int(time.time())


# --- text ---------------------------------------------------------------------------------------------------------

HOLD_TOKENS = 8  # tokens held back at most while their bytes are no complete UTF-8 character


class TextStream:
    """The text of one sequence as its tokens arrive: `add(token)` -> the new text that is final (complete
    characters, nothing that may still turn out to begin a stop string) and whether a stop string was reached (the
    text then ends before it); `finish()` -> the text held back, when the sequence ends otherwise."""

    def __init__(self, codec, stop: tuple = ()):
        self.codec, self.stop = codec, stop
        self.ids: list[int] = []
        self.start = 0      # self.ids[start:] are tokens whose text is not yet released
        self.held = ""      # released text that may be the beginning of a stop string
        self.text = ""      # all the text handed out
        self.stopped = False

    def add(self, token: int) -> tuple[str, bool]:
        self.ids.append(token)
        piece = self.codec.decode(self.ids[self.start:])
        if piece.endswith("\ufffd") and len(self.ids) - self.start < HOLD_TOKENS:
            return "", False  # an incomplete UTF-8 character: wait for its other bytes
        self.start = len(self.ids)
        return self._release(piece)

    def finish(self) -> str:
        """The rest: undecoded bytes (with replacement characters) and the held-back text."""
        out, _ = self._release(self.codec.decode(self.ids[self.start:]) if self.start < len(self.ids) else "",
                               final=True)
        self.start = len(self.ids)
        return out

    def _release(self, piece: str, final: bool = False) -> tuple[str, bool]:
        if not self.stop:  # (nothing held back, nothing stops it)
            self.text += piece
            return piece, False
        if self.stopped:
            return "", True
        buf = self.held + piece
        hits = [(buf.find(s), s) for s in self.stop if s in buf]
        if hits:
            self.stopped = True
            out, self.held = buf[:min(hits)[0]], ""
        else:
            keep = 0 if final else max((k for s in self.stop for k in range(1, len(s)) if buf.endswith(s[:k])),
                                       default=0)
            out, self.held = buf[:len(buf) - keep], buf[len(buf) - keep:]
        self.text += out
        return out, self.stopped
