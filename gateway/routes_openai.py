"""OpenAI-style routes: ``GET /v1/models`` (with Jev's card), ``POST /v1/chat/completions`` (SSE or
not), ``POST /v1/completions`` (with ``echo`` + ``logprobs``: the prompt's log-probabilities, which
llama-server does not give).

An engine with ``chat=0`` generates nothing: the generating routes answer 400
with a pointer to ``/v1/systemone``.
"""
from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import anyio
import orjson

from gateway.app import parse_json
from gateway.chat_template import TemplateError
from gateway.http import HTTPError, Request, Response
from gateway.routes_ops import capabilities

if TYPE_CHECKING:
    from gateway.app import App

DEFAULT_MAX_TOKENS = 256


def _bad(message: str, param: str | None = None) -> HTTPError:
    """A 400 in OpenAI's error envelope, with Jev's ``detail`` beside it (each client reads its own)."""
    return HTTPError(400, "invalid_request_error", message,
                     body={"error": {"message": message, "type": "invalid_request_error", "param": param, "code": None},
                           "detail": {"error_type": "invalid_request_error", "message": message}})


def _require_chat(app: "App") -> None:
    if not app.caps.chat:
        raise _bad(f"{app.model.name} is a decision engine: it generates nothing. Ask it with POST /v1/systemone.", "model")


def _number(body: dict, name: str, default, lo: float, hi: float, integer: bool = False):
    v = body.get(name, default)
    if v is None:
        return default
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok or not (lo <= v <= hi) or (not integer and not math.isfinite(v)):
        kind = "an integer" if integer else "a number"
        raise _bad(f"'{name}' must be {kind} in [{lo:g}, {hi:g}]", name)
    return v


def _stops(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop] if stop else []
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= 4:
        return [s for s in stop if s]
    raise _bad("'stop' must be a string or an array of up to 4 strings", "stop")


def _sampling(app: "App", body: dict) -> dict[str, Any]:
    n_ctx = int(app.caps.n_ctx or 1 << 20)
    return {
        "max_tokens": _number(body, "max_tokens", body.get("max_completion_tokens") or DEFAULT_MAX_TOKENS, 1, n_ctx, integer=True),
        "temperature": float(_number(body, "temperature", 0.0, 0.0, 2.0)),
        "top_p": float(_number(body, "top_p", 1.0, 1e-9, 1.0)),
    }


def _cut_at_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


async def _generate(app: "App", prompt: str, params: dict, stops: list[str], logprobs: int = 0):
    """Yield ``("text", str, event)`` per DATA and ``("done", finish_reason, done_event)`` last.

    Stop strings end generation on the gateway side (the engine's request is
    closed, which cancels it). Text is decoded from UTF-8 across DATA frames
    (a token may end inside a character).
    """
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    text = ""
    emitted = 0
    agen = app.engine.submit(prompt, max_tokens=params["max_tokens"], temperature=params["temperature"],
                             top_p=params["top_p"], logprobs=logprobs, pin=False, slot=None)
    try:
        async for ev in agen:
            kind = type(ev).__name__
            if kind == "Data":
                piece = decoder.decode(bytes(ev.text))
                if stops:
                    new, hit = _cut_at_stop(text + piece, stops)
                    piece = new[len(text):]
                    text = new
                    if piece:
                        yield ("text", piece, ev)
                    if hit:
                        yield ("done", "stop", None)
                        return
                else:
                    text += piece
                    if piece:
                        yield ("text", piece, ev)
                emitted += 1
            elif kind == "Done":
                tail = decoder.decode(b"", final=True)
                if tail:
                    yield ("text", tail, None)
                yield ("done", "length" if ev.length_limited else "stop", ev)
                return
            elif kind == "Echo":
                yield ("echo", None, ev)
    finally:
        aclose = getattr(agen, "aclose", None)
        if aclose is not None:
            with anyio.CancelScope(shield=True):
                await aclose()


def _messages(body: dict) -> list[dict[str, str]]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise _bad("'messages' must be a non-empty array", "messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "developer", "tool"):
            raise _bad(f"messages[{i}].role must be system, user, assistant, developer or tool", f"messages[{i}].role")
        content = m.get("content")
        if isinstance(content, list):  # content parts: keep the text ones
            parts = []
            for p in content:
                if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                    raise _bad(f"messages[{i}].content: only text parts are supported", f"messages[{i}].content")
                parts.append(p["text"])
            content = "".join(parts)
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise _bad(f"messages[{i}].content must be a string or text parts", f"messages[{i}].content")
        role = "system" if m["role"] == "developer" else m["role"]
        out.append({"role": role, "content": content})
    return out


def _sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _usage(done, completion: int) -> dict[str, int]:
    prompt = int(getattr(done, "prompt_tokens", 0) or 0) if done is not None else 0
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def chat_completions(app: "App", request: Request) -> Response:
    _require_chat(app)
    body = parse_json(request)
    if not isinstance(body, dict):
        raise _bad("the body must be a JSON object")
    messages = _messages(body)
    params = _sampling(app, body)
    stops = _stops(body)
    try:
        prompt = app.prompts.chat(messages)
    except TemplateError as exc:
        raise _bad(f"the model's chat template refuses these messages: {exc}", "messages") from None
    cid = "chatcmpl-" + request.request_id[4:]
    created = int(time.time())
    model = app.model.name
    stream = bool(body.get("stream"))
    include_usage = bool((body.get("stream_options") or {}).get("include_usage")) if isinstance(body.get("stream_options"), dict) else False

    want_lp = bool(body.get("logprobs"))
    top_n = _number(body, "top_logprobs", 0, 0, int(app.caps.max_logprobs or 20), integer=True) if want_lp else 0
    if not stream:
        text, finish, done, n = "", "stop", None, 0
        content_lps = []
        async for kind, value, ev in _generate(app, prompt, params, stops, logprobs=max(1, top_n) if want_lp else 0):
            if kind == "text":
                text += value
                n += ev is not None
                if want_lp and ev is not None and ev.logprob is not None:
                    content_lps.append(_chat_logprob(bytes(ev.text), ev.logprob, ev.top[:top_n], app.model.pieces))
            elif kind == "done":
                finish, done = value, ev
        app.metrics.generated.inc(n)
        return Response.json({
            "id": cid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish,
                         "logprobs": {"content": content_lps} if want_lp else None}],
            "usage": _usage(done, int(getattr(done, "emitted", n)) if done is not None else n),
        })

    gen = _generate(app, prompt, params, stops)
    # Start the engine request before the 200 goes out, so an engine that is down is a 503, not a broken stream.
    first = await gen.__anext__()

    async def events() -> AsyncIterator[bytes]:
        n = 0
        base = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model}
        yield _sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
        item = first
        try:
            while True:
                kind, value, ev = item
                if kind == "text":
                    n += ev is not None
                    yield _sse({**base, "choices": [{"index": 0, "delta": {"content": value}, "finish_reason": None}]})
                elif kind == "done":
                    yield _sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": value}]})
                    if include_usage:
                        yield _sse({**base, "choices": [], "usage": _usage(ev, n)})
                    break
                item = await gen.__anext__()
        except StopAsyncIteration:
            pass
        except Exception as exc:  # the engine failed mid-stream: tell the client in-band
            yield _sse({"error": {"message": f"the engine failed: {exc}", "type": "api_error"}})
        finally:
            app.metrics.generated.inc(n)
            await gen.aclose()
        yield b"data: [DONE]\n\n"

    return Response(200, [("content-type", "text/event-stream"), ("cache-control", "no-cache")], events())


#: How many snapshot levels a read-out is stitched across at most.
MAX_STITCH = 8


async def full_readout(app: "App", prompt: str, k: int, echoes: list) -> list:
    """The read-out of every position of ``prompt``, given the ``echoes`` the engine sent.

    The engine reads out from the end of the deepest snapshot it restored
    (spec section 6), so a prompt whose head was photographed comes back
    without that head. The head is then read out on its own (its own
    shallower snapshot, if any, is handled the same way) and the parts are
    stitched: each part's first position is predicted by the saved logits of
    the snapshot it resumed from, so the stitched read-out equals a cold one.
    Gives up (returns what it has) if the head does not tokenize to the
    positions it had in the whole prompt.
    """
    data = prompt.encode("utf-8")
    for _ in range(MAX_STITCH):
        if not echoes or echoes[0].position == 0:
            break
        tail = sum(len(bytes(e.text)) for e in echoes)
        head = data[: len(data) - tail]
        if not head:
            break
        part = await app.engine.read_out(head.decode("utf-8", "surrogateescape"), logprobs=max(1, k), pin=False, slot=None)
        got = [e for e in part.echoes if e.position < echoes[0].position]
        if not got or got[-1].position != echoes[0].position - 1 or b"".join(bytes(e.text) for e in got) != head[len(head) - sum(len(bytes(e.text)) for e in got):]:
            break
        echoes = got + echoes
    return echoes


def _chat_logprob(raw: bytes, logprob: float, top, pieces: list[bytes] | None) -> dict:
    """One entry of OpenAI's chat ``logprobs.content``: the token, its logprob, its bytes, the top alternatives."""
    def piece(tid: int) -> bytes:
        return pieces[tid] if pieces is not None and 0 <= tid < len(pieces) else f"<{tid}>".encode()

    return {"token": raw.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(raw),
            "top_logprobs": [{"token": piece(t).decode("utf-8", "replace"), "logprob": lp, "bytes": list(piece(t))}
                             for t, lp in top]}


def _token_text(raw: bytes) -> str:
    return bytes(raw).decode("utf-8", "replace")


def _top(ev, k: int, pieces: list[bytes] | None) -> dict[str, float] | None:
    """OpenAI's ``top_logprobs`` entry: token text -> logprob (``<id>`` when the vocabulary is unknown)."""
    if k == 0:
        return None
    out: dict[str, float] = {}
    for tid, lp in ev.top[:k]:
        key = pieces[tid].decode("utf-8", "replace") if pieces is not None and 0 <= tid < len(pieces) else f"<{tid}>"
        out.setdefault(key, lp)
    return out


async def completions(app: "App", request: Request) -> Response:
    _require_chat(app)
    body = parse_json(request)
    if not isinstance(body, dict):
        raise _bad("the body must be a JSON object")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise _bad("'prompt' must be a non-empty string", "prompt")
    if body.get("stream"):
        raise _bad("streaming is served on /v1/chat/completions; /v1/completions answers whole", "stream")
    echo = bool(body.get("echo"))
    max_logprobs = int(app.caps.max_logprobs or 32)
    logprobs = body.get("logprobs")
    k = 0 if logprobs is None else _number(body, "logprobs", 0, 0, max_logprobs, integer=True)
    want_lp = logprobs is not None
    max_tokens = body.get("max_tokens", 16)
    if max_tokens == 0 and not isinstance(max_tokens, bool):
        if not (echo and want_lp):
            raise _bad("max_tokens=0 needs echo=true and logprobs (it reads the prompt out and generates nothing)", "max_tokens")
        params = _sampling(app, {**body, "max_tokens": 1})
        max_tokens = 0
    else:
        params = _sampling(app, {**body, "max_tokens": 16 if max_tokens is None else max_tokens})
    stops = _stops(body)
    tokens: list[str] = []
    token_lps: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    text = ""
    finish = "stop"
    done = None
    if max_tokens == 0:
        ro = await app.engine.read_out(prompt, logprobs=max(1, k), pin=False, slot=None)
        done = ro.done
        echoes = list(ro.echoes)
        finish = "length"
    else:
        echoes = []
        async for kind, value, ev in _generate(app, prompt, params, stops, logprobs=max(1, k) if (want_lp and echo) or k else 0):
            if kind == "echo":
                echoes.append(ev)
            elif kind == "text":
                text += value
                if want_lp and ev is not None:
                    tokens.append(_token_text(ev.text))
                    token_lps.append(ev.logprob)
                    tops.append(_top(ev, k, app.model.pieces))
            elif kind == "done":
                finish, done = value, ev
    if echo:
        echoes = await full_readout(app, prompt, k, echoes)
    echo_tokens = [_token_text(e.text) for e in echoes]
    if echo:
        echo_lps = [None if (e.logprob is None or math.isnan(e.logprob)) else e.logprob for e in echoes]
        tokens = echo_tokens + tokens
        token_lps = echo_lps + token_lps
        tops = [(_top(e, k, app.model.pieces) if not math.isnan(e.logprob) else None) for e in echoes] + tops
        text = prompt + text
    lp_obj = None
    if want_lp:
        offsets, pos = [], 0
        for t in tokens:
            offsets.append(pos)
            pos += len(t)
        lp_obj = {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}
    emitted = int(getattr(done, "emitted", 0) or 0) if done is not None else 0
    app.metrics.generated.inc(emitted)
    return Response.json({
        "id": "cmpl-" + request.request_id[4:], "object": "text_completion", "created": int(time.time()), "model": app.model.name,
        "choices": [{"index": 0, "text": text, "logprobs": lp_obj, "finish_reason": finish}],
        "usage": _usage(done, emitted),
    })


async def models(app: "App", request: Request) -> Response:
    m = app.model
    caps = capabilities(app)
    created = int(app.started)
    return Response.json({
        "object": "list",
        "data": [{"id": m.name, "object": "model", "created": created, "owned_by": "serveproto", "capabilities": caps}],
        "models": [{"name": m.name, "description": m.description, "release_date": m.release_date, "capabilities": caps}],
    })


def register(app: "App") -> None:
    async def _models(request: Request) -> Response:
        return await models(app, request)

    async def _chat(request: Request) -> Response:
        return await chat_completions(app, request)

    async def _completions(request: Request) -> Response:
        return await completions(app, request)

    app.router.route("/v1/models", "GET", _models)
    app.router.route("/v1/chat/completions", "POST", _chat)
    app.router.route("/v1/completions", "POST", _completions)
