"""The Jev package's paths on the app's router: ``POST /v1/systemone`` and ``POST /v1/decisions``
(:mod:`gateway.server.jev.serving` answers them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.http import Request, Response
from gateway.server.jev.serving import decisions, systemone

if TYPE_CHECKING:
    from gateway.server.app import App


def register(app: App) -> None:
    async def _systemone(request: Request) -> Response:
        return await systemone(app, request)

    async def _decisions(request: Request) -> Response:
        return await decisions(app, request)

    app.router.route("/v1/systemone", "POST", _systemone)
    app.router.route("/v1/decisions", "POST", _decisions)
