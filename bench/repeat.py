"""A repeated question, side by side: this tree's server, another tree's, and llama-server.

The workload is the one a decision server sees most: the same state asked the same question
again (a page reloaded, a retry, a dashboard polling). One state, one ``noul`` question:

- **this tree** (and ``--baseline-tree``'s, e.g. the last landed commit exported to a folder,
  its engines built): ``POST /v1/systemone`` with ``x_debias: "none"``, through ``serveproto
  serve`` on the default model;
- **llama-server** built from the same llama-cpp-python sdist (``make -C engines llama-server``),
  one slot, its prompt cache on: ``POST /completion`` of the very prompt our SCORE reads (the
  chat-templated state and question, ``gateway.decision.prompts``) with ``n_predict: 1, n_probs: 10``:
  the next-token log-probabilities that hold both answers.

All three run here with the same ``--threads``; each gets one cold request, then ``--reps``
repeats, the servers taking turns request by request so that they share the machine's load.
Prints the median and p90 of the repeats (ms), ours / llama-server, and the positions our
engine computed on a repeat (``x_positions``). Usage::

    .venv/bin/python -m bench.repeat [--threads 1] [--reps 30] [--baseline-tree DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import httpx2
import orjson

from bench import ROOT
from bench.servers import LlamaServer, Server
from gateway.decision.chat_template import ChatTemplate
from gateway.decision.prompts import PromptBuilder
from gateway.paths import default_model_path, engine_bin

STATE = (
    "I have been trying to connect my Stripe account for 3 days and the integration keeps failing. "
    "I am losing sales and my manager is asking when this will be fixed."
)
QUESTION = {"type": "noul", "instructions": "Does this message express urgency?"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument(
        "--baseline-tree",
        type=Path,
        default=None,
        help="another source tree (its engines built) served beside this one",
    )
    ap.add_argument("--llama-server", type=Path, default=engine_bin("llama-server"))
    args = ap.parse_args(argv)
    model = default_model_path()
    if not args.llama_server.exists():
        print(f"missing {args.llama_server}: make -C engines llama-server", file=sys.stderr)
        return 2
    builder = PromptBuilder(ChatTemplate.from_gguf(model))
    prompt = builder.prefix(STATE) + builder.question("noul", QUESTION["instructions"], None).stem
    body = orjson.dumps({"state": STATE, "questions": {"urgent": QUESTION}, "x_debias": "none"})
    peer_body = orjson.dumps({"prompt": prompt, "n_predict": 1, "n_probs": 10, "temperature": 0, "cache_prompt": True})

    servers: list[tuple[str, object, str, bytes]] = []
    try:
        for label, tree in [("this tree", ROOT)] + (
            [("baseline tree", args.baseline_tree)] if args.baseline_tree else []
        ):
            s = Server("--threads", str(args.threads), tree=tree)
            servers.append((label, s, "/v1/systemone", body))
        peer = LlamaServer(args.llama_server, model, args.threads)
        servers.append(("llama-server", peer, "/completion", peer_body))
        times: dict[str, list[float]] = {label: [] for label, *_ in servers}
        positions: dict[str, dict] = {}
        with httpx2.Client(timeout=300) as client:
            for rep in range(args.reps + 1):
                for label, server, path, payload in servers:
                    t = time.perf_counter()
                    r = client.post(server.base + path, content=payload, headers={"content-type": "application/json"})
                    dt = time.perf_counter() - t
                    r.raise_for_status()
                    if rep == 0:
                        continue  # the cold request: the state is read once
                    times[label].append(dt)
                    if path == "/v1/systemone":
                        positions[label] = r.json().get("x_positions", {})
    finally:
        for _, server, *_ in servers:
            server.close()
    print(
        f"a repeated 1-question request: default model, {args.threads} threads, {args.reps} repeats after a "
        "cold one, the servers taking turns"
    )
    peer_med = statistics.median(times["llama-server"])
    for label, ts in times.items():
        med, p90 = statistics.median(ts), sorted(ts)[int(0.9 * (len(ts) - 1))]
        extra = f"   positions on a repeat: {positions[label]}" if label in positions else ""
        print(
            f"  {label:14s} median {med * 1e3:8.2f} ms  p90 {p90 * 1e3:8.2f} ms  / llama-server "
            f"{med / peer_med:6.3f}{extra}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
