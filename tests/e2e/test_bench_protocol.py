"""bench/protocol.py still runs (tiny sizes; no timing is asserted)."""

from __future__ import annotations

from test_bench_support import run_bench


def test_bench_protocol_runs_and_reports_its_ratio():
    sizes = ("--requests", "3", "--positions", "5", "--k", "2", "--repeat", "1", "--chunk", "7")
    out = run_bench("protocol", *sizes, check=True, timeout=120).stdout
    assert "3 requests x 5 positions, k=2: 21 frames (15 ECHO)" in out
    assert "ratio serveproto / baseline" in out and "goal 250,000 ECHO frames/s" in out
