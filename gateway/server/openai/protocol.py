"""OpenAI's API on the wire, as ``/v1/chat/completions`` and ``/v1/completions`` read and write it.

The request's side: the body's fields validated one by one (:func:`json_body`, :func:`number`,
:func:`flag`, :func:`stop_strings`, :func:`chat_messages`, ...), each refusal a 400 in OpenAI's
envelope naming the parameter (:func:`gateway.server.errors.openai_error`). The reply's side: the
engine's events as OpenAI *choices* (:class:`ChatChunks`, :class:`CompletionChunks`; one SSE chunk
each when streamed, merged into one reply when not), the ``logprobs`` objects, the SSE framing
(:func:`sse`, :data:`SSE_DONE`) and a stream's error chunk (:func:`stream_error`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any, Protocol

import orjson

from gateway.engine.errors import EngineError, RequestError
from gateway.http import Request
from gateway.server.body import parse_json
from gateway.server.errors import engine_http_error, openai_error
from serveproto import Data, Echo

log = logging.getLogger("serveproto.openai")

#: The four parallel lists of a completion's ``logprobs`` object, in OpenAI's order.
LOGPROB_KEYS = ("tokens", "token_logprobs", "top_logprobs", "text_offset")


#: One step of a generation, as the chunk builders take it: ``("echo", echoes, None)`` (a
#: completion's prompt part: its read-out, a list of ``Echo``, or None without logprobs), ``("text",
#: piece, data)`` per generated token (``piece`` the text it adds, maybe ``""``; ``data`` its
#: ``Data`` event, None for text flushed at the end), ``("done", finish_reason, done)`` last
#: (``done`` the ``Done`` event, None when a stop string ended generation on the gateway side).
#: Chunk builders pass over any other kind (``_generate``'s ``"readout"`` positions).
Item = tuple[str, Any, Any]


def json_body(request: Request) -> dict[str, Any]:
    body = parse_json(request)
    if not isinstance(body, dict):
        raise openai_error("the body must be a JSON object")
    return body


def number(body: dict[str, Any], name: str, default: Any, lo: float, hi: float, integer: bool = False) -> Any:
    v = body.get(name, default)
    if v is None:
        return default
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok or not (lo <= v <= hi) or (not integer and not math.isfinite(v)):
        kind = "an integer" if integer else "a number"
        raise openai_error(f"'{name}' must be {kind} in [{lo:g}, {hi:g}]", name)
    return v


def flag(body: dict[str, Any], name: str, param: str | None = None) -> bool:
    """A boolean field (absent or null: False); anything else is a 400 naming ``param`` (default ``name``)."""
    v = body.get(name)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise openai_error(f"'{param or name}' must be a boolean", param or name)
    return v


def wants_usage(body: dict[str, Any]) -> bool:
    """``stream_options.include_usage``: an object with a boolean, or null."""
    opts = body.get("stream_options")
    if opts is None:
        return False
    if not isinstance(opts, dict):
        raise openai_error("'stream_options' must be an object", "stream_options")
    return flag(opts, "include_usage", "stream_options.include_usage")


def one_choice(body: dict[str, Any], name: str) -> None:
    """``n`` (or ``best_of``): absent, null or 1; more choices are a 400 naming the field rather than
    one choice answered as if the client had not asked (issue 16)."""
    v = body.get(name)
    if v is None or (v == 1 and isinstance(v, int) and not isinstance(v, bool)):
        return
    raise openai_error(f"'{name}' must be 1: this server returns one choice per request", name)


def stop_strings(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop] if stop else []
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= 4:
        return [s for s in stop if s]
    raise openai_error("'stop' must be a string or an array of up to 4 strings", "stop")


def chat_messages(body: dict[str, Any]) -> list[dict[str, str]]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise openai_error("'messages' must be a non-empty array", "messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "developer", "tool"):
            raise openai_error(
                f"messages[{i}].role must be system, user, assistant, developer or tool", f"messages[{i}].role"
            )
        content = m.get("content")
        if isinstance(content, list):  # content parts: keep the text ones
            parts = []
            for p in content:
                if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                    raise openai_error(
                        f"messages[{i}].content: only text parts are supported", f"messages[{i}].content"
                    )
                parts.append(p["text"])
            content = "".join(parts)
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise openai_error(f"messages[{i}].content must be a string or text parts", f"messages[{i}].content")
        role = "system" if m["role"] == "developer" else m["role"]
        out.append({"role": role, "content": content})
    return out


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


#: The last event of every stream.
SSE_DONE = b"data: [DONE]\n\n"


def token_piece(pieces: list[bytes] | None, tid: int) -> bytes:
    """Token ``tid``'s bytes from the vocabulary, or ``<tid>`` when the vocabulary is unknown."""
    return pieces[tid] if pieces is not None and 0 <= tid < len(pieces) else f"<{tid}>".encode()


def chat_logprob(
    raw: bytes, logprob: float, top: Sequence[tuple[int, float]], pieces: list[bytes] | None
) -> dict[str, Any]:
    """One entry of OpenAI's chat ``logprobs.content``: the token, its logprob, its bytes, the top alternatives."""
    return {
        "token": raw.decode("utf-8", "replace"),
        "logprob": logprob,
        "bytes": list(raw),
        "top_logprobs": [
            {
                "token": token_piece(pieces, t).decode("utf-8", "replace"),
                "logprob": lp,
                "bytes": list(token_piece(pieces, t)),
            }
            for t, lp in top
        ],
    }


def top_logprobs(ev: Echo | Data, k: int, pieces: list[bytes] | None) -> dict[str, float] | None:
    """A completion's ``top_logprobs`` entry: token text -> logprob, the ``k`` most likely first (None for k=0)."""
    if k == 0:
        return None
    out: dict[str, float] = {}
    for tid, lp in ev.top[:k]:
        out.setdefault(token_piece(pieces, tid).decode("utf-8", "replace"), lp)
    return out


class Chunks(Protocol):
    """What turns a route's :data:`Item` s into OpenAI choices, and merges them for a whole reply."""

    def opening(self) -> list[dict[str, Any]]: ...
    def choices(self, item: Item) -> list[dict[str, Any]]: ...
    def whole(self, choices: list[dict[str, Any]]) -> dict[str, Any]: ...


class ChatChunks:
    """Chat chunk choices (``delta``, per-token ``logprobs.content``) and the whole reply's choice.

    ``top_n``: None without logprobs, else the alternatives per token (0..32);
    ``pieces``: token bytes by id (the model's vocabulary), or None.
    """

    def __init__(self, top_n: int | None, pieces: list[bytes] | None) -> None:
        self.top_n = top_n
        self.pieces = pieces

    def opening(self) -> list[dict[str, Any]]:
        return [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]

    def choices(self, item: Item) -> list[dict[str, Any]]:
        kind, value, ev = item
        if kind == "done":
            return [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": value}]
        if kind != "text":
            return []
        lp = None
        if self.top_n is not None and ev is not None and ev.logprob is not None:
            lp = {"content": [chat_logprob(bytes(ev.text), ev.logprob, ev.top[: self.top_n], self.pieces)]}
        if not value and lp is None:
            return []
        return [{"index": 0, "delta": {"content": value}, "logprobs": lp, "finish_reason": None}]

    def whole(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        content = "".join(c["delta"].get("content", "") for c in choices)
        lps = [e for c in choices if c["logprobs"] for e in c["logprobs"]["content"]]
        return {
            "index": 0,
            "message": {"role": "assistant", "content": content},
            "finish_reason": choices[-1]["finish_reason"],
            "logprobs": {"content": lps} if self.top_n is not None else None,
        }


class CompletionChunks:
    """Completion choices (``text``, per-token ``logprobs`` lists) and the whole reply's choice.

    ``prompt``: sent first when ``echo``; ``k``: None without logprobs, else
    the alternatives per token (0..32). ``text_offset`` counts characters of
    the tokens' texts from the start of the choice's text (the prompt's, with
    ``echo``), across chunks.
    """

    def __init__(self, prompt: str, k: int | None, pieces: list[bytes] | None) -> None:
        self.prompt = prompt
        self.k = k
        self.pieces = pieces
        self.offset = 0

    def opening(self) -> list[dict[str, Any]]:
        return []

    def choices(self, item: Item) -> list[dict[str, Any]]:
        kind, value, ev = item
        if kind == "done":
            return [{"text": "", "index": 0, "logprobs": None, "finish_reason": value}]
        if kind == "echo":
            rows = [] if value is None else [self._row(e, math.isnan(e.logprob)) for e in value]
            return [self._choice(self.prompt, rows)]
        if kind != "text":
            return []
        rows = [self._row(ev, False)] if self.k is not None and ev is not None else []
        return [self._choice(value, rows)] if value or rows else []

    def _row(self, ev: Echo | Data, cold: bool) -> tuple[str, float | None, dict[str, Any] | None]:
        text = bytes(ev.text).decode("utf-8", "replace")
        return (text, None, None) if cold else (text, ev.logprob, top_logprobs(ev, self.k or 0, self.pieces))

    def _choice(self, text: str, rows: list[tuple[Any, ...]]) -> dict[str, Any]:
        lp = None
        if self.k is not None:
            offsets = []
            for token, _, _ in rows:
                offsets.append(self.offset)
                self.offset += len(token)
            lp = {
                "tokens": [r[0] for r in rows],
                "token_logprobs": [r[1] for r in rows],
                "top_logprobs": [r[2] for r in rows],
                "text_offset": offsets,
            }
        return {"text": text, "index": 0, "logprobs": lp, "finish_reason": None}

    def whole(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        lp = None
        if self.k is not None:
            lp = {key: [x for c in choices if c["logprobs"] for x in c["logprobs"][key]] for key in LOGPROB_KEYS}
        return {
            "text": "".join(c["text"] for c in choices),
            "index": 0,
            "logprobs": lp,
            "finish_reason": choices[-1]["finish_reason"],
        }


def stream_error(exc: Exception, request_id: str) -> dict[str, Any]:
    """The in-band error event of a stream that failed after its 200: OpenAI's error object, with the
    message and type the same failure gets before the 200 (gateway.server.errors.engine_http_error)."""
    if isinstance(exc, (EngineError, RequestError)):
        err = engine_http_error(exc)
        message, kind = err.message, err.error_type
    else:
        log.error("request %s failed mid-stream", request_id, exc_info=exc)
        message, kind = f"internal error (request {request_id})", "api_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}
