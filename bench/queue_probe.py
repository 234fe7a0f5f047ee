"""Who waits how long: a closed loop of clients against a running server, every request's latency printed.

``--clients`` threads each send ``--rounds`` new support tickets (``bench/load.py``'s ticket workload,
``x_debias: "none"``) to ``POST /v1/systemone`` one after another. Printed: the total time and
requests/s, then each request's start (seconds from the first) and latency in start order. On a fair
server, once the first round has queued, every latency is about clients / requests/s; a router that
holds some requests for one busy slot while others idle shows as latencies from a second to several
times that (bench/results/NOTEBOOK.md, "Load").

    .venv/bin/serveproto serve --port 8790 &
    .venv/bin/python -m bench.queue_probe --url http://127.0.0.1:8790 [--clients 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import urllib.request

from bench import load


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="the server (default http://127.0.0.1:8000)")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3, help="requests each client sends, one after another")
    ap.add_argument("--seed", type=int, default=15, help="the tickets' seed (bench/load.py's)")
    args = ap.parse_args(argv)
    tickets = load.workloads(args.seed)["tickets"]
    rows: list[tuple[int, float, float]] = []
    lock = threading.Lock()
    t0 = time.time()

    def client(k: int) -> None:
        for j in range(args.rounds):
            body = {**tickets.body(1000 + k * args.rounds + j), "x_debias": "none"}
            req = urllib.request.Request(
                f"{args.url}/v1/systemone", data=json.dumps(body).encode(), headers={"content-type": "application/json"}
            )
            start = time.time()
            with urllib.request.urlopen(req, timeout=600) as r:
                r.read()
            with lock:
                rows.append((k, start - t0, time.time() - start))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = time.time() - t0
    print(f"{len(rows)} requests in {total:.1f} s: {len(rows) / total:.2f} requests/s")
    for k, start, latency in sorted(rows, key=lambda r: r[1]):
        print(f"client {k:3d}  start {start:6.1f} s  latency {latency:6.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
