"""Operational routes: ``GET /health`` (alive), ``GET /ready`` (serving: a readiness probe), ``GET /v1`` (the
index), ``GET /metrics`` (Prometheus text),
and the System One page (``GET /``, ``/style.css``, ``/app.js``: ``gateway/server/static``, no key needed;
see ``docs/terminal-and-page.md``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib import resources
from typing import TYPE_CHECKING, Any

from gateway.http import Request, Response
from gateway.server.starting import READY_PATH

if TYPE_CHECKING:
    from gateway.server.app import App
    from gateway.server.fleet import Backend


def capabilities(app: App | Backend) -> list[str]:
    """``["chat", "systemone"]`` for a language model, ``["systemone", "decision"]`` for a decision-only
    engine, ``["chat", "systemone", "decision"]`` for a chat engine with a decision head."""
    caps = app.caps
    out = ["chat"] if caps.chat else []
    out.append("systemone")
    if caps.decide:
        out.append("decision")
    return out


def _health_of_many(app: App) -> Response:
    """``/health`` of a server with several engines: ``{"status", "model" (the default), "engines": [...]}``
    (:meth:`gateway.server.fleet.Backend.status` each); 200 while every served model has a healthy
    engine, else 503 + ``Retry-After`` and ``unavailable`` naming the models that have none."""
    engines = [b.status() for b in app.backends]
    down = [name for name in app.served if not any(e["healthy"] for e in engines if e["model"] == name)]
    body: dict[str, Any] = {"status": "unavailable" if down else "ok", "model": app.model.name, "engines": engines}
    if down:
        body["unavailable"] = down
        return Response.json(body, 503, [("retry-after", "1")])
    return Response.json(body)


def served_settings(app: App) -> list[dict[str, Any]]:
    """``GET /v1``'s ``served``: per served model, the default first, what ``serve`` said when it started:
    ``{"model", "x_debias" (the default methods, [] for none), "calibration" (the file's id, or None),
    "heads" (the names of its trained heads, [] for none)}``."""
    out = []
    for name, served in app.served.items():
        s = served.settings
        out.append(
            {
                "model": name,
                "x_debias": list(s.debias),
                "calibration": s.calibration.id if s.calibration is not None else None,
                "heads": s.heads.names if s.heads is not None else [],
            }
        )
    return out


def register(app: App) -> None:
    async def health(request: Request) -> Response:
        # 200 only while the engine serves and answers the supervisor's PINGs in time; a stalled
        # or stopped engine is "unresponsive" from one missed PING interval until it is restarted.
        # With several engines: 200 while every model has an engine that serves, and each engine is listed.
        if len(app.backends) > 1:
            return _health_of_many(app)
        healthy = bool(getattr(app.engine, "healthy", True))
        if healthy:
            return Response.json({"status": "ok", "model": app.model.name})
        body = {"status": "unavailable", "model": app.model.name}
        state = getattr(app.engine, "state", None)
        if isinstance(state, str):
            body["engine"] = state
        return Response.json(body, 503, [("retry-after", "1")])

    async def ready(request: Request) -> Response:
        # The app exists once every engine of every model has loaded (gateway.server.starting answers 503
        # before): from then on ready while /health is 200, with /health's body.
        response = await health(request)
        if response.status != 200:
            return response
        return Response.json({"status": "ready", "model": app.model.name})

    async def index(request: Request) -> Response:
        return Response.json(
            {
                "object": "index",
                "model": app.model.name,
                "capabilities": capabilities(app),
                "served": served_settings(app),
                "routes": [
                    {
                        "method": "POST",
                        "path": "/v1/systemone",
                        "doc": "TypeSafe Jev System One: typed decisions with a probability per option",
                    },
                    {
                        "method": "POST",
                        "path": "/v1/systemone/batch",
                        "doc": "many states in one request: each item answered as /v1/systemone answers it, in order",
                    },
                    {"method": "POST", "path": "/v1/decisions", "doc": "OpenAI Decisions API shape, same scoring"},
                    {
                        "method": "POST",
                        "path": "/v1/rerank",
                        "doc": "Cohere/Jina rerank: documents by the probability that each is relevant, same scoring",
                    },
                    {"method": "GET", "path": "/v1/models", "doc": "the served model (Jev models and OpenAI data)"},
                    {
                        "method": "POST",
                        "path": "/v1/chat/completions",
                        "doc": "OpenAI chat completions (stream or not)",
                    },
                    {
                        "method": "POST",
                        "path": "/v1/completions",
                        "doc": "OpenAI completions, echo + logprobs read the prompt out",
                    },
                    {
                        "method": "GET",
                        "path": "/health",
                        "doc": "200 when the engine serves and answers its PINGs, 503 when it is unresponsive, restarting or has failed",  # noqa: E501  (one documented sentence)
                    },
                    {
                        "method": "GET",
                        "path": READY_PATH,
                        "doc": "readiness: 503 until every engine of every model has loaded, then as /health",
                    },
                    {"method": "GET", "path": "/metrics", "doc": "Prometheus text format"},
                ],
            }
        )

    async def metrics(request: Request) -> Response:
        body, content_type = app.metrics.render()
        return Response.text(body, content_type=content_type)

    def static(name: str, content_type: str) -> Callable[[Request], Awaitable[Response]]:
        data = (resources.files("gateway.server") / "static" / name).read_bytes()

        async def handler(request: Request) -> Response:
            return Response(200, [("content-type", content_type), ("cache-control", "no-cache")], data)

        return handler

    page = {
        "/": ("index.html", "text/html; charset=utf-8"),
        "/style.css": ("style.css", "text/css; charset=utf-8"),
        "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    }
    for path, (name, content_type) in page.items():
        try:
            app.router.route(path, "GET", static(name, content_type))
        except FileNotFoundError:  # a package installed without its page
            pass

    app.router.route("/health", "GET", health)
    app.router.route(READY_PATH, "GET", ready)
    app.router.route("/v1", "GET", index)
    app.router.route("/metrics", "GET", metrics)
