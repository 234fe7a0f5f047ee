"""serveproto-fixture --mode decide: DECIDE records in both forms
(spec/decision-record.md) answered by the rule of spec/fixture-engine.md,
compared with fixtures/toy_model.decide; refusals name the field."""

from __future__ import annotations

import json

import pytest

from fixtures import toy_model as tm
from test_fixture_engine_support import FIXTURE, Fixture, payload_frame, submit

pytestmark = [
    pytest.mark.skipif(not FIXTURE.exists(), reason="engines/bin/serveproto-fixture not built (make -C engines all)"),
    pytest.mark.timeout(60),
]

RECORD = {
    "state": "Bonjour, je n'arrive pas à payer — ça bloque tout. 😀",
    "state_type": "string",
    "questions": [
        {
            "id": "department",
            "type": "choice",
            "instructions": "Which team?",
            "options": [
                {"label": "billing", "text": "invoices"},
                {"label": "tech", "text": None},
                {"label": "sales", "text": "plans"},
            ],
        },
        {
            "id": "severity",
            "type": "score",
            "instructions": "How bad?",
            "options": [{"label": "0", "text": "none"}, {"label": "1", "text": "some"}, {"label": "2", "text": "down"}],
        },
        {
            "id": 'urgent "now"',
            "type": "noul",
            "instructions": "Is it urgent?",
            "options": [{"label": "false", "text": None}, {"label": "true", "text": None}],
        },
        {"id": "single", "type": "choice", "instructions": "Only one", "options": [{"label": "x", "text": None}]},
    ],
}

RAW_RECORD = {
    "record": "raw",
    "state": '{"a":1,"b":[2]}',
    "state_type": "object",
    "questions": [
        {
            "id": "q",
            "type": "noul",
            "instructions": None,
            "options": [{"label": "false"}, {"label": "true", "text": '{"k":"v"}', "json": True}],
        },
        {
            "id": "c",
            "type": "choice",
            "instructions": "pick",
            "options": [{"label": "a", "text": ""}, {"label": "b", "text": None}],
        },
    ],
}


def _decide(f: Fixture, rid: int, record: dict | bytes) -> tuple[bytes, dict | None]:
    body = record if isinstance(record, bytes) else json.dumps(record, ensure_ascii=False).encode()
    frames = f.request(payload_frame("DECIDE", rid, 0, body), rid)
    if not frames.startswith(b"ACCEPT"):
        return frames, None
    lines = frames.split(b"\n")
    return frames, json.loads(lines[2])


def test_decide_caps_and_refusals():
    with Fixture("--mode", "decide", "--slots", "2") as f:
        assert f.handshake.split(b"\n")[1] == b"CAPS chat=0 decide=1 slots=2 model=fixture x_health=1 x_stack=SIGUSR2"
        assert (
            f.request(submit(1, b"hi", max_tokens=1), 1) == b"ERROR 1 NOT_SUPPORTED this engine only decides (chat=0)\n"
        )
        f.send(payload_frame("SCORE", 2, 0, b"{}"))  # x_score is not advertised: an unknown kind
        assert (
            f.read_frame() + f.read_frame()
            == b"ERROR 0 BAD_FRAME unknown kind SCORE\nERROR 0 BAD_FRAME bad kind '{}'\n"
        )
        assert f.request(b"PING 3\n", 3) == b"PONG 3 active=0\n"
        assert (
            f.request(payload_frame("DECIDE", 4, 2, b"{}"), 4) == b"ERROR 4 BAD_REQUEST slot 2 out of range (slots=2)\n"
        )
    with Fixture("--mode", "decide", "--decide-record", "raw") as f:
        assert (
            f.handshake.split(b"\n")[1]
            == b"CAPS chat=0 decide=1 decide_record=raw slots=1 model=fixture x_health=1 x_stack=SIGUSR2"
        )


def test_default_form_matches_reference():
    with Fixture("--mode", "decide") as f:
        frames, decision = _decide(f, 7, RECORD)
    want = tm.decide(RECORD)
    n = want["input_tokens"]
    assert frames.startswith(b"ACCEPT 7 %d\nDECISION 7 " % n)
    assert frames.endswith(b"DONE 7 STAT 0 0 0 0 %d 0\n" % n)
    assert isinstance(decision.pop("engine_ms"), float)
    assert decision == want  # exact doubles: %.17g round-trips
    probs = {a["id"]: a["probs"] for a in decision["answers"]}
    assert probs["single"] == [1.0]
    assert all(abs(sum(p) - 1.0) < 1e-12 for p in probs.values())
    assert [a["temperature"] for a in decision["answers"]] == [1.5, 2.0, 1.0, 1.5]
    # tokens are UTF-8 bytes read: state + instructions + labels + texts
    state_bytes = len(RECORD["state"].encode())
    assert decision["answers"][0]["tokens"] == state_bytes + len("Which team?") + len("billinginvoicestechsalesplans")
    assert decision["answers"][0]["state_tokens"] == state_bytes


def test_rule_by_hand():
    """One logit worked out from the spec's formula, outside both implementations."""
    rec = {
        "state": "s",
        "state_type": "string",
        "questions": [
            {
                "id": "q",
                "type": "noul",
                "instructions": "i",
                "options": [{"label": "false", "text": None}, {"label": "true", "text": "t"}],
            }
        ],
    }
    h = 0xCBF29CE484222325
    for byte in b"s\x1fi\x1ftrue\x1ft":
        h = ((h ^ byte) * 0x100000001B3) % 2**64
    logit_true = (h >> 11) / 2**53 * 8 - 4
    with Fixture("--mode", "decide") as f:
        _, decision = _decide(f, 1, rec)
    assert decision["answers"][0]["logits"][1] == logit_true
    assert decision["input_tokens"] == 1 + 1 + 5 + 4 + 1


def test_raw_form_matches_reference_and_forms_are_not_mixed():
    with Fixture("--mode", "decide", "--decide-record", "raw") as f:
        frames, decision = _decide(f, 1, RAW_RECORD)
        decision.pop("engine_ms")
        assert decision == tm.decide(RAW_RECORD, raw=True)
        frames, _ = _decide(f, 2, RECORD)
        assert frames == b'ERROR 2 DECIDE_INVALID record: expected "raw" (this engine takes the raw form)\n'
    with Fixture("--mode", "decide") as f:
        frames, _ = _decide(f, 3, RAW_RECORD)
        assert frames == b"ERROR 3 DECIDE_INVALID record: unknown key\n"


def test_records_built_by_the_gateway_are_accepted():
    """gateway/decision/record.py's bytes, both forms, go through unchanged."""
    decision_record = pytest.importorskip("gateway.decision.record")
    jev = pytest.importorskip("gateway.decision.schema")
    body = {
        "state": {"ticket": "ça ne marche pas", "n": [1, 2]},
        "questions": {
            "u": {"type": "noul", "criteria": {"true": {"why": "x"}, "false": ""}},
            "d": {"type": "choice", "instructions": ["a", "b"], "criteria": {"x": None, "y": "why"}},
            "s": {"type": "score", "criteria": ["low", {"lvl": 1}]},
        },
    }
    req = jev.parse_request(body)
    for raw, args in ((False, ("--mode", "decide")), (True, ("--mode", "decide", "--decide-record", "raw"))):
        record = decision_record.build(req, raw=raw)
        with Fixture(*args) as f:
            frames, decision = _decide(f, 1, decision_record.serialize(record))
        assert decision is not None, frames
        decision.pop("engine_ms")
        assert decision == tm.decide(json.loads(decision_record.serialize(record)), raw=raw)


def _with(path: list, value, base=None) -> dict:
    rec = json.loads(json.dumps(base or RECORD))
    node = rec
    for key in path[:-1]:
        node = node[key]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return rec


_DELETE = object()


@pytest.mark.parametrize(
    "record, reason",
    [
        (b"{", "record: not valid JSON (byte 1: expected a string key)"),
        (b"[]", "record: expected an object"),
        (b'{"state": 1.}', "record: not valid JSON (byte 12: bad number)"),
        (b'{"state": 1e+}', "record: not valid JSON (byte 13: bad number)"),
        (b'{"state": -x}', "record: not valid JSON (byte 11: bad number)"),
        (_with(["state"], 3), "state: expected a string"),
        (_with(["state_type"], "list"), "state_type: expected one of string, object, array, number, boolean, null"),
        (_with(["questions"], []), "questions: expected 1 to 64 questions, got 0"),
        (_with(["questions"], [RECORD["questions"][3]] * 65), "questions: expected 1 to 64 questions, got 65"),
        (_with(["extra"], 1), "extra: unknown key"),
        (_with(["questions", 1, "id"], "department"), "questions.1.id: duplicate of questions.0.id"),
        (_with(["questions", 0, "id"], ""), "questions.0.id: expected a non-empty string"),
        (_with(["questions", 0, "type"], "rank"), 'questions.0.type: expected "noul", "choice" or "score"'),
        (_with(["questions", 0, "instructions"], None), "questions.0.instructions: expected a string"),
        (_with(["questions", 0, "instructions"], _DELETE), "questions.0.instructions: missing"),
        (_with(["questions", 0, "options"], []), "questions.0.options: expected 1 to 255 options, got 0"),
        (
            _with(["questions", 0, "options"], [{"label": str(i), "text": None} for i in range(256)]),
            "questions.0.options: expected 1 to 255 options, got 256",
        ),
        (
            _with(["questions", 0, "options", 2, "label"], "billing"),
            "questions.0.options.2.label: duplicate of options.0",
        ),
        (_with(["questions", 0, "options", 1, "text"], _DELETE), "questions.0.options.1.text: missing"),
        (_with(["questions", 0, "options", 1, "text"], 5), "questions.0.options.1.text: expected a string or null"),
        (_with(["questions", 0, "options", 1, "json"], True), "questions.0.options.1.json: unknown key"),
        (_with(["questions", 1, "options", 1, "label"], "2"), 'questions.1.options.1.label: expected "1"'),
        (
            _with(["questions", 2, "options"], [{"label": "true", "text": None}, {"label": "false", "text": None}]),
            'questions.2.options.0.label: expected "false"',
        ),
        (
            _with(["questions", 2, "options"], [{"label": "false", "text": None}]),
            "questions.2.options: a noul has exactly 2 options, got 1",
        ),
        (_with(["questions", 3, "x"], 1), "questions.3.x: unknown key"),
        (_with(["questions", 3], "q"), "questions.3: expected an object"),
    ],
)
def test_invalid_default_records(record, reason):
    with Fixture("--mode", "decide") as f:
        frames, _ = _decide(f, 5, record)
        assert frames == b"ERROR 5 DECIDE_INVALID " + reason.encode() + b"\n"
        # the engine goes on
        assert _decide(f, 6, RECORD)[1] is not None


@pytest.mark.parametrize(
    "record, reason",
    [
        (_with(["record"], "full", RAW_RECORD), 'record: expected "raw" (this engine takes the raw form)'),
        (_with(["questions", 0, "options", 1, "json"], False, RAW_RECORD), "questions.0.options.1.json: expected true"),
        (
            _with(["questions", 0, "options", 0, "json"], True, RAW_RECORD),
            "questions.0.options.0.json: set on an option without a text",
        ),
        (_with(["questions", 1, "instructions"], 3, RAW_RECORD), "questions.1.instructions: expected a string or null"),
    ],
)
def test_invalid_raw_records(record, reason):
    with Fixture("--mode", "decide", "--decide-record", "raw") as f:
        frames, _ = _decide(f, 5, record)
        assert frames == b"ERROR 5 DECIDE_INVALID " + reason.encode() + b"\n"
