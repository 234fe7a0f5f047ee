"""Many options (issue 45, item 4): one choice of 255 described labels, its time and what it reads right.

The choice: labels ``queue_000`` ... ``queue_254``, each described by a sentence naming a product and a
fault (15 products x 17 faults = 255 pairs, ``Tickets about a printer that will not turn on``); the
states are one-sentence tickets about one pair each, in other words than its description (``My
printer does not power up since Monday.``), so the right label is known.

For each ``x_debias`` setting (``default``: none sent, the server's default correction), on a fresh
server (``--threads``, nothing kept on disk):

- **cold**: one request on a new state, the labels new to the server: seconds, positions computed;
- **known labels**: the next ``--states`` requests, each a new state with the same labels (what a server
  answering one taxonomy sees after its first request): seconds (median), positions (median);
- the answers of all of them: accuracy, mean probability of the right label, and the share of answers
  in the first tenth of the listing (the listing is in label order under ``canonical``: the model's lean
  to the top of a long list shows there).

    .venv/bin/python -m bench.many_options [--debias 'default;none;...'] [--states 16] [--threads 2]
        [--words short] [--json PATH] [--tree DIR]

``--words short`` describes each label in five words (``Tickets routed to queue 17``, the request the
issue measured first: the states name no queue, so its quality columns mean nothing); ``pair`` (the
default) as above, 8 to 12 words; ``long`` adds eight more (``..., as customers report it to the
support desk``).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from bench import ROOT
from bench.servers import Server

PRODUCTS = (
    "printer|laptop|router|phone|tablet|monitor|keyboard|camera|speaker|watch|scanner|projector|headset|"
    "charger|smart lock"
).split("|")
#: (how the description says it, how a ticket says it)
FAULTS = (
    ("will not turn on", "does not power up"),
    ("overheats", "gets far too hot"),
    ("arrived broken", "came damaged in the box"),
    ("was charged twice", "appeared twice on my card"),
    ("needs a refund", "should be paid back to me"),
    ("cannot connect to wifi", "never joins the wireless network"),
    ("makes a loud noise", "is buzzing very loudly"),
    ("shows an error code", "displays error E42"),
    ("needs a software update", "asks for new firmware"),
    ("was never delivered", "still has not arrived"),
    ("has a cracked screen", "has glass broken across the display"),
    ("drains its battery", "goes flat within an hour"),
    ("is missing a part", "came without the cable"),
    ("needs a manual", "came with no instructions"),
    ("should be replaced under warranty", "needs a warranty swap"),
    ("keeps restarting", "reboots by itself"),
    ("was sent in the wrong colour", "came in red instead of black"),
)
WHEN = ("since Monday", "after one week", "today", "again", "this morning", "for two days")


def labels(words: str) -> dict[str, str]:
    """The 255 labels and their descriptions (``words``: ``pair``, ``long`` or ``short``)."""
    if words == "short":
        return {f"queue_{i:03d}": f"Tickets routed to queue {i}" for i in range(255)}
    tail = ", as customers report it to the support desk" if words == "long" else ""
    return {
        f"queue_{i:03d}": f"Tickets about a {PRODUCTS[i // len(FAULTS)]} that {FAULTS[i % len(FAULTS)][0]}{tail}"
        for i in range(255)
    }


def ticket(k: int) -> tuple[str, str]:
    """State ``k`` (a new one for each ``k``) and its right label: pairs spread over the listing."""
    i = (k * 97 + 11) % 255
    product, (_, said) = PRODUCTS[i // len(FAULTS)], FAULTS[i % len(FAULTS)]
    return f"My {product} {said} {WHEN[k % len(WHEN)]}. Ticket {1000 + k}.", f"queue_{i:03d}"


def body(state: str, criteria: dict[str, str], debias: str) -> dict:
    question = {"type": "choice", "instructions": "Which queue should handle this ticket?", "criteria": criteria}
    b: dict = {"state": state, "questions": {"queue": question}}
    if debias != "default":
        b["x_debias"] = debias
    return b


def run_setting(debias: str, n_states: int, threads: int, words: str, tree: Path = ROOT) -> dict:
    criteria = labels(words)
    server = Server("--threads", str(threads), "--cache-dir", "off", tree=tree)
    rows = []
    try:
        for k in range(n_states + 1):
            state, right = ticket(k)
            seconds, reply = server.post("/v1/systemone", body(state, criteria, debias), timeout=1800)
            answer = reply["answers"]["queue"]
            probs = answer["probabilities"]
            rows.append(
                {
                    "seconds": seconds,
                    "computed": int(reply["x_positions"]["computed"]),
                    "choice": answer["choice"],
                    "right": right,
                    "p_right": probs[right],
                    "debias": reply.get("x_debias"),  # absent when no correction applies
                }
            )
    finally:
        server.close()
    rank = {label: r for r, label in enumerate(sorted(criteria))}
    known = rows[1:]
    return {
        "debias": debias,
        "cold_s": rows[0]["seconds"],
        "cold_computed": rows[0]["computed"],
        "known_s": statistics.median(r["seconds"] for r in known) if known else None,
        "known_computed": statistics.median(r["computed"] for r in known) if known else None,
        "accuracy": sum(r["choice"] == r["right"] for r in rows) / len(rows),
        "p_right": statistics.fmean(r["p_right"] for r in rows),
        "top_tenth": sum(rank[r["choice"]] < 26 for r in rows) / len(rows),
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--debias", default="default;none", help="x_debias settings, ';'-separated")
    ap.add_argument("--states", type=int, default=16, help="requests on known labels after the cold one")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--words", choices=("pair", "long", "short"), default="pair")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    ap.add_argument("--tree", type=Path, default=ROOT, help="the source tree whose gateway serves (another commit's)")
    args = ap.parse_args(argv)
    settings = [s.strip() for s in args.debias.split(";")]
    print(f"255 labels ({args.words}), {args.states + 1} requests a setting, {args.threads} threads")
    print(
        f"{'x_debias':<40} {'cold s':>7} {'pos':>6} {'known s':>8} {'pos':>6} {'acc':>6} {'p_right':>8} {'top 10%':>8}"
    )
    out = []
    for debias in settings:
        r = run_setting(debias, args.states, args.threads, args.words, args.tree)
        out.append(r)
        print(
            f"{debias:<40} {r['cold_s']:7.1f} {r['cold_computed']:6d} {r['known_s'] or 0:8.1f} "
            f"{r['known_computed'] or 0:6.0f} {r['accuracy']:6.3f} {r['p_right']:8.4f} {r['top_tenth']:8.3f}",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
