"""The gateway's own share of a decision engine's request (issue 47): p50 wall time of one
3-question /v1/systemone request through ``serveproto serve --model sparrow-nano-general``
(HTTP/1.1 keep-alive, one client) against the same record sent to serveproto-sparrow alone as a
DECIDE frame over its pipes, side by side in one run (alternating, after a warm-up).

    .venv/bin/python -m bench.decision_gateway [--n 300] [--model sparrow-nano-general] [--port 8149]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import time

from bench import ROOT
from gateway.cli.plan import decision_engine_argv
from gateway.decision import record
from gateway.decision.schema import parse_request

BODY = {
    "state": "Subject: charged twice\n\nHi, my card was charged twice for the March invoice and I need the "
    "duplicate refunded before Friday or I cancel.",
    "questions": {
        "refund": {"type": "noul", "instructions": "Is the user asking for money back?"},
        "queue": {
            "type": "choice",
            "instructions": "Which queue?",
            "criteria": {"billing": "charges, invoices", "tech": "bugs", "sales": "plans", "other": None},
        },
        "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["not urgent", "soon", "now"]},
    },
}


def engine_call(proc: subprocess.Popen[bytes], rid: int, payload: bytes) -> None:
    assert proc.stdin and proc.stdout
    proc.stdin.write(b"DECIDE %d 0 %d\n%s\n" % (rid, len(payload), payload))
    proc.stdin.flush()
    while True:
        line = proc.stdout.readline()
        if line.startswith(b"DECISION"):
            proc.stdout.read(int(line.split()[2]) + 1)
        elif line.startswith(b"DONE"):
            return
        elif line.startswith(b"ERROR") or not line:
            raise SystemExit(f"engine: {line!r}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--model", default="sparrow-nano-general")
    ap.add_argument("--port", type=int, default=8149)
    a = ap.parse_args()
    argv = decision_engine_argv(a.model)
    payload = record.serialize(record.build(parse_request(BODY), raw=True, sort_keys=False))
    eng = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert eng.stdout
    while not eng.stdout.readline().startswith(b"STAT"):
        pass
    serve = subprocess.Popen(
        [str(ROOT / ".venv/bin/serveproto"), "serve", "--port", str(a.port), "--model", a.model],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=os.environ,
    )
    try:
        assert serve.stdout
        while b"serving" not in serve.stdout.readline():
            pass
        conn = http.client.HTTPConnection("127.0.0.1", a.port)
        body = json.dumps(BODY).encode()
        t_gw, t_eng = [], []
        for i in range(a.n + 20):
            t0 = time.perf_counter()
            conn.request("POST", "/v1/systemone", body, {"content-type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            t1 = time.perf_counter()
            assert resp.status == 200, resp.status
            engine_call(eng, i + 1, payload)
            t2 = time.perf_counter()
            if i >= 20:
                t_gw.append((t1 - t0) * 1e3)
                t_eng.append((t2 - t1) * 1e3)
        gw, en = statistics.median(t_gw), statistics.median(t_eng)
        print(
            f"{a.model}: 3 questions, n={a.n}: p50 through the gateway {gw:.2f} ms, engine alone {en:.2f} ms, "
            f"gateway's share {gw - en:.2f} ms"
        )
    finally:
        serve.terminate()
        serve.wait()
        eng.stdin.close() if eng.stdin else None
        eng.wait()


if __name__ == "__main__":
    main()
