"""SCORE's payload grammar, written once in C (engines/common/score_request.c) and used by both engines,
against the contract, serveproto's ``score_shape`` (serveproto/_events.py, spec/serve-protocol.md 9.1).

Each payload goes to serveproto-fixture, which reads SCORE with the common grammar: a payload
``score_shape`` refuses is refused ``BAD_REQUEST`` with the field and reason below (the fixture names
fields ``groups.0.options.1``, the text its older tests assert; the llama engine ``groups[0].options[1]``,
asserted in test_llama_hidden.py and test_llama_score_base.py), and one it takes is accepted. Then the
keys the contract leaves to the engine's CAPS: ``hidden`` (x_hidden) and a group's ``base``
(x_score_base), neither of which the fixture serves.
"""

from __future__ import annotations

import json

import pytest

from serveproto._events import score_shape
from test_fixture_engine_support import Fixture, payload_frame

GROUP = {"stem": "b", "options": ["c"]}

#: (payload, the reason of its BAD_REQUEST; None: the payload is accepted)
SHAPES = [
    (b"[1]", "payload: expected an object"),
    (b'{"prefix": "a", "groups": [', "payload: not valid JSON (byte 27: unexpected end)"),
    ({"groups": [GROUP]}, "prefix: expected a string"),
    ({"prefix": 1, "groups": [GROUP]}, "prefix: expected a string"),
    ({"prefix": "a", "groups": {}}, "groups: expected a non-empty array"),
    ({"prefix": "a", "groups": [GROUP], "pin": 1}, "pin: expected a boolean"),
    ({"prefix": "a", "groups": [3]}, "groups.0: expected an object"),
    ({"prefix": "a", "groups": [GROUP, {"options": ["c"]}]}, "groups.1.stem: expected a string"),
    ({"prefix": "a", "groups": [{"stem": "b", "options": []}]}, "groups.0.options: expected a non-empty array"),
    ({"prefix": "a", "groups": [{"stem": "b", "options": "c"}]}, "groups.0.options: expected a non-empty array"),
    ({"prefix": "a", "groups": [{"stem": "b", "options": ["c", 2]}]}, "groups.0.options.1: expected a string"),
    ({"prefix": "a", "groups": [GROUP, GROUP], "pin": True}, None),
    ({"prefix": "", "groups": [{"stem": "q", "options": ["xy"]}]}, None),
]


def _body(payload: dict | bytes) -> bytes:
    return payload if isinstance(payload, bytes) else json.dumps(payload).encode()


@pytest.mark.parametrize(("payload", "reason"), SHAPES, ids=[str(i) for i in range(len(SHAPES))])
def test_the_engines_grammar_is_the_contracts(payload, reason):
    body = _body(payload)
    assert (score_shape(body) is None) == (reason is not None), "the case is not what the contract says"
    with Fixture() as f:
        got = f.request(payload_frame("SCORE", 1, 0, body), 1)
    if reason is None:
        assert got.startswith(b"ACCEPT 1 ") and got.endswith(b"snapshot=none\n"), got
    else:
        assert got == b"ERROR 1 BAD_REQUEST " + reason.encode() + b"\n"


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ({"prefix": "a", "groups": [GROUP], "hidden": [0]}, "hidden: this engine reads no hidden states (x_hidden=0)"),
        (
            {"prefix": "a", "groups": [{"stem": "b", "options": ["c"], "base": 0}]},
            "groups.0.base: this engine takes no base (x_score_base=0)",
        ),
        ({"prefix": "a", "groups": [{"stem": "b", "options": ["c"], "x": 1}]}, "groups.0.x: unknown key"),
    ],
)
def test_keys_the_engine_does_not_serve_are_refused_by_name(payload, reason):
    body = _body(payload)
    assert score_shape(body) is not None  # the contract leaves them to the engine
    with Fixture() as f:
        assert f.request(payload_frame("SCORE", 1, 0, body), 1) == b"ERROR 1 BAD_REQUEST " + reason.encode() + b"\n"
