"""A served pair's time per request by reader (issue 47, item 4): one ``serveproto serve --pair`` of the
default language model and ``sparrow-nano-general``, a 3-question request (bench/decision_gateway.py's
questions) on each ticket and e-mail of bench/tickets_emails.py, asked once per reader in turn
(``x_reader``), side by side in one run over HTTP/1.1 keep-alive. Each ticket is new to the language model
for its first reader (its persisted score cache off), so the readers that need it are timed cold on the
state only when asked first: the order of the readers turns with each ticket.

    .venv/bin/python -m bench.pair_latency [--port 8151] [--threads 1]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
from time import perf_counter

from bench import ROOT, tickets_emails
from bench.decision_gateway import BODY
from gateway.cli.config import DEFAULT_MODEL_DEBIAS
from gateway.paths import default_model_path

READERS = ("decider", "lm", "mean")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8151)
    ap.add_argument("--threads", default="1")
    a = ap.parse_args()
    argv = [
        str(ROOT / ".venv/bin/serveproto"),
        "serve",
        "--port",
        str(a.port),
        "--threads",
        a.threads,
        "--cache-dir",
        "off",
        "--model",
        f"lm={default_model_path()}",
        "--model",
        "dec=sparrow-nano-general",
        "--pair",
        "both=lm,dec",
        "--debias",
        ",".join(DEFAULT_MODEL_DEBIAS),
    ]
    serve = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=os.environ)
    times: dict[str, list[float]] = {r: [] for r in READERS}
    first: dict[str, list[float]] = {r: [] for r in READERS}
    try:
        assert serve.stdout
        while b"serving" not in serve.stdout.readline():
            pass
        conn = http.client.HTTPConnection("127.0.0.1", a.port)
        for k, line in enumerate(tickets_emails.lines()):
            state = line["request"]["state"]
            order = READERS[k % 3 :] + READERS[: k % 3]
            for j, reader in enumerate(order):
                body = json.dumps({**BODY, "state": state, "x_reader": reader}).encode()
                t0 = perf_counter()
                conn.request("POST", "/v1/systemone", body, {"content-type": "application/json"})
                resp = conn.getresponse()
                resp.read()
                ms = (perf_counter() - t0) * 1e3
                assert resp.status == 200, resp.status
                times[reader].append(ms)
                if j == 0 or reader == "decider":
                    first[reader].append(ms)
        n = len(tickets_emails.lines())
        for reader in READERS:
            cold = statistics.median(first[reader]) if first[reader] else float("nan")
            print(
                f"x_reader {reader}: {n} requests, p50 {statistics.median(times[reader]):.1f} ms; "
                f"p50 on a state new to the language model {cold:.1f} ms ({len(first[reader])} requests)"
            )
    finally:
        serve.terminate()
        serve.wait()


if __name__ == "__main__":
    main()
