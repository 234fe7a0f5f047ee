"""llama.cpp's tokenizer on what a SCORE's start tokenizes (issue 24): stock, patch 0008, patches 0008 + 0009.

``engines/bin/llama-tokenize-ref`` times ``llama_tokenize`` (the engine's flags: special tokens parsed)
on the default model's vocabulary (SmolLM2's) three ways, in one run, side by side: llama.cpp's stock
paths (``LLAMA_UNICODE_STD_REGEX=1 LLAMA_BPE_NO_WORD_CACHE=1``: the ``\\p{N}`` split by a ``std::regex``
compiled on every call, every word merged), patch 0008 alone (the split in code) and both patches (each
word's tokens kept). Texts:

- **repeated** (``--reps`` calls each, the mean): the load benchmark's document (``bench/load.py``), its
  first 300 bytes, a ChatML question stem as the gateway writes one, a one-token option, a line of
  numbers;
- **new tickets**: ``--tickets`` tickets of ``bench/load.py``'s generator, each tokenized once, all of
  them in one fresh process per way and round (the words a new text shares with the ones before it
  are what 0009 saves).

The three ways run in turn ``--rounds`` times, and each cell is the median of its rounds.

    .venv/bin/python -m bench.tokenizing [--model PATH] [--reps 500] [--tickets 300] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.decisions import QUESTIONS_16
from bench.load import DOCUMENT, ticket_body
from gateway.paths import default_model_path, engine_bin

#: The three ways, by the environment that selects them.
WAYS = {
    "stock": {"LLAMA_UNICODE_STD_REGEX": "1", "LLAMA_BPE_NO_WORD_CACHE": "1"},
    "0008": {"LLAMA_BPE_NO_WORD_CACHE": "1"},
    "0008 + 0009": {},
}


def repeated_texts() -> list[tuple[str, str]]:
    """(label, text) of the repeated rows."""
    question = next(iter(QUESTIONS_16.values()))["instructions"]
    stem = f"<|im_end|>\n<|im_start|>user\nQuestion 1000017. {question}<|im_end|>\n<|im_start|>assistant\n"
    return [
        ("the document", DOCUMENT),
        ("its first 300 bytes", DOCUMENT[:300]),
        ("a ChatML question stem", stem),
        ("an option", " yes"),
        ("numbers", "Version 4.2.1, updated 2026-12-04 at 19:57, 12345 orders"),
    ]


def run(model: Path, texts: list[str], reps: int, env: dict[str, str]) -> list[tuple[int, int, float]]:
    """(bytes, tokens, mean microseconds a call) per text, from one llama-tokenize-ref process."""
    with tempfile.NamedTemporaryFile(suffix=".bin") as f:
        f.write(b"".join(t.encode() + b"\0" for t in texts))
        f.flush()
        out = subprocess.run(
            [str(engine_bin("llama-tokenize-ref")), "--model", str(model), "--texts", f.name, "--reps", str(reps)],
            env={**os.environ, **env},
            capture_output=True,
            check=True,
            text=True,
        ).stdout
    rows = []
    for line in out.splitlines():
        kv = dict(w.split("=") for w in line.split())
        rows.append((int(kv["bytes"]), int(kv["tokens"]), float(kv["us"])))
    return rows


def in_turn(model: Path, texts: list[str], reps: int, rounds: int) -> dict[str, list[list[tuple[int, int, float]]]]:
    """Each way's :func:`run` of ``texts``, the ways in turn, ``rounds`` times (a shared machine's speed
    drifts, so the rounds interleave): per way, one list of rows per round."""
    out: dict[str, list[list[tuple[int, int, float]]]] = {way: [] for way in WAYS}
    for _ in range(rounds):
        for way, env in WAYS.items():
            out[way].append(run(model, texts, reps, env))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None, help="GGUF (default: the default model)")
    ap.add_argument("--reps", type=int, default=500, help="calls per repeated text (default 500)")
    ap.add_argument("--tickets", type=int, default=300, help="new tickets, each tokenized once (default 300)")
    ap.add_argument("--rounds", type=int, default=5, help="the three ways in turn, this many times (default 5)")
    args = ap.parse_args()
    model = args.model or default_model_path()
    labels, texts = zip(*repeated_texts(), strict=True)
    rounds = in_turn(model, list(texts), args.reps, args.rounds)
    rep = {  # each cell the median of its rounds
        way: [(r[0][i][0], r[0][i][1], statistics.median(x[i][2] for x in r)) for i in range(len(texts))]
        for way, r in rounds.items()
    }
    print(
        f"\n`bench/tokenizing.py --reps {args.reps} --tickets {args.tickets} --rounds {args.rounds}` ({model.name}), "
        "microseconds a call, the median of the rounds\n"
    )
    print("| text | bytes | tokens | " + " | ".join(WAYS) + " | stock / both |")
    print("|---|---|---|" + "---|" * (len(WAYS) + 1))
    for i, label in enumerate(labels):
        nb, nt, _ = rep["stock"][i]
        us = [rep[w][i][2] for w in WAYS]
        print(f"| {label} | {nb} | {nt} | " + " | ".join(f"{u:.2f}" for u in us) + f" | {us[0] / us[-1]:.1f}x |")
    tickets = []
    for serial in range(args.tickets):
        state = ticket_body(1000 + serial, 15)["state"]
        tickets.append(state if isinstance(state, str) else json.dumps(state))
    runs = in_turn(model, tickets, 1, args.rounds)
    new = {way: r[0] for way, r in runs.items()}
    nb = sum(r[0] for r in new["stock"])
    total = {way: statistics.median(sum(x[2] for x in one) for one in r) for way, r in runs.items()}
    cells = [f"{us / 1e3:.1f} ms, {nb / us:.2f} MB/s" for us in total.values()]
    print(
        f"| {args.tickets} new tickets, once each | {nb} | {sum(r[1] for r in new['stock'])} | "
        + " | ".join(cells)
        + f" | {total['stock'] / total['0008 + 0009']:.1f}x |"
    )
    for got in (rep, new):
        if any(r[1] != s[1] for way in WAYS for r, s in zip(got[way], got["stock"], strict=True)):
            sys.exit("token counts differ between the ways")


if __name__ == "__main__":
    main()
