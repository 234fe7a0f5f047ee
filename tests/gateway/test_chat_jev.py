"""Issue 48, item 6: the ``jev`` extension of ``/v1/chat/completions`` over the route fake (numbers by hand).

Typed questions about the conversation, answered beside the completion, instead of it, or first with the
text generated after the designated answer (decide-then-generate); the answers in the reply's ``jev``
object, equal to ``/v1/systemone``'s with the conversation's ``Role: content`` text as the state; every
bad field of ``jev`` a 422 naming it, before the engine is asked anything.
"""

from __future__ import annotations

import copy
import json

import httpx2
import orjson
import pytest

from gateway.decision.prompts import SYSTEM
from test_routes import oracle, post
from test_routes_support import TICKET, FakeCaps, FakeEngine, make_app, running

pytestmark = pytest.mark.anyio

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": TICKET["state"]},
    {"role": "assistant", "content": "Which account?"},
    {"role": "user", "content": "The live one."},
]
#: The conversation as the state, written out by hand (gateway.decision.conversation.conversation_state).
STATE = f"System: Be brief.\nUser: {TICKET['state']}\nAssistant: Which account?\nUser: The live one."
QUESTIONS = TICKET["questions"]


def chatml(messages: list[dict[str, str]]) -> str:
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages) + "<|im_start|>assistant\n"


def check_by_hand(answers: dict) -> None:
    """The toy's numbers (test_routes.oracle): the answers do not depend on the state, only on the options."""
    p = oracle(["no", "yes"])
    assert answers["urgency"]["noul"] == pytest.approx(p[1], abs=1e-6)
    p = oracle(["billing", "technical", "sales"])
    assert list(answers["department"]["probabilities"].values()) == pytest.approx(p, abs=1e-6)
    assert answers["department"]["choice"] == "billing"  # billing and sales tie: the first
    p = oracle(["1", "2", "3", "4", "5"])
    assert list(answers["severity"]["probabilities"].values()) == pytest.approx(p, abs=1e-6)


async def test_beside_answers_equal_systemone_on_the_conversation_and_the_text_is_the_plain_chat():
    eng = FakeEngine()
    async with running(make_app(eng)) as base:
        r = await post(base, "/v1/chat/completions", {"messages": MESSAGES, "jev": {"questions": QUESTIONS}})
        plain = await post(base, "/v1/chat/completions", {"messages": MESSAGES})
        s1 = await post(base, "/v1/systemone", {"state": STATE, "questions": QUESTIONS})
    assert r.status_code == 200, r.text
    body, ref = r.json(), s1.json()
    # the decision: the state is the conversation's text, the same prompt as /v1/systemone's
    kind, prefix, groups, pin, _ = eng.calls[0]
    assert pin is True  # three questions share the state
    assert kind == "score" and prefix == f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{STATE}"
    assert eng.calls[3][:2] == ("score", prefix) and eng.calls[3][2] == groups
    # then the text, of the conversation as sent: the same engine call as the plain chat's
    assert eng.calls[1] == eng.calls[2] == ("submit", chatml(MESSAGES), 256, 0.0, 1.0, 0, None)
    jev = body.pop("jev")
    assert body["choices"] == plain.json()["choices"]
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Hello there"}
    assert body["usage"] == plain.json()["usage"]
    # bit for bit /v1/systemone's answers and usage (both replies' JSON compared as text)
    assert orjson.dumps(jev["answers"]) == orjson.dumps(ref["answers"])
    assert jev["usage"] == ref["usage"]
    check_by_hand(jev["answers"])
    n_read = len("noyes") + len("billingtechnicalsales") + 5
    assert isinstance(jev.pop("x_engine_ms"), float)  # the engine's time, measured
    assert jev == {
        "answers": ref["answers"],
        "usage": ref["usage"],
        "mode": "beside",
        "x_path": "score",
        "x_positions": {"computed": n_read, "reused": len(prefix), "snapshot": "none"},
    }
    assert ref["x_positions"]["snapshot"] == "hit"  # the chat route's decision photographed the conversation
    assert r.headers["x-serveproto-path"] == "score" and r.headers["x-serveproto-route-key"]


async def test_then_generates_after_the_designated_answer_in_the_system_turn():
    eng = FakeEngine()
    async with running(make_app(eng)) as base:
        r = await post(
            base,
            "/v1/chat/completions",
            {"messages": MESSAGES, "max_tokens": 5, "jev": {"questions": QUESTIONS, "question": "department"}},
        )
        # no system turn in the conversation: one of its own, first; a score's answer is its level as sent
        one = await post(
            base,
            "/v1/chat/completions",
            {"messages": MESSAGES[1:2], "jev": {"mode": "then", "questions": {"sev": QUESTIONS["severity"]}}},
        )
    assert r.status_code == 200, r.text
    note = (
        "A decision about this conversation is already taken.\nQuestion: Which team should handle this?\n"
        "Answer: billing\nWrite your reply in keeping with this answer."
    )
    conditioned = [{"role": "system", "content": "Be brief.\n\n" + note}, *MESSAGES[1:]]
    assert eng.calls[1] == ("submit", chatml(conditioned), 5, 0.0, 1.0, 0, None)
    jev = r.json()["jev"]
    assert jev["mode"] == "then"
    assert jev["then"] == {"question": "department", "option": "billing", "note": note}
    assert jev["answers"]["department"]["choice"] == "billing"
    check_by_hand(jev["answers"])
    assert r.json()["choices"][0]["message"]["content"] == "Hello there"
    # severity: the toy's most probable level is level 0 (option "1" scores highest)
    p = oracle(["1", "2", "3", "4", "5"])
    assert max(range(5), key=p.__getitem__) == 0
    sev_note = (
        "A decision about this conversation is already taken.\nQuestion: How severe is the customer impact?\n"
        "Answer: no impact\nWrite your reply in keeping with this answer."
    )
    assert one.json()["jev"]["then"] == {"question": "sev", "option": "no impact", "note": sev_note}
    assert eng.calls[-1][1] == chatml([{"role": "system", "content": sev_note}, MESSAGES[1]])


async def test_instead_answers_and_generates_nothing():
    eng = FakeEngine()
    async with running(make_app(eng)) as base:
        zero = await post(
            base, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 0, "jev": {"questions": QUESTIONS}}
        )
        named = await post(
            base,
            "/v1/chat/completions",
            {"messages": MESSAGES, "jev": {"mode": "instead", "questions": QUESTIONS}},
        )
        no_jev = await post(base, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 0})
    assert [c[0] for c in eng.calls] == ["score", "score"]  # nothing generated
    for r in (zero, named):
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["choices"] == [
            {"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": "stop", "logprobs": None}
        ]
        assert body["usage"] == {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        assert body["jev"]["mode"] == "instead"
        check_by_hand(body["jev"]["answers"])
    assert zero.json()["jev"]["answers"] == named.json()["jev"]["answers"]
    assert no_jev.status_code == 400 and no_jev.json()["error"]["param"] == "max_tokens"  # as before


async def test_streamed_reply_carries_the_answers_in_its_first_chunk():
    eng = FakeEngine()
    req = {"messages": MESSAGES, "stream": True, "jev": {"questions": QUESTIONS, "question": "urgency"}}
    async with running(make_app(eng)) as base:
        whole = await post(base, "/v1/chat/completions", {**req, "stream": False})
        async with httpx2.AsyncClient(base_url=base) as c:
            async with c.stream("POST", "/v1/chat/completions", content=orjson.dumps(req)) as s:
                raw = b"".join([chunk async for chunk in s.aiter_bytes()])
    events = [e[len(b"data: ") :] for e in raw.split(b"\n\n") if e]
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [("jev" in c) for c in chunks] == [True] + [False] * (len(chunks) - 1)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    w = whole.json()["jev"]
    assert chunks[0]["jev"]["answers"] == w["answers"] and chunks[0]["jev"]["then"] == w["then"]
    assert w["then"]["option"] == "yes"  # the toy: yes 0.55
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == whole.json()["choices"][0]["message"]["content"] == "Hello there"


async def test_a_decision_engine_answers_instead_and_refuses_to_generate():
    eng = FakeEngine(FakeCaps(chat=False, decide=True))
    async with running(make_app(eng)) as base:
        r = await post(
            base, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 0, "jev": {"questions": QUESTIONS}}
        )
        s1 = await post(base, "/v1/systemone", {"state": STATE, "questions": QUESTIONS})
        beside = await post(base, "/v1/chat/completions", {"messages": MESSAGES, "jev": {"questions": QUESTIONS}})
    assert r.status_code == 200, r.text
    assert r.json()["jev"]["answers"] == s1.json()["answers"] and r.json()["jev"]["x_path"] == "decide"
    assert json.loads(eng.calls[0][1])["state"] == STATE == json.loads(eng.calls[1][1])["state"]
    assert beside.status_code == 400 and "/v1/systemone" in beside.json()["error"]["message"]
    assert len(eng.calls) == 2  # the refused request asked nothing


def with_jev(**jev) -> dict:
    return {"messages": MESSAGES, "jev": {"questions": copy.deepcopy(QUESTIONS), **jev}}


def bad_choice_criteria() -> dict:
    body = with_jev()
    body["jev"]["questions"]["department"]["criteria"] = ["billing", "sales"]
    return body


def no_questions() -> dict:
    body = with_jev()
    del body["jev"]["questions"]
    return body


#: (body, the field the 422 names, its detail type): one per field of ``jev`` that can be wrong.
REFUSALS = {
    "jev": ({"messages": MESSAGES, "jev": ["urgency"]}, "jev", "dict_type"),
    "questions missing": (no_questions(), "jev.questions", "missing"),
    "questions empty": ({"messages": MESSAGES, "jev": {"questions": {}}}, "jev.questions", "too_short"),
    "question type": (
        {"messages": MESSAGES, "jev": {"questions": {"q1": {"type": "maybe"}}}},
        "jev.questions.q1.type",
        "literal_error",
    ),
    "choice criteria": (bad_choice_criteria(), "jev.questions.department.criteria", "dict_type"),
    "score criteria": (
        {"messages": MESSAGES, "jev": {"questions": {"q1": {"type": "score", "criteria": {"0": "low"}}}}},
        "jev.questions.q1.criteria",
        "list_type",
    ),
    "empty label": (
        {"messages": MESSAGES, "jev": {"questions": {"q1": {"type": "choice", "criteria": {"": None}}}}},
        "jev.questions.q1.criteria.",
        "string_too_short",
    ),
    "instructions": (
        {"messages": MESSAGES, "jev": {"questions": {"q1": {"type": "noul", "instructions": 3}}}},
        "jev.questions.q1.instructions",
        "content_type",
    ),
    "mode": (with_jev(mode="later"), "jev.mode", "literal_error"),
    "mode with max_tokens 0": ({**with_jev(mode="beside"), "max_tokens": 0}, "jev.mode", "value_error"),
    "then with max_tokens 0": ({**with_jev(question="urgency"), "max_tokens": 0}, "jev.mode", "value_error"),
    "question unknown": (with_jev(question="priority"), "jev.question", "value_error"),
    "question not a string": (with_jev(question=["urgency"]), "jev.question", "string_type"),
    "question beside": (with_jev(mode="beside", question="urgency"), "jev.question", "value_error"),
    "then without question": (with_jev(mode="then"), "jev.question", "missing"),
    "normalize": (with_jev(normalize="max"), "jev.normalize", "literal_error"),
    "x_debias": (with_jev(x_debias="sideways"), "jev.x_debias", "literal_error"),
    "x_head": (with_jev(x_head="mine"), "jev.x_head", "literal_error"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
async def test_each_bad_field_is_a_422_naming_it_and_nothing_is_asked(case):
    body, param, kind = REFUSALS[case]
    eng = FakeEngine()
    async with running(make_app(eng)) as base:
        r = await post(base, "/v1/chat/completions", body)
    assert r.status_code == 422, r.text
    err = r.json()
    assert err["error"]["param"] == param and err["error"]["type"] == "invalid_request_error"
    assert err["detail"][0]["loc"] == ["body", *param.split(".")] and err["detail"][0]["type"] == kind
    assert eng.calls == []


async def test_unknown_fields_are_warned_about_and_refused_by_a_strict_server():
    body = with_jev(questoin="urgency")
    body["jev"]["questions"]["urgency"]["critera"] = {"true": "x"}
    async with running(make_app(FakeEngine())) as base:
        r = await post(base, "/v1/chat/completions", body)
        clean = await post(base, "/v1/chat/completions", with_jev())
    assert r.json()["jev"]["x_warnings"] == [
        "jev.questoin: unknown field",
        "jev.questions.urgency.critera: unknown field",
    ]
    assert r.json()["jev"]["answers"] == clean.json()["jev"]["answers"] and "x_warnings" not in clean.json()["jev"]
    eng = FakeEngine()
    async with running(make_app(eng, strict=True)) as base:
        r = await post(base, "/v1/chat/completions", body)
    assert r.status_code == 422 and eng.calls == []
    assert [e["loc"] for e in r.json()["detail"]] == [
        ["body", "jev", "questions", "urgency", "critera"],
        ["body", "jev", "questoin"],
    ]
