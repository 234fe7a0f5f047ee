"""The routing key of a decision request: the text whose snapshot it reuses, hashed short.

The same key routes a request twice: inside one server the engine Pool sends
it to the engine that last served it (``gateway.engine.pool``), and every
reply of ``/v1/systemone`` and ``/v1/decisions`` carries it in
:data:`HEADER`, so that a balancer in front of several servers can hash on it
(docs/http-api.md, "Several engines, several servers").
"""

from __future__ import annotations

import hashlib
from typing import Any

from gateway.decision.prompts import as_text

#: The response header that carries a request's routing key (and the request header a client sends it in).
HEADER = "x-serveproto-route-key"
#: Hex digits kept of the SHA-256 (64 bits: a collision only shares an engine, it changes no answer).
DIGITS = 16


def routing_key(state: Any, prefix: Any = None) -> str:
    """The routing key of a request on ``state`` with fixed ``prefix`` (None: none): 16 hex digits.

    ``sha256(utf8(text)).hexdigest()[:16]`` where ``text`` is the prefix when
    one is given (not empty) (the snapshot every request with that prefix shares), else
    the state, each as the model reads it (:func:`gateway.decision.prompts.as_text`:
    a string as sent, an object or array as ``json.dumps(value, ensure_ascii=False)``).
    The key names neither the model nor the questions: requests on one
    document asking different questions of different models route alike.
    """
    text = as_text(prefix) if prefix is not None and prefix != "" else as_text(state)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:DIGITS]


def key_of_body(body: Any, state_field: str) -> str | None:
    """The routing key of a JSON ``body`` whose state is ``body[state_field]`` (``"state"`` on
    ``/v1/systemone``, ``"input"`` on ``/v1/decisions``); None when the body has no state."""
    if not isinstance(body, dict) or state_field not in body:
        return None
    return routing_key(body[state_field], body.get("prefix"))
