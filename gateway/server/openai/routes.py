"""The OpenAI package's paths on the app's router (:mod:`gateway.server.openai.serving` answers them)."""

from __future__ import annotations

from gateway.server.openai.serving import chat_completions, completions, models

#: (path, method, handler): the app routes each, its handler called with the app and the request.
ROUTES = (
    ("/v1/models", "GET", models),
    ("/v1/chat/completions", "POST", chat_completions),
    ("/v1/completions", "POST", completions),
)
