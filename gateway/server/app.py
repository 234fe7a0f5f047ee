"""The decision server's application: routes, auth, errors, metrics and the access log.

:class:`App` is the HTTP handler (``await app(request) -> Response``) over one
engine (the supervisor's ``gateway.engine.Engine``, or anything with its
interface). Route modules (``jev/``, ``openai/`` and ``rerank/``'s ``routes``, ``routes_ops``)
register their handlers on the app's router; what they raise becomes the
HTTP error :func:`gateway.server.errors.http_error` says (validation and
refusals 422, the engine's per-request errors by their protocol code, an
engine that is down 503 with ``Retry-After``), anything else a logged 500.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
import logging
import time
from pathlib import Path
from typing import Any

import attrs
import orjson

from gateway.decision import pipeline
from gateway.decision.calibration import Calibration
from gateway.decision.chat_template import ChatTemplate, read_gguf
from gateway.decision.decision_log import DecisionLog
from gateway.engine.errors import EngineUnavailable
from gateway.http import HTTPError, Request, Response, Router, access_line
from gateway.server import auth, routes_ops, routing
from gateway.server.errors import RETRY_AFTER, http_error, log_note
from gateway.server.fleet import Backend, PairBackend, Served
from gateway.server.jev import routes as routes_jev
from gateway.server.metrics import Metrics
from gateway.server.openai import routes as routes_openai
from gateway.server.rerank import routes as routes_rerank
from serveproto import Caps

log = logging.getLogger("serveproto.access")

#: Routes answered without an API key.
PUBLIC_ROUTES = frozenset({"/health", "/ready", "/metrics", "/", "/style.css", "/app.js"})


#: The decision routes, by the field that holds their state: their replies carry the routing key.
STATE_FIELD = {"/v1/systemone": "state", "/v1/decisions": "input"}


def _add_route_key(response: Response, request: Request, field: str) -> None:
    """Put the routing key (:mod:`gateway.server.routing`) on an error reply of a decision route, when the
    body is JSON with a state (a 200 has it from its route)."""
    if any(name == routing.HEADER for name, _ in response.headers):
        return
    try:
        key = routing.key_of_body(orjson.loads(request.body), field)
    except (orjson.JSONDecodeError, TypeError, ValueError):
        return
    if key is not None:
        response.headers.append((routing.HEADER, key))


def _timed(served: Served, timeout: float) -> Served:
    """``served`` with ``timeout`` as its decision timeout (``served`` itself when it has it already)."""
    if served.settings.timeout == timeout:
        return served
    return attrs.evolve(served, settings=attrs.evolve(served.settings, timeout=timeout))


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

    @functools.cached_property
    def max_token_bytes(self) -> int | None:
        """Bytes of the model's longest token piece (81 for SmolLM2), None when the pieces are not
        known: no token stands for more text, so a text of B bytes is at least B / this many tokens."""
        return max((len(p) for p in self.pieces), default=None) if self.pieces else None

    @classmethod
    def load(cls, caps_model: str | None, path: str | Path | None = None) -> ModelInfo:
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
        return cls(
            name,
            date,
            f"{name} served by serveproto: calibrated System One decisions by scoring options",
            template,
            None if path is None else str(path),
            pieces,
        )


@dataclasses.dataclass(frozen=True)
class AppConfig:
    """The application's own settings, built once (``serveproto serve``: from its flags).

    ``api_key``: the bearer token every non-public route requires (``None``, the default:
    none). ``request_timeout``: seconds one engine call may take before the client gets a
    503 (default 120; ``serve``'s ``--request-timeout`` defaults to 600). ``max_inflight``:
    POST requests served at once (default 256); one more is answered 503 + ``Retry-After``.
    ``strict``: refuse a ``/v1/systemone`` field this server does not read (422 naming it) instead
    of answering with an ``x_warnings`` line about it (default False; ``serve --strict``).
    """

    api_key: str | None = None
    request_timeout: float = 120.0
    max_inflight: int = 256
    strict: bool = False


class App:
    """The HTTP handler over one engine, or over several engines and models.

    ``engine``: the supervisor's engine (``caps``, ``healthy``, ``score``,
    ``decide``, ``submit``, ``read_out``) and ``model`` its :class:`ModelInfo`;
    or ``engine`` a :class:`gateway.engine.pool.Pool` and ``model`` a dict
    model name -> :class:`gateway.server.fleet.Served` (the first is the
    default model: a request naming no served model gets it; the pool's
    ``model_of`` names each engine's model). ``config``: :class:`AppConfig`
    (the bearer key, the engine call's timeout, the POST requests served at
    once: one more is answered 503 + ``Retry-After`` at once rather than
    queued past the client's timeout, the SDK giving up after 10 s); its
    ``request_timeout`` is every model's decision timeout (a served model built
    with another is served with this one).
    ``debias``: with a :class:`ModelInfo`, the :mod:`gateway.decision.debias`
    methods applied when a request does not say (``x_debias``); none by default
    (a :class:`Served` model carries its own, in its one ``settings``).

    ``decision_log`` (a :class:`gateway.decision.decision_log.DecisionLog` or
    None, the server's) is set after construction by ``serve``; so may the
    default model's ``settings``, ``calibration`` and ``model_sha256`` be, in a
    test (each replaces the default :class:`Served` whole, every engine of it
    reading it from its next request on).
    """

    def __init__(
        self,
        engine: Any,
        model: ModelInfo | dict[str, Served],
        *,
        config: AppConfig | None = None,
        debias: tuple[str, ...] = (),
    ) -> None:
        self.config = config or AppConfig()
        self.inflight = 0
        self.metrics = Metrics(
            engine_restarts=lambda: float(sum(b.status()["restarts"] for b in self.backends)),
            engine_up=lambda: 1.0 if all(b.status()["healthy"] for b in self.backends) else 0.0,
            engines=lambda: [b.status() for b in self.backends],
            load=lambda: [b.load() for b in self.backends],
        )
        if isinstance(model, dict):
            if not model:
                raise ValueError("model: at least one model")
            timeout = self.config.request_timeout
            self.served: dict[str, Served] = {name: _timed(s, timeout) for name, s in model.items()}
            self.pool = engine
            for name, s in self.served.items():
                if s.pair is not None and any(m not in self.served or self.served[m].pair for m in s.pair):
                    raise ValueError(f"model: the pair {name!r} holds {list(s.pair)}, not all served models")
            engines = list(engine.engines)
            unknown = [engine.model_of(e) for e in engines if engine.model_of(e) not in self.served]
            if unknown:
                raise ValueError(f"model: the pool's engines serve {unknown}, not in {list(self.served)}")
        else:
            served = Served.of(model, debias=debias, timeout=self.config.request_timeout)
            self.served = {served.name: served}
            self.pool = None
            engines = [engine]
        self.default = next(iter(self.served))
        self.backends = [
            Backend(
                e,
                self.served[self.pool.model_of(e)] if self.pool is not None else self.served[self.default],
                metrics=self.metrics,
                memory=pipeline.Memory(),
            )
            for e in engines
        ]
        self._by_engine = {id(b.engine): b for b in self.backends}
        self.decision_log = None
        self.router = Router()
        self.started = time.time()

        routes_ops.register(self)
        for api in (routes_jev, routes_openai, routes_rerank):  # each API package's ROUTES
            for path, method, handler in api.ROUTES:
                self.router.route(path, method, functools.partial(handler, self))

    # The default model's first engine, as the routes of a one-engine server see it.
    @property
    def engine(self) -> Any:
        return self.backends[0].engine

    @property
    def model(self) -> ModelInfo:
        return self.served[self.default].info

    @property
    def caps(self) -> Caps:
        return self.backends[0].caps

    @property
    def settings(self) -> pipeline.Settings:
        """The default model's decision settings (``gateway.decision.pipeline.Settings``). Settable, as its
        ``calibration`` and ``model_sha256`` are (a test's): the default model is then served with them, in
        place of the one it was, by every engine of it from its next request on."""
        return self.served[self.default].settings

    @settings.setter
    def settings(self, value: pipeline.Settings) -> None:
        self._set_default(attrs.evolve(self.served[self.default], settings=value))

    @property
    def calibration(self) -> Calibration | None:
        """The default model's calibration (``gateway.decision.calibration.Calibration`` or None)."""
        return self.settings.calibration

    @calibration.setter
    def calibration(self, value: Calibration | None) -> None:
        self.settings = attrs.evolve(self.settings, calibration=value)

    @property
    def model_sha256(self) -> str | None:
        """The default model file's sha256 (the decision log's lines), or None."""
        return self.served[self.default].model_sha256

    @model_sha256.setter
    def model_sha256(self, sha256: str | None) -> None:
        served = attrs.evolve(self.served[self.default], model_sha256=sha256)
        self._set_default(served)

    def _set_default(self, served: Served) -> None:
        old = self.served[self.default]
        self.served[self.default] = served
        for b in self.backends:
            if b.served is old:
                b.served = served

    @property
    def decision_log(self) -> DecisionLog | None:
        """The server's decision log (``gateway.decision.decision_log.DecisionLog``) or None: every engine's."""
        return self._decision_log

    @decision_log.setter
    def decision_log(self, log: DecisionLog | None) -> None:
        self._decision_log = log
        for b in self.backends:
            b.decision_log = log

    def reads_pictures(self, model: Any = None) -> bool:
        """Whether requests on ``model`` (a served name, else the default model) may carry pictures: every
        engine serving it has a vision projector (CAPS ``vision=1``: ``serve --mmproj``). False while one
        of them has no serving process (its CAPS unknown)."""
        name = model if isinstance(model, str) and model in self.served else self.default
        mine = [b for b in self.backends if self.pool is None or b.served.name == name]
        try:
            return bool(mine) and all(getattr(b.caps, "vision", False) for b in mine)
        except EngineUnavailable:
            return False

    def backend(self, model: str | None = None, route: str | None = None) -> Backend:
        """The engine a request on ``model`` (a served name, else the default model) with routing key
        ``route`` goes to (:meth:`gateway.engine.pool.Pool.pick`: the engine that served the key last,
        then the least loaded). Raises :class:`gateway.engine.errors.EngineUnavailable` (503) when none
        of the model's engines can serve."""
        if self.pool is None:
            chosen = self.backends[0]
        else:
            name = model if model in self.served else self.default
            pair = self.served[name].pair
            if pair is not None:  # the language model by the key, the decision engine by load
                lm = self._by_engine[id(self.pool.pick(pair[0], route))]
                self.metrics.routed.labels(lm.name, name).inc()
                return PairBackend(self.served[name], lm, self._by_engine[id(self.pool.pick(pair[1], None))])
            chosen = self._by_engine[id(self.pool.pick(name, route))]
        self.metrics.routed.labels(chosen.name, chosen.served.name).inc()
        return chosen

    def screen(self, request: Request) -> Response | None:
        """The server's look at a request's head (``request.body`` empty) before it reads the body.

        With a key, every request but those of the public routes needs it, and
        one without it gets its 401 here, so that an unauthenticated body is
        never read whole nor decoded (a compressed body would be inflated up to
        the decoded bound first): a request to an unknown path or with a method
        a path does not take too, which would be refused after its body (404,
        405; 40 such gzip bodies once took the server from 143 MB to 1.1 GB).
        Everything else goes on to :meth:`__call__`. Logged and counted as a
        response.
        """
        if not self.config.api_key:
            return None
        try:
            route, _ = self.router.resolve(request)
        except HTTPError:
            route = "unknown"  # as __call__ counts it
        if route in PUBLIC_ROUTES:
            return None
        try:
            auth.check(request, self.config.api_key)
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
                auth.check(request, self.config.api_key)
            if request.method == "POST":
                if self.inflight >= self.config.max_inflight:
                    raise HTTPError(
                        503,
                        "overloaded_error",
                        f"{self.inflight} requests are being served; retry shortly",
                        headers=[("retry-after", RETRY_AFTER)],
                    )
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
        if route in STATE_FIELD and response.status != 200:
            _add_route_key(response, request, STATE_FIELD[route])
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
