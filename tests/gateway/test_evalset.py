"""``gateway.lab.evalset``: the generated labelled set (deterministic, every type, 2 to 12 options, text and JSON
states, gold answers stated by the text) and the labelled JSONL reader."""

from __future__ import annotations

import hashlib

import orjson
import pytest

from gateway.decision import schema
from gateway.lab import evalset


@pytest.fixture(scope="module")
def items():
    return evalset.generate()


def test_the_set_is_fixed_by_its_seed(items):
    assert [i.body for i in evalset.generate()] == [i.body for i in items]
    assert [i.body for i in evalset.generate(seed=15)] != [i.body for i in items]
    assert len(items) == sum(evalset.SIZES.values()) == 64
    assert sum(len(i.gold) for i in items) == 400


def test_every_type_option_count_and_state_kind(items):
    tasks = evalset.summary(items)
    assert {t["type"] for t in tasks.values()} == {"noul", "choice", "score"}
    assert sorted({t["options"] for t in tasks.values()}) == [2, 3, 4, 5, 6, 8, 12]
    kinds = {type(i.body["state"]).__name__ for i in items}
    assert kinds == {"str", "dict"}
    for item in items:
        schema.parse_request(item.body)  # every request validates as the server reads it
        assert set(item.gold) == set(item.body["questions"])


MOSTLY_YES = {
    "ticket.running",
    "ticket.staying",
    "review.kept",
    "review.above_one_star",
    "email.genuine",
    "order.paid",
    "order.on_time",
}


def test_nouls_mostly_no_and_mostly_yes(items):
    nouls = {name: t for name, t in evalset.summary(items).items() if t["type"] == "noul"}
    by_group = {"no": [0, 0], "yes": [0, 0]}
    for name, t in nouls.items():
        share = t["gold"].get(1, 0) / t["n"]
        assert (share > 0.5) == (name in MOSTLY_YES), name  # every mostly-yes task is mostly yes, and only those
        g = by_group["yes" if name in MOSTLY_YES else "no"]
        g[0] += t["gold"].get(1, 0)
        g[1] += t["n"]
    # a quarter yes, and three quarters: always answering the majority scores 0.75 on each
    assert by_group == {"no": [33, 132], "yes": [81, 108]}


def test_the_mostly_yes_nouls_left_the_other_questions_as_they_were(items):
    # they are read off facts already drawn (no new draw): the states and the other answers are those of
    # the 292-question set before them (its digest, computed on that generator), so earlier reads still apply
    old = [[i.body["state"], {q: g for q, g in i.gold.items() if i.tasks[q] not in MOSTLY_YES}] for i in items]
    digest = hashlib.sha256(orjson.dumps(old, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]
    assert digest == "d98d167ff4b6918b"


def test_gold_answers_are_stated_by_the_text(items):
    for item in items:
        text = item.body["state"] if isinstance(item.body["state"], str) else orjson.dumps(item.body["state"]).decode()
        domain = item.id.split("-")[0]
        qs = item.body["questions"]
        if domain == "ticket":
            area = list(qs["area"]["criteria"])[item.gold["area"]]
            assert any(s in text for s in evalset.AREAS[area][1])
            assert list(qs["department"]["criteria"])[item.gold["department"]] == evalset.AREAS[area][0]
            assert any(s in text for s in evalset.SEVERITY_SENTENCES[item.gold["severity"]])
            assert (item.gold["refund"] == 1) == any(s in text for s in evalset.REFUND_SENTENCES)
            assert (item.gold["running"] == 1) == (item.gold["severity"] < 3)
            assert (item.gold["running"] == 0) == any(s in text for s in evalset.SEVERITY_SENTENCES[3])
            assert item.gold["staying"] == 1 - item.gold["competitor"]
            assert (item.gold["staying"] == 0) == any(c in text for c in evalset.COMPETITORS)
        elif domain == "email":
            assert (item.gold["credentials"] == 1) == any(s in text for s in evalset.CREDENTIAL_SENTENCES)
            assert (item.gold["link"] == 1) == ("http" in text)
            category = list(qs["category"]["criteria"])[item.gold["category"]]
            assert (item.gold["genuine"] == 0) == (category == "phishing")
            assert (item.gold["genuine"] == 0) == any(s in text for s in evalset.EMAIL_BODIES["phishing"])
        elif domain == "order":
            status = list(qs["status"]["criteria"])[item.gold["status"]]
            assert item.body["state"]["history"][-1] == evalset.ORDER_EVENTS[status]
            assert (item.gold["late"] == 1) == (item.body["state"]["days_past_promised_date"] > 0)
            assert item.gold["on_time"] == 1 - item.gold["late"]
            assert (item.gold["paid"] == 1) == (evalset.ORDER_EVENTS["paid"] in item.body["state"]["history"])
        elif domain == "review":
            assert any(s in text for s in evalset.STAR_SENTENCES[item.gold["stars"]])
            assert (item.gold["above_one_star"] == 1) == (item.gold["stars"] >= 1)
            assert item.gold["kept"] == 1 - item.gold["returned"]
            assert (item.gold["kept"] == 0) == any(s in text for s in evalset.RETURN_SENTENCES)


def test_jsonl_round_trip(items, tmp_path):
    path = tmp_path / "set.jsonl"
    evalset.write_jsonl(items[:5], path)
    back = evalset.read_jsonl(path)
    assert back == items[:5]
    first = orjson.loads(path.read_bytes().splitlines()[0])
    assert first["gold"] == {
        "department": "billing",
        "area": "payments",
        "refund": False,
        "severity": 2,
        "competitor": False,
        "running": True,
        "staying": True,
    }


def test_a_users_file(tmp_path):
    request = {
        "state": "hello",
        "questions": {
            "q": {"type": "noul"},
            "c": {"type": "choice", "criteria": {"a": None, "b": None}},
            "s": {"type": "score", "criteria": ["lo", "hi"]},
        },
    }
    lines = [
        orjson.dumps({"request": request, "gold": {"q": "yes", "c": "b", "s": 0}}),
        b"",
        orjson.dumps({"id": "x", "request": request, "gold": {"q": False}}),
    ]
    path = tmp_path / "mine.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    a, b = evalset.read_jsonl(path)
    assert a.id == f"{path}:1" and a.gold == {"q": 1, "c": 1, "s": 0} and a.tasks == {"q": "q", "c": "c", "s": "s"}
    assert b.id == "x" and b.gold == {"q": 0}


@pytest.mark.parametrize(
    "line, message",
    [
        (b"{nope", ":1: not JSON"),
        (b'{"request": {"state": "x"}, "gold": {}}', ":1: request: body.questions: Field required"),
        (b'{"gold": {}}', ":1: expected an object with 'request'"),
        (
            b'{"request": {"state": "x", "questions": {"q": {"type": "noul"}}}, "gold": {"r": true}}',
            ":1: gold.r: no question 'r' in the request",
        ),
        (
            b'{"request": {"state": "x", "questions": {"q": {"type": "noul"}}}, "gold": {"q": "maybe"}}',
            ":1: gold.q: a noul's answer is true or false (or 'yes' / 'no'), got 'maybe'",
        ),
        (
            b'{"request": {"state": "x", "questions": {"q": {"type": "choice", "criteria": {"a": null}}}}, "gold": {"q": "b"}}',
            ":1: gold.q: a choice's answer is one of its labels ['a'], got 'b'",
        ),
        (
            b'{"request": {"state": "x", "questions": {"q": {"type": "score", "criteria": ["a", "b"]}}}, "gold": {"q": 2}}',
            ":1: gold.q: a score's answer is a level 0..1, got 2",
        ),
    ],
)
def test_a_bad_line_is_named(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(line + b"\n")
    with pytest.raises(evalset.LabelledFileError) as e:
        evalset.read_jsonl(path)
    assert str(e.value).startswith(str(path) + message)
