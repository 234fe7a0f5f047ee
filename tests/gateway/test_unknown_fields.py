"""Issue 48, item 4: a field ``/v1/systemone`` does not read, at any level, is named in ``x_warnings``
(the request is answered as without it, so Jev clients keep working); ``serve --strict`` refuses it
with a 422 naming it, in the shape of every other 422. The official SDK's own requests carry none."""

from __future__ import annotations

import copy

import anyio
import httpx2
import orjson
import pytest
from typesafe_sdk import Choice, Noul, Score, TypeSafeClient

from gateway.cli import build_parser
from gateway.cli.config import from_args
from gateway.decision import schema
from test_routes_support import TICKET, FakeEngine, Recorder, make_app, running

#: The ticket with a typo or an extra field at every level the schema has objects.
TYPOS = copy.deepcopy(TICKET)
TYPOS["seed"] = 7
TYPOS["x_trace"] = "abc"
TYPOS["questions"]["urgency"]["criteria"] = {"true": "the customer is blocked", "ture": "a typo"}
TYPOS["questions"]["urgency"]["instruction"] = "a typo of instructions"
TYPOS["questions"]["department"]["critera"] = {"billing": None}

WARNINGS = [
    "seed: unknown field",
    "x_trace: unknown field",
    "questions.urgency.instruction: unknown field",
    "questions.urgency.criteria.ture: unknown field",
    "questions.department.critera: unknown field",
]


def test_the_parser_names_every_unknown_field_by_its_path():
    parsed = schema.parse_request(TYPOS)
    assert parsed.warnings == WARNINGS
    assert schema.parse_request(TICKET).warnings == []


def test_strict_parsing_refuses_each_unknown_field_naming_it():
    with pytest.raises(schema.JevValidationError) as info:
        schema.parse_request(TYPOS, strict=True)
    assert info.value.errors == [
        {
            "loc": ["body", *w.removesuffix(": unknown field").split(".")],
            "msg": "Extra inputs are not permitted",
            "type": "extra_forbidden",
        }
        for w in WARNINGS
    ]
    schema.parse_request(TICKET, strict=True)  # a request of known fields passes


@pytest.mark.anyio
async def test_unknown_fields_are_warned_about_and_the_answers_are_those_without_them():
    plain = copy.deepcopy(TICKET)
    plain["questions"]["urgency"]["criteria"] = {"true": "the customer is blocked"}
    async with running(make_app(FakeEngine())) as base:
        async with httpx2.AsyncClient(base_url=base) as client:
            with_typos = await client.post("/v1/systemone", json=TYPOS)
            without = await client.post("/v1/systemone", json=plain)
    assert with_typos.status_code == 200 and without.status_code == 200
    a, b = with_typos.json(), without.json()
    assert a["x_warnings"] == WARNINGS
    assert "x_warnings" not in b
    assert a["answers"] == b["answers"]


@pytest.mark.anyio
async def test_strict_server_answers_422_naming_the_field():
    body = copy.deepcopy(TICKET)
    body["questions"]["department"]["critera"] = {"billing": None}
    async with running(make_app(FakeEngine(), strict=True)) as base:
        async with httpx2.AsyncClient(base_url=base) as client:
            refused = await client.post("/v1/systemone", json=body)
            fine = await client.post("/v1/systemone", json=TICKET)
    assert refused.status_code == 422
    assert refused.json() == {
        "detail": [
            {
                "loc": ["body", "questions", "department", "critera"],
                "msg": "Extra inputs are not permitted",
                "type": "extra_forbidden",
            }
        ],
        "error": {
            "type": "invalid_request_error",
            "message": "body.questions.department.critera: Extra inputs are not permitted",
            "param": "questions.department.critera",
        },
    }
    assert fine.status_code == 200 and "x_warnings" not in fine.json()


def test_serve_strict_flag_reaches_the_app_config():
    assert from_args(build_parser().parse_args(["serve", "--strict"])).app.strict is True
    assert from_args(build_parser().parse_args(["serve"])).app.strict is False


@pytest.mark.anyio
async def test_the_official_sdks_requests_carry_no_unknown_field():
    questions = {
        "urgency": {"type": "noul", "instructions": "Urgent?", "criteria": {"true": "blocked", "false": "not"}},
        "plain": {"type": "noul", "criteria": {"false": "not urgent"}},
        "department": {"type": "choice", "instructions": "Team?", "criteria": {"billing": "money", "sales": None}},
        "severity": {"type": "score", "instructions": "How bad?", "criteria": ["none", "some", "all"]},
        # the SDK's own question classes, serialized by it
        "typed_noul": Noul(instructions="Urgent?", criteria={"true": "blocked"}),
        "typed_choice": Choice(instructions="Team?", criteria={"billing": None, "sales": "deals"}),
        "typed_score": Score(instructions="How bad?", criteria=["none", "all"]),
    }
    rec = Recorder(make_app(FakeEngine(), strict=True))
    async with running(rec) as base:

        def call():
            with TypeSafeClient(api_key="k", base_url=base) as client:
                return client.system_one(state={"ticket": "s", "tags": ["a"]}, questions=questions)

        result = await anyio.to_thread.run_sync(call)
        async with httpx2.AsyncClient(base_url=base) as client:  # the SDK's body, read back by the lenient parser
            again = await client.post("/v1/systemone", content=bytes(rec.requests[0].body))
    assert set(result.answers) == set(questions)  # answered under --strict: nothing refused
    assert schema.parse_request(orjson.loads(rec.requests[0].body)).unknown == ()
    assert again.status_code == 200 and "x_warnings" not in again.json()


#: A ``/v1/decisions`` body with a typo or an extra field at every level its objects have.
DECISIONS_TYPOS = {
    "input": "The PR has no tests.",
    "seed": 7,
    "questions": [
        {"type": "predicate", "question": "Is it risky?", "descripton": "a typo"},
        {"type": "choice", "choices": [{"value": "merge"}, {"value": "close", "descriptoin": "drop"}]},
        {"type": "score", "levels": [{"label": "bad", "score": 0}, {"label": "good"}]},
    ],
}
DECISIONS_WARNINGS = [
    "seed: unknown field",
    "questions[0].descripton: unknown field",
    "questions[1].choices[1].descriptoin: unknown field",
    "questions[2].levels[0].score: unknown field",
]


@pytest.mark.anyio
async def test_decisions_route_warns_about_unknown_fields_and_strict_refuses_them():
    """``/v1/decisions`` as ``/v1/systemone``: each unknown field in ``x_warnings`` by its OpenAI parameter,
    the answers those without it; under ``--strict`` a 400 in OpenAI's envelope naming the first."""
    plain = copy.deepcopy(DECISIONS_TYPOS)
    del plain["seed"], plain["questions"][0]["descripton"], plain["questions"][1]["choices"][1]["descriptoin"]
    del plain["questions"][2]["levels"][0]["score"]
    async with running(make_app(FakeEngine())) as base:
        async with httpx2.AsyncClient(base_url=base) as client:
            with_typos = await client.post("/v1/decisions", json=DECISIONS_TYPOS)
            without = await client.post("/v1/decisions", json=plain)
    assert with_typos.status_code == 200 and without.status_code == 200
    assert with_typos.json()["x_warnings"] == DECISIONS_WARNINGS
    assert "x_warnings" not in without.json()
    assert with_typos.json()["answers"] == without.json()["answers"]
    eng = FakeEngine()
    async with running(make_app(eng, strict=True)) as base:
        async with httpx2.AsyncClient(base_url=base) as client:
            refused = await client.post("/v1/decisions", json=DECISIONS_TYPOS)
            fine = await client.post("/v1/decisions", json=plain)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "seed"
    assert fine.status_code == 200 and len(eng.calls) == 1  # the refused request asked nothing
