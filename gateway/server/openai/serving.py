"""Serving OpenAI's API: ``GET /v1/models`` (with Jev's card), ``POST /v1/chat/completions`` and
``POST /v1/completions``, each answered whole or streamed as server-sent events (``stream``).
``/v1/completions`` with ``echo`` + ``logprobs`` reads the prompt out (each prompt token's
log-probability, which llama-server does not give), whole or streamed.

Both generating routes turn the engine's events into OpenAI *choices*, one per chunk
(:mod:`gateway.server.openai.protocol`'s :class:`ChatChunks`, :class:`CompletionChunks`): a
streamed reply sends each choice as one SSE chunk, a whole reply merges the same choices into
one, so the two carry the same text and logprobs. An engine with ``chat=0`` generates nothing:
these routes answer 400 with a pointer to ``/v1/systemone``.
"""

from __future__ import annotations

import codecs
import logging
import time
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

import anyio
import attrs

from gateway.decision import chat_jev, refusals
from gateway.decision.chat_template import TemplateError
from gateway.decision.errors import Refused
from gateway.engine import RequestError
from gateway.http import HTTPError, Request, Response
from gateway.server import deciding
from gateway.server.errors import openai_error
from gateway.server.openai.protocol import (
    SSE_DONE,
    ChatChunks,
    Chunks,
    CompletionChunks,
    Item,
    chat_messages,
    flag,
    json_body,
    number,
    one_choice,
    sse,
    stop_strings,
    stream_error,
    wants_usage,
)
from gateway.server.routes_ops import capabilities
from gateway.server.routing import HEADER as ROUTE_HEADER
from gateway.server.routing import routing_key
from serveproto import Accept, Data, Done, Echo

if TYPE_CHECKING:
    from gateway.server.app import App
    from gateway.server.fleet import Backend

log = logging.getLogger("serveproto.openai")

DEFAULT_MAX_TOKENS = 256
#: How many snapshot levels a read-out is stitched across at most.
MAX_STITCH = 8


def _require_chat(app: Backend) -> None:
    if not app.caps.chat:
        raise openai_error(
            f"{app.model.name} is a decision engine: it generates nothing. Ask it with POST /v1/systemone.", "model"
        )


def _sampling(app: Backend, body: dict[str, Any]) -> dict[str, Any]:
    n_ctx = int(app.caps.n_ctx or 1 << 20)
    return {
        # the default is capped by the context: a field the client did not send is never refused
        "max_tokens": number(
            body,
            "max_tokens",
            body.get("max_completion_tokens") or min(DEFAULT_MAX_TOKENS, n_ctx),
            1,
            n_ctx,
            integer=True,
        ),
        "temperature": float(number(body, "temperature", 0.0, 0.0, 2.0)),
        "top_p": float(number(body, "top_p", 1.0, 1e-9, 1.0)),
    }


class StopScan:
    """Cuts generated text at the first of ``stops``, holding back a tail that may begin one.

    ``feed(piece) -> (text to send, stopped)``: the text up to the first stop
    string, or all but the longest tail that is a proper prefix of a stop
    string (so a stop split across tokens is never sent in part); ``flush()``
    gives the held tail once generation ended without a stop.
    """

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.held = ""

    def feed(self, piece: str) -> tuple[str, bool]:
        buf = self.held + piece
        cut = min((i for i in (buf.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.held = ""
            return buf[:cut], True
        keep = max(
            (n for s in self.stops for n in range(min(len(s) - 1, len(buf)), 0, -1) if buf.endswith(s[:n])), default=0
        )
        self.held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        held, self.held = self.held, ""
        return held


@attrs.define
class Tally:
    """Token counts of one request, for ``usage``: ``prompt_tokens`` (ACCEPT's, then DONE's) and
    ``completion_tokens`` (DATA frames received, then DONE's ``emitted``)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }


async def _generate(
    app: Backend, prompt: str, params: dict[str, Any], stops: list[str], logprobs: int, tally: Tally
) -> AsyncGenerator[Item, None]:
    """Generate from ``prompt``: ``("readout", None, echo)`` per prompt position the engine reads out
    (when ``logprobs`` > 0), then the :data:`Item` s ``text`` ... ``done``; counts tokens into ``tally``.

    Text is decoded from UTF-8 across DATA frames (a token may end inside a
    character). Stop strings end generation on the gateway side: the engine
    request is closed, which cancels it. Raises the engine's errors.
    """
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    scan = StopScan(stops)
    agen = app.engine.submit(
        prompt,
        max_tokens=params["max_tokens"],
        temperature=params["temperature"],
        top_p=params["top_p"],
        logprobs=logprobs,
        pin=False,
        slot=None,
    )
    try:
        async for ev in agen:
            if isinstance(ev, Data):
                tally.completion_tokens += 1
                piece, stopped = scan.feed(decoder.decode(bytes(ev.text)))
                yield ("text", piece, ev)
                if stopped:
                    yield ("done", "stop", None)
                    return
            elif isinstance(ev, Done):
                tally.prompt_tokens, tally.completion_tokens = int(ev.prompt_tokens), int(ev.emitted)
                tail = scan.flush() + decoder.decode(b"", final=True)
                if tail:
                    yield ("text", tail, None)
                yield ("done", "length" if ev.length_limited else "stop", ev)
                return
            elif isinstance(ev, Echo):
                yield ("readout", None, ev)
            elif isinstance(ev, Accept):
                tally.prompt_tokens = int(ev.prompt_tokens)
    finally:
        aclose = getattr(agen, "aclose", None)
        if aclose is not None:
            with anyio.CancelScope(shield=True):
                await aclose()


def _check_prompt_bytes(app: Backend, prompt: str, param: str) -> None:
    """A 400 naming ``param`` for a prompt that no context of the engine's ``n_ctx`` tokens can hold,
    before the engine reads it: over ``n_ctx`` times the model's longest token piece in bytes
    (:func:`gateway.decision.refusals.over_any_context`; no check when either is unknown)."""
    n_ctx = refusals.max_prompt(app.caps)  # the longest prompt (CAPS x_max_prompt), else a slot's n_ctx
    longest = getattr(app.model, "max_token_bytes", None)
    if not isinstance(n_ctx, int) or n_ctx <= 0 or not longest or len(prompt) <= n_ctx * longest // 4:
        return
    n = len(prompt.encode("utf-8", "surrogatepass"))
    if n > n_ctx * longest:
        raise openai_error(
            f"'{param}': the prompt is longer than the engine's context of {n_ctx} tokens ({n} bytes; a token "
            f"of this model stands for at most {longest} bytes)",
            param,
        )


def _prompt_refusal(app: Backend, exc: BaseException, param: str) -> HTTPError | None:
    """A 400 naming ``param`` (the request's field the prompt came from) for the engine's refusal of a
    prompt longer than its context, with the engine's token counts; None for any other error."""
    reason = getattr(exc, "reason", "") or ""
    if not isinstance(exc, RequestError) or exc.code != "BAD_REQUEST" or not refusals.too_long(reason):
        return None
    n_ctx = getattr(app.caps, "n_ctx", None)
    limit = f" of {n_ctx} tokens" if isinstance(n_ctx, int) and n_ctx > 0 else ""
    return openai_error(
        f"'{param}': the prompt is longer than the engine's context{limit} (the engine said: {reason})", param
    )


async def _reply(
    app: Backend,
    request: Request,
    body: dict[str, Any],
    items: AsyncGenerator[Item, None],
    shape: Chunks,
    tally: Tally,
    *,
    ident: str,
    objects: tuple[str, str],
    param: str,
    extra: dict[str, Any] | None = None,
    headers: list[tuple[str, str]] | None = None,
) -> Response:
    """Answer from ``items``: one JSON reply, or (``stream: true``) SSE chunks then ``data: [DONE]``.

    ``objects``: the ``object`` of the whole reply and of a chunk. A stream
    takes the first item before its 200 goes out, so an engine that is down
    is a 503 like the whole reply's; a failure after it is one in-band
    ``data: {"error": ...}`` event before ``[DONE]``. With
    ``stream_options.include_usage`` a chunk with no choices and the
    ``usage`` comes last. A client that leaves closes ``items`` (the engine
    request is cancelled). A prompt over the engine's context is a 400 naming
    ``param``, the request's field the prompt was made from. ``extra``: fields
    added to the whole reply after ``usage``, or to a stream's first chunk (the
    ``jev`` answers); ``headers``: added to the response's.
    """
    stream = flag(body, "stream")
    include_usage = wants_usage(body)
    base = {"id": ident, "object": objects[1], "created": int(time.time()), "model": app.model.name}
    if not stream:
        choices = shape.opening()
        try:
            async for item in items:
                choices += shape.choices(item)
        except RequestError as exc:
            refused = _prompt_refusal(app, exc, param)
            if refused is not None:
                raise refused from None
            raise
        finally:
            app.metrics.generated.inc(tally.completion_tokens)
            await items.aclose()
        whole = {**base, "object": objects[0], "choices": [shape.whole(choices)], "usage": tally.usage()}
        return Response.json(whole | (extra or {}), headers=headers or [])

    try:
        first = await items.__anext__()
    except BaseException as exc:
        await items.aclose()
        refused = _prompt_refusal(app, exc, param)
        if refused is not None:
            raise refused from None
        raise

    async def events() -> AsyncGenerator[bytes, None]:
        item = first
        once = dict(extra or {})  # the first chunk's

        def chunk(choices: list[dict[str, Any]]) -> bytes:
            out = sse({**base, "choices": choices, **once})
            once.clear()
            return out

        try:
            for choice in shape.opening():
                yield chunk([choice])
            while True:
                for choice in shape.choices(item):
                    yield chunk([choice])
                if item[0] == "done":
                    break
                item = await items.__anext__()
            if include_usage:
                yield sse({**base, "choices": [], "usage": tally.usage()})
        except Exception as exc:  # after the 200: tell the client in-band
            yield sse(stream_error(exc, request.request_id))
        finally:
            app.metrics.generated.inc(tally.completion_tokens)
            await items.aclose()
        yield SSE_DONE

    return Response(
        200, [("content-type", "text/event-stream"), ("cache-control", "no-cache"), *(headers or [])], events()
    )


async def chat_completions(server: App, request: Request) -> Response:
    """``POST /v1/chat/completions``: the messages through the model's chat template, generated whole or streamed.
    ``model`` picks a served model (any other name: the default), then its least loaded engine. With a
    ``jev`` object, typed questions about the conversation are answered first (:func:`_chat_decision`)."""
    body = json_body(request)
    if body.get("jev") is not None:
        return await _chat_decision(server, request, body)
    app = _backend(server, body)
    _require_chat(app)
    messages = chat_messages(body)
    one_choice(body, "n")
    params = _sampling(app, body)
    stops = stop_strings(body)
    want_lp = flag(body, "logprobs")
    top_n = number(body, "top_logprobs", 0, 0, int(app.caps.max_logprobs or 20), integer=True) if want_lp else None
    tally = Tally()
    items = _chat_generate(app, messages, params, stops, top_n, tally)
    return await _chat_reply(app, request, body, items, top_n, tally)


def _chat_generate(
    app: Backend, turns: list[dict[str, Any]], params: dict[str, Any], stops: list[str], top_n: int | None, tally: Tally
) -> Any:
    """The generation of a chat reply: ``turns`` through the model's chat template (a template's refusal and
    a prompt over the engine's are 400s naming ``messages``), then :func:`_generate`."""
    try:
        prompt = app.served.settings.prompts.chat(turns)
    except TemplateError as exc:
        raise openai_error(f"the model's chat template refuses these messages: {exc}", "messages") from None
    _check_prompt_bytes(app, prompt, "messages")
    return _generate(app, prompt, params, stops, max(1, top_n) if top_n is not None else 0, tally)


async def _chat_reply(
    app: Backend, request: Request, body: dict[str, Any], items: Any, top_n: int | None, tally: Tally, **more: Any
) -> Response:
    """:func:`_reply` in the chat completion's shape (``chatcmpl-`` ids, its objects); ``more``: ``extra``,
    ``headers``."""
    return await _reply(
        app,
        request,
        body,
        items,
        ChatChunks(top_n, app.model.pieces),
        tally,
        ident="chatcmpl-" + request.request_id[4:],
        objects=("chat.completion", "chat.completion.chunk"),
        param="messages",
        **more,
    )


def _generates(body: dict[str, Any]) -> bool:
    """Whether a chat body asks for text: False for ``max_tokens`` (else ``max_completion_tokens``) 0."""
    limit = body.get("max_tokens", body.get("max_completion_tokens"))
    return not (limit == 0 and isinstance(limit, int) and not isinstance(limit, bool))


async def _nothing() -> AsyncGenerator[Item, None]:
    """The items of a reply that generates nothing (``jev.mode`` ``instead``): ``done`` with ``stop``."""
    yield ("done", "stop", None)


async def _chat_decision(server: App, request: Request, body: dict[str, Any]) -> Response:
    """``/v1/chat/completions`` with ``jev``: the questions answered about the conversation (its
    ``Role: content`` text as the state, :func:`gateway.decision.chat_jev.parse`) by the same path as
    ``/v1/systemone`` (:mod:`gateway.server.deciding`), on the engine the state routes to; then, by
    ``jev.mode``, the completion of the conversation as sent (``beside``), none (``instead``), or the
    completion of the conversation with the designated answer in its system turn (``then``,
    :func:`gateway.decision.chat_jev.conditioned`). The reply carries the answers in ``jev``; a refusal of
    the questions is a 422 naming the field under ``jev`` (docs/http-api.md, "Decisions on the chat route").
    """
    messages = chat_messages(body)
    generates = _generates(body)
    asked = chat_jev.parse(body["jev"], messages, generates=generates, strict=server.config.strict)
    model = body.get("model")
    key = routing_key(asked.request.state)
    app = server.backend(model if isinstance(model, str) else None, key)
    generating = asked.mode != "instead"
    if generating:
        _require_chat(app)
    one_choice(body, "n")
    params = _sampling(app, body if generates else {**body, "max_tokens": 1})
    stops = stop_strings(body)
    want_lp = flag(body, "logprobs")
    top_n = number(body, "top_logprobs", 0, 0, int(app.caps.max_logprobs or 20), integer=True) if want_lp else None
    try:
        decided = await deciding.decide(app, asked.request)
    except Refused as exc:  # the engine's refusal, named as this body's field
        raise Refused([chat_jev.in_jev(e) for e in exc.errors]) from None
    deciding.log_decisions(app, request.request_id, asked.request, decided)
    jev: dict[str, Any] = {
        "answers": deciding.answers(asked.request, decided),
        "usage": {"input_tokens": decided.input_tokens, "output_tokens": decided.output_tokens},
        "mode": asked.mode,
    }
    turns = messages
    if asked.then is not None:
        question = next(q for q in asked.request.questions if q.id == asked.then)
        i = chat_jev.chosen(decided.probs[question.id])
        note = chat_jev.then_note(question, i)
        jev["then"] = {"question": question.id, "option": chat_jev.answer_words(question, i), "note": note}
        turns = chat_jev.conditioned(messages, note, system_in_user=app.served.settings.prompts.system_in_user)
    jev |= deciding.extras(asked.request, decided)
    tally = Tally()
    items = _chat_generate(app, turns, params, stops, top_n, tally) if generating else _nothing()
    return await _chat_reply(
        app,
        request,
        body,
        items,
        top_n,
        tally,
        extra={"jev": jev},
        headers=deciding.headers(decided) + [(ROUTE_HEADER, key)],
    )


async def full_readout(app: Backend, prompt: str, k: int, echoes: list[Echo]) -> list[Echo]:
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
        part = await app.engine.read_out(
            head.decode("utf-8", "surrogateescape"), logprobs=max(1, k), pin=False, slot=None
        )
        got = [e for e in part.echoes if e.position < echoes[0].position]
        if (
            not got
            or got[-1].position != echoes[0].position - 1
            or b"".join(bytes(e.text) for e in got) != head[len(head) - sum(len(bytes(e.text)) for e in got) :]
        ):
            break
        echoes = got + echoes
    return echoes


@attrs.frozen
class CompletionAsk:
    """A validated ``/v1/completions`` body: ``prompt``; ``echo``; ``logprobs`` (None, or the
    alternatives per token); ``max_tokens`` (0: read the prompt out only); sampling ``params``; ``stops``."""

    prompt: str
    echo: bool
    logprobs: int | None
    max_tokens: int
    params: dict[str, Any]
    stops: list[str]

    @classmethod
    def parse(cls, app: Backend, body: dict[str, Any]) -> CompletionAsk:
        """Validate ``body``; raises a 400 (OpenAI's envelope) naming the field."""
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            raise openai_error("'prompt' must be a non-empty string", "prompt")
        _check_prompt_bytes(app, prompt, "prompt")
        echo = flag(body, "echo")
        one_choice(body, "n")
        one_choice(body, "best_of")
        k = number(body, "logprobs", None, 0, int(app.caps.max_logprobs or 32), integer=True)
        max_tokens = body.get("max_tokens", 16)
        if max_tokens == 0 and not isinstance(max_tokens, bool):
            if not (echo and k is not None):
                raise openai_error(
                    "max_tokens=0 needs echo=true and logprobs (it reads the prompt out and generates nothing)",
                    "max_tokens",
                )
            params = _sampling(app, {**body, "max_tokens": 1})
        else:
            params = _sampling(app, {**body, "max_tokens": 16 if max_tokens is None else max_tokens})
            max_tokens = params["max_tokens"]
        return cls(prompt, echo, k, max_tokens, params, stop_strings(body))


async def _completion_items(app: Backend, ask: CompletionAsk, tally: Tally) -> AsyncGenerator[Item, None]:
    """The :data:`Item` s of a completion: with ``echo`` the prompt part first (its full read-out
    with logprobs), then the generated tokens and ``done``.

    The prompt part waits for the engine's first event, so a stream's 200
    means the engine took the request. Its read-out is the ECHOs of the
    generating request itself, stitched by :func:`full_readout` when the
    engine resumed from a snapshot (that extra read-out queues behind the
    generation on the same KV slot).
    """
    k = ask.logprobs
    if ask.max_tokens == 0:
        assert k is not None  # CompletionAsk.parse refuses max_tokens=0 without logprobs
        ro = await app.engine.read_out(ask.prompt, logprobs=max(1, k), pin=False, slot=None)
        if ro.done is not None:
            tally.prompt_tokens = int(ro.done.prompt_tokens)
        yield ("echo", await full_readout(app, ask.prompt, k, list(ro.echoes)), None)
        yield ("done", "length", ro.done)
        return
    echoes: list[Echo] = []
    pending = ask.echo
    gen = _generate(app, ask.prompt, ask.params, ask.stops, 0 if k is None else max(1, k), tally)
    try:
        async for item in gen:
            if item[0] == "readout":
                echoes.append(item[2])
                continue
            if pending:
                pending = False
                yield ("echo", None if k is None else await full_readout(app, ask.prompt, k, echoes), None)
            yield item
    finally:
        await gen.aclose()


async def completions(server: App, request: Request) -> Response:
    """``POST /v1/completions``: a raw prompt, generated whole or streamed; ``echo`` + ``logprobs`` read it out.
    ``model`` picks a served model as on the chat route."""
    body = json_body(request)
    app = _backend(server, body)
    _require_chat(app)
    ask = CompletionAsk.parse(app, body)
    tally = Tally()
    shape = CompletionChunks(ask.prompt if ask.echo else "", ask.logprobs, app.model.pieces)
    return await _reply(
        app,
        request,
        body,
        _completion_items(app, ask, tally),
        shape,
        tally,
        ident="cmpl-" + request.request_id[4:],
        objects=("text_completion", "text_completion"),
        param="prompt",
    )


def _backend(app: App, body: dict[str, Any]) -> Backend:
    """The engine (a :class:`gateway.server.fleet.Backend`) for ``body``'s ``model``; the prompt is
    read there, so it goes to the least loaded engine of that model (no routing key)."""
    model = body.get("model")
    return app.backend(model if isinstance(model, str) else None)


async def models(app: App, request: Request) -> Response:
    """``GET /v1/models``: every served model, the default first, in OpenAI's ``data`` and Jev's ``models``
    lists; with several engines each model lists its engines in ``x_engines``
    (:meth:`gateway.server.fleet.Backend.status`); a served pair lists what it holds (``x_holds``:
    ``{"lm", "decider"}``, the served models' names) and its default reader (``x_reader``)."""
    created = int(app.started)
    data, jev_models = [], []
    for name, served in app.served.items():  # noqa: B007  (name unused; kept as written)
        m = served.info
        if served.pair is not None:  # a served pair: what it holds, and who reads by default
            lm, decider = served.pair
            backends = [b for b in app.backends if b.served.name in served.pair]
            caps = capabilities(next(b for b in backends if b.served.name == lm))
            caps += [] if "decision" in caps else ["decision"]
            extra: dict[str, Any] = {"x_holds": {"lm": lm, "decider": decider}, "x_reader": served.reader}
        else:
            backends = [b for b in app.backends if b.served is served]
            caps = capabilities(backends[0])
            extra = {}
        if len(app.backends) > 1:
            extra["x_engines"] = [b.status() for b in backends]
        data.append(
            {
                "id": m.name,
                "object": "model",
                "created": created,
                "owned_by": "serveproto",
                "capabilities": caps,
                **extra,
            }
        )
        jev_models.append(
            {
                "name": m.name,
                "description": m.description,
                "release_date": m.release_date,
                "capabilities": caps,
                **extra,
            }
        )
    return Response.json({"object": "list", "data": data, "models": jev_models})
