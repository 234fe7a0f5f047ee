"""Readiness while the engines load: ``serveproto serve`` answers from its bind on, ``/ready`` 503 and
``/health`` 200 (alive) while its engine loads (the fixture engine's ``slow_start`` fault), ``/ready`` 200
once it has, and a request before then gets 503 + ``Retry-After`` rather than a hang."""

from __future__ import annotations

import subprocess
import time

import httpx2
import orjson

from support import free_port, serve_process


def test_ready_is_503_while_the_engine_loads_and_200_after(fixture_engine):
    port = free_port()
    argv = ["--port", str(port), "--log-level", "WARNING", "--engine", str(fixture_engine), "--fault", "slow_start=4"]
    seen: list[tuple[int, bytes]] = []
    with serve_process(*argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE):
        with httpx2.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as c:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    r = c.get("/ready")
                except httpx2.TransportError:  # not bound yet
                    time.sleep(0.05)
                    continue
                if not seen or seen[-1] != (r.status_code, r.content):
                    seen.append((r.status_code, r.content))
                if r.status_code == 503 and len(seen) == 1:
                    health = c.get("/health")
                    early = c.post("/v1/systemone", content=orjson.dumps({"state": "x", "questions": {}}))
                if r.status_code == 200:
                    break
                time.sleep(0.05)
            after = c.get("/health")
    assert [status for status, _ in seen] == [503, 200], seen
    assert orjson.loads(seen[0][1]) == {"status": "loading"}
    assert orjson.loads(seen[1][1]) == {"status": "ready", "model": "fixture"}
    assert health.status_code == 200 and health.json() == {"status": "loading"}
    assert early.status_code == 503 and early.headers["retry-after"] == "1"
    assert early.json()["detail"]["error_type"] == "overloaded_error"
    assert after.status_code == 200 and after.json() == {"status": "ok", "model": "fixture"}
