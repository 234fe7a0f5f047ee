"""The Jev package's paths on the app's router: ``POST /v1/systemone``, ``POST /v1/systemone/batch`` and
``POST /v1/decisions``
(:mod:`gateway.server.jev.serving` answers them)."""

from __future__ import annotations

from gateway.server.jev.serving import decisions, systemone, systemone_batch

#: (path, method, handler): the app routes each, its handler called with the app and the request.
ROUTES = (
    ("/v1/systemone", "POST", systemone),
    ("/v1/systemone/batch", "POST", systemone_batch),
    ("/v1/decisions", "POST", decisions),
)
