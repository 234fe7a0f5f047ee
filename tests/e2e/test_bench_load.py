"""bench/load.py: its workloads, llama-server's first-token read-out, and a short run on the fixture engine.

No timing is asserted: the run checks the tables' shape and that every request was answered.
"""

from __future__ import annotations

import subprocess

import orjson
import pytest

from bench import load
from gateway.decision import schema
from gateway.paths import engine_bin
from test_bench_support import ROOT, bench_argv, run_bench


def test_tickets_are_new_valid_and_reproducible():
    bodies = [load.ticket_body(serial, seed=15) for serial in range(1_000_000, 1_000_050)]
    assert [load.ticket_body(serial, seed=15) for serial in range(1_000_000, 1_000_050)] == bodies
    texts = [orjson.dumps(b["state"]) for b in bodies]
    assert len(set(texts)) == 50
    for serial, body in zip(range(1_000_000, 1_000_050), bodies):
        assert list(body["questions"]) == ["department", "refund", "severity"]
        assert [q["type"] for q in body["questions"].values()] == ["choice", "noul", "score"]
        state = body["state"]
        assert state["ticket"] == serial if isinstance(state, dict) else state.startswith(f"Ticket {serial}. ")
        schema.parse_request(body)  # the server's own validation
    assert load.ticket_body(1_000_000, seed=16) != bodies[0]


def test_document_questions_are_new_and_share_the_document():
    bodies = [load.document_body(serial) for serial in range(2_000_000, 2_000_032)]
    assert {b["state"] for b in bodies} == {load.DOCUMENT}
    asked = [next(iter(b["questions"].values()))["instructions"] for b in bodies]
    assert len(set(asked)) == 32 and asked[0].startswith("Question 2000000. ")
    assert [next(iter(b["questions"])) for b in bodies[:16]] == list(load.QUESTIONS_16)
    for body in bodies:
        schema.parse_request(body)


def test_first_token_read_out():
    top = [
        {"token": "No", "logprob": -0.5},
        {"token": " tech", "logprob": -1.0},
        {"token": "t", "logprob": -2.0},
        {"token": " ", "logprob": -0.1},
        {"token": "1", "logprob": -3.0},
    ]
    assert load.first_token_logprob(top, "no") == -0.5
    assert load.first_token_logprob(top, "technical") == -1.0  # the likelier of " tech" and "t"
    assert load.first_token_logprob(top, "1") == -3.0
    assert load.first_token_logprob(top, "yes") is None  # a bare space starts nothing
    assert load.first_token_logprob(top, "10") == -3.0


def test_client_counts_are_checked():
    assert load.client_counts("1,4,16") == [1, 4, 16]
    for bad in ("", "1,x", "0,4"):
        with pytest.raises(Exception, match="--clients"):
            load.client_counts(bad)


@pytest.mark.skipif(
    not engine_bin("serveproto-fixture").exists(), reason="the fixture engine is not built (make engines)"
)
def test_a_short_run_on_the_fixture_engine(tmp_path):
    out = run_bench(
        "load",
        *("--clients", "1,16", "--seconds", "0.3", "--debias", "default,cyclic", "--baseline-tree", str(ROOT)),
        *("--json", str(tmp_path / "cells.json"), "--engine", str(engine_bin("serveproto-fixture"))),
        timeout=240,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("`bench/load.py --clients 1,16 --seconds 0.3 ")
    for workload in ("tickets", "document"):
        head = next(i for i, line in enumerate(lines) if line.startswith(f"#### {workload}: "))
        assert lines[head + 2] == (
            "| server | x_debias | clients | requests | errors | requests/s | questions/s | p50 | p99 "
            "| p99 / p50 | computed a request | / baseline's |"
        )
        rows = [line.split(" | ") for line in lines[head + 4 : head + 4 + 8]]
        assert [(r[0], r[1], r[2]) for r in rows] == [
            ("| this tree", "default: none", "1"),
            ("| this tree", "cyclic", "1"),
            ("| baseline", "default: none", "1"),
            ("| baseline", "cyclic", "1"),
            ("| this tree", "default: none", "16"),
            ("| this tree", "cyclic", "16"),
            ("| baseline", "default: none", "16"),
            ("| baseline", "cyclic", "16"),
        ]
        assert lines[head + 4 + 8] == ""
        assert all(int(r[3]) >= int(r[2]) and r[4] == "0" for r in rows)  # every client answered, no errors
        assert all(float(r[-1].rstrip(" |")) > 0 for r in rows if r[0] == "| this tree")
        assert all(r[-1] == " |" for r in rows if r[0] == "| baseline")
    cells = orjson.loads((tmp_path / "cells.json").read_bytes())["cells"]
    assert len(cells) == 16 and all(c["errors"] == 0 and c["requests"] > 0 for c in cells)
    by_workload = {w: [c for c in cells if c["workload"] == w] for w in ("tickets", "document")}
    assert all(c["questions_per_s"] == pytest.approx(3 * c["requests_per_s"]) for c in by_workload["tickets"])
    assert all(c["questions_per_s"] == pytest.approx(c["requests_per_s"]) for c in by_workload["document"])
    assert all(c["p50_s"] <= c["p99_s"] for c in cells)
    # cyclic reads each question once per rotation: more positions than the default's one reading
    for w, cs in by_workload.items():
        assert min(c["computed_per_request"] for c in cs if c["x_debias"] == "cyclic") > max(
            c["computed_per_request"] for c in cs if c["x_debias"] == "default: none"
        ), w


@pytest.mark.skipif(
    not engine_bin("serveproto-fixture").exists(), reason="the fixture engine is not built (make engines)"
)
def test_sigterm_prints_the_cells_so_far():
    """bench/gpu/run.sh ends an over-long bench with `timeout` (SIGTERM): the cells measured so far are printed."""
    argv = bench_argv(
        "load",
        *("--clients", "1,2", "--seconds", "0.3", "--workloads", "tickets", "--debias", "none", "--requests", "5"),
        *("--engine", str(engine_bin("serveproto-fixture")), "--score-delay-ms", "1000"),
    )
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = proc.stderr.readline()  # the first cell's line: 1 client, 1 slow request
        assert first.startswith("  tickets, 1 clients, this tree (none): 1 answered, 0 errors"), first
        proc.terminate()  # during the 2-client cell
        out, err = proc.communicate(timeout=60)
    finally:  # a load.py left running would be counted as a leaked child by the tests after this one
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err
    lines = out.splitlines()
    assert lines, err
    assert "CUT SHORT (SIGTERM or ^C): the cells measured so far" in lines[0]
    rows = [line for line in lines if line.startswith("| this tree |")]
    assert len(rows) == 1 and rows[0].startswith("| this tree | none | 1 | 1 | 0 |")
