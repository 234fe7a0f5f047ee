"""The server room: the HTTP application over an engine.

``app`` (the App: auth, limits, the router, the decision pipeline's settings and
memory), the routes, each parse -> :func:`gateway.decision.pipeline.decide` -> reply
(``routes_jev``: ``/v1/systemone`` and ``/v1/decisions``; ``routes_openai``;
``routes_ops``: health, metrics, models, the page in ``static/``), ``errors`` (what
a handler raises as HTTP, in one place), ``body`` (the JSON body), ``auth``, ``metrics``.
May import :mod:`gateway.decision`, :mod:`gateway.engine` and :mod:`gateway.http`; never :mod:`gateway.cli`.
"""
