"""From the decision log to a labelled file for ``serveproto heads fit``, as docs/http-api.md tells it.

A server with ``--log-decisions`` (a fake engine) answers two requests; the client keeps their bodies
under ``x_request_id`` (step 2), judges some log lines (step 3), and the docs' own join script (step 4,
read out of docs/http-api.md and run as it is) writes the labelled file; what ``heads fit`` reads from it
(:func:`gateway.lab.evalset.read_jsonl`) is compared with the bodies sent and the answers judged."""

from __future__ import annotations

import textwrap
from pathlib import Path

import httpx2
import orjson
import pytest

from gateway.decision.decision_log import DecisionLog
from gateway.lab import evalset
from test_routes_support import TICKET, FakeEngine, make_app, running

DOCS = Path(__file__).resolve().parents[2] / "docs" / "http-api.md"


def join_script() -> str:
    """The first python block after the heading "From your decision log to a head", dedented."""
    text = DOCS.read_text()
    after = text[text.index("### From your decision log to a head") :]
    start = after.index("```python\n") + len("```python\n")
    return textwrap.dedent(after[start : after.index("```", start)])


@pytest.mark.anyio
async def test_the_docs_join_turns_a_judged_log_into_the_file_heads_fit_reads(tmp_path, monkeypatch):
    app = make_app(FakeEngine())
    app.decision_log = DecisionLog(tmp_path / "decisions.jsonl")
    other = {**TICKET, "state": "Please cancel my subscription, the invoice was wrong twice."}
    kept = []
    async with running(app) as base:
        async with httpx2.AsyncClient(base_url=base) as client:
            for body in (TICKET, other, TICKET):
                reply = (await client.post("/v1/systemone", json=body)).json()
                kept.append({"request_id": reply["x_request_id"], "request": body})
    app.decision_log.close()
    (tmp_path / "bodies.jsonl").write_bytes(b"".join(orjson.dumps(k) + b"\n" for k in kept[:2]))  # the third not kept
    # step 3: judge every line of the first request, one of the second, and the third (its body not kept)
    judged = {
        (kept[0]["request_id"], "urgency"): True,
        (kept[0]["request_id"], "department"): "technical",
        (kept[0]["request_id"], "severity"): 2,
        (kept[1]["request_id"], "department"): "billing",
        (kept[2]["request_id"], "urgency"): False,
    }
    lines = [orjson.loads(x) for x in (tmp_path / "decisions.jsonl").read_bytes().splitlines()]
    assert len(lines) == 9
    for x in lines:
        x["answer"] = judged.get((x["request_id"], x["question_id"]))
    (tmp_path / "decisions.jsonl").write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))

    monkeypatch.chdir(tmp_path)
    exec(compile(join_script(), str(DOCS), "exec"), {})

    items = evalset.read_jsonl(tmp_path / "labelled.jsonl")
    assert [(i.id, i.body) for i in items] == [(kept[0]["request_id"], TICKET), (kept[1]["request_id"], other)]
    # reply-order indices: a noul's no/yes, the choice's labels as sent, the score's level
    assert items[0].gold == {"urgency": 1, "department": 1, "severity": 2}
    assert items[1].gold == {"department": 0}
