"""``POST /v1/systemone/batch`` against the single route it answers with: each item's reply is the one
``/v1/systemone`` gives for that state, bit for bit (the fixture engine, and the llama engine on the tiny
fixture model), its refusals name ``items[i]``, and its items leave single requests a slot; ``/metrics``'
scheduling gauges read during a batch."""

from __future__ import annotations

import anyio
import httpx2
import orjson
import pytest

from gateway.decision import batch
from test_routes_support import serving

pytestmark = pytest.mark.anyio

#: The fields of a reply that are the request's own, not its answer: its id (twice) and the engine's time.
PER_REQUEST = ("id", "x_request_id", "x_engine_ms")

QUESTIONS = {
    "urgent": {"type": "noul", "instructions": "Is it urgent?"},
    "team": {
        "type": "choice",
        "instructions": "Who handles it?",
        "criteria": {"billing": "invoices and payments", "support": None, "legal": "contracts"},
    },
    "severity": {"type": "score", "instructions": "How severe is it?", "criteria": ["low", "medium", "high"]},
}
STATES = [
    "The invoice was paid twice and the customer wants the money back before Friday.",
    "Login fails with error 500 since this morning for every user of the EU region.",
    {"subject": "contract renewal", "body": "Our lawyer asks for the signed annex."},
    "Thanks, all good now!",
    ["a", "list", "state"],
]


def own(reply: dict) -> dict:
    """``reply`` less its per-request fields."""
    return {k: v for k, v in reply.items() if k not in PER_REQUEST}


async def post(c: httpx2.AsyncClient, path: str, body: dict) -> httpx2.Response:
    return await c.post(path, content=orjson.dumps(body), headers={"content-type": "application/json"})


async def singles_then_batch(serve_argv: tuple[str, ...], body: dict, items: list[dict]) -> tuple[list, list]:
    """The single route's replies of ``items`` (one server, in order) and the batch route's (a fresh one)."""
    async with serving(*serve_argv) as base, httpx2.AsyncClient(base_url=base, timeout=120) as c:
        singles = []
        for item in items:
            r = await post(c, "/v1/systemone", {**{k: v for k, v in body.items() if k != "items"}, **item})
            assert r.status_code == 200, r.text
            singles.append(r.json())
    async with serving(*serve_argv) as base, httpx2.AsyncClient(base_url=base, timeout=120) as c:
        r = await post(c, "/v1/systemone/batch", body)
        assert r.status_code == 200, r.text
        reply = r.json()
    assert list(reply) == ["items"] and len(reply["items"]) == len(items)
    return singles, reply["items"]


async def test_each_item_is_the_single_routes_reply_bit_for_bit_fixture(fixture_engine):
    # one slot: the batch's items are read one after another, as the singles are, so even the engine's
    # counters (x_positions) match; JSON floats compare bit for bit once parsed (orjson writes the shortest
    # repr that reads back to the same double)
    items = [{"state": s} for s in STATES]
    body = {"model": "fixture", "questions": QUESTIONS, "items": items}
    singles, batched = await singles_then_batch(("--engine", str(fixture_engine), "--slots", "1"), body, items)
    for i, (one, item) in enumerate(zip(singles, batched)):
        assert own(item) == own(one), i
        assert item["id"] == item["x_request_id"] and item["id"].endswith(f"-{i}")
    assert batched[0]["answers"]["urgent"]["noul"] != batched[1]["answers"]["urgent"]["noul"]  # states differ


async def test_items_with_their_own_questions_fixture(fixture_engine):
    items = [
        {"state": STATES[0], "questions": {"q": QUESTIONS["urgent"]}},
        {"state": STATES[1], "questions": QUESTIONS},
    ]
    singles, batched = await singles_then_batch(
        ("--engine", str(fixture_engine), "--slots", "1"), {"items": items}, items
    )
    assert [own(b) for b in batched] == [own(s) for s in singles]
    assert list(batched[0]["answers"]) == ["q"] and list(batched[1]["answers"]) == list(QUESTIONS)


@pytest.mark.slow
async def test_each_item_is_the_single_routes_reply_bit_for_bit_llama(tiny):
    from gateway.paths import engine_bin

    llama = engine_bin("serveproto-llama")
    if not llama.exists():
        pytest.skip(f"{llama} is not built yet (make -C engines all)")
    items = [{"state": s} for s in STATES[:3]]
    body = {"questions": QUESTIONS, "items": items}
    argv = ("--model", str(tiny), "--threads", "2", "--slots", "1", "--ctx", "512")
    singles, batched = await singles_then_batch(argv, body, items)
    # everything but x_positions, the engine's report of the work it did: computed vs reused depends on
    # what the engine held from before (the digits do not: model, build and tokens only)
    for b, s in zip(batched, singles):
        assert {k: v for k, v in own(b).items() if k != "x_positions"} == {
            k: v for k, v in own(s).items() if k != "x_positions"
        }
        assert sum(b["x_positions"][k] for k in ("computed", "reused")) == sum(
            s["x_positions"][k] for k in ("computed", "reused")
        )  # the same prompt positions, wherever they came from
    assert batched[0]["answers"]["team"]["probabilities"] != batched[1]["answers"]["team"]["probabilities"]


async def test_refusals_name_the_item_and_nothing_is_answered(fixture_engine, monkeypatch):
    monkeypatch.setattr(batch, "MAX_STATE_BYTES", 100)
    async with serving("--engine", str(fixture_engine)) as base, httpx2.AsyncClient(base_url=base, timeout=30) as c:
        bad = {
            "questions": QUESTIONS,
            "items": [{"state": "fine"}, {"state": 7}, "no", {"state": "x", "questions": {}}],
        }
        r = await post(c, "/v1/systemone/batch", bad)
        assert r.status_code == 422
        assert [(e["loc"], e["type"]) for e in r.json()["detail"]] == [
            (["body", "items", 1, "state"], "content_type"),
            (["body", "items", 2], "model_attributes_type"),
            (["body", "items", 3, "questions"], "value_error"),
        ]
        assert r.json()["error"]["param"] == "items[1].state"
        assert r.json()["error"]["message"].startswith("items[1].state: ")

        shared = await post(c, "/v1/systemone/batch", {"questions": {}, "items": [{"state": "a"}, {"state": "b"}]})
        assert shared.status_code == 422
        assert [e["loc"] for e in shared.json()["detail"]] == [["body", "questions"]]  # once, where it was sent

        over = await post(c, "/v1/systemone/batch", {"questions": QUESTIONS, "items": [{"state": "y" * 60}] * 2})
        assert over.status_code == 422
        assert [e["loc"] for e in over.json()["detail"]] == [["body", "items", 1, "state"]]

        many = await post(c, "/v1/systemone/batch", {"questions": QUESTIONS, "items": [{"state": "s"}] * 1001})
        assert many.status_code == 422 and many.json()["detail"][0]["loc"] == ["body", "items"]
        assert many.json()["detail"][0]["type"] == "too_long"

        none = await post(c, "/v1/systemone/batch", {"questions": QUESTIONS, "items": []})
        assert none.status_code == 422 and none.json()["detail"][0]["type"] == "too_short"

        metrics = (await c.get("/metrics")).text
        assert 'serveproto_questions_total{path="score",type="noul"}' not in metrics  # nothing was answered


def gauge(text: str, name: str) -> float:
    """The value of the unlabelled gauge ``name`` in a Prometheus text exposition."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} is not in /metrics")


async def test_a_batch_leaves_a_slot_to_single_requests_and_the_gauges_say_so(fixture_engine):
    # 3 slots, each SCORE held 1.5 s: a batch of 6 items holds 2 slots (2 lanes), 4 items wait for a lane.
    # Long states that differ from their first byte: two short tickets share most of their prompt, and
    # the slot router keeps such affine requests on one slot (gateway/engine/slots.py)
    argv = ("--engine", str(fixture_engine), "--slots", "3", "--score-delay-ms", "1500")
    questions = {"urgent": QUESTIONS["urgent"]}
    async with serving(*argv) as base, httpx2.AsyncClient(base_url=base, timeout=60) as c:
        before = (await c.get("/metrics")).text
        assert gauge(before, "serveproto:num_requests_waiting") == 0.0
        assert gauge(before, "serveproto:kv_cache_usage_perc") == 0.0
        done: dict[str, httpx2.Response] = {}

        async def run_batch() -> None:
            items = [{"state": f"{i} " + "the printer on floor two jams " * 8} for i in range(6)]
            done["batch"] = await post(c, "/v1/systemone/batch", {"questions": questions, "items": items})

        async with anyio.create_task_group() as tg:
            tg.start_soon(run_batch)
            with anyio.fail_after(10):
                while gauge(text := (await c.get("/metrics")).text, "serveproto:num_requests_running") < 2:
                    await anyio.sleep(0.02)
            assert gauge(text, "serveproto:num_requests_running") == 2.0
            assert gauge(text, "serveproto:num_requests_waiting") == 4.0
            assert gauge(text, "serveproto:kv_cache_usage_perc") == 2 / 3
            single = await post(
                c, "/v1/systemone", {"state": "single: " + "a refund for order 77 " * 10, "questions": questions}
            )
            assert single.status_code == 200 and "batch" not in done  # answered on the free slot, batch still on
        assert done["batch"].status_code == 200 and len(done["batch"].json()["items"]) == 6
        after = (await c.get("/metrics")).text
        assert gauge(after, "serveproto:num_requests_waiting") == 0.0
