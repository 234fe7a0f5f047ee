"""``serveproto serve`` on the llama engine: the tiny random-weight GGUF against the numpy oracle,
and a smoke test of the default model (SmolLM2-135M) on the seed's support-ticket example.

The oracle test rebuilds, outside the server, what the server must have
computed: the same prompts (the GGUF's own chat template), their token ids
(read back through ``/v1/completions`` with ``echo``), the option tokens past
the longest common token prefix (spec 9.1), their logprobs from
``fixtures.oracle``, and the softmax by hand.
"""

from __future__ import annotations

import math

import anyio
import httpx2
import orjson
import pytest
from typesafe_sdk import TypeSafeClient

from fixtures import oracle, vocab
from gateway.decision import debias, schema
from gateway.decision.chat_template import ChatTemplate
from gateway.decision.prompts import PromptBuilder
from gateway.paths import default_model_path
from support import INVOICE
from test_routes_support import serving as serve_in_process

# every test here runs the llama engine: it skips where the engine is not built
pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.usefixtures("llama_bin")]

#: logprob agreement with the oracle (fixtures/README.md: llama.cpp with F32 KV meets 1e-4)
TOL = 1e-4


@pytest.fixture
def anyio_backend():
    return "asyncio"


def serving(*argv):
    """``serveproto serve`` in-process with 2 engine threads and ``argv``; yields the base URL."""
    return serve_in_process("--threads", "2", *argv)


async def post(client, path, body):
    r = await client.post(path, content=orjson.dumps(body), headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    return r.json()


async def oracle_scores(c, tiny, text_context: str, options, check_top: bool = True) -> list[float]:
    """Each option's summed logprob after ``text_context``, from the numpy oracle.

    The server's token ids are read back through ``/v1/completions`` with
    ``echo`` (whose read-out is itself checked against the oracle at every
    position, values and top-1 alternatives); an option's tokens are those
    past the longest common token prefix with the context alone (spec 9.1).
    ``check_top=False`` skips the top-1 check (done once is enough).
    """
    v = vocab.load(tiny)
    ids_of = {p: i for i, p in enumerate(v.pieces)}

    async def tokens(text: str) -> tuple[list[int], list]:
        body = await post(c, "/v1/completions", {"prompt": text, "max_tokens": 0, "echo": True, "logprobs": 1})
        lp = body["choices"][0]["logprobs"]
        ids = [ids_of[t.encode()] for t in lp["tokens"]]
        if not check_top:
            return ids, lp["token_logprobs"]
        # the most likely alternative at each position, by its text, as the oracle ranks it
        top_ids, top_lps = oracle.top_k(tiny, ids, 1)
        for p in range(1, len(ids)):
            [(text, value)] = lp["top_logprobs"][p].items()
            assert abs(value - top_lps[p][0]) <= TOL
            assert text == v.pieces[int(top_ids[p][0])].decode("utf-8", "replace")
        return ids, lp["token_logprobs"]

    context, _ = await tokens(text_context)
    scores = []
    for opt in options:
        full, echo_lps = await tokens(text_context + opt)
        ref = oracle.logprobs(tiny, full)
        # the echo read-out itself equals the oracle at every position
        assert echo_lps[0] is None
        assert max(abs(a - r) for a, r in zip(echo_lps[1:], ref[1:])) <= TOL
        common = next((i for i, (x, y) in enumerate(zip(context, full)) if x != y), len(context))
        assert len(full) > common
        scores.append(float(sum(ref[common:])))
    return scores


def softmax(scores) -> list[float]:
    m = max(scores)
    e = [math.exp(s - m) for s in scores]
    return [x / sum(e) for x in e]


async def test_tiny_gguf_systemone_and_echo_match_the_oracle(tiny):
    async with serving("--model", str(tiny), "--slots", "1", "--ctx", "1024") as base:
        async with httpx2.AsyncClient(base_url=base, timeout=60) as c:
            reply = await post(c, "/v1/systemone", INVOICE)
            b = PromptBuilder(ChatTemplate.from_gguf(tiny))
            parsed = schema.parse_request(INVOICE)
            prefix = b.prefix(parsed.state)
            expected = {}
            for q in parsed.questions:
                qp = b.question(q.type, q.instructions, q.criteria)
                expected[q.id] = softmax(await oracle_scores(c, tiny, prefix + qp.stem, qp.options))
    ans = reply["answers"]
    assert ans["refund"]["noul"] == pytest.approx(expected["refund"][1], abs=TOL)
    assert list(ans["team"]["probabilities"].values()) == pytest.approx(expected["team"], abs=TOL)
    assert reply["usage"]["output_tokens"] >= 5 and isinstance(reply["usage"]["input_tokens"], int)


async def test_tiny_gguf_debias_matches_the_oracle(tiny):
    """``x_debias: ["cyclic", "content_free"]``: every rotation and every content-free state read by the
    oracle, combined here with numpy (log-softmax per reading, means, difference, softmax)."""
    import numpy as np

    request = {**INVOICE, "x_debias": ["cyclic", "content_free"]}
    async with serving("--model", str(tiny), "--slots", "1", "--ctx", "1024") as base:
        async with httpx2.AsyncClient(base_url=base, timeout=60) as c:
            reply = await post(c, "/v1/systemone", request)
            again = await post(c, "/v1/systemone", request)
            b = PromptBuilder(ChatTemplate.from_gguf(tiny))
            parsed = schema.parse_request(INVOICE)
            expected = {}
            for q in parsed.questions:

                def log_softmax(x):
                    x = np.asarray(x, dtype=np.float64)
                    return x - np.log(np.exp(x - x.max()).sum()) - x.max()

                real, free = [], []
                for r in range(q.n_options):
                    qp = b.question(q.type, q.instructions, q.criteria, rotation=r)
                    real.append(
                        log_softmax(await oracle_scores(c, tiny, b.prefix(parsed.state) + qp.stem, qp.options, False))
                    )
                    for state in debias.CONTENT_FREE_STATES:
                        free.append(
                            log_softmax(await oracle_scores(c, tiny, b.prefix(state) + qp.stem, qp.options, False))
                        )
                expected[q.id] = softmax(list(np.mean(real, axis=0) - np.mean(free, axis=0)))
    for body in (reply, again):
        ans = body["answers"]
        assert body["x_debias"] == ["cyclic", "content_free"]
        assert ans["refund"]["noul"] == pytest.approx(expected["refund"][1], abs=TOL)
        assert list(ans["team"]["probabilities"].values()) == pytest.approx(expected["team"], abs=TOL)
    # the content-free readings are remembered: the second request reads only the state's rotations
    assert again["usage"]["output_tokens"] < reply["usage"]["output_tokens"]


def test_default_model_answers_the_seed_ticket(llama_engine):
    """The README's main command on the seed's example: a well-formed, sensible Jev reply, warm on repeat."""
    ticket = (
        "Hi, I have been trying to connect my Stripe account for 3 days and the integration keeps failing. "
        "I am losing sales. Please help ASAP."
    )
    questions = {
        "urgency": {"type": "noul", "instructions": "Does this message express urgency?"},
        "department": {
            "type": "choice",
            "instructions": "Which team should handle this?",
            "criteria": {
                "billing": "payments, invoices, Stripe payouts",
                "technical": "bugs, outages, integration errors",
                "sales": "pricing, plans, upgrades",
            },
        },
        "severity": {
            "type": "score",
            "instructions": "How severe is the customer impact?",
            "criteria": ["no impact", "minor inconvenience", "blocked on one task", "losing money", "business down"],
        },
    }

    async def main():
        async with serving("--model", str(default_model_path())) as base:

            def call():
                # a generous timeout: the machine running the tests may be shared (the SDK default is 10 s)
                with TypeSafeClient(api_key="any", base_url=base, timeout=120) as client:
                    return [client.system_one(state=ticket, questions=questions, model="jev-latest") for _ in range(2)]

            return await anyio.to_thread.run_sync(call)

    cold, warm = anyio.run(main)
    for r in (cold, warm):
        assert r.model.startswith("SmolLM2-135M-Instruct")
        assert 0 < r.nouls["urgency"].noul < 1
        dep = r.choices["department"]
        assert dep.choice == max(dep.probabilities, key=dep.probabilities.get)
        assert round(sum(dep.probabilities.values()) * 1e6) == 1_000_000
        sev = r.scores["severity"]
        assert 0 <= sev.score <= 4 and round(sum(sev.probabilities.values()) * 1e6) == 1_000_000
        # option tokens read, not generated: yes/no 1 + 1, billing 2 + technical 1 + sales 2, levels 5 x 1
        assert r.usage.output_tokens == 12
    assert warm.answers == cold.answers
    raw = warm.raw_http_response.json()
    assert raw["x_positions"]["snapshot"] == "hit"
    assert raw["x_positions"]["computed"] < cold.raw_http_response.json()["x_positions"]["computed"]


def test_default_model_with_its_default_debias_answers_the_same_under_any_label_order(llama_engine):
    """``serve`` with no ``--model`` turns on ``x_debias`` (canonical, spellings, content_free_listing since
    issue 23; canonical, content_free before, which this test also passed): the seed's ticket gets the
    same probabilities by label under two orders that are not rotations of each other, where the uncorrected
    model gives 0.98 to whichever label is listed first. (Until bench/quality.py chose canonical,content_free
    the default was cyclic,content_free and this test asserted its answer, technical; the toy model now
    spreads this ticket over the three teams, 0.30 to 0.35 each.)"""
    ticket = (
        "Hi, I have been trying to connect my Stripe account for 3 days and the integration keeps failing. "
        "I am losing sales. Please help ASAP."
    )
    teams = {"billing": "payments, invoices", "technical": "bugs, integration errors", "sales": "pricing, plans"}

    async def main():
        async with serving() as base:

            def call(order):
                questions = {
                    "department": {
                        "type": "choice",
                        "instructions": "Which team should handle this?",
                        "criteria": {k: teams[k] for k in order},
                    }
                }
                with TypeSafeClient(api_key="any", base_url=base, timeout=120) as client:
                    return client.system_one(state=ticket, questions=questions)

            return [
                await anyio.to_thread.run_sync(call, order)
                for order in (("billing", "technical", "sales"), ("sales", "billing", "technical"))
            ]

    first, second = anyio.run(main)
    a, b = first.choices["department"], second.choices["department"]
    assert a.probabilities == b.probabilities and a.choice == b.choice
    assert max(a.probabilities.values()) < 0.9
    for r in (first, second):
        assert r.raw_http_response.json()["x_debias"] == ["canonical", "spellings", "content_free_listing"]
