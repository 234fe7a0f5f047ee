"""The routes through real HTTP on loopback, over a fake engine whose numbers are worked out by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import anyio
import httpx2
import orjson
import pytest

import gateway
from gateway.decision.prompts import SYSTEM
from test_routes_support import (
    TICKET,
    EngineCrashed,
    FakeCaps,
    FakeEngine,
    RequestError,
    char_logprob,
    make_app,
    running,
)

pytestmark = pytest.mark.anyio


def oracle(options: list[str], normalize: str = "sum") -> list[float]:
    """Softmax of the toy's option scores, by hand with math (independent of gateway.decision.scoring)."""
    scores = []
    for o in options:
        lps = [char_logprob(c) for c in o]
        scores.append(sum(lps) if normalize == "sum" else sum(lps) / len(lps))
    m = max(scores)
    e = [math.exp(s - m) for s in scores]
    return [x / sum(e) for x in e]


async def post(base, path, body, **kw):
    async with httpx2.AsyncClient(base_url=base) as c:
        return await c.post(
            path,
            content=orjson.dumps(body),
            headers={"content-type": "application/json", **kw.pop("headers", {})},
            **kw,
        )


async def get(base, path, **kw):
    async with httpx2.AsyncClient(base_url=base) as c:
        return await c.get(path, **kw)


async def test_systemone_scores_every_question_against_the_oracle():
    eng = FakeEngine()
    async with running(make_app(eng)) as base:
        r = await post(base, "/v1/systemone", TICKET)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "fake-model"
    assert r.headers["x-typesafe-request-id"] == body["x_request_id"]
    ans = body["answers"]
    assert list(ans) == ["urgency", "department", "severity"]
    p = oracle(["no", "yes"])
    # x_margin, x_label_mass, x_argmax_is_label: issue 48 (test_label_mass.py; the toy's first-token
    # probabilities add up past 1, so its mass is capped at 1 and the argmax is a label)
    assert ans["urgency"] == {
        "type": "noul",
        "noul": pytest.approx(p[1], abs=1e-6),
        "x_calibration": "identity",
        "x_margin": pytest.approx(abs(p[1] - p[0]), abs=2e-6),
        "x_label_mass": 1.0,
        "x_argmax_is_label": True,
    }
    p = oracle(["billing", "technical", "sales"])
    dep = ans["department"]
    # billing and sales tie in the toy (to 1e-16): the first of the tied labels is the choice
    assert dep["choice"] == "billing" and p[0] == pytest.approx(p[2], abs=1e-12) and p[0] > p[1]
    assert [dep["probabilities"][k] for k in ("billing", "technical", "sales")] == pytest.approx(p, abs=1e-6)
    assert dep["confidence"] == pytest.approx((3 * max(p) - 1) / 2, abs=2e-6)
    p = oracle(["1", "2", "3", "4", "5"])
    sev = ans["severity"]
    assert sev["legend"] == {str(i): v for i, v in enumerate(TICKET["questions"]["severity"]["criteria"])}
    assert list(sev["probabilities"].values()) == pytest.approx(p, abs=1e-6)
    assert sev["score"] == pytest.approx(sum(i * x for i, x in enumerate(p)), abs=1e-5)
    for a in (dep, sev):
        assert round(sum(a["probabilities"].values()) * 1e6) == 1_000_000
    # one scoring call: the state once, the options never in it, pinned since 3 questions share it
    [(kind, prefix, groups, pin, slot)] = eng.calls
    assert kind == "score" and pin is True and slot is None  # the supervisor routes by prefix
    assert prefix == f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{TICKET['state']}"
    assert [g[1] for g in groups] == [["no", "yes"], ["billing", "technical", "sales"], ["1", "2", "3", "4", "5"]]
    assert groups[1][0] == (
        "\n\nWhich team should handle this?\nbilling: payments, invoices\n"
        "technical: bugs, integration errors\nsales\nAnswer with one label.<|im_end|>\n<|im_start|>assistant\n"
    )
    n_read = len("noyes") + len("billingtechnicalsales") + 5
    assert body["usage"] == {
        "input_tokens": max(len(prefix) + len(s) + max(len(o) for o in opts) for s, opts in groups),
        "output_tokens": n_read,
    }
    assert body["x_positions"] == {"computed": n_read, "reused": len(prefix), "snapshot": "none"}


async def test_single_option_question_needs_no_engine_and_mean_warns():
    eng = FakeEngine()
    async with running(make_app(eng)) as base:
        r = await post(
            base, "/v1/systemone", {"state": "s", "questions": {"only": {"type": "choice", "criteria": {"x": None}}}}
        )
        assert r.status_code == 200
        assert r.json()["answers"]["only"] == {
            "type": "choice",
            "choice": "x",
            "probabilities": {"x": 1.0},
            "confidence": 1.0,
            "x_entropy": 0.0,
            "x_calibration": "identity",
        }
        assert r.json()["usage"] == {"input_tokens": 0, "output_tokens": 0}
        assert eng.calls == []
        r = await post(
            base,
            "/v1/systemone",
            {
                "state": "s",
                "normalize": "mean",
                "pin_state": False,
                "questions": {"q": {"type": "choice", "criteria": {"ab": None, "abcd": None}}},
            },
        )
    assert r.json()["answers"]["q"]["probabilities"]["ab"] == pytest.approx(oracle(["ab", "abcd"], "mean")[0], abs=1e-6)
    assert "normalize=mean" in r.json()["x_warnings"][0]
    assert eng.calls[-1][3] is False  # pin_state=false


async def test_validation_errors_are_422_with_detail():
    async with running(make_app()) as base:
        r = await post(base, "/v1/systemone", {"questions": {"q": {"type": "score", "criteria": {"a": 1}}}})
        assert r.status_code == 422
        assert [(d["loc"], d["type"]) for d in r.json()["detail"]] == [
            (["body", "state"], "missing"),
            (["body", "questions", "q", "criteria"], "list_type"),
        ]
        async with httpx2.AsyncClient(base_url=base) as c:
            r = await c.post("/v1/systemone", content=b"{nope", headers={"content-type": "application/json"})
        assert r.status_code == 422 and r.json()["detail"][0]["type"] == "json_invalid"
        r = await post(base, "/v1/systemone", {"state": "s", "cache_slot": 2, "questions": {"q": {"type": "noul"}}})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "cache_slot"]
        r = await post(base, "/v1/systemone", {}, headers={"content-type": "multipart/form-data; boundary=x"})
        # the SDK's image assets: refused naming the field (issue 48; test_pictures_refused.py)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "assets"]


async def test_auth_bearer_key():
    async with running(make_app(api_key="sekret")) as base:
        r = await get(base, "/v1/models")
        assert r.status_code == 401 and r.json()["detail"]["error_type"] == "authentication_error"
        r = await get(base, "/v1/models", headers={"authorization": "Bearer wrong"})
        assert r.status_code == 401
        r = await get(base, "/v1/models", headers={"authorization": "Bearer sekret"})
        assert r.status_code == 200
        assert (await get(base, "/health")).status_code == 200
    async with running(make_app()) as base:
        assert (await get(base, "/v1/models", headers={"authorization": "Bearer anything"})).status_code == 200


async def test_prefix_is_photographed_once_per_slot():
    eng = FakeEngine()
    body = {"state": "frame 1", "prefix": "RULES", "cache_slot": 1, "questions": {"q": {"type": "noul"}}}
    async with running(make_app(eng)) as base:
        assert (await post(base, "/v1/systemone", body)).status_code == 200
        assert (await post(base, "/v1/systemone", dict(body, state="frame 2"))).status_code == 200
    kinds = [c[0] for c in eng.calls]
    assert kinds == ["read_out", "score", "score"]
    assert eng.calls[0][1].endswith("<|im_start|>user\nRULES") and eng.calls[0][3] is True and eng.calls[0][4] == 1
    assert eng.calls[1][1].endswith("user\nRULES\n\nframe 1") and eng.calls[2][4] == 1


DECIDE_CAPS = FakeCaps(chat=False, decide=True, slots=1, model="fake-decider")


async def test_decision_engine_path_record_and_reply():
    eng = FakeEngine(DECIDE_CAPS)
    req = {
        "state": {"subject": "Dup", "body": "charged twice"},
        "questions": {
            "department": {
                "type": "choice",
                "instructions": "Which department?",
                "criteria": {"billing": "invoices", "other": None},
            },
            "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["not urgent", "blocking"]},
            "churn": {"type": "noul", "instructions": "Leaving?"},
            "solo": {"type": "choice", "criteria": {"only": None}},
        },
    }
    async with running(make_app(eng)) as base:
        r = await post(base, "/v1/systemone", req)
        chat = await post(base, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
        models = await get(base, "/v1/models")
    assert r.status_code == 200, r.text
    [(kind, record, slot)] = eng.calls
    assert kind == "decide" and slot == 0
    assert record == (
        b'{"state": "{\\"subject\\": \\"Dup\\", \\"body\\": \\"charged twice\\"}", "state_type": "object", "questions": ['
        b'{"id": "department", "type": "choice", "instructions": "Which department?", "options": [{"label": "billing", "text": "invoices"}, {"label": "other", "text": null}]}, '
        b'{"id": "urgency", "type": "score", "instructions": "How urgent?", "options": [{"label": "0", "text": "not urgent"}, {"label": "1", "text": "blocking"}]}, '
        b'{"id": "churn", "type": "noul", "instructions": "Leaving?", "options": [{"label": "false", "text": null}, {"label": "true", "text": null}]}]}'
    )
    body = r.json()
    assert body["answers"]["department"]["probabilities"] == {"billing": 0.333333, "other": 0.666667}
    assert body["answers"]["urgency"]["score"] == 0.666667
    # a decision engine gives no token probabilities: x_margin alone of issue 48's fields
    assert body["answers"]["churn"] == {
        "type": "noul",
        "noul": 0.666667,
        "x_calibration": "identity",
        "x_margin": 0.333334,
    }
    assert body["answers"]["solo"]["choice"] == "only"
    assert body["usage"] == {"input_tokens": 42, "output_tokens": 0}
    assert r.headers["x-serveproto-engine-ms"] == "1.500"
    assert chat.status_code == 400 and "/v1/systemone" in chat.json()["error"]["message"]
    assert models.json()["data"][0]["capabilities"] == ["systemone", "decision"]


async def test_raw_record_form():
    eng = FakeEngine(FakeCaps(chat=False, decide=True, decide_record="raw", slots=1))
    req = {
        "state": {"b": 1, "a": "é"},
        "questions": {
            "n": {"type": "noul", "criteria": {"true": ""}},
            "c": {"type": "choice", "instructions": {"z": 1, "y": 2}, "criteria": {"x": {"k": [1, 2]}, "w": ""}},
        },
    }
    async with running(make_app(eng)) as base:
        assert (await post(base, "/v1/systemone", req)).status_code == 200
    assert (
        eng.calls[0][1]
        == (
            '{"record": "raw", "state": "{\\"a\\":\\"é\\",\\"b\\":1}", "state_type": "object", "questions": ['
            '{"id": "n", "type": "noul", "instructions": null, "options": [{"label": "false"}, {"label": "true", "text": ""}]}, '
            '{"id": "c", "type": "choice", "instructions": "{\\"y\\":2,\\"z\\":1}", "options": [{"label": "x", "text": "{\\"k\\":[1,2]}", "json": true}, {"label": "w", "text": ""}]}]}'
        ).encode()
    )


@pytest.mark.parametrize(
    "error, status",
    [
        (RequestError("DECIDE_INVALID", "questions.0.options: too many options"), 422),
        (RequestError("DECIDE_FAILED", "out of memory"), 500),
        (EngineCrashed("engine 'fixture' exited with 3"), 503),
        (RequestError("SLOT_BUSY", ""), 503),
    ],
)
async def test_engine_errors_map_to_http(error, status):
    eng = FakeEngine(DECIDE_CAPS, fail=error)
    async with running(make_app(eng)) as base:
        r = await post(base, "/v1/systemone", {"state": "s", "questions": {"department": {"type": "noul"}}})
    assert r.status_code == status
    if status == 422:
        assert r.json()["detail"] == [
            {
                "loc": ["body", "questions", "department", "criteria"],
                "msg": "too many options",
                "type": "decide_invalid",
            }
        ]
        assert r.json()["error"]["param"] == "questions.department.criteria"
    if status == 503:
        assert r.headers["retry-after"] == "1"


async def test_health_models_index_metrics():
    eng = FakeEngine()
    async with running(make_app(eng)) as base:
        assert (await get(base, "/health")).json() == {"status": "ok", "model": "fake-model"}
        m = (await get(base, "/v1/models")).json()
        assert m["models"] == [
            {
                "name": "fake-model",
                "description": "a fake model",
                "release_date": "2026-11-30",
                "capabilities": ["chat", "systemone"],
            }
        ]
        assert m["data"][0]["id"] == "fake-model" and m["object"] == "list"
        assert any(r["path"] == "/v1/systemone" for r in (await get(base, "/v1")).json()["routes"])
        await post(base, "/v1/systemone", TICKET)
        await post(base, "/v1/systemone", TICKET)
        eng.healthy = False
        h = await get(base, "/health")
        assert h.status_code == 503 and h.headers["retry-after"] == "1"
        text = (await get(base, "/metrics")).text
    assert 'serveproto_http_requests_total{method="POST",route="/v1/systemone",status="200"} 2.0' in text
    assert 'serveproto_snapshots_total{result="none"} 1.0' in text
    assert 'serveproto_snapshots_total{result="hit"} 1.0' in text
    assert 'serveproto_questions_total{path="score",type="choice"} 2.0' in text
    assert "serveproto_engine_up 0.0" in text
    assert 'serveproto_http_request_duration_seconds_count{route="/v1/systemone"} 2.0' in text


async def test_chat_completions_whole_and_streamed():
    eng = FakeEngine(reply="Hello there friend")
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    async with running(make_app(eng)) as base:
        r = await post(base, "/v1/chat/completions", {"messages": msgs, "max_tokens": 2})
        body = r.json()
        assert body["choices"][0]["message"] == {"role": "assistant", "content": "Hello there"}
        assert body["choices"][0]["finish_reason"] == "length"
        assert (
            eng.calls[-1][1]
            == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        )
        async with httpx2.AsyncClient(base_url=base) as c:
            async with c.stream(
                "POST",
                "/v1/chat/completions",
                content=orjson.dumps(
                    {"messages": msgs, "stream": True, "stop": [" fr"], "stream_options": {"include_usage": True}}
                ),
            ) as s:
                raw = b"".join([chunk async for chunk in s.aiter_bytes()])
    events = [e[len(b"data: ") :] for e in raw.split(b"\n\n") if e]
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == "Hello there"
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    # " friend", which holds the stop string, was generated too: it counts
    assert chunks[-1]["usage"]["completion_tokens"] == 3


async def test_completions_echo_logprobs_reads_the_prompt():
    eng = FakeEngine(reply="ok")
    async with running(make_app(eng)) as base:
        r = await post(base, "/v1/completions", {"prompt": "abc", "echo": True, "logprobs": 2, "max_tokens": 0})
        r2 = await post(base, "/v1/completions", {"prompt": "abc", "max_tokens": 0})
    lp = r.json()["choices"][0]["logprobs"]
    assert r.json()["choices"][0]["text"] == "abc"
    assert lp["tokens"] == ["a", "b", "c"] and lp["text_offset"] == [0, 1, 2]
    assert lp["token_logprobs"] == [None, char_logprob("b"), char_logprob("c")]
    assert lp["top_logprobs"][1] == {"<0>": -0.5, "<1>": -1.5}
    assert r2.status_code == 400


async def test_decisions_route_openai_shape():
    eng = FakeEngine()
    req = {
        "model": "x",
        "input": "The PR has no tests.",
        "questions": [
            {"type": "predicate", "name": "risky", "question": "Is it risky?"},
            {
                "type": "choice",
                "question": "What now?",
                "choices": [{"value": "merge"}, {"value": "close", "description": "drop"}],
            },
            {
                "type": "score",
                "question": "Quality?",
                "levels": [{"label": "bad", "description": "poor"}, {"label": "good"}],
            },
        ],
    }
    async with running(make_app(eng)) as base:
        r = await post(base, "/v1/decisions", req)
        bad = await post(base, "/v1/decisions", {"input": "x", "questions": [{"type": "choice", "choices": []}]})
    a = r.json()["answers"]
    p = oracle(["no", "yes"])
    # the label-mass fields of /v1/systemone's answers (issue 48; the toy's first tokens hold all the mass)
    assert a[0] == {
        "type": "predicate",
        "name": "risky",
        "probability": pytest.approx(p[1], abs=1e-6),
        "x_calibration": "identity",
        "x_margin": pytest.approx(abs(p[1] - p[0]), abs=2e-6),
        "x_label_mass": 1.0,
        "x_argmax_is_label": True,
    }
    p = oracle(["merge", "close"])
    assert a[1]["probabilities"] == [
        {"value": "merge", "probability": pytest.approx(p[0], abs=1e-6)},
        {"value": "close", "probability": pytest.approx(p[1], abs=1e-6)},
    ]
    assert a[1]["x_margin"] == pytest.approx(abs(p[0] - p[1]), abs=2e-6) and a[1]["x_argmax_is_label"] is True
    assert [x["label"] for x in a[2]["probabilities"]] == ["bad", "good"]
    assert "x_warnings" not in r.json()  # nothing to say: the field is left out
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "questions[0].choices"


async def test_over_max_inflight_is_503_at_once():
    eng = FakeEngine(DECIDE_CAPS)
    eng.token_delay = 0.5
    statuses = []
    async with running(make_app(eng, max_inflight=2)) as base:

        async def one():
            r = await post(base, "/v1/systemone", {"state": "s", "questions": {"q": {"type": "noul"}}})
            statuses.append((r.status_code, r.headers.get("retry-after")))

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                for _ in range(5):
                    tg.start_soon(one)
    assert sorted(statuses, key=str) == [(200, None)] * 2 + [(503, "1")] * 3


async def test_the_system_one_page_is_served_without_a_key():
    async with running(make_app(api_key="k")) as base:
        page = await get(base, "/")
        css = await get(base, "/style.css")
        js = await get(base, "/app.js")
    assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
    assert 'id="questions"' in page.text
    assert (
        css.headers["content-type"] == "text/css; charset=utf-8"
        and js.headers["content-type"] == "text/javascript; charset=utf-8"
    )
    assert js.content == (Path(gateway.__file__).parent / "server" / "static" / "app.js").read_bytes()


def test_decide_invalid_fields_map_to_the_request():
    from gateway.decision import schema
    from gateway.decision.refusals import decide_refusal

    qs = list(
        schema.parse_request(
            {
                "state": "s",
                "questions": {
                    "solo": {"type": "choice", "criteria": {"x": None}},
                    "team": {"type": "choice", "criteria": {"billing": None, "légal": None}},
                    "level": {"type": "score", "criteria": ["a", "b"]},
                    "churn": {"type": "noul"},
                },
            }
        ).questions[1:]
    )  # the single-option question is not in the record
    assert decide_refusal("questions.0.options.1.label: expected a string", qs) == {
        "loc": ["body", "questions", "team", "criteria", "légal"],
        "msg": "expected a string",
        "type": "decide_invalid",
    }
    assert decide_refusal("questions.1.options.1.text: too long", qs)["loc"] == [
        "body",
        "questions",
        "level",
        "criteria",
        1,
    ]
    assert decide_refusal("questions.2.options.0.text: bad", qs)["loc"] == [
        "body",
        "questions",
        "churn",
        "criteria",
        "false",
    ]
    assert decide_refusal("questions.2.instructions: too long", qs)["loc"] == [
        "body",
        "questions",
        "churn",
        "instructions",
    ]
    assert decide_refusal("state: too long", qs)["loc"] == ["body", "state"]
    assert decide_refusal("record: not valid JSON", qs)["loc"] == ["body"]
    assert decide_refusal("no field here", qs) == {"loc": ["body"], "msg": "no field here", "type": "decide_invalid"}


async def test_one_structured_log_line_per_request(caplog):
    import logging

    eng = FakeEngine()
    with caplog.at_level(logging.INFO, logger="serveproto.access"):
        async with running(make_app(eng)) as base:
            r = await post(base, "/v1/systemone", TICKET)
            bad = await post(base, "/v1/systemone", {"state": 1})
    lines = [orjson.loads(rec.getMessage()) for rec in caplog.records if rec.name == "serveproto.access"]
    assert len(lines) == 2
    assert lines[0]["request_id"] == r.headers["x-typesafe-request-id"] and lines[0]["status"] == 200
    assert lines[0]["path"] == "/v1/systemone" and lines[0]["method"] == "POST" and lines[0]["via"] == "score"
    assert lines[0]["engine_ms"] >= 0 and lines[0]["ms"] >= lines[0]["engine_ms"]
    assert lines[1]["status"] == 422 and lines[1]["error"] == "validation"
    assert lines[1]["request_id"] == bad.headers["x-typesafe-request-id"]


async def test_every_422_carries_detail_and_the_error_envelope():
    async with running(make_app()) as base:
        async with httpx2.AsyncClient(base_url=base) as c:
            bad_json = await c.post("/v1/systemone", content=b"{nope", headers={"content-type": "application/json"})
        invalid = await post(base, "/v1/systemone", {"state": "s", "questions": {"q": {"type": "maybe"}}})
    assert bad_json.status_code == 422 and invalid.status_code == 422
    body = bad_json.json()
    assert body["error"] == {
        "type": "invalid_request_error",
        "param": "",
        "message": "the body is not valid JSON: unexpected character, expected a string key (at character 1)",
    }
    assert body["detail"] == [
        {
            "loc": ["body", 1],
            "msg": "JSON decode error: unexpected character, expected a string key",
            "type": "json_invalid",
        }
    ]
    assert set(invalid.json()) == {"detail", "error"} and set(invalid.json()["error"]) == {"type", "message", "param"}


def test_docs_http_api_lists_every_route_and_the_open_ones():
    from pathlib import Path

    from gateway.server.app import PUBLIC_ROUTES

    doc = (Path(__file__).resolve().parents[2] / "docs" / "http-api.md").read_text()
    table = doc.split("## Routes", 1)[1].split("\n## ", 1)[0]
    rows = {
        line.split("|")[2].strip(): line.split("|")[3].strip()
        for line in table.splitlines()
        if line.startswith("| ") and "`/" in line
    }
    documented = {p.strip(" `"): key for cell, key in rows.items() for p in cell.split(",")}
    app = make_app()
    assert set(app.router.paths) == set(documented)
    assert {p for p, key in documented.items() if key == "no"} == set(PUBLIC_ROUTES)
