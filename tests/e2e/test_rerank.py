"""``POST /v1/rerank``: the request's fields, the prompts sent, the reply's shape, every 422, a departing client.

Over the toy engine of ``test_routes_support`` (an option's logprob is a sum over its characters,
:func:`char_logprob`), whose P(yes) is worked out here by hand, and over the real fixture engine
for the cancellation. The default model's ranking and the Cohere client: ``test_rerank_llama.py``.
"""

from __future__ import annotations

import math

import anyio
import httpx2
import orjson
import pytest

from gateway.decision import rerank
from gateway.decision.prompts import SYSTEM
from gateway.engine.errors import RequestError
from gateway.server.rerank import protocol
from gateway.server.routing import routing_key
from test_routes_support import FakeEngine, char_logprob, make_app, running
from test_server_disconnect import raw_post, serving, wait_until

pytestmark = pytest.mark.anyio

HEAD = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"
TAIL = "\nAnswer yes or no.<|im_end|>\n<|im_start|>assistant\n"


def p_yes() -> float:
    """softmax over (no, yes) of the toy's summed character logprobs, by hand."""
    no, yes = (sum(char_logprob(c) for c in w) for w in ("no", "yes"))
    return math.exp(yes) / (math.exp(yes) + math.exp(no))


async def post(base: str, body, path: str = "/v1/rerank"):
    async with httpx2.AsyncClient(base_url=base) as c:
        return await c.post(path, content=orjson.dumps(body), headers={"content-type": "application/json"})


def invalid(loc: list, msg: str, type_: str) -> dict:
    """The exact 422 body of one error at ``loc`` (from ``"body"``)."""
    message = f"{protocol.param(['body', *loc])}: {msg}"
    return {
        "detail": [{"loc": ["body", *loc], "msg": msg, "type": type_}],
        "error": {"type": "invalid_request_error", "message": message, "param": protocol.param(["body", *loc])},
        "message": message,
    }


async def test_one_score_the_query_as_prefix_each_document_a_group_and_the_reply_shape():
    eng = FakeEngine()
    body = {
        "model": "m",
        "query": "what is the capital?",
        "documents": ["Paris is the capital.", {"text": "Cats sleep.", "id": 7}, "Lyon is a city."],
        "return_documents": True,
        "x_debias": "none",
    }
    async with running(make_app(eng)) as base:
        r = await post(base, body)
    assert r.status_code == 200, r.text
    (call,) = eng.calls
    _, prefix, groups, _pin, _slot = call
    assert prefix == HEAD + "Search query: what is the capital?"
    assert groups == [
        (f"\n\nDocument: {d}\n\nIs this document relevant to the search query?{TAIL}", ["no", "yes"])
        for d in ("Paris is the capital.", "Cats sleep.", "Lyon is a city.")
    ]
    out = r.json()
    p = round(p_yes(), 6)
    # the toy reads the same yes/no after every document: equal scores, ties in the documents' order
    assert out["results"] == [
        {"index": 0, "relevance_score": p, "document": {"text": "Paris is the capital."}},
        {"index": 1, "relevance_score": p, "document": {"text": "Cats sleep.", "id": 7}},
        {"index": 2, "relevance_score": p, "document": {"text": "Lyon is a city."}},
    ]
    assert out["object"] == "list" and out["model"] == "fake-model" and out["id"] == out["x_request_id"]
    # each document's prompt: the toy's context (prefix + stem characters) plus its longest option
    tokens = sum(len(prefix) + len(stem) + 3 for stem, _ in groups)
    assert out["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    assert out["x_path"] == "score" and out["x_calibration"] == "identity" and "x_debias" not in out
    assert out["x_positions"] == {"computed": 3 * 5, "reused": len(prefix), "snapshot": "none"}
    assert r.headers["x-serveproto-route-key"] == routing_key("Search query: what is the capital?")


async def test_positions_from_disk_are_reported_as_on_systemone():
    eng = FakeEngine()
    eng.disk = 11  # an engine that keeps results on disk (CAPS x_persist) read 11 positions there
    body = {"query": "q", "documents": ["a", "b"], "x_debias": "none"}
    async with running(make_app(eng)) as base:
        r = await post(base, body)
        s = await post(base, {"state": "q", "questions": {"a": {"type": "noul"}}, "x_debias": "none"}, "/v1/systemone")
    assert r.status_code == 200 and s.status_code == 200, (r.text, s.text)
    assert r.json()["x_positions"]["disk"] == 11 == s.json()["x_positions"]["disk"]


async def test_scores_sorted_top_n_cut_documents_left_out_by_default():
    r = protocol.parse({"query": "q", "documents": ["a", "b", "c", "d"], "top_n": 2})
    assert protocol.results(r, [0.1, 0.7, 0.7, 0.9]) == [
        {"index": 3, "relevance_score": 0.9},
        {"index": 1, "relevance_score": 0.7},
    ]
    everything = protocol.parse({"query": "q", "texts": ["a", "b"], "top_n": 5})  # llama.cpp's name; top_n clamps
    assert everything.texts == ("a", "b")
    assert [x["index"] for x in protocol.results(everything, [0.2, 0.3])] == [1, 0]


async def test_rank_fields_read_as_field_lines():
    r = protocol.parse({"query": "q", "documents": [{"title": "T", "text": "body"}], "rank_fields": ["title", "text"]})
    assert r.texts == ("title: T\ntext: body",)


async def test_without_x_debias_the_route_reads_both_orders_and_the_content_free_listing():
    eng = FakeEngine()
    async with running(make_app(eng)) as base:  # the server's own default: none
        r = await post(base, {"query": "q", "documents": ["d"]})
    assert r.status_code == 200, r.text
    assert r.json()["x_debias"] == ["cyclic", "content_free_listing"]
    (_, _, groups, _, _), (_, free_prefix, free_groups, _, _) = eng.calls  # the toy reads the beside groups apart
    stem = "\n\nDocument: d\n\nIs this document relevant to the search query?"
    flipped = TAIL.replace("yes or no", "no or yes")
    assert groups == [(stem + TAIL, ["no", "yes"]), (stem + flipped, ["no", "yes"])]
    cf = "N/A\n\nIs this true of the text?"
    assert free_prefix == HEAD and free_groups == [(cf + TAIL, ["no", "yes"]), (cf + flipped, ["no", "yes"])]
    # both orders' mean log-probabilities less the same on "N/A": the toy reads the same everywhere, so 1/2
    assert r.json()["results"] == [{"index": 0, "relevance_score": 0.5}]


async def test_x_debias_is_read_as_on_systemone():
    eng = FakeEngine()
    async with running(make_app(eng)) as base:
        r = await post(base, {"query": "q", "documents": ["d"], "x_debias": "cyclic"})
    assert r.status_code == 200, r.text
    assert r.json()["x_debias"] == ["cyclic"]
    ((_, _, groups, _, _),) = eng.calls
    stem = "\n\nDocument: d\n\nIs this document relevant to the search query?"
    assert groups == [(stem + TAIL, ["no", "yes"]), (stem + TAIL.replace("yes or no", "no or yes"), ["no", "yes"])]


@pytest.mark.parametrize(
    ("body", "loc", "msg", "type_"),
    [
        ({"documents": ["a"]}, ["query"], "Field required", "missing"),
        ({"query": 3, "documents": ["a"]}, ["query"], "Input should be a valid string", "string_type"),
        ({"query": " ", "documents": ["a"]}, ["query"], "The query must not be empty", "string_too_short"),
        ({"query": "q"}, ["documents"], "Field required", "missing"),
        ({"query": "q", "documents": "a"}, ["documents"], "Input should be a list of documents", "list_type"),
        ({"query": "q", "documents": []}, ["documents"], "Between 1 and 1000 documents are needed, got 0", "too_short"),
        (
            {"query": "q", "documents": ["a"] * 1001},
            ["documents"],
            "Between 1 and 1000 documents are needed, got 1001",
            "too_long",
        ),
        (
            {"query": "q", "documents": ["a", 3]},
            ["documents", 1],
            "Input should be a string or an object with 'text'",
            "document_type",
        ),
        ({"query": "q", "documents": ["a", {"title": "x"}]}, ["documents", 1, "text"], "Field required", "missing"),
        (
            {"query": "q", "documents": ["a", "b", "c", {"text": 5}]},
            ["documents", 3, "text"],
            "Input should be a valid string",
            "string_type",
        ),
        (
            {"query": "q", "documents": [{"text": "a"}], "rank_fields": ["title"]},
            ["documents", 0, "title"],
            "Field required",
            "missing",
        ),
        (
            {"query": "q", "documents": ["a"], "rank_fields": "text"},
            ["rank_fields"],
            "Input should be a list of distinct field names",
            "list_type",
        ),
        ({"query": "q", "documents": ["a"], "top_n": 0}, ["top_n"], "Input should be a positive integer", "int_type"),
        (
            {"query": "q", "documents": ["a"], "top_n": True},
            ["top_n"],
            "Input should be a positive integer",
            "int_type",
        ),
        (
            {"query": "q", "documents": ["a"], "max_tokens_per_doc": -1},
            ["max_tokens_per_doc"],
            "Input should be a positive integer",
            "int_type",
        ),
        (
            {"query": "q", "documents": ["a"], "return_documents": "yes"},
            ["return_documents"],
            "Input should be a valid boolean",
            "bool_type",
        ),
        ({"query": "q", "documents": ["a"], "model": 1}, ["model"], "Input should be a valid string", "string_type"),
    ],
)
async def test_each_bad_field_is_a_422_naming_it(body, loc, msg, type_):
    eng = FakeEngine()
    async with running(make_app(eng)) as base:
        r = await post(base, body)
    assert r.status_code == 422
    assert r.json() == invalid(loc, msg, type_)
    assert eng.calls == []


async def test_bad_x_debias_and_non_object_body():
    async with running(make_app(FakeEngine())) as base:
        r = await post(base, {"query": "q", "documents": ["a"], "x_debias": "cloze,letters"})
        assert r.status_code == 422 and r.json()["error"]["param"] == "x_debias"
        r = await post(base, ["q"], path="/v2/rerank")
        assert r.status_code == 422 and r.json() == invalid(
            [], "Input should be a JSON object", "model_attributes_type"
        )


async def test_an_engine_refusal_of_a_long_document_names_documents_i_text():
    # the engine refuses the SCORE as too long: the longest part of the prompt is document 1's
    eng = FakeEngine(fail=RequestError("BAD_REQUEST", "the prompt has 9000 tokens, the context 8192"))
    async with running(make_app(eng)) as base:
        r = await post(base, {"query": "q", "documents": ["short", {"text": "long " * 400}, "x"]})
    assert r.status_code == 422
    e = r.json()
    assert e["error"]["param"] == "documents[1].text"
    assert e["detail"][0]["loc"] == ["body", "documents", 1, "text"]
    assert e["detail"][0]["type"] == "too_long"
    assert "longer than the engine's context of 4096 tokens" in e["message"]


async def test_field_of_maps_the_decision_fields():
    r = protocol.parse({"query": "q", "documents": ["a", {"text": "b"}]})
    assert protocol.field_of(r, ["body", "state"]) == ["body", "query"]
    assert protocol.field_of(r, ["body", "questions", "0"]) == ["body", "documents", 0]
    assert protocol.field_of(r, ["body", "questions", "1", "criteria", "true"]) == ["body", "documents", 1, "text"]
    assert protocol.field_of(r, ["body", "cache_slot"]) == ["body", "cache_slot"]


async def test_document_first_asks_one_request_per_document():
    r = protocol.parse({"query": "q?", "documents": ["a", "b"]})
    reqs = rerank.questions_request(r, rerank.DOCUMENT_FIRST)
    assert [x.state for x in reqs] == ["Document: a", "Document: b"]
    assert {x.questions[0].instructions for x in reqs} == {
        "Search query: q?\n\nIs this document relevant to the search query?"
    }
    with pytest.raises(ValueError, match="unknown order"):
        rerank.questions_request(r, "sideways")


#: 16 documents: one SCORE of 16 groups, 16 x 2 s at --score-delay-ms 2000.
LONG = {"query": "Is it urgent?", "documents": [f"point {i}" for i in range(16)], "x_debias": "none"}


async def test_a_departing_client_cancels_its_score(fixture_engine):
    async with serving(fixture_engine, "--score-delay-ms", "2000") as (engine, port):
        s = await anyio.connect_tcp("127.0.0.1", port)
        await s.send(raw_post("/v1/rerank", LONG))
        await wait_until(lambda: engine.in_flight == 1, "the 16-document SCORE reached the engine")
        await s.aclose()
        await wait_until(lambda: engine.in_flight == 0, "the SCORE was cancelled", deadline=10.0)  # alone: 32 s
        with anyio.fail_after(20):
            r = await post(f"http://127.0.0.1:{port}", {"query": "q", "documents": ["one"], "x_debias": "none"})
        assert r.status_code == 200, r.text
        assert [x["index"] for x in r.json()["results"]] == [0]
        assert engine.healthy
