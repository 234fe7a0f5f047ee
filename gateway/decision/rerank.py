"""Reranking as decisions: a query and its documents as yes/no questions.

``POST /v1/rerank`` (:mod:`gateway.server.rerank`: the Cohere / Jina wire, parsed and answered there)
asks the decision pipeline one noul per document (:func:`questions_request`) and answers each
document's probability of "yes" as its ``relevance_score``. This module is the prompt's wording and
the decision requests it makes; nothing here does I/O.

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

from collections.abc import Sequence
from typing import Protocol

from gateway.decision.schema import Question, SystemOneRequest

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


class Ranked(Protocol):
    """What :func:`questions_request` reads of a rerank request (``gateway.server.rerank.protocol.RerankRequest``):
    the query, each document's text, the model named (or None) and the ``x_debias`` methods."""

    @property
    def query(self) -> str: ...

    @property
    def texts(self) -> Sequence[str]: ...

    @property
    def model(self) -> str | None: ...

    @property
    def debias(self) -> tuple[str, ...]: ...


def _noul(qid: str, text: str) -> Question:
    return Question(qid, "noul", text, None, True)


def questions_request(r: Ranked, order: str = QUERY_FIRST) -> list[SystemOneRequest]:
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
