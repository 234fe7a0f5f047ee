"""What a smaller llama.cpp ubatch costs, and how soon a CANCEL lands (issue 15).

One engine per ``--ubatch`` value (and per binary, to compare builds), all
loaded at once and used in turn, round by round, so that each sees the same
machine. Per engine and round: a cold prefill of about 500 tokens, a warm
SCORE of 16 questions x 3 options on it, 64 generated tokens, then a prefill
cancelled 0.2 s after its ACCEPT. Prints the medians of the wall seconds and
of the engine's CPU seconds (utime + stime from /proc, the number that other
load on a shared machine moves least), and the CANCEL latency: from writing
CANCEL to reading its ERROR (``DONE`` in the last column: the request ran to
its end first). Score cache off, so a repeat computes again.

    .venv/bin/python -m bench.cancel [--ubatch 64,128,256,512] [--rounds 2] [--threads 1]
                                     [--engine BIN[,BIN2]] [--model PATH] [--prefix-words 500]
                                     [--cancel-after 0.2] [--engine-args "--slots 1 --ctx 8192"]

On a GPU a 500-word prefill is over in well under 0.2 s: there ``--prefix-words 6000
--cancel-after 0.02`` (and a ``--ctx`` that holds it) puts the CANCEL inside the prefill.
"""

from __future__ import annotations

import argparse
import json
import time

from bench.timed_engine import TimedEngine
from gateway.paths import default_model_path, engine_bin
from serveproto import Accept, Cancel, Score, Submit

WORDS = "the quick brown fox jumps over the lazy dog while a customer writes about billing trouble".split()


def prefix(words: int) -> str:
    """The ticket every request reads: ``words`` words of WORDS in turn."""
    return "Ticket: " + " ".join(WORDS[i % len(WORDS)] for i in range(words)) + "\n"


GROUPS = [
    {
        "stem": f"Question {g}: is the {WORDS[g % len(WORDS)]} part of item {g} relevant here? Answer:",
        "options": [" yes", " no", f" it depends on item {g}"],
    }
    for g in range(16)
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ubatch", default="64,128,256,512")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--engine", default=str(engine_bin("serveproto-llama")))
    ap.add_argument("--model", default=str(default_model_path()))
    ap.add_argument("--prefix-words", type=int, default=500, help="the ticket's length in words")
    ap.add_argument("--cancel-after", type=float, default=0.2, help="seconds from ACCEPT to CANCEL")
    ap.add_argument("--engine-args", default="", help="more engine flags, one string")
    a = ap.parse_args()
    ticket = prefix(a.prefix_words)
    more = a.engine_args.split()
    engines = {
        (b, u): TimedEngine(
            [b, "--model", a.model, "--threads", str(a.threads), "--score-cache-mb", "0", "--ubatch", u, *more]
        )
        for b in a.engine.split(",")
        for u in a.ubatch.split(",")
    }
    got = {k: {"prefill": [], "score": [], "gen": [], "cancel": []} for k in engines}
    rid = 0

    def timed(e: TimedEngine, what: str, key, ev) -> None:
        c, t = e.cpu(), time.perf_counter()
        e.send(ev)
        e.until_end(ev.id, e.timeout)
        got[key][what].append((time.perf_counter() - t, e.cpu() - c))

    for r in range(a.rounds):
        prompt = f"{r} {ticket}"  # a new prompt each round: cold
        for key, e in engines.items():
            rid += 4
            timed(
                e,
                "prefill",
                key,
                Submit(id=rid, slot=0, prompt=prompt.encode(), max_tokens=1, temperature=0.0, top_p=1.0),
            )
            timed(
                e,
                "score",
                key,
                Score(id=rid + 1, slot=0, payload=json.dumps({"prefix": prompt, "groups": GROUPS}).encode()),
            )
            timed(
                e,
                "gen",
                key,
                Submit(id=rid + 2, slot=0, prompt=b"Write a story:", max_tokens=64, temperature=0.0, top_p=1.0),
            )
            e.send(
                Submit(id=rid + 3, slot=0, prompt=("y " + ticket).encode(), max_tokens=1, temperature=0.0, top_p=1.0)
            )
            assert isinstance(e.next_event(e.timeout), Accept)
            time.sleep(a.cancel_after)
            t = time.perf_counter()
            e.send(Cancel(id=rid + 3))
            end = e.until_end(rid + 3, e.timeout)[-1]
            got[key]["cancel"].append((time.perf_counter() - t, getattr(end, "code", "DONE")))
    for e in engines.values():
        e.close()

    def med(v, i):
        return sorted(x[i] for x in v)[len(v) // 2]

    print(f"threads {a.threads}, {a.rounds} rounds, medians; wall s / engine CPU s")
    print(
        f"{'engine':>28} {'ubatch':>6} | {f'prefill {a.prefix_words} words':>16} | {'warm SCORE 16x3':>16} | "
        f"{'64 tokens':>14} | CANCEL ms (max) ended"
    )
    for (b, u), v in got.items():
        print(
            f"{b[-28:]:>28} {u:>6} | {med(v['prefill'], 0):7.2f} {med(v['prefill'], 1):7.2f}  | "
            f"{med(v['score'], 0):7.2f} {med(v['score'], 1):7.2f}  | {med(v['gen'], 0):6.2f} {med(v['gen'], 1):6.2f} "
            f" | {med(v['cancel'], 0) * 1e3:7.1f} ({max(x[0] for x in v['cancel']) * 1e3:.1f}) "
            f"{','.join(sorted({x[1] for x in v['cancel']}))}"
        )


if __name__ == "__main__":
    main()
