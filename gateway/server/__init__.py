"""The server room: the HTTP application over an engine.

``app`` (the App: auth, limits, error mapping, the router), the routes
(``routes_jev``: ``/v1/systemone`` and ``/v1/decisions``; ``routes_openai``;
``routes_ops``: health, metrics, models, the page in ``static/``), ``auth``,
``refusals`` (field-named 4xx for limits), ``metrics``.
May import :mod:`gateway.decision`, :mod:`gateway.engine` and :mod:`gateway.http`; never :mod:`gateway.cli`.
"""
