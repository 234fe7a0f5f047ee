"""JSON nested as deep as the body parser allows is answered (issue 30, item 5).

A state, instructions or label description nested 1,000 deep answered 500 with two tracebacks:
``json.dumps`` (the text the model reads) recursed past Python's stack. The text is now written
with an explicit stack beyond the C encoder's reach, byte for byte what ``json.dumps`` gives, so a
deep value reads exactly as the same text sent as a string.
"""

from __future__ import annotations

import json

import httpx2
import orjson
import pytest

from gateway.decision import jsontext
from gateway.decision.prompts import as_text
from gateway.decision.record import _raw_json
from test_routes_support import serving

pytestmark = pytest.mark.anyio

#: The deepest a request's value can be: orjson parses 1,024 levels, the body itself is one.
DEEPEST = 1023


def nested_list(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


def nested_dict(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


SHALLOW = [
    {"b": [1, 2.5, -0.0, 1e300, None, True, False], "a": {"é": 'naïve \u2028 "q" \\ \n', "": []}, "z": {}},
    [[], {}, [[]], "x", 12345678901234567890, -7],
    "plain",
    3.141592653589793,
]


@pytest.mark.parametrize("value", SHALLOW)
@pytest.mark.parametrize("sort_keys", [False, True])
@pytest.mark.parametrize("separators", [(", ", ": "), (",", ":")])
def test_the_deep_writer_is_json_dumps_byte_for_byte(value, sort_keys, separators):
    want = json.dumps(value, ensure_ascii=False, separators=separators, sort_keys=sort_keys)
    assert jsontext._dumps_deep(value, separators, sort_keys) == want
    assert jsontext.dumps(value, separators=separators, sort_keys=sort_keys) == want


def test_as_text_at_the_deepest_the_parser_allows():
    for text in (nested_list(DEEPEST), nested_dict(DEEPEST)):
        value = orjson.loads(text)
        with pytest.raises(RecursionError):
            json.dumps(value, ensure_ascii=False)  # why it was a 500
        assert as_text(value) == text
    assert _raw_json(orjson.loads(nested_dict(DEEPEST))) == '{"a":' * DEEPEST + "1" + "}" * DEEPEST
    mixed = orjson.loads('[{"k": ' * 500 + '"v"' + "}]" * 500)
    assert as_text(mixed) == '[{"k": ' * 500 + '"v"' + "}]" * 500


def post(c, path: str, raw: str):
    return c.post(path, content=raw.encode(), headers={"content-type": "application/json"})


def bodies(deep: str) -> dict[str, str]:
    """Requests with ``deep`` (JSON text) as the state, the instructions, a label's description."""
    return {
        "state": '{"state": ' + deep + ', "questions": {"q": {"type": "noul"}}}',
        "instructions": '{"state": "s", "questions": {"q": {"type": "noul", "instructions": ' + deep + "}}}",
        "description": '{"state": "s", "questions": {"q": {"type": "choice", "criteria": {"a": '
        + deep
        + ', "b": null}}}}',
    }


@pytest.mark.parametrize("mode", ["chat", "decide"])
async def test_a_value_nested_1000_deep_is_answered_as_its_text(fixture_engine, mode):
    # The same request with the deep value sent as a string (the text the model reads) gets the
    # same answer: the deep value is read, not refused, and not read differently.
    async with serving("--engine", str(fixture_engine), "--mode", mode, "--ctx", "16384") as base:
        async with httpx2.AsyncClient(base_url=base, timeout=60) as c:
            for deep in (nested_list(1000), nested_dict(1000)):
                for field, raw in bodies(deep).items():
                    r = await post(c, "/v1/systemone", raw)
                    same = await post(c, "/v1/systemone", raw.replace(deep, orjson.dumps(deep).decode(), 1))
                    assert r.status_code == 200, (field, r.text)
                    assert same.status_code == 200, (field, same.text)
                    assert r.json()["answers"] == same.json()["answers"], field
                    assert r.json()["usage"] == same.json()["usage"], field
            decisions = await post(
                c,
                "/v1/decisions",
                '{"input": ' + nested_list(DEEPEST) + ', "questions": [{"type": "predicate", "question": "Q?"}]}',
            )
            deepest = await post(c, "/v1/systemone", bodies(nested_list(DEEPEST))["state"])
            too_deep = await post(c, "/v1/systemone", bodies(nested_list(DEEPEST + 1))["state"])
    assert decisions.status_code == 200 and deepest.status_code == 200
    assert deepest.json()["usage"]["input_tokens"] == (2289 if mode == "chat" else 2081)
    assert too_deep.status_code == 422
    assert too_deep.json()["detail"] == [
        {"loc": ["body", 1034], "msg": "JSON decode error: depth limit exceeded", "type": "json_invalid"}
    ]
