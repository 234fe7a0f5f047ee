"""A client that goes away cancels its engine work: the supervisor sends CANCEL, or the waiter leaves the slot queue.

The server runs in-process over the real fixture engine with a per-token
delay (``--token-delay-ms``), so a chat completion occupies its slot for many
seconds, and a per-question SCORE delay (``--score-delay-ms``), so a
16-question ``/v1/systemone`` is one long engine request; the tests read the
supervisor's ``in_flight`` / ``waiting`` counts and the order of the engine's
frames. The deadlines are generous bounds for "promptly", far below the work's
length.
"""

from __future__ import annotations

import contextlib

import anyio
import orjson
import pytest

from gateway.engine import Engine
from gateway.engine.options import EngineOptions
from gateway.engine.process import EngineProcess
from gateway.http import HTTPServer
from gateway.server.app import App, AppConfig, ModelInfo
from serveproto import Accept, Done, Error

pytestmark = pytest.mark.anyio

#: 400 tokens at 100 ms each: 40 s of generation, against deadlines of 10 s.
SLOW_CHAT = {"model": "fixture", "messages": [{"role": "user", "content": "count"}], "max_tokens": 400}
TICKET = {
    "state": "My Stripe integration keeps failing.",
    "model": "jev-latest",
    "questions": {"urgency": {"type": "noul", "instructions": "Is this urgent?"}},
}


#: 16 questions: one SCORE of 16 groups, 16 x 2 s at --score-delay-ms 2000.
LONG_TICKET = {
    "state": TICKET["state"],
    "model": "jev-latest",
    "questions": {f"q{i}": {"type": "noul", "instructions": f"Is point {i} urgent?"} for i in range(16)},
}


@contextlib.asynccontextmanager
async def serving(fixture_engine, *extra: str):
    """The app over a one-slot fixture engine with a 100 ms token delay; yields (engine, port)."""
    argv = [str(fixture_engine), "--slots", "1", "--ctx", "1024", "--token-delay-ms", "100", *extra]
    async with Engine.spawn(argv, options=EngineOptions().updated(handshake_timeout=30)) as engine:
        app = App(engine, ModelInfo.load(engine.caps.model), config=AppConfig(request_timeout=120))
        async with anyio.create_task_group() as tg:
            port = await HTTPServer(app).start(tg)
            try:
                yield engine, port
            finally:
                tg.cancel_scope.cancel()


def raw_post(path: str, body: dict) -> bytes:
    data = orjson.dumps(body)
    return (
        f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    ).encode() + data


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


async def post(port: int, path: str, body: dict) -> tuple[int, bytes]:
    """One request on its own connection: (status, body)."""
    s = await anyio.connect_tcp("127.0.0.1", port)
    async with s:
        await s.send(raw_post(path, body))
        data = b""
        while b"\r\n\r\n" not in data:
            data += await s.receive()
        head, rest = data.split(b"\r\n\r\n", 1)
        length = next(
            int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
        )
        while len(rest) < length:
            rest += await s.receive()
        return int(head.split(b" ", 2)[1]), rest[:length]


async def test_closed_systemone_client_cancels_its_score(fixture_engine, monkeypatch):
    frames = []  # every reply frame the supervisor read, in order
    dispatch = EngineProcess._dispatch

    def record(self, ev):
        frames.append(ev)
        dispatch(self, ev)

    monkeypatch.setattr(EngineProcess, "_dispatch", record)
    async with serving(fixture_engine, "--score-delay-ms", "2000") as (engine, port):
        s = await anyio.connect_tcp("127.0.0.1", port)
        await s.send(raw_post("/v1/systemone", LONG_TICKET))
        await wait_until(lambda: engine.in_flight == 1, "the 16-question SCORE reached the engine")
        await s.aclose()
        with anyio.fail_after(20):  # the SCORE alone would take 32 s
            status, body = await post(port, "/v1/systemone", TICKET)
        assert status == 200, body
        assert b"urgency" in body
        ended = [(i, ev) for i, ev in enumerate(frames) if isinstance(ev, (Done, Error))]
        accepts = [(i, ev) for i, ev in enumerate(frames) if isinstance(ev, Accept)]
        # the long SCORE ended CANCELLED (never answered), before the next request's ACCEPT
        (i_cancel, cancelled), (i_done, done) = ended
        assert isinstance(cancelled, Error) and cancelled.code == "CANCELLED"
        assert [ev.id for _, ev in accepts] == [done.id] and isinstance(done, Done)
        assert i_cancel < accepts[0][0] < i_done
        assert engine.healthy and engine.in_flight == 0
