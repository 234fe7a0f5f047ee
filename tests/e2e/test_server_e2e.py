"""End to end: ``serveproto serve`` over the real fixture engine, through real HTTP.

Expected numbers come from ``fixtures/toy_model.py`` (the fixture's model,
recomputed in Python): the scoring path (``x_score``), the seed's fallback path
(``--mode plain``: pin + one SUBMIT per option), the decision path (``--mode
decide``), faults surfacing as 503 + Retry-After within the request timeout,
and the ``openai`` client on the chat and completions routes.
"""

from __future__ import annotations

import math
import os
import subprocess

import anyio
import httpx2
import orjson
import pytest
from typesafe_sdk import TypeSafeClient

from fixtures import toy_model
from gateway.cli import build_parser
from gateway.cli.serve import serve
from gateway.decision import record as decision_record
from gateway.decision import schema
from gateway.decision.prompts import PromptBuilder
from support import serve_process
from test_routes_support import TICKET
from test_routes_support import serving as serve_in_process

pytestmark = pytest.mark.anyio


def serving(fixture_engine, *engine_args, timeout: float = 10.0):
    """``serveproto serve`` in-process on a free port, over the fixture engine; yields the base URL."""
    return serve_in_process("--request-timeout", str(timeout), "--engine", str(fixture_engine), *engine_args)


def toy_option_logprobs(text_before: str, option: str) -> list[float]:
    """Each option byte's logprob given everything before it, by the toy model (bytes are tokens)."""
    toks = list((text_before + option).encode())
    start = len(text_before.encode())
    hs = toy_model.chain(toks)
    return [toy_model.log_softmax(toy_model.logits(hs[p], toks[p - 1]))[toks[p]] for p in range(start, len(toks))]


def expected_probabilities(request: dict) -> dict[str, list[float]]:
    """The oracle: the same prompts (ChatML, the fixture has no template), scored by the toy, softmax by hand."""
    parsed = schema.parse_request(request)
    b = PromptBuilder()
    prefix = b.prefix(parsed.state)
    out = {}
    for q in parsed.questions:
        qp = b.question(q.type, q.instructions, q.criteria)
        scores = [sum(toy_option_logprobs(prefix + qp.stem, o)) for o in qp.options]
        m = max(scores)
        e = [math.exp(s - m) for s in scores]
        out[q.id] = [x / sum(e) for x in e]
    return out


async def post(base, path, body):
    async with httpx2.AsyncClient(base_url=base, timeout=30) as c:
        return await c.post(path, content=orjson.dumps(body), headers={"content-type": "application/json"})


def check_against_oracle(body: dict, request: dict) -> None:
    exp = expected_probabilities(request)
    ans = body["answers"]
    assert ans["urgency"]["noul"] == pytest.approx(exp["urgency"][1], abs=1e-6)
    assert list(ans["department"]["probabilities"].values()) == pytest.approx(exp["department"], abs=1e-6)
    assert list(ans["severity"]["probabilities"].values()) == pytest.approx(exp["severity"], abs=1e-6)
    assert ans["severity"]["score"] == pytest.approx(sum(i * p for i, p in enumerate(exp["severity"])), abs=1e-5)


async def test_scoring_path_matches_the_toy_model(fixture_engine):
    async with serving(fixture_engine, "--slots", "2") as base:
        first = await post(base, "/v1/systemone", TICKET)
        second = await post(base, "/v1/systemone", TICKET)
    assert first.status_code == 200, first.text
    check_against_oracle(first.json(), TICKET)
    assert second.json()["answers"] == first.json()["answers"]
    assert first.json()["x_positions"]["snapshot"] == "none"
    # the second request restores the state's snapshot: only the questions and options are computed
    pos = second.json()["x_positions"]
    prefix_len = len(PromptBuilder().prefix(TICKET["state"]).encode())
    assert pos["snapshot"] == "hit" and pos["reused"] == prefix_len
    assert pos["computed"] == first.json()["x_positions"]["computed"] - prefix_len
    assert first.json()["usage"]["output_tokens"] == len("noyes") + len("billingtechnicalsales") + 5


async def test_fallback_path_without_extensions_gives_the_same_numbers(fixture_engine):
    async with serving(fixture_engine, "--mode", "plain") as base:
        r = await post(base, "/v1/systemone", TICKET)
    assert r.status_code == 200, r.text
    check_against_oracle(r.json(), TICKET)
    assert r.json()["usage"]["output_tokens"] == len("noyes") + len("billingtechnicalsales") + 5


async def test_decision_path_with_the_sdk(fixture_engine):
    async with serving(fixture_engine, "--mode", "decide") as base:

        def call():
            with TypeSafeClient(api_key="k", base_url=base) as client:
                return client.system_one(state=TICKET["state"], questions=TICKET["questions"])

        result = await anyio.to_thread.run_sync(call)
        chat = await post(base, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    parsed = schema.parse_request(TICKET)
    expected = toy_model.decide(decision_record.build(parsed))
    probs = {a["id"]: a["probs"] for a in expected["answers"]}
    assert result.nouls["urgency"].noul == pytest.approx(probs["urgency"][1], abs=1e-6)
    assert list(result.choices["department"].probabilities.values()) == pytest.approx(probs["department"], abs=1e-6)
    assert list(result.scores["severity"].probabilities.values()) == pytest.approx(probs["severity"], abs=1e-6)
    assert result.usage.input_tokens == expected["input_tokens"] and result.usage.output_tokens == 0
    assert chat.status_code == 400 and "/v1/systemone" in chat.json()["error"]["message"]


@pytest.mark.parametrize("fault", ["exit_after=0", "hang_after=0"])
async def test_faults_are_503_with_retry_after_never_a_hang(fixture_engine, fault):
    async with serving(fixture_engine, "--fault", fault, timeout=2.0) as base:
        with anyio.fail_after(20):
            r = await post(base, "/v1/systemone", TICKET)
            health = None
            async with httpx2.AsyncClient(base_url=base) as c:
                health = await c.get("/health")
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"] == "1"
    assert r.json()["detail"]["error_type"] == "overloaded_error"
    assert health.status_code in (200, 503)


async def test_openai_client_chat_and_completions(fixture_engine):
    import openai

    async with serving(fixture_engine) as base:
        client = openai.AsyncOpenAI(api_key="x", base_url=base + "/v1", max_retries=0)
        chat = await client.chat.completions.create(
            model="any", messages=[{"role": "user", "content": "say hi"}], max_tokens=8
        )
        stream = await client.chat.completions.create(
            model="any", messages=[{"role": "user", "content": "say hi"}], max_tokens=8, stream=True
        )
        streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        comp = await client.completions.create(model="any", prompt="the cat sat", max_tokens=0, echo=True, logprobs=2)
        with_lp = await client.chat.completions.create(
            model="any", messages=[{"role": "user", "content": "say hi"}], max_tokens=3, logprobs=True, top_logprobs=2
        )
        models = await client.models.list()
        await client.close()
    text = chat.choices[0].message.content
    assert len(text) == 8 and chat.choices[0].finish_reason == "length" and text == streamed
    assert chat.usage.completion_tokens == 8
    lp = comp.choices[0].logprobs
    assert comp.choices[0].text == "the cat sat"
    assert lp.tokens == list("the cat sat")
    toks = list(b"the cat sat")
    hs = toy_model.chain(toks)
    exp = [toy_model.log_softmax(toy_model.logits(hs[p], toks[p - 1]))[toks[p]] for p in range(1, len(toks))]
    assert lp.token_logprobs[0] is None
    assert lp.token_logprobs[1:] == pytest.approx(exp, abs=1e-6)
    assert [m.id for m in models.data] == ["fixture"]
    # chat logprobs: the greedy token is the most likely one, its logprob the toy's (bytes are tokens)
    content = with_lp.choices[0].logprobs.content
    assert "".join(c.token for c in content) == with_lp.choices[0].message.content == text[:3]
    prompt = PromptBuilder().chat([{"role": "user", "content": "say hi"}]).encode()
    toks = list(prompt)
    for c in content:
        hs = toy_model.chain(toks)
        lps = toy_model.log_softmax(toy_model.logits(hs[len(toks)], toks[-1]))
        assert c.logprob == pytest.approx(lps[c.bytes[0]], abs=1e-6)
        assert c.top_logprobs[0].logprob == pytest.approx(max(lps), abs=1e-6) and len(c.top_logprobs) == 2
        toks.append(c.bytes[0])


def test_cli_prints_its_address_and_serves(fixture_engine):
    env = dict(os.environ, SERVEPROTO_API_KEY="k1")
    argv = ["--port", "0", "--engine", str(fixture_engine)]
    with serve_process(*argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as proc:
        line = proc.stdout.readline()
        assert line.startswith("serveproto: serving fixture on http://127.0.0.1:"), line
        base = line.split(" on ")[1].strip()
        r = httpx2.get(base + "/v1/models", headers={"authorization": "Bearer k1"}, timeout=10)
        assert r.status_code == 200 and r.json()["models"][0]["name"] == "fixture"
        assert httpx2.get(base + "/v1/models", timeout=10).status_code == 401
        proc.terminate()  # SIGTERM: a clean shutdown, engine included
        assert proc.wait(timeout=20) == 0


async def test_engine_that_keeps_dying_is_restarted_then_the_server_fails_upward(fixture_engine):
    """Each engine process exits after its third frame (one DECIDE answered): the supervisor restarts
    it, requests are answered or get 503 + Retry-After, the metrics count the restarts, and once the
    restart intensity is spent the server stops: ``serve`` raises ``EngineGaveUp`` (``serveproto
    serve`` exits 1; tests/e2e/test_hostile.py runs the command)."""
    from gateway.cli.serve import EngineGaveUp

    args = build_parser().parse_args(
        [
            "serve",
            "--port",
            "0",
            "--request-timeout",
            "5",
            "--log-level",
            "WARNING",
            "--ping-interval",
            "60",
            "--engine",
            str(fixture_engine),
            "--mode",
            "decide",
            "--fault",
            "exit_after=3",
        ]
    )
    statuses, restarts = [], []

    async def client(base: str) -> None:
        async with httpx2.AsyncClient(base_url=base, timeout=30) as c:
            while True:
                r = await c.post(
                    "/v1/systemone", content=orjson.dumps(TICKET), headers={"content-type": "application/json"}
                )
                statuses.append(r.status_code)
                if r.status_code == 503:
                    assert r.headers["retry-after"] == "1"
                metrics = (await c.get("/metrics")).text
                restarts.append(
                    float(
                        next(
                            line.split()[1]
                            for line in metrics.splitlines()
                            if line.startswith("serveproto_engine_restarts ")
                        )
                    )
                )
                await anyio.sleep(0.3)

    with pytest.raises(BaseExceptionGroup) as info:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                port = await tg.start(lambda task_status: serve(args, task_status=task_status))
                tg.start_soon(client, f"http://127.0.0.1:{port}")
    gave_up = [e for e in info.value.exceptions if isinstance(e, EngineGaveUp)]
    assert len(gave_up) == 1 and "the engine failed 4 time(s) within 60 s (--max-restarts 3)" in str(gave_up[0])
    assert set(statuses) <= {200, 503} and 200 in statuses and 503 in statuses, statuses
    assert max(restarts) >= 1
