"""Serving ``POST /v1/rerank``: documents ranked by the probability of "yes".

The request (:func:`gateway.server.rerank.protocol.parse`) becomes one System One request, the query as
its state and one noul per document (:func:`gateway.decision.rerank.questions_request`), answered by the
same path as ``/v1/systemone`` (:func:`gateway.server.deciding.decide`: the pre-check of texts no context
can hold, the pipeline, the metrics; the decision log's lines, question ids ``"0"``, ``"1"``, ... by
document), under the request's ``x_debias`` (else :data:`gateway.decision.rerank.DEFAULT_DEBIAS`) and the
server's calibration. Each document's ``relevance_score`` is its reported probability of yes. A refusal
of the engine names the rerank field (``documents[3].text``, ``query``); a client that leaves cancels the
engine work, as on every route (:mod:`gateway.http.server`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.decision import rerank as asking
from gateway.decision.errors import Refused
from gateway.http import Request, Response
from gateway.server import deciding
from gateway.server.body import parse_json
from gateway.server.errors import openai_error
from gateway.server.rerank import protocol
from gateway.server.routing import HEADER as ROUTE_HEADER
from gateway.server.routing import routing_key

if TYPE_CHECKING:
    from gateway.server.app import App


async def rerank(app: App, request: Request) -> Response:
    """Answer one rerank request (module doc). Raises :class:`gateway.server.rerank.protocol.RerankInvalid`
    (422 naming the field) and what :func:`gateway.server.deciding.decide` raises, mapped by
    :mod:`gateway.server.errors`; a model that is a decision engine alone (no language model: CAPS
    ``chat=0``) is a 400 naming ``model`` that points at ``/v1/systemone``, as chat and completions are."""
    parsed = protocol.parse(parse_json(request))
    (asked,) = asking.questions_request(parsed)
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
        raise protocol.RerankInvalid([{**e, "loc": protocol.field_of(parsed, e["loc"])} for e in exc.errors]) from None
    deciding.log_decisions(here, request.request_id, asked, decided)  # --log-decisions: one line per document
    body = protocol.reply(request.request_id, here.model.name, parsed, decided)
    return Response.json(body, headers=deciding.headers(decided) + [(ROUTE_HEADER, key)])
