"""Every request the contract allows, on the default model: prompts past a slot, end to end.

Through ``POST /v1/systemone`` on ``serveproto serve`` (in-process, the default
model): 255 options each with a one-sentence description (a listing of about
3,400 tokens, a SCORE stem past one engine batch: the gateway scores it on
``prefix + stem``, ``gateway.engine.api.Engine._score_folded``); a state past a
slot's 4096 tokens and within the model's trained 8192 (the engine's lease,
spec/llama-engine.md "Prompts longer than a slot"); a state past 8192 refused
with its exact 422. The folded reading is checked against the unfolded one on
small slots (``--ctx 256``: a batch of 256), where both are possible, under the
default correction: the same probabilities bit for bit.
"""

from __future__ import annotations

import anyio
import httpx2
import orjson
import pytest

from test_routes_support import serving as serve_in_process

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def anyio_backend():
    return "asyncio"


def serving(*argv):
    # a generous engine timeout: the long prompts take minutes on a shared 2-core machine
    return serve_in_process("--threads", "2", "--request-timeout", "1500", *argv)


async def post(base: str, body: dict) -> httpx2.Response:
    async with httpx2.AsyncClient(base_url=base, timeout=1800) as c:
        return await c.post("/v1/systemone", content=orjson.dumps(body), headers={"content-type": "application/json"})


def queues(n: int) -> dict:
    return {
        "state": "My invoice is wrong.",
        "questions": {
            "route": {
                "type": "choice",
                "instructions": "Which queue?",
                "criteria": {f"queue_{i}": f"Tickets routed to queue {i}" for i in range(n)},
            }
        },
    }


def long_state(lines: int) -> str:
    """About 12.7 tokens a line on the default model."""
    return " ".join(f"Line {i}: the invoice total was wrong again." for i in range(lines))


def test_255_options_with_descriptions_answer(llama_engine):
    async def main():
        async with serving() as base:
            return await post(base, {**queues(255), "x_debias": "none"})

    r = anyio.run(main)
    assert r.status_code == 200, r.text
    probs = r.json()["answers"]["route"]["probabilities"]
    assert len(probs) == 255 and set(probs) == {f"queue_{i}" for i in range(255)}
    assert abs(sum(probs.values()) - 1) < 1e-4  # six decimals each (Jev's rounding)
    assert r.json()["usage"]["input_tokens"] > 2048  # past one batch: the folded reading served it


def test_a_folded_reading_equals_the_unfolded_one_under_the_default_correction(llama_engine):
    """30 labels with descriptions: a stem past the batch of a 256-token slot, within one of 1024."""

    async def main(*argv):
        async with serving(*argv) as base:
            return await post(base, queues(30))

    folded = anyio.run(main, "--ctx", "256", "--ctx-max", "1024")
    whole = anyio.run(main, "--ctx", "1024")
    assert folded.status_code == 200 and whole.status_code == 200, (folded.text, whole.text)
    assert folded.json()["x_debias"] and folded.json()["x_debias"] == whole.json()["x_debias"]  # the server's default
    assert folded.json()["usage"]["input_tokens"] > 256
    assert folded.json()["answers"] == whole.json()["answers"]


def test_a_state_past_a_slot_within_the_trained_context_answers(llama_engine):
    body = {
        "state": long_state(400),  # about 5,100 tokens: past 4096, within 8192
        "questions": {"urgent": {"type": "noul", "instructions": "Is this urgent?"}},
        "x_debias": "none",
    }

    async def main():
        async with serving() as base:
            return await post(base, body)

    r = anyio.run(main)
    assert r.status_code == 200, r.text
    assert 4096 < r.json()["usage"]["input_tokens"] <= 8192
    assert 0 < r.json()["answers"]["urgent"]["noul"] < 1


def test_a_state_past_the_trained_context_is_refused_naming_it(llama_engine):
    body = {
        "state": long_state(720),  # about 9,200 tokens
        "questions": {"urgent": {"type": "noul", "instructions": "Is this urgent?"}},
    }

    async def main():
        async with serving() as base:
            return await post(base, body)

    r = anyio.run(main)
    assert r.status_code == 422, r.text
    msg = (
        "The prompt of question 'urgent' (the state, then the question and its options) is longer than "
        "the engine's context of 8192 tokens; this is its longest part"
    )
    assert r.json() == {
        "detail": [{"loc": ["body", "state"], "type": "too_long", "msg": msg}],
        "error": {"type": "invalid_request_error", "message": f"body.state: {msg}", "param": "state"},
    }
