"""The decision server's application: routes, auth, errors, metrics and the access log.

:class:`App` is the HTTP handler (``await app(request) -> Response``) over one
engine (the supervisor's ``gateway.engine.Engine``, or anything with its
interface). Route modules (``routes_jev``, ``routes_openai``, ``routes_ops``)
register their handlers on the app's router; this module maps what they
raise to HTTP: validation to 422, the engine's per-request errors by their
protocol code, an engine that is down to 503 with ``Retry-After``.
"""
from __future__ import annotations

import datetime as _dt
import json
import logging
import time
from pathlib import Path
from typing import Any

import attrs
import orjson

from gateway.chat_template import ChatTemplate, TemplateError, read_gguf
from gateway.http import HTTPError, Request, Response, Router, access_line
from gateway.jev import JevValidationError
from gateway.metrics import Metrics
from gateway.prompts import PromptBuilder
from gateway import auth

log = logging.getLogger("serveproto.access")

#: Seconds a client is told to wait when the engine is down or busy.
RETRY_AFTER = "1"
#: Routes answered without an API key.
PUBLIC_ROUTES = frozenset({"/health", "/metrics", "/", "/style.css", "/app.js"})


@attrs.frozen
class ModelInfo:
    """What the server says about its model: ``name`` (reply ``model``), ``release_date`` (YYYY-MM-DD),
    ``description``, the chat ``template``, the GGUF ``path`` and its token ``pieces`` (bytes by
    token id) when known."""

    name: str
    release_date: str
    description: str
    template: ChatTemplate
    path: str | None = None
    pieces: list[bytes] | None = None

    @classmethod
    def load(cls, caps_model: str | None, path: str | Path | None = None) -> "ModelInfo":
        """From the engine's CAPS ``model`` and, when given, the GGUF (its chat template and file date).

        Blocking (reads the GGUF's metadata): call it in a worker thread.
        """
        template = ChatTemplate.chatml()
        pieces = None
        date = _dt.date.today().isoformat()
        name = caps_model or "serveproto"
        if path is not None:
            p = Path(path)
            template, pieces = read_gguf(p)
            date = _dt.date.fromtimestamp(p.stat().st_mtime).isoformat()
            if not caps_model:
                name = p.stem
        return cls(name, date, f"{name} served by serveproto: calibrated System One decisions by scoring options", template,
                   None if path is None else str(path), pieces)


def _is_engine_error(exc: BaseException) -> bool:
    # The supervisor's error classes (gateway.engine) are recognised by name so
    # that a fake engine in tests, or an older supervisor, maps the same way.
    return any(c.__name__ in ("EngineError",) for c in type(exc).__mro__)


def _is_request_error(exc: BaseException) -> bool:
    return any(c.__name__ == "RequestError" for c in type(exc).__mro__) and hasattr(exc, "code")


def engine_http_error(exc: BaseException) -> HTTPError:
    """Map an engine failure to the HTTP error the client sees.

    ``RequestError`` by its code (spec section 7): ``DECIDE_INVALID
    <field>: <reason>`` 422 naming the field, ``DECIDE_FAILED`` 500,
    ``SLOT_BUSY`` / ``CANCELLED`` 503 + ``Retry-After``, ``BAD_REQUEST`` /
    ``EMPTY_PROMPT`` / ``NOT_SUPPORTED`` 400. Any ``EngineError`` (crashed,
    timed out, unavailable, failed to load) 503 + ``Retry-After``.
    """
    retry = [("retry-after", RETRY_AFTER)]
    if _is_request_error(exc):
        code, reason = exc.code, getattr(exc, "reason", "")
        if code == "DECIDE_INVALID":
            field, _, why = reason.partition(": ")
            loc = ["body", *[p for p in field.split(".") if p]] if why else ["body"]
            detail = [{"loc": loc, "msg": why or reason or "refused by the decision engine", "type": "decide_invalid"}]
            return HTTPError(422, "invalid_request_error", reason,
                             body=validation_body(detail, reason or "refused by the decision engine", ".".join(loc[1:])))
        if code == "DECIDE_FAILED":
            return HTTPError(500, "api_error", f"the decision engine failed: {reason}")
        if code in ("SLOT_BUSY", "CANCELLED"):
            return HTTPError(503, "overloaded_error", f"engine: {code} {reason}".strip(), headers=retry)
        if code in ("BAD_REQUEST", "EMPTY_PROMPT", "NOT_SUPPORTED"):
            return HTTPError(400, "invalid_request_error", f"the engine refused the request: {code} {reason}".strip())
        return HTTPError(502, "api_error", f"engine error {code} {reason}".strip())
    return HTTPError(503, "overloaded_error", f"the engine is unavailable: {exc}", headers=retry)


def validation_body(detail: list[dict[str, Any]], message: str, param: str) -> dict[str, Any]:
    """Every 422 body: Jev's ``detail`` list (what the SDK reads) and an ``error`` envelope beside it,
    ``{"type": "invalid_request_error", "message", "param"}`` (``param``: the dotted field, ``""`` for
    the body as a whole), the same shape :meth:`JevValidationError.body` gives."""
    return {"detail": detail, "error": {"type": "invalid_request_error", "message": message, "param": param}}


def parse_json(request: Request) -> Any:
    """The request body as JSON (orjson). Raises a 422 ``json_invalid`` with Jev's ``detail`` list, a 422
    ``duplicate_key`` naming the first object that repeats a key (:func:`duplicate_key`), and a 415 for a
    multipart body (the SDK's image assets: this server serves text models)."""
    ctype = (request.header("content-type") or "").lower()
    if ctype.startswith("multipart/"):
        raise HTTPError(415, "unsupported_media_type", "multipart bodies (image assets) are not supported: send JSON")
    try:
        value = orjson.loads(request.body)
    except orjson.JSONDecodeError as exc:
        detail = [{"loc": ["body", exc.pos], "msg": f"JSON decode error: {exc.msg}", "type": "json_invalid"}]
        message = f"the body is not valid JSON: {exc.msg} (at character {exc.pos})"
        raise HTTPError(422, "invalid_request_error", message, body=validation_body(detail, message, "")) from None
    dup = duplicate_key(request.body) if isinstance(value, (dict, list)) else None
    if dup is not None:
        path, key = dup
        loc = ["body", *path, key]
        msg = f"The key {key!r} is sent more than once in this object: send it once"
        param = ".".join(map(str, loc[1:]))
        detail = [{"loc": loc, "msg": msg, "type": "duplicate_key"}]
        raise HTTPError(422, "invalid_request_error", f"{param}: {msg}",
                        body=validation_body(detail, f"body.{param}: {msg}", param))
    return value


class _Repeats(dict):
    """An object of the body that repeats a key (``repeated``: the first such key)."""

    repeated: str


def duplicate_key(body: bytes) -> tuple[list[Any], str] | None:
    """``(path, key)`` of the first object (depth first, in document order) of the JSON ``body`` that
    sends ``key`` twice, or None. ``path``: keys and list indices from the top. orjson keeps the last
    value silently, other parsers the first: a request that repeats a key is refused, not guessed.

    The stdlib parser reports every key pair (``object_pairs_hook``); only called on a body orjson
    parsed. A body nested past the stdlib's recursion limit is not checked (orjson bounds the depth).
    """
    found = False

    def pairs(items: list[tuple[str, Any]]) -> dict:
        nonlocal found
        obj = dict(items)
        if len(obj) == len(items):
            return obj
        seen: set[str] = set()
        repeats = _Repeats(obj)
        repeats.repeated = next(k for k, _ in items if k in seen or seen.add(k))
        found = True
        return repeats

    try:
        tree = json.loads(body, object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return None
    if not found:
        return None
    stack: list[tuple[list[Any], Any]] = [([], tree)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, _Repeats):
            return path, node.repeated
        children = list(node.items()) if isinstance(node, dict) else list(enumerate(node)) if isinstance(node, list) else []
        stack.extend((path + [k], v) for k, v in reversed(children))
    return None


class App:
    """The HTTP handler over one engine.

    ``engine``: the supervisor's engine (``caps``, ``healthy``, ``score``,
    ``decide``, ``submit``, ``read_out``). ``model``: :class:`ModelInfo`.
    ``api_key``: required bearer token, or None for none.
    ``request_timeout``: seconds one engine call may take before the client
    gets a 503. ``max_inflight``: POST requests served at once; one more is
    answered 503 + ``Retry-After`` at once rather than queued past the
    client's timeout (the SDK gives up after 10 s). ``debias``: the
    :mod:`gateway.debias` methods applied when a request does not say
    (``x_debias``); none by default.
    """

    def __init__(self, engine: Any, model: ModelInfo, *, api_key: str | None = None, request_timeout: float = 120.0,
                 max_inflight: int = 256, debias: tuple[str, ...] = ()) -> None:
        self.engine = engine
        self.debias = tuple(debias)
        self.max_inflight = max_inflight
        self.inflight = 0
        self.model = model
        self.api_key = api_key
        self.request_timeout = request_timeout
        try:
            self.prompts = PromptBuilder(model.template)
        except TemplateError as exc:
            logging.getLogger("serveproto.serve").warning("the model's chat template is unusable (%s): prompts use ChatML", exc)
            self.prompts = PromptBuilder(ChatTemplate.chatml())
        self.metrics = Metrics(
            engine_restarts=lambda: float(getattr(engine, "restarts", 0) or 0),
            engine_up=lambda: 1.0 if getattr(engine, "healthy", True) else 0.0,
        )
        self.router = Router()
        self.started = time.time()
        from gateway import routes_jev, routes_openai, routes_ops

        routes_ops.register(self)
        routes_jev.register(self)
        routes_openai.register(self)

    @property
    def caps(self):
        return self.engine.caps

    def screen(self, request: Request) -> Response | None:
        """The server's look at a request's head (``request.body`` empty) before it reads the body.

        A route that needs the key and a request without it get their 401
        here, so that an unauthenticated body is never read whole nor
        decoded (a compressed body would be inflated up to the decoded bound
        first). Everything else (public routes, unknown paths, methods not
        allowed) goes on to :meth:`__call__`. Logged and counted as a response.
        """
        if not self.api_key:
            return None
        try:
            route, _ = self.router.resolve(request)
        except HTTPError:
            return None
        if route in PUBLIC_ROUTES:
            return None
        try:
            auth.check(request, self.api_key)
        except HTTPError as exc:
            response = exc.response()
            self.metrics.observe_request(route, request.method, response.status, 0.0)
            if log.isEnabledFor(logging.INFO):
                log.info(access_line(request, response.status, 0.0, {"error": exc.error_type}))
            return response
        return None

    async def __call__(self, request: Request) -> Response:
        started = time.perf_counter()
        route = "unknown"
        extra: dict[str, Any] = {}
        try:
            route, handler = self.router.resolve(request)
            if route not in PUBLIC_ROUTES:
                auth.check(request, self.api_key)
            if request.method == "POST":
                if self.inflight >= self.max_inflight:
                    raise HTTPError(503, "overloaded_error", f"{self.inflight} requests are being served; retry shortly",
                                    headers=[("retry-after", RETRY_AFTER)])
                self.inflight += 1
                try:
                    response = await handler(request)
                finally:
                    self.inflight -= 1
            else:
                response = await handler(request)
        except HTTPError as exc:
            response = exc.response()
            extra["error"] = exc.error_type
        except JevValidationError as exc:
            response = Response.json(exc.body(), 422)
            extra["error"] = "validation"
        except Exception as exc:
            if _is_engine_error(exc) or _is_request_error(exc):
                err = engine_http_error(exc)
                response = err.response()
                extra["error"] = f"engine: {exc}"[:300]
            else:
                log.exception("request %s failed", request.request_id)
                response = HTTPError(500, "api_error", f"internal error (request {request.request_id})").response()
                extra["error"] = repr(exc)[:300]
        seconds = time.perf_counter() - started
        self.metrics.observe_request(route, request.method, response.status, seconds)
        if log.isEnabledFor(logging.INFO):
            for name, value in response.headers:
                if name == "x-serveproto-engine-ms":
                    extra["engine_ms"] = float(value)
                elif name == "x-serveproto-path":
                    extra["via"] = value
            log.info(access_line(request, response.status, seconds, extra))
        return response
