"""bench/burst.py on the fixture engine: the table's shape, every request answered. No timing is asserted."""

from __future__ import annotations

from gateway.paths import engine_bin
from test_bench_support import run_bench


def test_bursts_on_the_fixture_engine():
    serve_args = f"--engine {engine_bin('serveproto-fixture')} --slots 4"
    out = run_bench("burst", "--clients", "4", "--rounds", "2", "--serve-args", serve_args, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [line.split("|")[1:-1] for line in out.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert [r[0].strip() for r in rows] == ["round", "1", "2"]
    for r in rows[1:]:
        wall, p50, slowest, computed = (float(c) for c in r[1:])
        assert 0 < p50 <= slowest and wall > 0 and computed > 0
