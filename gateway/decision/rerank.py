"""Reranking as decisions: a query and its documents as one request of yes/no questions, and back.

``POST /v1/rerank`` (:mod:`gateway.server.routes_rerank`) takes the Cohere / Jina shape
(:func:`parse`), asks the decision pipeline one noul per document (:func:`questions_request`)
and answers each document's probability of "yes" as its ``relevance_score``, sorted
(:func:`results`). Nothing here does I/O.

The prompt (the user turn of :mod:`gateway.decision.prompts`' chat, the system turn unchanged)::

    Search query: <query>

    Document: <document>

    Is this document relevant to the search query?
    Answer yes or no.

The query comes first: it is the request's state, so the prompt up to the end of the query
is the prefix every document shares, computed once (and photographed, so the same query
asked again with new documents reads only the documents); each document and the question
after it is one question's stem. The order is that of the pointwise generative rerankers
that read a relevance word after the pair (monoT5, Nogueira et al. 2020, "Document Ranking
with a Pretrained Sequence-to-Sequence Model", Findings of EMNLP: ``Query: q Document: d
Relevant:``, the probability of "true"), with our yes/no wording so that the question is a
plain noul: the server's corrections and calibration apply unchanged. The other order
(:data:`DOCUMENT_FIRST`: the document as the state, the query in the question) shares
nothing between documents; ``bench/rerank.py`` measures both.
"""

from __future__ import annotations

from typing import Any

import attrs

from gateway.decision.schema import JevValidationError, Question, SystemOneRequest, x_debias

#: Documents one request may rank (Cohere's documented bound for one call).
MAX_DOCUMENTS = 1000
#: The query's line (the state): everything up to the end of it is shared by every document.
QUERY = "Search query: {query}"
#: One document's question (its stem): the document, then the yes/no question.
QUESTION = "Document: {document}\n\nIs this document relevant to the search query?"
#: The other order, for the bench: the document as the state, the query in the question.
DOCUMENT_FIRST_STATE = "Document: {document}"
DOCUMENT_FIRST_QUESTION = "Search query: {query}\n\nIs this document relevant to the search query?"

#: The correction a request that sends no ``x_debias`` is read under (``bench/rerank.py``, bench/results/NOTEBOOK.md: on
#: the default model the best nDCG@10 and MRR of the corrections; ``content_free_listing`` moves every document's
#: log-odds alike, so it leaves the order as ``cyclic`` alone ranks and takes the model's lean to one answer out
#: of the probability, read once for all documents). Not the server's ``--debias``: that one is chosen on the
#: decision questions of ``bench/quality.py``, whose best corrections rank worse here.
DEFAULT_DEBIAS: tuple[str, ...] = ("cyclic", "content_free_listing")

QUERY_FIRST = "query_first"
DOCUMENT_FIRST = "document_first"


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


def _noul(qid: str, text: str) -> Question:
    return Question(qid, "noul", text, None, True)


def questions_request(r: RerankRequest, order: str = QUERY_FIRST) -> list[SystemOneRequest]:
    """The decision requests that rank ``r``: question id ``str(i)`` asks about document ``i``.

    :data:`QUERY_FIRST` (the route's): one request, the query as its state and one noul per
    document. :data:`DOCUMENT_FIRST`: one request per document, the document as its state and
    the query in its one noul. Both read the same words (module doc); ``normalize`` ``sum``.
    """
    if order == QUERY_FIRST:
        qs = tuple(_noul(str(i), QUESTION.format(document=t)) for i, t in enumerate(r.texts))
        return [SystemOneRequest(QUERY.format(query=r.query), qs, r.model, debias=r.debias)]
    if order == DOCUMENT_FIRST:
        q = DOCUMENT_FIRST_QUESTION.format(query=r.query)
        return [
            SystemOneRequest(DOCUMENT_FIRST_STATE.format(document=t), (_noul(str(i), q),), r.model, debias=r.debias)
            for i, t in enumerate(r.texts)
        ]
    raise ValueError(f"unknown order {order!r}")


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
