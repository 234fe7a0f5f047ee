"""Shared by the route tests: a fake engine with the supervisor's interface, and a live server.

The fake is a toy with numbers a test can work out by hand: an option's
tokens are its characters, and character ``c`` has logprob
``-(1 + ord(c) % 7) / 10``. It records every call it gets.
"""

from __future__ import annotations

import contextlib
import json

import anyio
import attrs

from fixtures.requests import TICKET  # noqa: F401  (re-exported: the route and end-to-end tests import it from here)
from gateway.decision.chat_template import ChatTemplate
from gateway.engine import (
    EngineCrashed,  # noqa: F401  (re-exported: test_routes, test_sdk, test_openai_stream import it from here)
    OptionScore,
    ReadOut,
    RequestError,  # noqa: F401
    ScoreResult,
)
from gateway.http import HTTPServer
from gateway.server.app import App, AppConfig, ModelInfo
from serveproto import Accept, Data, Done, Echo


def char_logprob(c: str) -> float:
    return -(1 + ord(c) % 7) / 10


@attrs.frozen
class FakeCaps:
    chat: bool = True
    decide: bool = False
    decide_record: str | None = None
    slots: int = 2
    n_ctx: int = 4096
    model: str = "fake-model"
    max_logprobs: int = 32
    x_score: bool = True


class FakeEngine:
    """The supervisor's ``Engine`` interface, answered by a toy (see module doc)."""

    def __init__(self, caps: FakeCaps | None = None, *, reply: str = "Hello there", decision=None, fail=None) -> None:
        self.caps = caps or FakeCaps()
        self.healthy = True
        self.restarts = 0
        self.calls: list[tuple] = []
        self.reply = reply
        self.decision = decision
        self.fail = fail  # an exception to raise from every call
        self.pinned: dict = {}  # slot -> texts photographed (pin=True)
        self.token_delay = 0.0  # seconds between generated tokens
        self.closed = 0  # generation streams that ended (finished or abandoned)
        self.disk: int | None = None  # DONE disk= of every SCORE (an engine with x_persist), else absent

    def _check(self):
        if self.fail is not None:
            raise self.fail

    async def score(self, prefix, groups, pin=False, slot=None, route=None, beside=None):
        if beside is not None:  # as Engine.score on an engine without x_score_base: a second call, same slot
            main = await self.score(prefix, groups, pin, slot, route)
            extra = await self.score(beside[0], beside[1], False, slot, route)
            return attrs.evolve(
                main,
                groups=main.groups + extra.groups,
                computed=main.computed + extra.computed,
                reused=main.reused + extra.reused,
            )
        self.calls.append(("score", prefix, groups, pin, slot))
        self._check()
        ctx = len(prefix)
        out = []
        for stem, options in groups:
            out.append([OptionScore(ctx + len(stem), tuple(char_logprob(c) for c in o)) for o in options])
        n = sum(len(o) for _, opts in groups for o in opts)
        pinned = self.pinned.setdefault(slot, set())
        hit = any(prefix.startswith(p) for p in pinned)  # the scored texts extend the prefix
        if pin:
            pinned.add(prefix)
        done = Done(1, 0, 0.0, 0.0, 0.1, ctx, False, computed=n, reused=ctx, snapshot="hit" if hit else "none")
        return ScoreResult(out, done, n, ctx, disk=self.disk)

    async def decide(self, record: bytes, slot=0):
        self.calls.append(("decide", record, slot))
        self._check()
        if self.token_delay:
            await anyio.sleep(self.token_delay)
        rec = json.loads(record)
        if self.decision is not None:
            return self.decision(rec), Done(1, 0, 0.0, 0.0, 0.1, 7, False)
        answers = []
        for q in rec["questions"]:
            n = len(q["options"])
            w = [float(i + 1) for i in range(n)]
            answers.append({"id": q["id"], "probs": [x / sum(w) for x in w], "logits": w})
        return {"answers": answers, "input_tokens": 42, "engine_ms": 1.5}, Done(1, 0, 0.0, 0.0, 0.1, 42, False)

    async def submit(
        self, prompt, max_tokens=16, temperature=0.0, top_p=1.0, logprobs=0, pin=False, slot=None, counters=False
    ):
        self.calls.append(("submit", prompt, max_tokens, temperature, top_p, logprobs, slot))
        self._check()
        p = prompt.encode() if isinstance(prompt, str) else prompt
        yield Accept(1, len(p))
        if logprobs:
            for i, b in enumerate(p):
                lp = float("nan") if i == 0 else char_logprob(chr(b))
                top = () if i == 0 else tuple((j, -0.5 - j) for j in range(logprobs))
                yield Echo(1, i, lp, top, bytes([b]))
        words = self.reply.encode().split(b" ")
        pieces = [w if i == 0 else b" " + w for i, w in enumerate(words)][:max_tokens]
        try:
            for piece in pieces:
                if self.token_delay:
                    await anyio.sleep(self.token_delay)
                yield Data(1, piece, -0.25 if logprobs else None, tuple((7 + j, -0.25 - j) for j in range(logprobs)))
            yield Done(1, len(pieces), 10.0, 0.0, 0.1, len(p), len(pieces) == max_tokens and len(words) > max_tokens)
        finally:
            self.closed += 1

    async def read_out(self, prompt, logprobs=1, pin=False, slot=None, route=None):
        self.calls.append(("read_out", prompt, logprobs, pin, slot))
        self._check()
        if pin:
            self.pinned.setdefault(slot, set()).add(prompt)
        echoes = [ev async for ev in self.submit(prompt, max_tokens=0, logprobs=logprobs) if isinstance(ev, Echo)]
        self.calls.pop()
        return ReadOut(echoes, Done(1, 0, 0.0, 0.0, 0.1, len(echoes), False))


def make_app(engine=None, *, api_key=None, template=None, debias=(), **config) -> App:
    engine = engine or FakeEngine()
    model = ModelInfo(engine.caps.model, "2026-11-30", "a fake model", template or ChatTemplate.chatml())
    return App(engine, model, config=AppConfig(api_key=api_key, request_timeout=5.0, **config), debias=debias)


@contextlib.asynccontextmanager
async def serving(*argv: str):
    """``serveproto serve`` in-process on a free port with ``argv`` (WARNING logs); yields the base URL."""
    from gateway.cli import build_parser
    from gateway.cli.serve import serve

    args = build_parser().parse_args(["serve", "--port", "0", "--log-level", "WARNING", *argv])
    async with anyio.create_task_group() as tg:
        port = await tg.start(lambda task_status: serve(args, task_status=task_status))
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            tg.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def running(app: App):
    """Serve ``app`` on a free loopback port; yields the base URL."""
    async with anyio.create_task_group() as tg:
        port = await HTTPServer(app).start(tg, "127.0.0.1", 0)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            tg.cancel_scope.cancel()


class Recorder:
    """Wraps the app to keep the raw requests a client (the official SDK) sent."""

    def __init__(self, app):
        self.app = app
        self.requests = []

    async def __call__(self, request):
        self.requests.append(request)
        return await self.app(request)
