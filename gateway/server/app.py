"""The decision server's application: routes, auth, errors, metrics and the access log.

:class:`App` is the HTTP handler (``await app(request) -> Response``) over one
engine (the supervisor's ``gateway.engine.Engine``, or anything with its
interface). Route modules (``routes_jev``, ``routes_openai``, ``routes_ops``)
register their handlers on the app's router; what they raise becomes the
HTTP error :func:`gateway.server.errors.http_error` says (validation and
refusals 422, the engine's per-request errors by their protocol code, an
engine that is down 503 with ``Retry-After``), anything else a logged 500.
"""
from __future__ import annotations

import datetime as _dt
import logging
import time
from pathlib import Path
from typing import Any

import attrs

from gateway.decision import pipeline
from gateway.decision.chat_template import ChatTemplate, TemplateError, read_gguf
from gateway.http import HTTPError, Request, Response, Router, access_line
from gateway.server.metrics import Metrics
from gateway.decision.prompts import PromptBuilder
from gateway.server import auth, routes_jev, routes_openai, routes_ops
from gateway.server.errors import RETRY_AFTER, http_error, log_note

log = logging.getLogger("serveproto.access")

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


class App:
    """The HTTP handler over one engine.

    ``engine``: the supervisor's engine (``caps``, ``healthy``, ``score``,
    ``decide``, ``submit``, ``read_out``). ``model``: :class:`ModelInfo`.
    ``api_key``: required bearer token, or None for none.
    ``request_timeout``: seconds one engine call may take before the client
    gets a 503. ``max_inflight``: POST requests served at once; one more is
    answered 503 + ``Retry-After`` at once rather than queued past the
    client's timeout (the SDK gives up after 10 s). ``debias``: the
    :mod:`gateway.decision.debias` methods applied when a request does not say
    (``x_debias``); none by default.

    Set after construction by ``serve``: ``calibration`` (a
    :class:`gateway.decision.calibration.Calibration` or None) and
    ``decision_log`` (a :class:`gateway.decision.decision_log.DecisionLog` or
    None) with ``model_sha256`` (the model file's, for the log's lines).
    """

    def __init__(self, engine: Any, model: ModelInfo, *, api_key: str | None = None, request_timeout: float = 120.0,
                 max_inflight: int = 256, debias: tuple[str, ...] = ()) -> None:
        self.engine = engine
        self.max_inflight = max_inflight
        self.inflight = 0
        self.model = model
        self.api_key = api_key
        try:
            self.prompts = PromptBuilder(model.template)
        except TemplateError as exc:
            logging.getLogger("serveproto.serve").warning("the model's chat template is unusable (%s): prompts use ChatML", exc)
            self.prompts = PromptBuilder(ChatTemplate.chatml())
        #: The decision pipeline's settings and memory (gateway.decision.pipeline), shared by the Jev routes.
        self.settings = pipeline.Settings(self.prompts, debias=tuple(debias), timeout=request_timeout)
        self.memory = pipeline.Memory()
        self.metrics = Metrics(
            engine_restarts=lambda: float(getattr(engine, "restarts", 0) or 0),
            engine_up=lambda: 1.0 if getattr(engine, "healthy", True) else 0.0,
        )
        self.decision_log: Any = None
        self.model_sha256: str | None = None
        self.router = Router()
        self.started = time.time()

        routes_ops.register(self)
        routes_jev.register(self)
        routes_openai.register(self)

    @property
    def caps(self):
        return self.engine.caps

    @property
    def debias(self) -> tuple[str, ...]:
        """The :mod:`gateway.decision.debias` methods of a request that sends no ``x_debias``."""
        return self.settings.debias

    @property
    def request_timeout(self) -> float:
        """Seconds one engine call may take before the client gets a 503."""
        return self.settings.timeout

    @property
    def calibration(self):
        """The :class:`gateway.decision.calibration.Calibration` applied to answers, or None (set by ``serve``)."""
        return self.settings.calibration

    @calibration.setter
    def calibration(self, value) -> None:
        self.settings.calibration = value

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
        except Exception as exc:
            err = http_error(exc)
            if err is None:
                log.exception("request %s failed", request.request_id)
                err = HTTPError(500, "api_error", f"internal error (request {request.request_id})")
                extra["error"] = repr(exc)[:300]
            else:
                extra["error"] = log_note(exc, err)
            response = err.response()
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
