"""The OpenAI package's paths on the app's router (:mod:`gateway.server.openai.serving` answers them)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from gateway.server.openai.serving import chat_completions, completions, models

if TYPE_CHECKING:
    from gateway.server.app import App

#: (path, method, handler): each handler is called with the app and the request.
ROUTES = (
    ("/v1/models", "GET", models),
    ("/v1/chat/completions", "POST", chat_completions),
    ("/v1/completions", "POST", completions),
)


def register(app: App) -> None:
    """Route :data:`ROUTES` on ``app``'s router."""
    for path, method, handler in ROUTES:
        app.router.route(path, method, functools.partial(handler, app))
