"""Issue 48, item 6, end to end: the ``jev`` extension of ``/v1/chat/completions`` through the official
``openai`` client (``extra_body`` out, the reply's ``jev`` back through the client's models unchanged).

On the fixture engine (its toy model recomputed in Python: the answers against the oracle, the
decide-then-generate text against the plain chat of the conversation conditioned by hand) and on the
tiny random-weight GGUF of the llama engine (the answers bit for bit ``/v1/systemone``'s with the
conversation as the state: the same prompts, the same engine calls).
"""

from __future__ import annotations

import copy

import httpx2
import orjson
import pytest

from gateway.decision.conversation import conversation_state
from test_routes_support import TICKET
from test_server_e2e import check_against_oracle, serving
from test_server_llama import serving as serving_llama

pytestmark = pytest.mark.anyio

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": TICKET["state"]},
]
STATE = f"System: Be brief.\nUser: {TICKET['state']}"
QUESTIONS = TICKET["questions"]


async def post(base: str, path: str, body: dict) -> dict:
    async with httpx2.AsyncClient(base_url=base, timeout=60) as c:
        r = await c.post(path, content=orjson.dumps(body), headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    return r.json()


def openai_client(base: str):
    import openai

    return openai.AsyncOpenAI(api_key="x", base_url=base + "/v1", max_retries=0)


async def test_openai_client_decide_then_generate_on_the_fixture_engine(fixture_engine):
    import openai

    assert conversation_state(MESSAGES) == STATE
    jev = {"questions": QUESTIONS, "question": "department"}
    async with serving(fixture_engine) as base:
        client = openai_client(base)
        raw = await client.chat.completions.with_raw_response.create(
            model="any", messages=MESSAGES, max_tokens=8, extra_body={"jev": jev}
        )
        done = raw.parse()
        s1 = await post(base, "/v1/systemone", {"state": STATE, "questions": QUESTIONS})
        answer = done.jev["then"]["option"]
        note = done.jev["then"]["note"]
        # the text generated after the decision is the plain chat of the conversation conditioned by hand
        by_hand = [{"role": "system", "content": "Be brief.\n\n" + note}, MESSAGES[1]]
        plain = await client.chat.completions.create(model="any", messages=by_hand, max_tokens=8)
        unconditioned = await client.chat.completions.create(model="any", messages=MESSAGES, max_tokens=8)
        stream = await client.chat.completions.create(
            model="any", messages=MESSAGES, max_tokens=8, stream=True, extra_body={"jev": jev}
        )
        chunks = [c async for c in stream]
        instead = await client.chat.completions.create(
            model="any", messages=MESSAGES, max_tokens=0, extra_body={"jev": {"questions": QUESTIONS}}
        )
        with pytest.raises(openai.UnprocessableEntityError) as refused:
            await client.chat.completions.create(
                model="any", messages=MESSAGES, extra_body={"jev": {"questions": {"q1": {"type": "choice"}}}}
            )
        await client.close()
    # the client hands the reply's jev over as the server wrote it
    assert done.jev == raw.http_response.json()["jev"] == done.model_extra["jev"]
    # the decision: /v1/systemone's on the conversation's text, bit for bit, and the toy's numbers
    assert orjson.dumps(done.jev["answers"]) == orjson.dumps(s1["answers"])
    assert done.jev["usage"] == s1["usage"]
    check_against_oracle({"answers": done.jev["answers"]}, {"state": STATE, "questions": QUESTIONS})
    probs = s1["answers"]["department"]["probabilities"]
    assert answer == max(probs, key=probs.get) == s1["answers"]["department"]["choice"]
    assert note == (
        "A decision about this conversation is already taken.\nQuestion: Which team should handle this?\n"
        f"Answer: {answer}\nWrite your reply in keeping with this answer."
    )
    text = done.choices[0].message.content
    assert text == plain.choices[0].message.content and len(text) == 8
    assert text != unconditioned.choices[0].message.content  # the note changed what the toy generates
    assert done.usage.prompt_tokens == plain.usage.prompt_tokens
    # streamed: the answers ride on the first chunk, the text is the whole reply's
    assert chunks[0].jev["answers"] == done.jev["answers"] and chunks[0].jev["then"] == done.jev["then"]
    assert all(c.model_extra.get("jev") is None for c in chunks[1:])
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    # instead: nothing generated, the same answers
    assert instead.choices[0].message.content == "" and instead.usage.completion_tokens == 0
    assert instead.jev["answers"] == done.jev["answers"] and instead.jev["mode"] == "instead"
    # the client reads the 422's error envelope: the field under jev
    assert refused.value.status_code == 422 and refused.value.body["param"] == "jev.questions.q1.criteria"
    assert refused.value.response.json()["detail"][0]["loc"] == ["body", "jev", "questions", "q1", "criteria"]


async def test_chat_route_answers_equal_systemone_bit_for_bit_on_the_tiny_gguf(tiny):
    questions = copy.deepcopy(QUESTIONS)
    async with serving_llama("--model", str(tiny), "--slots", "1", "--ctx", "1024") as base:
        client = openai_client(base)
        done = await client.chat.completions.create(
            model="any", messages=MESSAGES, max_tokens=4, extra_body={"jev": {"questions": questions}}
        )
        await client.close()
        s1 = await post(base, "/v1/systemone", {"state": STATE, "questions": questions})
    # the printed digits (the reply's JSON) are the same bytes; both read the same prompts on one engine
    assert orjson.dumps(done.jev["answers"]) == orjson.dumps(s1["answers"])
    assert done.jev["usage"] == s1["usage"] and done.jev["mode"] == "beside"
    assert done.usage.completion_tokens == 4
