"""docs/http-api.md's "Reply" example against the code, without an engine.

The example is one real run: its headers and its body must be those of one request (the request id,
the engine time, the path and the length agree; the routing key is the doc's request's own), and the
same request answered by the server (a fake engine, the default model's correction) has the same
headers and the same fields, in the same order, at every level of the body."""

from __future__ import annotations

import json
from pathlib import Path

import httpx2
import orjson
import pytest

from gateway.cli.config import DEFAULT_MODEL_DEBIAS
from gateway.server.routing import routing_key
from test_routes_support import FakeEngine, make_app, running

DOCS = Path(__file__).resolve().parents[2] / "docs" / "http-api.md"


def reply_example() -> tuple[dict, list[tuple[str, str]], bytes]:
    """The doc's ``ticket.json``, the reply's headers (in order) and its body as the server sent it
    (the doc's re-wrapped JSON, compact again)."""
    text = DOCS.read_text()
    section = text[text.index("### Reply") : text.index("### Ambiguous requests")]
    after = section[section.index("with `ticket.json`:") :]
    start = after.index("```json\n") + len("```json\n")
    request = json.loads(after[start : after.index("```", start)])
    start = after.index("```\nHTTP/1.1 200 OK\n") + len("```\nHTTP/1.1 200 OK\n")
    block = after[start : after.index("```", start)]
    head, _, body = block.partition("\n\n")
    headers = [(k, v.strip()) for k, _, v in (line.partition(":") for line in head.splitlines())]
    return request, headers, orjson.dumps(json.loads(body))


def test_the_reply_examples_headers_and_body_are_one_request():
    request, headers, body = reply_example()
    h = dict(headers)
    doc = orjson.loads(body)
    assert h["content-length"] == str(len(body))
    assert h["x-typesafe-request-id"] == doc["x_request_id"] == doc["id"]
    assert h["x-serveproto-engine-ms"] == f"{doc['x_engine_ms']:.3f}"
    assert h["x-serveproto-path"] == doc["x_path"]
    assert h["x-serveproto-route-key"] == routing_key(request["state"], request.get("prefix"))
    assert doc["x_debias"] == list(DEFAULT_MODEL_DEBIAS)


def shape(value, key=None):
    """The keys of every object, in order, and the type of every other value (``x_argmax_is_label``, true
    or null by what the model read, is one type)."""
    if key == "x_argmax_is_label" and value in (True, None):
        return "true or null"
    if isinstance(value, dict):
        return [(k, shape(v, k)) for k, v in value.items()]
    if isinstance(value, list):
        return [shape(v) for v in value]
    return "number" if isinstance(value, (int, float)) and not isinstance(value, bool) else type(value).__name__


@pytest.mark.anyio
async def test_the_server_answers_the_reply_examples_request_in_its_shape():
    request, headers, body = reply_example()
    engine = FakeEngine()
    engine.disk = 0  # the default model's engine keeps results on disk (x_positions.disk; serve --cache-dir)
    app = make_app(engine, debias=DEFAULT_MODEL_DEBIAS)
    async with running(app) as base:
        async with httpx2.AsyncClient(base_url=base) as client:
            r = await client.post("/v1/systemone", json=request)
    assert r.status_code == 200
    assert [k for k, _ in headers] == [k for k in r.headers if k not in ("server", "date")]
    assert r.headers["x-serveproto-route-key"] == dict(headers)["x-serveproto-route-key"]
    assert shape(r.json()) == shape(orjson.loads(body))
