"""The decision log on a disk that fills: ``serve --log-decisions`` on a small filesystem, filled mid-run.

Starts ``serveproto serve`` (the fixture engine) logging to ``DIR/decisions.jsonl``, asks ``--before``
requests, fills ``DIR`` with a filler file (leaving 300 bytes, so the next request's lines get a short
write), asks ``--during`` requests, deletes the filler, asks ``--after`` more. Printed: the status
codes of each phase, ``serveproto_decision_log_lines_lost_total``, the log's lines and how many do not
parse as JSON (a torn line), and the server's warnings about the log. With a full disk the first few
requests still fit in the log's last allocated block (on tmpfs a 4 KiB page: 3 requests of 975 bytes
after 5), the next gets a short write, the rest ``ENOSPC``. ``DIR`` must be a filesystem of
its own (as root: ``mount -t tmpfs -o size=64k tmpfs DIR``); files in it are deleted first.

    .venv/bin/python -m bench.full_disk DIR [--required] [--before 5] [--during 20] [--after 5] [--tree PATH]

``--tree``: the checkout whose server runs (default this one; another, to compare a version before).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx2

from bench import ROOT
from fixtures.requests import TICKET


def _fill(folder: Path, leave: int = 300) -> None:
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"x" * 512)
    except OSError:
        pass
    finally:
        os.close(fd)
    os.truncate(folder / "filler", max(0, (folder / "filler").stat().st_size - leave))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path, help="a small filesystem of its own (its files are deleted)")
    ap.add_argument("--required", action="store_true", help="serve with --log-decisions-required")
    ap.add_argument("--before", type=int, default=5)
    ap.add_argument("--during", type=int, default=20)
    ap.add_argument("--after", type=int, default=5)
    ap.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose gateway serves (default this one)")
    args = ap.parse_args(argv)
    for f in args.dir.iterdir():
        f.unlink()
    log = args.dir / "decisions.jsonl"
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--port", "0", "--log-level", "WARNING"]
    cmd += ["--log-decisions", str(log)] + (["--log-decisions-required"] if args.required else [])
    cmd += ["--engine", str(ROOT / "engines" / "bin" / "serveproto-fixture")]
    env = {**os.environ, "PYTHONPATH": str(args.tree)}
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=args.tree, env=env)
    try:
        port = None
        for line in server.stdout:
            if m := re.search(r"serving .* on http://[^:]+:(\d+)", line):
                port = m.group(1)
                break
        if port is None:
            print(server.stderr.read(), file=sys.stderr)
            return 1
        with httpx2.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as c:
            phases = {}
            phases["before"] = [c.post("/v1/systemone", json=TICKET).status_code for _ in range(args.before)]
            _fill(args.dir)
            phases["full"] = [c.post("/v1/systemone", json=TICKET).status_code for _ in range(args.during)]
            (args.dir / "filler").unlink()
            phases["after"] = [c.post("/v1/systemone", json=TICKET).status_code for _ in range(args.after)]
            metrics = c.get("/metrics").text
            health = c.get("/health").status_code
    finally:
        server.terminate()
        err = server.communicate(timeout=30)[1]
    lines = log.read_bytes().splitlines()
    torn = 0
    for raw in lines:
        try:
            json.loads(raw)
        except ValueError:
            torn += 1
    for name, codes in phases.items():
        print(
            f"{name}: {dict(collections.Counter(codes))}", "".join("." if x == 200 else "x" for x in codes)
        )  # in order
    print(f"/health after: {health}")
    print(
        *[x for x in metrics.splitlines() if x.startswith("serveproto_decision_log_lines_lost_total")]
        or ["(no counter)"]
    )
    print(f"log: {len(lines)} lines, {torn} not JSON")
    for x in err.splitlines():
        if "decision" in x or "Error" in x:
            print("stderr:", x)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
