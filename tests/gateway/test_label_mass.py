"""Issue 48, item 3: ``x_label_mass``, ``x_argmax_is_label`` and ``x_margin`` per answer, against a
computation by hand from a fake engine whose first-token logprobs are set by the test.

The engine scores each option's characters as its tokens (as ``test_routes_support.FakeEngine``); the
first character ``c`` of an option gets ``FIRST[c]`` (default -3.0), every later one -0.1, and every
option of a group starts at one position, except a text starting with ``~``, one position earlier."""

from __future__ import annotations

import math

import attrs
import httpx2
import pytest

from gateway.decision import label_mass
from gateway.engine import OptionScore, ScoreResult
from serveproto import Done
from test_routes_support import FakeCaps, FakeEngine, make_app, running

pytestmark = pytest.mark.anyio


class FirstTokenEngine(FakeEngine):
    def __init__(self, first: dict[str, float], **kw) -> None:
        super().__init__(**kw)
        self.first = first

    def lp(self, text: str) -> tuple[float, ...]:
        return (self.first.get(text[0], -3.0),) + (-0.1,) * (len(text) - 1)

    async def score(self, prefix, groups, pin=False, slot=None, route=None, beside=None):
        self.calls.append(("score", prefix, groups, pin, slot))
        out = [
            [OptionScore(len(prefix) + len(stem) - o.startswith("~"), self.lp(o)) for o in opts]
            for stem, opts in groups
        ]
        n = sum(len(o) for _, opts in groups for o in opts)
        return ScoreResult(
            out, Done(1, 0, 0.0, 0.0, 0.1, len(prefix), False, computed=n, reused=0, snapshot="none"), n, 0
        )


async def ask(engine, body):
    async with running(make_app(engine)) as base:
        async with httpx2.AsyncClient(base_url=base) as client:
            r = await client.post("/v1/systemone", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def softmax(xs):
    m = max(xs)
    e = [math.exp(x - m) for x in xs]
    return [x / sum(e) for x in e]


def r6(x):
    return round(x, 6)


async def test_a_noul_reads_the_mass_of_yes_and_no_and_cannot_tell_the_argmax_when_most_is_elsewhere():
    engine = FirstTokenEngine({"y": -2.0, "n": -1.5})
    reply = await ask(engine, {"state": "s", "questions": {"q": {"type": "noul", "instructions": "Urgent?"}}})
    assert engine.calls[0][2][0][1] == ["no", "yes"]  # the scored texts
    p_no, p_yes = softmax([-1.5 - 0.1, -2.0 - 0.1 * 2])  # "no": n o; "yes": y e s
    assert reply["answers"]["q"] == {
        "type": "noul",
        "noul": r6(p_yes),
        "x_calibration": "identity",
        "x_margin": r6(abs(1 - 2 * r6(p_yes))),  # of the millionths reported: p_no is 1 - noul
        "x_label_mass": r6(math.exp(-2.0) + math.exp(-1.5)),  # 0.358652: the rest went to other tokens
        "x_argmax_is_label": None,  # 1 - 0.358652 could sit on one other token: not known without the top-k
    }
    assert reply["answers"]["q"]["x_margin"] == pytest.approx(p_no - p_yes, abs=2e-6)


async def test_a_shared_first_token_counts_once_and_a_likely_label_is_the_argmax():
    engine = FirstTokenEngine({"b": -0.25, "s": -2.5, "t": -4.0})
    crit = {"billing": None, "bugs": None, "sales": None, "technical": None}
    reply = await ask(engine, {"state": "s", "questions": {"team": {"type": "choice", "criteria": crit}}})
    a = reply["answers"]["team"]
    # "billing" and "bugs" start with one token "b": once, not twice (it would pass 1)
    mass = math.exp(-0.25) + math.exp(-2.5) + math.exp(-4.0)
    assert a["x_label_mass"] == r6(mass) == 0.879201
    assert math.exp(-0.25) >= 1 - mass and a["x_argmax_is_label"] is True
    p = softmax([-0.25 - 0.6, -0.25 - 0.3, -2.5 - 0.4, -4.0 - 0.8])
    top = sorted(p, reverse=True)
    assert a["x_margin"] == pytest.approx(top[0] - top[1], abs=2e-6)  # of the millionths the reply prints
    assert a["x_margin"] == r6(a["probabilities"]["bugs"] - a["probabilities"]["billing"])


async def test_no_mass_where_the_options_are_predicted_at_different_positions():
    engine = FirstTokenEngine({"~": -1.0, "a": -1.0})
    crit = {"a": None, "~b": None}
    reply = await ask(engine, {"state": "s", "questions": {"q": {"type": "choice", "criteria": crit}}})
    a = reply["answers"]["q"]
    assert "x_label_mass" not in a and "x_argmax_is_label" not in a
    assert a["x_margin"] == r6(abs(a["probabilities"]["a"] - a["probabilities"]["~b"]))


async def test_every_spelling_counts_and_the_reads_are_averaged():
    engine = FirstTokenEngine({"y": -3.0, "Y": -2.0, " ": -1.0, "n": -3.5, "N": -2.5})
    body = {"state": "s", "x_debias": "spellings", "questions": {"q": {"type": "noul"}}}
    reply = await ask(engine, body)
    assert engine.calls[0][2][0][1] == ["no", " no", "No", " No", "yes", " yes", "Yes", " Yes"]
    # " no", " No", " yes" and " Yes" begin with one token " " here (the fake's tokens are characters)
    mass = sum(math.exp(x) for x in (-3.5, -1.0, -2.5, -3.0, -2.0))
    assert reply["answers"]["q"]["x_label_mass"] == r6(mass)
    assert reply["answers"]["q"]["x_argmax_is_label"] is True  # e^-1 = 0.368 >= 1 - 0.758


async def test_decision_engines_and_single_options_have_no_mass():
    eng = FakeEngine(FakeCaps(chat=False, decide=True, slots=1))
    body = {
        "state": "s",
        "questions": {
            "q": {"type": "choice", "criteria": {"a": None, "b": None, "c": None}},
            "one": {"type": "choice", "criteria": {"only": None}},
        },
    }
    reply = await ask(eng, body)
    q, one = reply["answers"]["q"], reply["answers"]["one"]
    assert q["x_margin"] == r6(3 / 6 - 2 / 6)  # the fake decides 1:2:3
    assert "x_label_mass" not in q and "x_argmax_is_label" not in q
    assert not {"x_margin", "x_label_mass", "x_argmax_is_label"} & set(one)


def test_read_mass_by_hand():
    assert label_mass.read_mass([]) is None
    assert label_mass.read_mass([("a", 3, -1.0), ("b", 4, -1.0)]) is None  # two positions
    assert label_mass.read_mass([("a", 3, float("nan"))]) is None
    m, arg = label_mass.read_mass([("ab", 3, math.log(0.5)), ("ac", 3, math.log(0.5)), ("d", 3, math.log(0.2))])
    assert m == pytest.approx(0.7) and arg is True
    m, arg = label_mass.read_mass([("a", 3, math.log(0.2)), ("b", 3, math.log(0.2))])  # tied, other first chars
    assert m == pytest.approx(0.4) and arg is None
    q = label_mass.question_mass([[("a", 1, math.log(0.2))], [("a", 1, math.log(0.6))]])
    assert q == label_mass.Mass(pytest.approx(0.4), None)  # mean of reads; argmax known in one read only
    assert label_mass.margin([0.2, 0.5, 0.3]) == pytest.approx(0.2)


async def test_a_reply_without_options_keeps_its_fields_otherwise():
    """The new fields are appended after the answer's earlier fields; nothing else moves."""
    engine = FirstTokenEngine({})
    reply = await ask(engine, {"state": "s", "questions": {"q": {"type": "score", "criteria": ["lo", "hi"]}}})
    assert list(reply["answers"]["q"]) == [
        "type",
        "score",
        "legend",
        "probabilities",
        "confidence",
        "x_entropy",
        "x_calibration",
        "x_margin",
        "x_label_mass",
        "x_argmax_is_label",
    ]
    assert attrs.has(label_mass.Mass)
