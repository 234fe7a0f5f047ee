"""A fixed ``prefix`` against the same text inside ``state`` (issue 48, item 1): time a request, side by side.

Fresh states (a new ticket each request) after the same rules of about 40 words, two ways on two
servers of the default model started side by side: the rules sent as ``"prefix"``, and the same
text sent inside ``"state"`` (``rules + "\\n\\n" + ticket``: the same prompt). Requests go to the two
servers in turns, request by request, so that the machine's load falls on both alike. Each row gives
each server's seconds and ``x_positions.computed``; the summary gives the median of the requests
after the first and their ratio (issue 48's goal: prefix / state at most 1.2). ``--before TREE``
adds a third server run from another source tree (e.g. ``git archive main | tar -x -C /tmp/main``)
with the rules as ``prefix``: the same requests before the change.

    .venv/bin/python -m bench.prefix [--requests 8] [--threads 2] [--debias none] [--before TREE]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import httpx2

from bench.servers import Server

RULES = (
    "You triage support tickets for a payments company. Escalate anything that mentions lost money, "
    "failed payouts or legal threats; route integration errors to the technical team and pricing questions "
    "to sales. Answer from the ticket alone."
)
QUESTIONS = {
    "urgency": {"type": "noul", "instructions": "Does this message express urgency?"},
    "department": {
        "type": "choice",
        "instructions": "Which team should handle this?",
        "criteria": {"billing": "payments, invoices", "technical": "bugs, integration errors", "sales": "pricing"},
    },
}


def ticket(i: int) -> str:
    return f"Ticket {i}: my payout #{4100 + 7 * i} has not arrived after {i % 5 + 2} days and my bank sees nothing."


def body(i: int, as_prefix: bool, debias: str | None) -> dict:
    b: dict = {"state": ticket(i), "prefix": RULES} if as_prefix else {"state": RULES + "\n\n" + ticket(i)}
    b["questions"] = QUESTIONS
    if debias is not None:
        b["x_debias"] = debias
    return b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=8, help="fresh states per server (default 8)")
    ap.add_argument("--threads", default="2", help="engine threads of each server (default 2)")
    ap.add_argument("--debias", default=None, help="x_debias of every request (default: the server's)")
    ap.add_argument("--before", type=Path, default=None, help="another source tree, served with the rules as prefix")
    args = ap.parse_args()
    common = ("--threads", args.threads, "--cache-dir", "off")
    columns = [("prefix", True, Server(*common)), ("state", False, Server(*common))]
    if args.before is not None:
        columns.append(("prefix before", True, Server(*common, tree=args.before)))
    seconds: dict[str, list[float]] = {name: [] for name, _, _ in columns}
    computed: dict[str, list[int]] = {name: [] for name, _, _ in columns}
    digits: dict[str, list[object]] = {name: [] for name, _, _ in columns}
    try:
        clients = [httpx2.Client(base_url=srv.base, timeout=600) for _, _, srv in columns]
        print("request  " + "  ".join(f"{name:>22}" for name, _, _ in columns))
        for i in range(args.requests):
            cells = []
            for (name, as_prefix, _), client in zip(columns, clients):
                t = time.perf_counter()
                r = client.post("/v1/systemone", json=body(i, as_prefix, args.debias))
                dt = time.perf_counter() - t
                if r.status_code != 200:
                    raise SystemExit(f"{name}: {r.status_code} {r.text}")
                reply = r.json()
                seconds[name].append(dt)
                computed[name].append(reply["x_positions"]["computed"])
                digits[name].append(reply["answers"])
                cells.append(f"{dt:8.3f} s {computed[name][-1]:5d} pos")
            print(f"{i:7d}  " + "  ".join(f"{c:>22}" for c in cells))
        for c in clients:
            c.close()
    finally:
        for _, _, srv in columns:
            srv.close()
    print()
    print("after the first request (median):")
    for name, _, _ in columns:
        print(
            f"  {name:14s} {statistics.median(seconds[name][1:]):.3f} s  "
            f"{statistics.median(computed[name][1:]):.0f} positions  (first: {seconds[name][0]:.3f} s, "
            f"{computed[name][0]} positions)"
        )
    for name, _, _ in columns:
        if name != "state":
            ratio = statistics.median(seconds[name][1:]) / statistics.median(seconds["state"][1:])
            print(f"  {name} / state: {ratio:.2f}x time")
    if args.debias == "none":  # the content-free readings of a correction read the prefix, not the state
        print(f"  same digits, prefix and state: {digits['prefix'] == digits['state']}")


if __name__ == "__main__":
    main()
