"""How an engine's death reads (issue 30, items 4 and 8).

A killed engine's 503 once quoted the last line of its stderr, a llama.cpp start-up warning
("n_ctx_seq (20480) > n_ctx_train (8192)"), as if it were the cause. The reply now says what
happened (the signal, and whether the engine is restarted); the engine's stderr goes to the
server's log only. After the restart intensity the server exits 1 with one line and nothing else.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys

import anyio
import httpx2
import pytest

from gateway.engine.process import exit_words
from gateway.paths import ROOT
from test_routes_support import serving

pytestmark = pytest.mark.anyio

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}

#: What ``--fault stderr_flood=1`` writes on the fixture's stderr before READY.
FLOOD_LINE = "serveproto-fixture: stderr flood line 1 of 1, padding to about one hundred bytes........"


def test_exit_words():
    assert exit_words(3) == "exited (exit status 3)"
    assert exit_words(0) == "exited (exit status 0)"
    assert exit_words(None) == "exited (still running)"
    assert exit_words(-9) == "was killed by signal 9 (SIGKILL)"
    assert exit_words(-6, "exited before its handshake") == "was killed by signal 6 (SIGABRT) before its handshake"
    assert exit_words(-99) == "was killed by signal 99"


async def test_a_killed_engine_says_so_and_keeps_its_stderr_in_the_log(fixture_engine, caplog):
    # The fixture writes one line on stderr at start, then aborts (SIGABRT) after its third frame
    # (ACCEPT, DATA, DATA) of the chat request: the 503 names the signal and the restart, not the line.
    caplog.set_level(logging.WARNING)
    argv = [str(fixture_engine), "--token-delay-ms", "20", "--fault", "stderr_flood=1", "--fault", "abort_after=3"]
    async with serving("--ping-interval", "60", "--engine", *argv) as base:
        async with httpx2.AsyncClient(base_url=base, timeout=30) as c:
            with anyio.fail_after(20):
                r = await c.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json() == {
        "detail": {
            "error_type": "overloaded_error",
            "message": "the engine is unavailable: engine 'serveproto-fixture' was killed by signal 6 (SIGABRT); "
            "restarting",
        }
    }
    logged = [rec.getMessage() for rec in caplog.records if rec.name == "gateway.engine"]
    assert (
        "engine 'serveproto-fixture' was killed by signal 6 (SIGABRT); restarting; its last stderr lines: " + FLOOD_LINE
    ) in logged


async def test_a_sigkilled_engine_in_flight_is_503_saying_signal_9(fixture_engine, probes):
    async with serving("--ping-interval", "60", "--engine", str(fixture_engine), "--token-delay-ms", "20") as base:
        async with httpx2.AsyncClient(base_url=base, timeout=30) as c:
            with anyio.fail_after(20):
                body = {**CHAT, "max_tokens": 1000, "stream": True}
                async with c.stream("POST", "/v1/chat/completions", json=body) as r:
                    lines = r.aiter_lines()
                    first = await anext(lines)
                    (pid,) = probes.child_pids()
                    os.kill(pid, signal.SIGKILL)
                    rest = [line async for line in lines if line]
    assert first.startswith("data: {")
    assert rest[-2:] == [
        'data: {"error":{"message":"the engine is unavailable: engine \'serveproto-fixture\' was killed by signal 9 '
        '(SIGKILL); restarting","type":"overloaded_error","param":null,"code":null}}',
        "data: [DONE]",
    ]


def test_giving_up_prints_the_log_lines_and_the_one_line_nothing_else(fixture_engine):
    # issue 30, item 8: a stray asyncio traceback sometimes came before the "giving up" line. An engine
    # that exits right after its handshake, restarted once: stderr is these lines, in this order, each
    # time (three runs: the stray traceback was intermittent).
    name = "serveproto-fixture"
    want = [
        f"engine {name}: engine '{name}' exited (exit status 3); restarting",
        f"engine {name}: restarting in 0.10 s (restart 1): engine '{name}' exited (exit status 3)",
        f"engine {name}: engine '{name}' exited (exit status 3)",
        f"engine '{name}' gave up: more than 1 restart(s) within 60.0 s; last error: engine '{name}' exited "
        "(exit status 3)",
        "serveproto serve: giving up: the engine failed 2 time(s) within 60 s (--max-restarts 1); last error: "
        f"engine '{name}' exited (exit status 3); exiting with status 1 (--keep-restarting keeps retrying)",
    ]
    for _ in range(3):
        done = subprocess.run(
            [sys.executable, "-m", "gateway.cli", "serve", "--port", "0", "--log-level", "WARNING"]
            + [
                "--max-restarts",
                "1",
                "--ping-interval",
                "60",
                "--engine",
                str(fixture_engine),
                "--fault",
                "exit_after=0",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 1
        assert done.stderr.splitlines() == want
