"""bench/protocol.py still runs (tiny sizes; no timing is asserted)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_bench_protocol_runs_and_reports_its_ratio():
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "protocol.py"),
            "--requests",
            "3",
            "--positions",
            "5",
            "--k",
            "2",
            "--repeat",
            "1",
            "--chunk",
            "7",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    assert "3 requests x 5 positions, k=2: 21 frames (15 ECHO)" in out
    assert "ratio serveproto / baseline" in out and "goal 250,000 ECHO frames/s" in out
