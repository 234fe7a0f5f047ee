"""``serveproto batch`` against a loop of single requests, side by side on one server (issue 50, item 2).

One server (``--serve-args``; default: the fixture engine, 4 slots, each SCORE held 20 ms a group). The
same number of new states (``--rows``) three ways, each with states of its own (cold): a loop of single
``/v1/systemone`` requests, one after another (what a user writes first); ``serveproto batch IN OUT``
(JSONL in and out, its defaults: 4 requests in flight, 32 rows a request); and ``serveproto batch
--concurrency 1`` (one request at a time, as the loop). Prints rows a second of each and the ratio to the loop.

    .venv/bin/python -m bench.batch_cli [--rows 1000] [--serve-args '--slots 4 --threads 2']
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx2
import orjson

from bench import ROOT
from bench.batch_fair import DEFAULT_SERVE, QUESTIONS, state
from bench.servers import Server


def loop(base: str, n: int) -> float:
    """``n`` single requests one after another (one keep-alive connection); seconds."""
    t = time.perf_counter()
    with httpx2.Client(base_url=base, timeout=600) as c:
        for i in range(n):
            r = c.post("/v1/systemone", content=orjson.dumps({"state": state("loop", i), "questions": QUESTIONS}))
            if r.status_code != 200:
                raise SystemExit(f"single request: {r.status_code} {r.text[:300]}")
    return time.perf_counter() - t


def cli(base: str, n: int, tag: str, folder: Path, *flags: str) -> float:
    """``serveproto batch`` on ``n`` new rows (JSONL); seconds, the command's start included."""
    src, out, q = folder / f"{tag}.jsonl", folder / f"{tag}.out.jsonl", folder / "q.json"
    q.write_bytes(orjson.dumps(QUESTIONS))
    src.write_bytes(b"".join(orjson.dumps({"state": state(tag, i)}) + b"\n" for i in range(n)))
    t = time.perf_counter()
    cmd = [sys.executable, "-m", "gateway.cli", "batch", str(src), str(out), "--url", base, "--questions", str(q)]
    subprocess.run([*cmd, *flags], cwd=ROOT, check=True, capture_output=True)
    seconds = time.perf_counter() - t
    if out.read_bytes().count(b'"reply"') != n:
        raise SystemExit(f"serveproto batch {' '.join(flags)}: not {n} replies in {out}")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1000, help="rows each way (default 1000)")
    ap.add_argument("--serve-args", default=DEFAULT_SERVE, help="`serve` flags, one string (default: the fixture)")
    args = ap.parse_args()
    server = Server(*shlex.split(args.serve_args))
    try:
        with tempfile.TemporaryDirectory() as d:
            folder = Path(d)
            loop(server.base, 4)  # warm: the template's head read once
            single = loop(server.base, args.rows)
            default = cli(server.base, args.rows, "cli", folder)
            one = cli(server.base, args.rows, "cli1", folder, "--concurrency", "1")
    finally:
        server.close()
    n = args.rows
    print(f"serve {args.serve_args}; {n} rows each")
    print("| way | seconds | rows/s | / loop |")
    print("|---|---|---|---|")
    for name, s in (
        ("a loop of single requests", single),
        ("serveproto batch (4 in flight, 32 rows a request)", default),
        ("serveproto batch --concurrency 1", one),
    ):
        print(f"| {name} | {s:.2f} | {n / s:.1f} | {single / s:.2f}x |")


if __name__ == "__main__":
    main()
