"""Rerank on the wire (Cohere v1 / v2, Jina, llama.cpp's shape): the request's fields, the 422 and the reply.

:func:`parse` validates a body into a :class:`RerankRequest` (:class:`RerankInvalid`, every error naming
the field as the client wrote it: ``documents[3].text``); :func:`field_of` names a decision request's
field (an engine's refusal) as the rerank field; :func:`results` and :func:`reply` are the 200 body. How
the documents are asked is the decision room's (:mod:`gateway.decision.rerank`).
"""

from __future__ import annotations

import time
from typing import Any

import attrs

from gateway.decision.calibration import IDENTITY
from gateway.decision.pipeline import Decided
from gateway.decision.rerank import DEFAULT_DEBIAS
from gateway.decision.schema import JevValidationError, x_debias

#: Documents one request may rank (Cohere's documented bound for one call).
MAX_DOCUMENTS = 1000


class RerankInvalid(JevValidationError):
    """A ``/v1/rerank`` body that does not validate: ``errors`` as :class:`JevValidationError`
    (``loc`` from ``"body"``); the 422 names the field as ``documents[3].text``."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(errors)
        self.args = ("; ".join(f"{param(e['loc'])}: {e['msg']}" for e in errors),)

    def body(self) -> dict[str, Any]:
        """The 422 body: ``detail`` (every error), the ``error`` envelope naming the first field
        (``param``, :func:`param`), and ``message`` (what Cohere's and Jina's clients print)."""
        return {
            "detail": self.errors,
            "error": {"type": "invalid_request_error", "message": str(self), "param": param(self.errors[0]["loc"])},
            "message": str(self),
        }


def param(loc: list[Any]) -> str:
    """A field path as the client wrote it: ``["body", "documents", 3, "text"]`` is ``documents[3].text``
    (``""`` for the body as a whole)."""
    out = ""
    for part in loc[1:]:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


@attrs.frozen
class RerankRequest:
    """A validated rerank request.

    ``query``: the query text; ``texts[i]``: what the model reads of document ``i``
    (a string as sent; an object's ``text``, or its ``rank_fields`` as ``field: value`` lines);
    ``sent[i]``: document ``i`` as sent (for ``return_documents``); ``objects[i]``: whether it
    was sent as an object (its field is then ``documents[i].text``); ``top_n``: results
    returned (None: all; never more than the documents); ``debias``: the ``x_debias`` methods,
    :data:`DEFAULT_DEBIAS` when the request sends none (absent or null); ``model``: the name sent or None.
    """

    query: str
    texts: tuple[str, ...]
    sent: tuple[Any, ...]
    objects: tuple[bool, ...]
    top_n: int | None = None
    return_documents: bool = False
    debias: tuple[str, ...] = DEFAULT_DEBIAS
    model: str | None = None


def _err(loc: list[Any], msg: str, type_: str) -> dict[str, Any]:
    return {"loc": ["body", *loc], "msg": msg, "type": type_}


def _positive_int(body: dict[str, Any], key: str, errors: list[dict[str, Any]]) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        errors.append(_err([key], "Input should be a positive integer", "int_type"))
        return None
    return v


def parse(body: Any) -> RerankRequest:
    """Validate a decoded ``/v1/rerank`` body (Cohere v1 / v2, Jina, llama.cpp's shape).

    ``{"model"?: str, "query": str, "documents": [str | {"text": str, ...}, ...],
    "top_n"?: int >= 1, "return_documents"?: bool, "rank_fields"?: [str, ...],
    "max_tokens_per_doc"?: int >= 1, "max_chunks_per_doc"?: int >= 1, "x_debias"?}``;
    llama.cpp's ``texts`` is taken for ``documents``. The two ``max_*`` hints are checked
    and otherwise unused: a document is never cut or split, so one whose prompt is over
    the engine's longest prompt is refused (422 ``documents[i]``), not truncated. Other
    fields are ignored, as on ``/v1/systemone``. Raises :class:`RerankInvalid` with every error.
    """
    if not isinstance(body, dict):
        raise RerankInvalid([_err([], "Input should be a JSON object", "model_attributes_type")])
    errors: list[dict[str, Any]] = []
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        errors.append(_err(["model"], "Input should be a valid string", "string_type"))
    query = body.get("query")
    if "query" not in body:
        errors.append(_err(["query"], "Field required", "missing"))
    elif not isinstance(query, str):
        errors.append(_err(["query"], "Input should be a valid string", "string_type"))
    elif not query.strip():
        errors.append(_err(["query"], "The query must not be empty", "string_too_short"))
    rank_fields = body.get("rank_fields")
    if rank_fields is not None and (
        not isinstance(rank_fields, list)
        or not rank_fields
        or not all(isinstance(f, str) and f for f in rank_fields)
        or len(set(rank_fields)) != len(rank_fields)
    ):
        errors.append(_err(["rank_fields"], "Input should be a list of distinct field names", "list_type"))
        rank_fields = None
    key = "documents" if "documents" in body or "texts" not in body else "texts"
    docs = body.get(key)
    texts: list[str] = []
    objects: list[bool] = []
    if docs is None:
        errors.append(_err(["documents"], "Field required", "missing"))
    elif not isinstance(docs, list):
        errors.append(_err([key], "Input should be a list of documents", "list_type"))
    elif not 1 <= len(docs) <= MAX_DOCUMENTS:
        errors.append(
            _err(
                [key],
                f"Between 1 and {MAX_DOCUMENTS} documents are needed, got {len(docs)}",
                "too_short" if not docs else "too_long",
            )
        )
    else:
        for i, d in enumerate(docs):
            objects.append(isinstance(d, dict))
            if isinstance(d, str):
                texts.append(d)
            elif isinstance(d, dict):
                fields = rank_fields or ["text"]
                bad = [f for f in fields if not isinstance(d.get(f), str)]
                if bad:
                    what = "Field required" if bad[0] not in d else "Input should be a valid string"
                    errors.append(_err([key, i, bad[0]], what, "missing" if bad[0] not in d else "string_type"))
                    texts.append("")
                elif rank_fields:
                    texts.append("\n".join(f"{f}: {d[f]}" for f in fields))
                else:
                    texts.append(d["text"])
            else:
                errors.append(_err([key, i], "Input should be a string or an object with 'text'", "document_type"))
                texts.append("")
    top_n = _positive_int(body, "top_n", errors)
    _positive_int(body, "max_tokens_per_doc", errors)
    _positive_int(body, "max_chunks_per_doc", errors)
    ret = body.get("return_documents")
    if ret is not None and not isinstance(ret, bool):
        errors.append(_err(["return_documents"], "Input should be a valid boolean", "bool_type"))
    methods = x_debias(body, errors)
    if methods is None:
        methods = DEFAULT_DEBIAS
    if errors:
        raise RerankInvalid(errors)
    assert isinstance(query, str) and isinstance(docs, list)
    return RerankRequest(
        query=query,
        texts=tuple(texts),
        sent=tuple(docs),
        objects=tuple(objects),
        top_n=top_n,
        return_documents=bool(ret),
        debias=methods,
        model=model,
    )


def field_of(r: RerankRequest, loc: list[Any]) -> list[Any]:
    """The rerank field of a decision request's field (a :class:`gateway.decision.errors.Refused`'s
    ``loc``, query-first): ``state`` is ``query``; ``questions.<i>`` (and anything under it) is
    ``documents[i]``, ``documents[i].text`` for a document sent as an object; the rest as it is."""
    path = list(loc[1:])
    if path[:1] == ["state"]:
        return ["body", "query"]
    if path[:1] == ["questions"] and len(path) >= 2 and str(path[1]).isdigit() and int(path[1]) < len(r.texts):
        i = int(path[1])
        return ["body", "documents", i, *(["text"] if r.objects[i] else [])]
    return ["body", *path]


def results(r: RerankRequest, scores: list[float]) -> list[dict[str, Any]]:
    """The reply's ``results``: ``{"index", "relevance_score"}`` (plus ``"document"``, ``{"text"}``
    for a string, the object as sent otherwise, under ``return_documents``) for each document,
    by score from the highest, ties in the documents' order, the first ``top_n``.

    ``scores[i]``: document ``i``'s relevance, a probability in [0, 1].
    """
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    if r.top_n is not None:
        order = order[: r.top_n]
    out = []
    for i in order:
        item: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
        if r.return_documents:
            d = r.sent[i]
            item["document"] = dict(d) if isinstance(d, dict) else {"text": d}
        out.append(item)
    return out


def reply(request_id: str, model: str, r: RerankRequest, decided: Decided) -> dict[str, Any]:
    """The 200 body of ``r`` answered by ``decided`` (its query-first decision request, question ``str(i)``
    document ``i``): ``{"id", "object": "list", "created", "model", "results" (:func:`results`, each
    document's reported probability of yes), "usage": {"prompt_tokens", "total_tokens"}}`` and the
    ``x_`` fields ``/v1/systemone`` has (``x_request_id``, ``x_engine_ms``, ``x_path``, ``x_positions``
    when the engine counts, ``x_debias`` when applied, ``x_calibration``, ``x_warnings`` when any)."""
    scores = [decided.probs[str(i)][1] for i in range(len(r.texts))]
    prompt_tokens = sum(decided.prompt_tokens.values())
    body: dict[str, Any] = {
        "id": request_id,
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "results": results(r, scores),
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        "x_request_id": request_id,
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
    return body
