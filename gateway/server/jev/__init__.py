"""TypeSafe's Jev System One API (``POST /v1/systemone``) and OpenAI's Decisions API shape
(``POST /v1/decisions``), in the shape serving stacks give each API (vLLM's ``entrypoints/openai``).

``protocol`` (the wire: the 422 body, the answers and the reply), ``serving`` (each request:
parse -> :func:`gateway.decision.pipeline.decide` -> reply, counted and logged), ``routes``
(the paths on the app's router). May import the server's shared modules (``body``, ``errors``,
``routing``), :mod:`gateway.decision`, :mod:`gateway.engine` and :mod:`gateway.http`; never another
API's package (``tests/gateway/test_layers.py``).
"""
