"""``serveproto batch IN OUT --url URL`` against a running server (the fixture engine): JSONL and CSV in and
out, each row's reply the single route's; retried through a server that is still loading (503 +
``Retry-After``); and killed with SIGKILL mid-run then started again, every row written once, whole, in order.
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess

import anyio
import httpx2
import orjson
import pytest

from gateway.paths import ROOT
from support import SERVEPROTO, first_reply, free_port, serve_process
from test_batch_route import QUESTIONS, own
from test_routes_support import serving

pytestmark = pytest.mark.anyio


def batch_argv(tmp_path, url: str, *argv: str, files: tuple[str, str] = ("in.jsonl", "out.jsonl")) -> list:
    """``serveproto batch IN OUT --url url --questions q.json *argv``, IN, OUT and q.json in ``tmp_path``."""
    src, dst = (tmp_path / name for name in files)
    return [*SERVEPROTO, "batch", src, dst, "--url", url, "--questions", tmp_path / "q.json", *argv]


def ticket(i: int) -> str:
    """A long state whose first bytes are its own (short ones share a slot: gateway/engine/slots.py)."""
    return f"{i:03d} the printer on floor two jams and the invoice is late " * 3


def write_inputs(tmp_path, n: int) -> None:
    (tmp_path / "q.json").write_bytes(orjson.dumps(QUESTIONS))
    with (tmp_path / "in.jsonl").open("wb") as f:
        for i in range(n):
            f.write(orjson.dumps({"id": i, "ticket": {"body": ticket(i)}}) + b"\n")
    with (tmp_path / "in.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "text"])
        for i in range(n):
            w.writerow([i, ticket(i)])


async def singles(base: str, n: int) -> list[dict]:
    async with httpx2.AsyncClient(base_url=base, timeout=60) as c:
        out = []
        for i in range(n):
            r = await c.post("/v1/systemone", content=orjson.dumps({"state": ticket(i), "questions": QUESTIONS}))
            assert r.status_code == 200, r.text
            out.append(r.json())
        return out


def jsonl_rows(path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def comparable(reply: dict) -> dict:
    """A reply less its request's own fields and the engine's work report (what it held differs by run)."""
    return {k: v for k, v in own(reply).items() if k != "x_positions"}


async def test_jsonl_and_csv_rows_get_the_single_routes_answers(fixture_engine, tmp_path):
    n = 7
    write_inputs(tmp_path, n)
    async with serving("--engine", str(fixture_engine), "--slots", "2") as base:
        a = await anyio.run_process(
            batch_argv(tmp_path, base, "--state", "ticket.body", "--chunk", "3"), check=False, cwd=ROOT
        )
        b = await anyio.run_process(
            batch_argv(tmp_path, base, "--state", "text", "--chunk", "3", files=("in.csv", "out.csv")),
            check=False,
            cwd=ROOT,
        )
        expected = await singles(base, n)
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
    assert b"7/7 rows" in a.stderr and b"7 rows written" in a.stderr
    lines = jsonl_rows(tmp_path / "out.jsonl")
    assert [line["row"] for line in lines] == list(range(n))
    assert [comparable(line["reply"]) for line in lines] == [comparable(e) for e in expected]
    with (tmp_path / "out.csv").open(newline="") as f:
        records = list(csv.DictReader(f))
    assert [int(r["row"]) for r in records] == list(range(n))
    for r, e in zip(records, expected):
        assert float(r["urgent"]) == e["answers"]["urgent"]["noul"]
        assert r["team"] == e["answers"]["team"]["choice"] and r["severity"] == str(e["answers"]["severity"]["score"])
        assert comparable(orjson.loads(r["reply"])) == comparable(e) and r["error"] == ""


async def test_a_bad_row_gets_its_error_line_and_the_others_their_replies(fixture_engine, tmp_path):
    (tmp_path / "q.json").write_bytes(orjson.dumps(QUESTIONS))
    (tmp_path / "in.jsonl").write_bytes(b'{"state": "fine"}\n{"state": 12}\n{"state": "also fine"}\n')
    async with serving("--engine", str(fixture_engine)) as base:
        r = await anyio.run_process(batch_argv(tmp_path, base), check=False, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    lines = jsonl_rows(tmp_path / "out.jsonl")
    assert [sorted(line) for line in lines] == [["reply", "row"], ["error", "row"], ["reply", "row"]]
    assert lines[1]["error"]["status"] == 422
    assert lines[1]["error"]["body"]["detail"][0]["loc"] == ["body", "state"]


def test_retries_a_loading_server_after_its_retry_after(fixture_engine, tmp_path):
    # the server binds, then its engine takes 3 s to load: 503 + Retry-After: 1 until then (/ready)
    write_inputs(tmp_path, 4)
    port = free_port()
    argv = ["--port", str(port), "--log-level", "WARNING", "--engine", str(fixture_engine), "--fault", "slow_start=3"]
    with serve_process(*argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
        with httpx2.Client(timeout=5) as c:  # bound (the CLI's first tries then meet 503s, not a refused port)
            loading = first_reply(c, f"http://127.0.0.1:{port}/ready", seconds=10)
        assert loading.status_code == 503
        cmd = batch_argv(tmp_path, f"http://127.0.0.1:{port}", "--state", "ticket.body")
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert [line["row"] for line in jsonl_rows(tmp_path / "out.jsonl")] == [0, 1, 2, 3]


async def test_killed_with_sigkill_and_started_again_writes_each_row_once_whole(fixture_engine, tmp_path):
    n = 60
    write_inputs(tmp_path, n)
    # each SCORE held 150 ms a group: the run takes seconds even on a loaded machine, so the kill lands in
    # the middle of it (at 40 ms it failed once on a busy 2-core machine)
    async with serving("--engine", str(fixture_engine), "--slots", "3", "--score-delay-ms", "150") as base:
        cmd = batch_argv(tmp_path, base, "--state", "ticket.body", "--chunk", "2", "--concurrency", "3")
        out = tmp_path / "out.jsonl"
        kills = 0
        for _ in range(2):  # killed twice, at two different points
            proc = await anyio.open_process(cmd, cwd=ROOT)
            async with proc:
                with anyio.fail_after(60):
                    while not out.exists() or out.read_bytes().count(b"\n") < 10 * (kills + 1):
                        await anyio.sleep(0.01)
                os.kill(proc.pid, signal.SIGKILL)
                assert await proc.wait() == -signal.SIGKILL
            kills += 1
        held = out.read_bytes().count(b"\n")
        assert 20 <= held < n  # killed before the end
        done = await anyio.run_process(cmd, check=False, cwd=ROOT)
        expected = await singles(base, n)
    assert done.returncode == 0, done.stderr
    assert f"{n}/{n} rows".encode() in done.stderr
    data = out.read_bytes()
    assert data.endswith(b"\n")
    lines = jsonl_rows(out)
    assert [line["row"] for line in lines] == list(range(n))  # each row once, in order
    assert [comparable(line["reply"]) for line in lines] == [comparable(e) for e in expected]
