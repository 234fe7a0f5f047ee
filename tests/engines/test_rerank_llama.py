"""``POST /v1/rerank`` on the default model (SmolLM2-135M) through Cohere's own client, v1 and v2.

The ranking is checked against ``/v1/systemone`` asked the same nouls on the same server
(the query as the state, each document's question as written in :mod:`gateway.decision.rerank`):
every ``relevance_score`` must be that noul's probability, bit for bit, and the results that
order, ties by index. Then ``top_n``, ``return_documents`` and the 422s as the client raises them.
"""

from __future__ import annotations

import anyio
import httpx2
import orjson
import pytest

from gateway.decision import rerank
from test_routes_support import serving

cohere = pytest.importorskip("cohere")

pytestmark = pytest.mark.slow

QUERY = "How do I reset my password?"
DOCS = [
    "Our office is closed on public holidays.",
    "To reset your password, open Settings, choose Security and click 'Forgot password'.",
    "The password must have at least twelve characters.",
    "Invoices are sent on the first day of every month.",
]


def test_default_model_reranks_as_systemone_decides_through_cohere_clients(llama_engine):
    async def main():
        # --ctx 1024 --ctx-max 1024: a document of 2,000 words is over the longest prompt, and the engine says so
        async with serving("--threads", "2", "--ctx", "1024", "--ctx-max", "1024") as base:
            async with httpx2.AsyncClient(base_url=base, timeout=300) as c:
                jev = {
                    "state": rerank.QUERY.format(query=QUERY),
                    "x_debias": list(rerank.DEFAULT_DEBIAS),
                    "questions": {
                        str(i): {"type": "noul", "instructions": rerank.QUESTION.format(document=d)}
                        for i, d in enumerate(DOCS)
                    },
                }
                s1 = (await c.post("/v1/systemone", content=orjson.dumps(jev))).json()

            def call():
                co = cohere.Client(api_key="any", base_url=base, timeout=300)
                full = co.rerank(model="m", query=QUERY, documents=DOCS)
                top = co.rerank(
                    model="m", query=QUERY, documents=[{"text": d} for d in DOCS], top_n=2, return_documents=True
                )
                v2 = cohere.ClientV2(api_key="any", base_url=base, timeout=300).rerank(
                    model="m", query=QUERY, documents=DOCS, top_n=3
                )
                with pytest.raises(cohere.UnprocessableEntityError) as long_doc:
                    co.rerank(model="m", query=QUERY, documents=[DOCS[0], "word " * 2000])
                with pytest.raises(cohere.UnprocessableEntityError) as bad_top:
                    co.rerank(model="m", query=QUERY, documents=DOCS, top_n=0)
                return full, top, v2, long_doc.value, bad_top.value

            return s1, await anyio.to_thread.run_sync(call)

    s1, (full, top, v2, long_doc, bad_top) = anyio.run(main)
    p = {int(k): a["noul"] for k, a in s1["answers"].items()}
    expected = sorted(range(len(DOCS)), key=lambda i: (-p[i], i))
    assert [r.index for r in full.results] == expected
    assert [r.relevance_score for r in full.results] == [p[i] for i in expected]
    assert all(r.document is None for r in full.results)
    assert len(set(p.values())) == len(DOCS)  # the model reads the documents apart: the order is the model's
    assert [(r.index, r.relevance_score, r.document.text) for r in top.results] == [
        (i, p[i], DOCS[i]) for i in expected[:2]
    ]
    assert [(r.index, r.relevance_score) for r in v2.results] == [(i, p[i]) for i in expected[:3]]
    raw = full.model_dump()
    assert raw["usage"]["prompt_tokens"] == raw["usage"]["total_tokens"] > 0
    # /v1/systemone read these very prompts first: the query's snapshot and the engine's score cache answer
    assert raw["x_positions"]["computed"] == 0 and raw["x_positions"]["snapshot"] == "hit"
    assert raw["x_debias"] == ["cyclic", "content_free_listing"]  # the route's default, not the server's
    assert long_doc.body["error"]["param"] == "documents[1]"
    assert long_doc.body["detail"][0]["type"] == "too_long"
    assert "1024 tokens" in long_doc.body["message"]
    assert bad_top.body["message"] == "top_n: Input should be a positive integer"
