"""A client that goes away cancels its engine work: the supervisor sends CANCEL, or the waiter leaves the slot queue.

The server runs in-process over the real fixture engine with a per-token
delay (``--token-delay-ms``), so a chat completion occupies its slot for many
seconds; the test reads the supervisor's ``in_flight`` / ``waiting`` counts.
The deadlines are generous bounds for "promptly", far below the work's length.
"""
from __future__ import annotations

import contextlib

import anyio
import orjson
import pytest

from gateway.app import App, ModelInfo
from gateway.engine import Engine
from gateway.http import HTTPServer

pytestmark = pytest.mark.anyio

#: 400 tokens at 100 ms each: 40 s of generation, against deadlines of 10 s.
SLOW_CHAT = {"model": "fixture", "messages": [{"role": "user", "content": "count"}], "max_tokens": 400}
TICKET = {"state": "My Stripe integration keeps failing.", "model": "jev-latest",
          "questions": {"urgency": {"type": "noul", "instructions": "Is this urgent?"}}}


@contextlib.asynccontextmanager
async def serving(fixture_engine):
    """The app over a one-slot fixture engine with a 100 ms token delay; yields (engine, port)."""
    argv = [str(fixture_engine), "--slots", "1", "--ctx", "1024", "--token-delay-ms", "100"]
    async with Engine.spawn(argv, handshake_timeout=30) as engine:
        app = App(engine, ModelInfo.load(engine.caps.model), request_timeout=120)
        async with anyio.create_task_group() as tg:
            port = await HTTPServer(app).start(tg)
            try:
                yield engine, port
            finally:
                tg.cancel_scope.cancel()


def raw_post(path: str, body: dict) -> bytes:
    data = orjson.dumps(body)
    return (f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


async def wait_until(predicate, what: str, deadline: float = 10.0) -> None:
    with anyio.move_on_after(deadline):
        while not predicate():
            await anyio.sleep(0.02)
    assert predicate(), f"not reached within {deadline} s: {what}"


async def test_closed_client_cancels_the_engine_request(fixture_engine):
    async with serving(fixture_engine) as (engine, port):
        s = await anyio.connect_tcp("127.0.0.1", port)
        await s.send(raw_post("/v1/chat/completions", SLOW_CHAT))
        await wait_until(lambda: engine.in_flight == 1, "the chat request reached the engine")
        await s.aclose()
        await wait_until(lambda: engine.in_flight == 0, "the engine request was cancelled")
        assert engine.healthy and engine.waiting == 0


async def test_closed_systemone_client_leaves_the_slot_queue(fixture_engine):
    async with serving(fixture_engine) as (engine, port):
        busy = await anyio.connect_tcp("127.0.0.1", port)
        await busy.send(raw_post("/v1/chat/completions", SLOW_CHAT))
        await wait_until(lambda: engine.in_flight == 1, "the chat request holds the only slot")
        s = await anyio.connect_tcp("127.0.0.1", port)
        await s.send(raw_post("/v1/systemone", TICKET))
        await wait_until(lambda: engine.waiting == 1, "the /v1/systemone request waits for the slot")
        await s.aclose()
        await wait_until(lambda: engine.waiting == 0, "the /v1/systemone request left the slot queue")
        assert engine.in_flight == 1  # the chat request, whose client is still there, goes on
        await busy.aclose()
        await wait_until(lambda: engine.in_flight == 0, "the chat request was cancelled too")
        assert engine.healthy
