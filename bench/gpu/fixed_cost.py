"""Where the llama engine's fixed per-request cost goes on a short prompt (issue 6, item 5b).

    python -m bench.gpu.fixed_cost --model M.gguf [--tokens 371] [--reps 7] [--ctx 16384]
                                   [--threads N] [--engine-flags "..."] [--ref-bin PATH|'']

``bench/gpu_decisions.py``'s prefill table times a SUBMIT (max_tokens=1) of an
N-token state from the frame's write to its DONE, each rep after a SUBMIT of
the 1-token prompt "x" (so the slot keeps nothing), against llama.cpp's own
``llama_decode`` of the same tokens (``llama-prefill-ref``, which decodes the
same N tokens rep after rep). On the H200 at 371 tokens the engine took about
4.5 ms more (48.9 against 44.4 ms). This script takes that difference apart by
timing variants in one engine process, side by side (best and median of
``--reps``, milliseconds):

  text after "x"      the prefill table's measurement;
  ids after "x"       the same number of tokens sent as token ids (``ids=1``):
                      no tokenization; text minus this = the tokenizer's cost;
  ids, same shape     two N-token id sequences that differ in their first
                      token, alternating: every decode has the previous one's
                      shape (N new tokens from position 0), as in the reference;
                      "ids after x" minus this = what a change of batch shape
                      costs (llama.cpp rebuilds and re-allocates the graph);
  1 token             a 1-token prompt, alternating "x" / "y" as ids: a
                      request's cost beyond the model's work on N tokens;
  PING                the protocol's round trip over the pipes.

Token ids of the synthetic sequences are arbitrary (the model's speed does not
depend on them). Prints one markdown table, and llama-prefill-ref's per-rep
seconds (its first rep builds the graph for the shape). No network, no server.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench.gpu_decisions import sized_bodies, state_text
from bench.timed_engine import TimedEngine, engine_options, llama_argv, reference_reps
from serveproto import Ping, Pong


def ids_payload(ids: list[int]) -> bytes:
    """Token ids as SUBMIT ids=1 carries them: ASCII decimal, single spaces."""
    return " ".join(map(str, ids)).encode()


def ping_s(eng: TimedEngine) -> float:
    """Seconds from a PING's write to its PONG."""
    ev = Ping(id=eng.new_id())
    t0 = time.perf_counter()
    eng.send(ev)
    while True:
        got = eng.next_event(60.0)
        if isinstance(got, Pong) and got.id == ev.id:
            return time.perf_counter() - t0


def measure(eng: TimedEngine, text: str, n_vocab: int, reps: int) -> tuple[int, dict[str, list[float]]]:
    """(tokens of ``text``, variant name -> seconds of each rep), variants as in the module doc."""
    n = eng.count(text)
    a = [(1000 + 7 * i) % n_vocab for i in range(n)]
    b = [(a[0] + 1) % n_vocab] + a[1:]
    x, y = ids_payload([a[0]]), ids_payload([b[0]])
    out: dict[str, list[float]] = {k: [] for k in ("text after x", "ids after x", "ids, same shape", "1 token", "PING")}

    def timed(prompt: bytes, **kw) -> float:
        dt, ev = eng.submit(prompt, **kw)
        if ev[-1].computed != ev[-1].prompt_tokens:
            raise RuntimeError(f"the slot reused a prefix: {ev[-1]}")
        return dt

    for _ in range(2):  # warm-up: every shape seen once
        eng.submit("x")
        eng.submit(text)
        eng.submit(ids_payload(a), ids=True)
        eng.submit(ids_payload(b), ids=True)
    for _ in range(reps):
        eng.submit("x")
        out["text after x"].append(timed(text))
        eng.submit("x")
        out["ids after x"].append(timed(ids_payload(a), ids=True))
        eng.submit(ids_payload(b), ids=True)
        out["ids, same shape"].append(timed(ids_payload(a), ids=True))
        out["ids, same shape"].append(timed(ids_payload(b), ids=True))
        eng.submit(x, ids=True)
        out["1 token"].append(timed(y, ids=True))
        out["1 token"].append(timed(x, ids=True))
        out["PING"].append(ping_s(eng))
    return n, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the GGUF to load")
    engine_options(ap)
    ap.add_argument("--tokens", type=int, default=371, help="prompt length in tokens (default 371)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--ctx", type=int, default=16384, help="context per slot, tokens (engine --ctx)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--engine-flags", default="", help="extra engine options")
    args = ap.parse_args(argv)
    if args.tokens < 2 or args.reps < 1:
        ap.error("--tokens must be >= 2 and --reps >= 1")
    argv_eng = llama_argv(args.engine_bin, args.model, args.ctx, args.threads, slots=1, flags=args.engine_flags)
    err = Path(tempfile.gettempdir()) / "fixed_cost-engine.log"
    with TimedEngine(argv_eng, err, timeout=600) as eng:
        body = sized_bodies(eng, [args.tokens])[args.tokens]
        text = state_text(0, body)
        n, out = measure(eng, text, eng.caps.n_vocab, args.reps)
    print(
        f"## the engine's fixed cost per request: {Path(args.model).name}, {n}-token prompt, "
        f"engine flags `{args.engine_flags or '(defaults)'}`, best / median of {args.reps} (2x for the alternating pairs)\n"
    )
    print("| variant | best ms | median ms |")
    print("|---|---|---|")
    for k, v in out.items():
        print(f"| {k} | {min(v) * 1e3:.2f} | {statistics.median(v) * 1e3:.2f} |")
    if args.ref_bin:
        n_ref, secs = reference_reps(args.ref_bin, args.model, text, args.ctx, args.threads, args.reps)
        print(
            f"\nllama-prefill-ref, {n_ref} tokens, ms per rep (the same shape every rep): "
            + " ".join(f"{s * 1e3:.2f}" for s in secs)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
