"""Benchmark of the llama engine, measured side by side in one run.

1. Prefill: tokens/s of ``serveproto-llama`` reading a prompt (SUBMIT, from the
   write of the frame to its DONE) against llama.cpp's own batched decode of the
   same prompt with the same context parameters (``engines/bin/llama-prefill-ref``,
   nothing but ``llama_decode``). Two modes: logits of the last position only
   (SUBMIT max_tokens=1) and logits of every position (read-out: SUBMIT
   logprobs=1 max_tokens=0, against the reference's ``--all-logits``). Printed
   as the ratio engine/llama.cpp of tokens per second (goal >= 0.95).
2. Scoring one question of K options over a pinned prefix: SCORE (the stem and
   all options in one llama_decode) against one-by-one snapshot scoring (prefix +
   stem read and pinned, then one SUBMIT logprobs=1 max_tokens=0 per option, each
   computing only its own tokens), as K grows. Per-option marginal cost =
   (t(K_max) - t(1)) / (K_max - 1).

3. ``--long-state``: a warm SCORE of 16 questions x 3 options on a state of
   about 13,500 tokens against the same SCORE on one of about 370 tokens, each
   engine binary given with ``--engine`` (e.g. a build of an older commit, to
   see what a change bought) measured in the same run. Warm: the state was
   pinned by an earlier SCORE of other questions, so only the questions'
   positions are computed; what grows with the state is the engine's own
   work (tokenization, snapshot lookup). The default model here is the tiny
   fixture GGUF (SmolLM2's tokenizer, a fast forward pass), where that work
   shows most.

Times are the best of ``--reps`` runs (the machine is shared; the minimum is the
least disturbed). Usage::

    .venv/bin/python -m bench.engine [--model PATH] [--threads 2] [--tokens 512] [--reps 5]
    .venv/bin/python -m bench.engine --long-state [--engine BIN ...] [--reps 5]
    .venv/bin/python -m bench.engine --numerics [--engine BIN ...] [--threads 1] [--reps 5]

4. ``--numerics``: the cost of invariant numerics (``--numerics invariant``, the default) against
   llama.cpp's own kernel choices (``--numerics fast``) and any ``--engine`` binary: prefill, SCORE
   per option, 16 questions warm; see :func:`bench_numerics`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from bench.timed_engine import TimedEngine as Engine
from bench.timed_engine import reference_reps
from gateway.paths import default_model_path, engine_bin
from serveproto import Score

SENTENCE = "The quick brown fox jumps over the lazy dog while the farmer counts his sheep. "
COLOURS = [" red", " blue", " green", " yellow", " black", " white", " purple", " orange"]
#: Options of several tokens each: SCORE computes all but the last token of each.
SHADES = [
    " dark cherry red",
    " pale sky blue",
    " deep forest green",
    " lemon chiffon yellow",
    " jet coal black",
    " fresh snow white",
    " royal violet purple",
    " burnt amber orange",
]


def reference(
    model: Path, prompt_file: Path, ctx: int, threads: int, reps: int, all_logits: bool
) -> tuple[int, list[float]]:
    """llama.cpp's decode of the prompt file (``llama-prefill-ref``): (tokens, seconds of each decode)."""
    more = ["--prompt-file", str(prompt_file), *(["--all-logits"] if all_logits else [])]
    return reference_reps(engine_bin("llama-prefill-ref"), model, None, ctx, threads, reps, *more)


def bench_prefill(args, eng: Engine) -> None:
    text = (SENTENCE * (args.tokens // 14 + 1)).encode()
    # cut to about --tokens tokens: the engine's count of a first read tells how many
    _, ev = eng.submit(text, max_tokens=1)
    n_full = ev[-1].prompt_tokens
    text = text[: max(1, len(text) * args.tokens // n_full)]
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write(text)
    prompt_file = Path(f.name)
    try:
        print(f"prefill: {args.model.name}, {args.threads} threads, best of {args.reps}")
        for label, all_logits, kw in (
            ("last logit", False, dict(max_tokens=1)),
            ("every logit (read-out)", True, dict(max_tokens=0, logprobs=1)),
        ):
            # interleaved, one of each per round, so both see the same machine load
            t_engine, t_ref = [], []
            for _ in range(args.reps):
                # two decodes per reference process: the first warms it up (buffers, pages)
                n_ref, (_, t) = reference(args.model, prompt_file, args.ctx, args.threads, 2, all_logits)
                t_ref.append(t)
                eng.submit(b"x", max_tokens=1)  # another prompt: the slot keeps nothing of the text
                dt, ev = eng.submit(text, **kw)
                done = ev[-1]
                assert done.computed == done.prompt_tokens == n_ref, (done, n_ref)
                t_engine.append(dt)
            te, tr = min(t_engine), min(t_ref)
            print(
                f"  {label:24s} {n_ref} tokens: engine {te * 1e3:8.1f} ms ({n_ref / te:7.1f} tok/s)"
                f"   llama.cpp {tr * 1e3:8.1f} ms ({n_ref / tr:7.1f} tok/s)"
                f"   ratio {tr / te:.3f}"
            )
    finally:
        prompt_file.unlink()


def bench_scoring(args, eng: Engine) -> None:
    for label, options in (("one-token options", COLOURS), ("multi-token options", SHADES)):
        bench_options(args, eng, label, options)


def bench_options(args, eng: Engine, label: str, options: list[str]) -> None:
    prefix = SENTENCE * 20
    stem = "Question: which colour is the fox? Answer:"
    ks = [k for k in (1, 2, 3, 4, 8) if k <= len(options)]
    print(f"scoring, {label}: prefix {len(prefix)} bytes pinned, one question, K options; best of {args.reps}")
    print("   K   SCORE ms  computed   one-by-one ms  computed   ratio")
    rows = {}
    for k in ks:
        opts = options[:k]
        job = {"prefix": prefix, "groups": [{"stem": stem, "options": opts}]}
        t_score, t_one = [], []
        for _ in range(args.reps):
            # SCORE: the prefix from its snapshot, the stem and every option in one llama_decode
            eng.run(lambda rid: Score(id=rid, slot=0, payload=json.dumps({**job, "pin": True}).encode()))
            dt, ev = eng.run(lambda rid: Score(id=rid, slot=0, payload=json.dumps(job).encode()))
            c_score = ev[-1].computed
            t_score.append(dt)
            # one by one (the seed's recipe): prefix + stem read and pinned (counted: SCORE
            # computes the stem too), then each option through that snapshot
            total, ev = eng.submit((prefix + stem).encode(), max_tokens=0, logprobs=1, pin=True)
            c_one = ev[-1].computed
            for o in opts:
                dt, ev = eng.submit((prefix + stem + o).encode(), max_tokens=0, logprobs=1)
                assert ev[-1].snapshot == "hit"
                total += dt
                c_one += ev[-1].computed
            t_one.append(total)
        rows[k] = (min(t_score), min(t_one))
        print(
            f"  {k:2d} {rows[k][0] * 1e3:9.1f} {c_score:9d} {rows[k][1] * 1e3:14.1f} {c_one:9d}"
            f" {rows[k][1] / rows[k][0]:7.2f}"
        )
    k_max = ks[-1]
    m_score = (rows[k_max][0] - rows[1][0]) / (k_max - 1)
    m_one = (rows[k_max][1] - rows[1][1]) / (k_max - 1)
    ratio = f"one-by-one / SCORE = {m_one / m_score:.1f}x" if m_score > 1e-4 else "SCORE's is within the noise of zero"
    print(
        f"  marginal cost per option (K=1..{k_max}): SCORE {m_score * 1e3:.2f} ms,"
        f" one-by-one {m_one * 1e3:.2f} ms; {ratio}"
    )


#: Words the long states are drawn from (seeded): varied text, not one sentence repeated.
STATE_WORDS = (
    "the customer says their order arrived late and the box was damaged so they want a refund "
    "or a replacement before Friday; support replied that the warehouse in Lyon ships 1,250 "
    "parcels a day and apologised twice, asking for photos of the label and the invoice number "
    "while the manager checked the courier's tracking history"
).split()
QUESTIONS = [
    "Is the customer angry?",
    "Does the customer want a refund?",
    "Was the box damaged?",
    "Is Friday mentioned?",
    "Did support apologise?",
    "Is a photo requested?",
    "Is the tone polite?",
    "Is the order late?",
    "Is Lyon the warehouse?",
    "Is a manager involved?",
    "Is the invoice asked for?",
    "Is this resolved?",
    "Should we escalate?",
    "Is a courier mentioned?",
    "Is it urgent?",
    "Is the customer a business?",
]


def state_text(rng, n_words: int) -> str:
    """A ChatML conversation of about n_words words (about 1.1 tokens a word for SmolLM2)."""
    turns, left = [], n_words
    while left > 0:
        k = min(left, rng.randint(40, 160))
        role = "user" if len(turns) % 2 == 0 else "assistant"
        words = " ".join(rng.choice(STATE_WORDS) for _ in range(k))
        turns.append(f"<|im_start|>{role}\n{words[0].upper()}{words[1:]}.<|im_end|>\n")
        left -= k
    return "<|im_start|>system\nYou answer questions about the conversation.<|im_end|>\n" + "".join(turns)


def bench_long_state(args) -> None:
    import random

    engines = args.engine or [engine_bin("serveproto-llama")]
    rng = random.Random(0)
    short, long_ = state_text(rng, 260), state_text(rng, 10_800)
    tail = "<|im_start|>user\nAnswer each question with yes, no or unsure.\n"

    def job(state: str, qs: list[str], pin: bool = False) -> bytes:
        groups = [{"stem": f"Q: {q}\nA:", "options": [" yes", " no", " unsure"]} for q in qs]
        return json.dumps({"prefix": state + tail, "groups": groups, "pin": pin}).encode()

    print(
        f"warm SCORE, 16 questions x 3 options, {args.model.name}, {args.threads} threads, best of {args.reps}"
        " (the engines interleaved, one SCORE each per round)"
    )
    print(f"  {'engine':40s} {'state (reused)':>14s} {'SCORE ms':>9s} {'computed':>9s}")
    results = {}
    procs = [
        Engine([str(p), "--model", str(args.model), "--threads", str(args.threads), "--ctx", "16384"]) for p in engines
    ]
    try:
        for state in (short, long_):
            times, n_state, computed = {p: [] for p in engines}, {}, {}
            for path, eng in zip(engines, procs):  # noqa: B007  (kept as written)
                # the state pinned by a SCORE of other questions, then the timed ones through it
                eng.run(lambda rid: Score(id=rid, slot=0, payload=job(state, ["Is it?"], pin=True)))
            for _ in range(args.reps):
                for path, eng in zip(engines, procs):
                    dt, ev = eng.run(lambda rid: Score(id=rid, slot=0, payload=job(state, QUESTIONS)))
                    assert ev[-1].snapshot == "hit", ev[-1]
                    times[path].append(dt)
                    computed[path] = ev[-1].computed
                    n_state[path] = ev[-1].reused  # the state's tokens, from the snapshot
            for path in engines:
                results[(str(path), state is long_)] = min(times[path])
                print(f"  {str(path)[-40:]:40s} {n_state[path]:14d} {min(times[path]) * 1e3:9.1f} {computed[path]:9d}")
    finally:
        for eng in procs:
            eng.close()
    for path in engines:
        s_, l_ = results[(str(path), False)], results[(str(path), True)]
        print(f"  {str(path)[-40:]:40s} long / short = {l_ / s_:.2f}")
    if len(engines) > 1:
        base = results[(str(engines[0]), True)]
        for path in engines[1:]:
            print(
                f"  at the long state: {str(engines[0])[-30:]} / {str(path)[-30:]} = "
                f"{base / results[(str(path), True)]:.2f}"
            )


def bench_numerics(args) -> None:
    """Invariant numerics against llama.cpp's own kernel choices, interleaved in one run.

    Each engine is a configuration: ``--numerics fast`` and ``--numerics invariant`` of the built
    binary (the score cache off, so every SCORE computes), and each ``--engine`` binary as given
    (e.g. the last landed tree's). Per round, each engine in turn: a read-out of ``--tokens``
    tokens (every position's logits), the same prompt with the last logit only, a warm SCORE of
    one question with 1 and with 8 options (one-token and multi-token: the marginal cost per
    option), and a warm SCORE of 16 questions x 3 options. Best of ``--reps``.
    """
    binary = str(engine_bin("serveproto-llama"))
    common = ["--model", str(args.model), "--threads", str(args.threads), "--ctx", str(args.ctx)]
    configs = [(f"tree {p.parent.parent.parent.name}", [str(p), *common]) for p in (args.engine or [])]
    configs += [
        ("fast", [binary, *common, "--numerics", "fast"]),
        ("invariant", [binary, *common, "--numerics", "invariant", "--score-cache-mb", "0"]),
    ]
    text = (SENTENCE * (args.tokens // 14 + 1)).encode()
    prefix = SENTENCE * 20
    stem = "Question: which colour is the fox? Answer:"
    tail = "<|im_start|>user\nAnswer each question with yes, no or unsure.\n"

    def score(eng, groups, pin=False):
        payload = json.dumps({"prefix": prefix, "groups": groups, "pin": pin}).encode()
        return eng.run(lambda rid: Score(id=rid, slot=0, payload=payload))

    engines = [Engine(argv) for _, argv in configs]
    best: dict[tuple[str, str], float] = {}
    try:
        _, ev = engines[0].submit(text, max_tokens=1)
        n_full = ev[-1].prompt_tokens
        text = text[: max(1, len(text) * args.tokens // n_full)]
        for _ in range(args.reps):
            for (label, _), eng in zip(configs, engines):

                def timed(metric, fn):
                    dt, ev = fn()
                    best[(label, metric)] = min(best.get((label, metric), dt), dt)
                    return ev

                eng.submit(b"x", max_tokens=1)
                ev = timed("read-out", lambda: eng.submit(text, max_tokens=0, logprobs=1))
                n_tokens = ev[-1].computed
                eng.submit(b"x", max_tokens=1)
                timed("last logit", lambda: eng.submit(text, max_tokens=1))
                score(eng, [{"stem": "Q: is it? A:", "options": [" yes"]}], pin=True)
                for kind, opts in (("one-token", COLOURS), ("multi-token", SHADES)):
                    for k in (1, 8):
                        timed(f"{kind} K={k}", lambda: score(eng, [{"stem": stem, "options": opts[:k]}]))
                groups = [{"stem": f"{tail}Q: {q}\nA:", "options": [" yes", " no", " unsure"]} for q in QUESTIONS]
                timed("16 questions", lambda: score(eng, groups))
    finally:
        for eng in engines:
            eng.close()
    labels = [label for label, _ in configs]
    print(
        f"invariant numerics vs the others: {args.model.name}, {args.threads} threads, best of {args.reps}, interleaved"
    )
    print(
        f"  {'measurement':34s}"
        + "".join(f"{lab[-14:]:>15s}" for lab in labels)
        + "".join(f"{'inv/' + lab[-10:]:>15s}" for lab in labels[:-1])
    )

    def row(name, values):
        cells = "".join(f"{v:15.2f}" for v in values)
        ratios = "".join(f"{values[-1] / v:15.3f}" for v in values[:-1])
        print(f"  {name:34s}{cells}{ratios}")

    for metric in ("read-out", "last logit"):
        row(f"prefill {metric}, tok/s ({n_tokens} tokens)", [n_tokens / best[(lab, metric)] for lab in labels])
    for kind in ("one-token", "multi-token"):
        row(
            f"SCORE ms per {kind} option",
            [(best[(lab, f"{kind} K=8")] - best[(lab, f"{kind} K=1")]) / 7 * 1e3 for lab in labels],
        )
    row("SCORE 16 questions x 3, ms (warm)", [best[(lab, "16 questions")] * 1e3 for lab in labels])
    print("  (tok/s: higher is faster, inv/x > 1 means invariant is faster; ms: inv/x > 1 means slower)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=default_model_path())
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--tokens", type=int, default=512, help="prefill prompt length, tokens")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--skip-prefill", action="store_true")
    ap.add_argument("--skip-scoring", action="store_true")
    ap.add_argument(
        "--long-state",
        action="store_true",
        help="only the warm SCORE at a ~370- and a ~13,500-token state (default model: the tiny fixture)",
    )
    ap.add_argument(
        "--engine",
        type=Path,
        action="append",
        help="with --long-state: an engine binary to time (repeatable; default the built one)",
    )
    ap.add_argument(
        "--numerics",
        action="store_true",
        help="only invariant numerics against --numerics fast (and each --engine), interleaved",
    )
    args = ap.parse_args(argv)
    if args.numerics:
        bench_numerics(args)
        return 0
    if args.long_state:
        if "--model" not in (argv if argv is not None else sys.argv):
            from fixtures import tiny_gguf

            args.model = tiny_gguf.ensure()
        bench_long_state(args)
        return 0
    for need in (engine_bin("serveproto-llama"), engine_bin("llama-prefill-ref"), args.model):
        if not Path(need).exists():
            print(f"missing {need}: run make -C engines all / make model", file=sys.stderr)
            return 2
    eng = Engine(
        [
            str(engine_bin("serveproto-llama")),
            "--model",
            str(args.model),
            "--threads",
            str(args.threads),
            "--ctx",
            str(args.ctx),
        ]
    )
    try:
        if not args.skip_prefill:
            bench_prefill(args, eng)
        if not args.skip_scoring:
            bench_scoring(args, eng)
    finally:
        eng.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
