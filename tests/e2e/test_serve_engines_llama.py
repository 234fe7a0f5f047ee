"""Two llama engines behind one server (``--model default=... --model tiny=...``): each request is answered
by the model it names, and its bits equal those of a server that runs that model alone."""

from __future__ import annotations

import httpx2
import orjson
import pytest

from gateway.server.routing import HEADER, routing_key
from support import INVOICE
from test_serve_engines import serving

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

#: the llama tests' ticket and a third question, a score
REQUEST = {
    **INVOICE,
    "questions": {
        **INVOICE["questions"],
        "urgency": {"type": "score", "instructions": "How urgent is it?", "criteria": ["not", "somewhat", "very"]},
    },
}


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def answers(base: str, model: str | None) -> tuple[str, dict, str]:
    """``(reply model, answers, routing key header)`` of REQUEST asking ``model`` (None: no model field)."""
    body = {**REQUEST, **({"model": model} if model else {})}
    async with httpx2.AsyncClient(base_url=base, timeout=120) as c:
        r = await c.post("/v1/systemone", content=orjson.dumps(body), headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    return r.json()["model"], r.json()["answers"], r.headers[HEADER]


async def test_two_llama_models_answer_as_alone(model_path, tiny):
    async with serving("--threads", "1", "--model", f"smol={model_path}", "--model", f"tiny={tiny}") as base:
        async with httpx2.AsyncClient(base_url=base, timeout=30) as c:
            health = (await c.get("/health")).json()
            models = (await c.get("/v1/models")).json()
        assert health["status"] == "ok" and [(e["name"], e["model"]) for e in health["engines"]] == [
            ("smol-0", "smol"),
            ("tiny-0", "tiny"),
        ]
        assert [m["name"] for m in models["models"]] == ["smol", "tiny"]
        both = {asked: await answers(base, asked) for asked in ("tiny", "smol", "jev-latest", None)}
    async with serving("--threads", "1", "--model", str(tiny)) as base:
        tiny_alone = await answers(base, None)
    async with serving("--threads", "1", "--model", str(model_path)) as base:
        smol_alone = await answers(base, None)
    key = routing_key(REQUEST["state"])
    assert both["tiny"] == ("tiny", tiny_alone[1], key)
    assert both["smol"] == ("smol", smol_alone[1], key)
    assert both["jev-latest"] == both[None] == both["smol"]  # any other name: the first model
    assert tiny_alone[1] != smol_alone[1]  # the two models do answer apart
