"""SCORE against the read-out of each whole text, option by option (spec 9.1: equal up to float32 rounding).

    python -m bench.gpu.score_check --model M.gguf --chars 48000 --questions 1 [--fresh] [--engine-flags "..."]

The state is ``bench/gpu_decisions.py``'s support thread cut to ``--chars``
characters (case 00001), the questions its ``QUESTIONS`` by index. One engine
answers a SCORE of those questions (``pin=1``, so the state is computed cold),
then a SUBMIT ``logprobs=1 max_tokens=0`` of every option's whole text (each
resumed from the state's snapshot); with ``--fresh`` the worst option is read
again by a new engine process with nothing cached. Prints one line per option
whose logprobs differ by more than ``--tol`` (natural log units), and exits 1
when any does.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench.gpu_decisions import QUESTIONS, state_body, state_text
from bench.timed_engine import TimedEngine, engine_options, llama_argv
from serveproto import Echo


def read_out(eng: TimedEngine, text: str, n: int) -> list[float]:
    """The logprobs of the last ``n`` tokens of ``text`` as ECHO reports them."""
    _, ev = eng.submit(text, max_tokens=0, logprobs=1)
    return [e.logprob for e in ev if isinstance(e, Echo)][-n:]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    engine_options(ap, reference=False)
    ap.add_argument("--engine-flags", default="")
    ap.add_argument("--ctx", type=int, default=16384)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chars", type=int, default=48000, help="length of the state's text, characters")
    ap.add_argument("--questions", default="1", help="indices into QUESTIONS, comma-separated")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--fresh", action="store_true", help="read the worst option again in a new engine")
    args = ap.parse_args(argv)

    from gateway.decision.chat_template import ChatTemplate
    from gateway.decision.prompts import PromptBuilder

    pb = PromptBuilder(ChatTemplate.from_gguf(args.model))
    items = list(QUESTIONS.values())
    groups = []
    for i in (int(x) for x in args.questions.split(",")):
        q = pb.question("choice", items[i][0], {lab: None for lab in items[i][1]})
        groups.append((q.stem, list(q.options)))
    prefix = pb.prefix(state_text(1, state_body(args.chars)))
    argv_eng = llama_argv(args.engine_bin, args.model, args.ctx, args.threads, flags=args.engine_flags)
    log = Path(tempfile.gettempdir()) / "score_check-engine.log"
    bad = []
    with TimedEngine(argv_eng, log, timeout=900) as eng:
        _, scored, done = eng.score(prefix, groups, pin=True)
        print(f"state {done.prompt_tokens} tokens (longest option text), SCORE computed {done.computed}")
        k = 0
        for stem, options in groups:
            for opt in options:
                lps = read_out(eng, prefix + stem + opt, len(scored[k].logprobs))
                diff = max(abs(a - b) for a, b in zip(scored[k].logprobs, lps))
                if diff > args.tol:
                    bad.append((diff, stem, opt, scored[k].logprobs, lps))
                    print(f"option {opt!r}: SCORE {list(scored[k].logprobs)} read-out {lps} (max diff {diff:.3g})")
                k += 1
    if bad and args.fresh:
        diff, stem, opt, sc, lps = max(bad, key=lambda b: b[0])
        with TimedEngine(argv_eng, log, timeout=900) as fresh:
            print(f"option {opt!r}, a fresh engine's cold read-out: {read_out(fresh, prefix + stem + opt, len(sc))}")
    print(f"{len(bad)} of {k} options differ by more than {args.tol:g}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
