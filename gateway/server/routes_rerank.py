"""``POST /v1/rerank`` (and ``/v2/rerank``, ``/rerank``): documents ranked by the probability of "yes".

The Cohere / Jina / llama.cpp request shape (:func:`gateway.decision.rerank.parse`) becomes
one System One request, the query as its state and one noul per document
(:func:`gateway.decision.rerank.questions_request`), answered by the same path as
``/v1/systemone`` (:func:`gateway.server.deciding.decide`: the pre-check of texts no
context can hold, the pipeline, the metrics; the decision log's lines, question ids ``"0"``,
``"1"``, ... by document), under the request's ``x_debias`` (else
:data:`gateway.decision.rerank.DEFAULT_DEBIAS`) and the server's calibration. Each document's ``relevance_score`` is its
reported probability of yes. A refusal of the engine names the rerank field
(``documents[3].text``, ``query``); a client that leaves cancels the engine work, as on
every route (:mod:`gateway.http.server`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from gateway.decision import rerank
from gateway.decision.calibration import IDENTITY
from gateway.decision.errors import Refused
from gateway.http import Request, Response
from gateway.server import deciding
from gateway.server.body import parse_json
from gateway.server.errors import openai_error
from gateway.server.routing import HEADER as ROUTE_HEADER
from gateway.server.routing import routing_key

if TYPE_CHECKING:
    from gateway.server.app import App

#: The paths served: Cohere's v1 and v2 clients, Jina's and llama.cpp's (``/v1/rerank``, ``/rerank``).
PATHS = ("/v1/rerank", "/v2/rerank", "/rerank")


async def rerank_route(app: App, request: Request) -> Response:
    """Answer one rerank request (module doc). Raises :class:`gateway.decision.rerank.RerankInvalid`
    (422 naming the field) and what :func:`gateway.server.deciding.decide` raises, mapped by
    :mod:`gateway.server.errors`; a model that is a decision engine alone (no language model: CAPS
    ``chat=0``) is a 400 naming ``model`` that points at ``/v1/systemone``, as chat and completions are."""
    parsed = rerank.parse(parse_json(request))
    (asked,) = rerank.questions_request(parsed)
    key = routing_key(asked.state)
    here = app.backend(parsed.model, key)
    if not here.caps.chat:
        raise openai_error(
            f"{here.model.name} is a decision engine: it ranks no documents. Ask it with POST /v1/systemone.",
            "model",
        )
    try:
        decided = await deciding.decide(here, asked)
    except Refused as exc:
        raise rerank.RerankInvalid([{**e, "loc": rerank.field_of(parsed, e["loc"])} for e in exc.errors]) from None
    deciding.log_decisions(here, request.request_id, asked, decided)  # --log-decisions: one line per document
    scores = [decided.probs[q.id][1] for q in asked.questions]
    prompt_tokens = sum(decided.prompt_tokens.values())
    body: dict[str, Any] = {
        "id": request.request_id,
        "object": "list",
        "created": int(time.time()),
        "model": here.model.name,
        "results": rerank.results(parsed, scores),
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        "x_request_id": request.request_id,
        "x_engine_ms": round(decided.engine_ms, 3),
        "x_path": decided.path,
    }
    if decided.computed is not None:
        body["x_positions"] = {"computed": decided.computed, "reused": decided.reused, "snapshot": decided.snapshot}
        if decided.disk is not None:  # an engine that keeps results on disk (CAPS x_persist), as /v1/systemone
            body["x_positions"]["disk"] = decided.disk
    if decided.debias:
        body["x_debias"] = list(decided.debias)
    body["x_calibration"] = next(iter(decided.calibration.values()), IDENTITY)
    if decided.warnings:
        body["x_warnings"] = decided.warnings
    headers = [
        ("x-serveproto-engine-ms", f"{decided.engine_ms:.3f}"),
        ("x-serveproto-path", decided.path),
        (ROUTE_HEADER, key),
    ]
    return Response.json(body, headers=headers)


def register(app: App) -> None:
    async def _rerank(request: Request) -> Response:
        return await rerank_route(app, request)

    for path in PATHS:
        app.router.route(path, "POST", _rerank)
