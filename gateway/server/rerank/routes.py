"""The rerank package's paths on the app's router (:mod:`gateway.server.rerank.serving` answers them)."""

from __future__ import annotations

from gateway.server.rerank.serving import rerank

#: (path, method, handler): the app routes each, its handler called with the app and the request. Cohere's
#: v1 and v2 clients, Jina's and llama.cpp's (``/v1/rerank``, ``/rerank``).
ROUTES = (
    ("/v1/rerank", "POST", rerank),
    ("/v2/rerank", "POST", rerank),
    ("/rerank", "POST", rerank),
)
