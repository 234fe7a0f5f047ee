"""The server room: the HTTP application over an engine.

``app`` (the App: auth, limits, the router, the decision pipeline's settings and
memory), the routes, each parse -> :func:`gateway.decision.pipeline.decide` -> reply
(``jev/``: ``/v1/systemone`` and ``/v1/decisions``, one package per API in the shape serving
stacks use: ``protocol`` the wire, ``serving`` each request, ``routes`` the paths; ``openai/``: the OpenAI routes;
``rerank/``: ``/v1/rerank``; ``routes_ops``: health, metrics, models, the page in ``static/``), ``deciding`` (the
decision as every route asks it: the pipeline call and the Jev answers, shared by the Jev routes, rerank
and the chat route's ``jev``), ``errors`` (what a handler raises as HTTP, in one place), ``body`` (the
JSON body), ``auth``, ``metrics``.
May import :mod:`gateway.decision`, :mod:`gateway.engine` and :mod:`gateway.http`; never :mod:`gateway.cli`.
"""
