"""The Jev package's paths on the app's router: ``POST /v1/systemone``, ``POST /v1/systemone/batch`` and
``POST /v1/decisions``
(:mod:`gateway.server.jev.serving` answers them)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from gateway.server.jev.serving import decisions, systemone, systemone_batch

if TYPE_CHECKING:
    from gateway.server.app import App

#: (path, method, handler): each handler is called with the app and the request.
ROUTES = (
    ("/v1/systemone", "POST", systemone),
    ("/v1/systemone/batch", "POST", systemone_batch),
    ("/v1/decisions", "POST", decisions),
)


def register(app: App) -> None:
    """Route :data:`ROUTES` on ``app``'s router."""
    for path, method, handler in ROUTES:
        app.router.route(path, method, functools.partial(handler, app))
