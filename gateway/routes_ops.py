"""Operational routes: ``GET /health``, ``GET /v1`` (the index), ``GET /metrics`` (Prometheus text)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.http import Request, Response

if TYPE_CHECKING:
    from gateway.app import App


def capabilities(app: "App") -> list[str]:
    """``["chat", "systemone"]`` for a language model, ``["systemone", "decision"]`` for a decision-only
    engine, ``["chat", "systemone", "decision"]`` for a chat engine with a decision head."""
    caps = app.caps
    out = ["chat"] if caps.chat else []
    out.append("systemone")
    if caps.decide:
        out.append("decision")
    return out


def register(app: "App") -> None:
    async def health(request: Request) -> Response:
        healthy = bool(getattr(app.engine, "healthy", True))
        body = {"status": "ok" if healthy else "unavailable", "model": app.model.name}
        if not healthy:
            return Response.json(body, 503, [("retry-after", "1")])
        return Response.json(body)

    async def index(request: Request) -> Response:
        return Response.json({
            "object": "index",
            "model": app.model.name,
            "capabilities": capabilities(app),
            "routes": [
                {"method": "POST", "path": "/v1/systemone", "doc": "TypeSafe Jev System One: typed decisions with a probability per option"},
                {"method": "POST", "path": "/v1/decisions", "doc": "OpenAI Decisions API shape, same scoring"},
                {"method": "GET", "path": "/v1/models", "doc": "the served model (Jev models and OpenAI data)"},
                {"method": "POST", "path": "/v1/chat/completions", "doc": "OpenAI chat completions (stream or not)"},
                {"method": "POST", "path": "/v1/completions", "doc": "OpenAI completions, echo + logprobs read the prompt out"},
                {"method": "GET", "path": "/health", "doc": "200 when the engine serves, 503 when it has failed"},
                {"method": "GET", "path": "/metrics", "doc": "Prometheus text format"},
            ],
        })

    async def metrics(request: Request) -> Response:
        body, content_type = app.metrics.render()
        return Response.text(body, content_type=content_type)

    app.router.route("/health", "GET", health)
    app.router.route("/v1", "GET", index)
    app.router.route("/metrics", "GET", metrics)
