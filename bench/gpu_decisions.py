"""Decision benchmarks of the llama engine on one model, measured side by side in one run (issue 8).

    python -m bench.gpu_decisions --model M.gguf [--states 370,13500] [--questions 1,4,16]
                                  [--ctx 16384] [--reps 3] [--gen-tokens 3] [--engine-flags "..."]
                                  [--only engine|server] [--out-dir DIR]

Written for the GPU machine (``bench/gpu/run.sh`` builds the CUDA engine and a
random-weight 8B model there and runs this), and runs as well on a CPU with
small states. Every question has 3 options (a ``choice`` of 3 labels); a
state of N tokens is N tokens of the state text alone (BOS included when the
model adds one), the system turn and the questions come on top.

Part 1, the engine alone (``serveproto`` frames through ``fixtures.sync_engine``):
  prefill: tokens/s of ``serveproto-llama`` reading each state (SUBMIT
  max_tokens=1, from the frame's write to DONE, the slot holding another
  prompt) against llama.cpp's own batched decode of the same text with the
  same context parameters (``engines/bin/llama-prefill-ref``); the ratio
  engine / llama.cpp (goal >= 0.95); best of ``--reps``.
  scoring: 1 / 4 / 16 questions on a state whose prefix snapshot is held:
  the batched extension (one ``SCORE``) against one-by-one snapshot scoring
  (the seed's way: prefix + question pinned with ``pin=1``, then one SUBMIT
  ``logprobs=1 max_tokens=0`` per option), times, positions computed, and
  the largest logprob difference between the two; and, as a baseline, one
  SUBMIT of the stems and options written in a row on the same snapshot (as
  many new positions in one sequence: what SCORE costs beyond it is its own).
Part 2, System One through the server (``python -m gateway.cli serve``, HTTP
on loopback, ``/v1/systemone``), the shape of seed 001's table: per state
size and question count, cold (a state never seen: the request computes the
state) and warm (the same request again, median of ``--reps``), per-question
cost, and the positions computed (the reply's ``x_positions``); then the same
16 questions answered by generation (``/v1/chat/completions``, one per
question, the same prompt, greedy, ``--gen-tokens`` tokens), cold and warm.

Prints markdown tables; with ``--out-dir`` also writes them (``<tag>.md``)
and every number (``<tag>.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench.servers import Server
from bench.timed_engine import TimedEngine, engine_options, llama_argv, reference_reps
from serveproto import Echo

TICKET = (
    "Hi, I have been trying to connect my Stripe account for 3 days and the integration keeps failing. "
    "I am losing sales. Please help ASAP. I already reinstalled the plugin twice and checked the API keys, "
    "the dashboard says the webhook endpoint returns 500 since Monday. Our shop runs on WooCommerce."
)
REPLIES = (
    "Agent: thanks, could you send the webhook log of the last failed delivery? ",
    "Customer: here it is, the signature check fails and then the request times out. ",
    "Agent: we see the same on our side, the certificate of the endpoint expired on Sunday. ",
)

#: 16 questions of 3 options each (choice: the labels are the scored options).
QUESTIONS = {
    "department": ("Which team should handle this?", ["billing", "technical", "sales"]),
    "sentiment": ("What is the customer's mood?", ["calm", "frustrated", "angry"]),
    "platform": ("Which shop platform is it?", ["Shopify", "WooCommerce", "Magento"]),
    "channel": ("What failed?", ["webhook", "login", "checkout"]),
    "language": ("Which language is the message in?", ["English", "German", "French"]),
    "next": ("What should the agent do first?", ["ask for logs", "escalate", "send docs"]),
    "effort": ("How much work will this take?", ["minutes", "hours", "days"]),
    "urgency": ("How urgent is it?", ["low", "high", "critical"]),
    "cause": ("What is the likely cause?", ["certificate", "plugin", "network"]),
    "owner": ("Whose system is failing?", ["ours", "theirs", "Stripe"]),
    "tone": ("Which tone should the reply take?", ["formal", "friendly", "apologetic"]),
    "refund": ("What does the customer want?", ["refund", "fix", "explanation"]),
    "tier": ("Which support tier fits?", ["first", "second", "third"]),
    "risk": ("How likely is the customer to leave?", ["unlikely", "possible", "likely"]),
    "period": ("How long has it been failing?", ["hours", "days", "weeks"]),
    "status": ("What status should the ticket get?", ["open", "pending", "solved"]),
}


def jev_questions(n: int) -> dict:
    """The first ``n`` questions in Jev's shape (``choice`` with 3 labels, no descriptions)."""
    return {
        k: {"type": "choice", "instructions": ins, "criteria": {lab: None for lab in labels}}
        for k, (ins, labels) in list(QUESTIONS.items())[:n]
    }


def state_body(n_chars: int) -> str:
    """A support thread of at least ``n_chars`` characters: the ticket, then replies in turn."""
    parts, k = [TICKET], 0
    while sum(map(len, parts)) < n_chars:
        parts.append(f"\n[{k + 1}] " + REPLIES[k % len(REPLIES)])
        k += 1
    return "".join(parts)[:n_chars]


def state_text(tag: int, body: str) -> str:
    """One state: a unique 5-digit case number (so a new tag is a state never seen), then ``body``."""
    return f"Case {tag:05d}. {body}"


# ------------------------------------------------------------------ part 1: the engine alone


def sized_bodies(eng: TimedEngine, targets: list[int]) -> dict[int, str]:
    """For each target N, a state body such that ``state_text(0, body)`` is N tokens (within 1%)."""
    out = {}
    for n in targets:
        chars = n * 4
        for _ in range(6):
            body = state_body(chars)
            got = eng.count(state_text(0, body))
            if abs(got - n) <= max(1, n // 100):
                break
            chars = max(8, int(chars * n / got))
        out[n] = body
    return out


def reference(ref_bin: str, model: str, text: str, ctx: int, threads: int, reps: int) -> tuple[int, float]:
    """llama.cpp's own decode of ``text`` (last logit only): (tokens, best seconds of ``reps``)."""
    n, secs = reference_reps(ref_bin, model, text, ctx, threads, reps)
    return n, min(secs)


def bench_engine(args, argv: list[str], prompts, bodies: dict[int, str], eng: TimedEngine, res: dict, md: list) -> None:
    md.append(
        f"\n### Prefill: engine vs llama.cpp's own batched decode (best of {args.reps}, "
        "last logit, same context parameters)\n"
    )
    md.append("| state tokens | engine ms | engine tok/s | llama.cpp ms | llama.cpp tok/s | ratio |")
    md.append("|---|---|---|---|---|---|")
    res["prefill"] = []
    for n, body in bodies.items():  # noqa: B007  (kept as written)
        text = state_text(0, body)
        ref = reference(args.ref_bin, args.model, text, args.ctx, args.threads, args.reps) if args.ref_bin else None
        times = []
        for _ in range(args.reps):
            eng.submit("x")  # another prompt: the slot keeps nothing of the text
            dt, ev = eng.submit(text)
            assert ev[-1].computed == ev[-1].prompt_tokens, ev[-1]
            times.append(dt)
        n_tok = ev[-1].prompt_tokens
        row = {"tokens": n_tok, "engine_s": min(times)}
        if ref:
            row["llama_tokens"] = ref[0]  # the same tokenization: equal to n_tok
            row["llama_s"] = ref[1]
            row["ratio"] = row["llama_s"] / row["engine_s"]
            md.append(
                f"| {n_tok} | {row['engine_s'] * 1e3:.1f} | {n_tok / row['engine_s']:.0f} | "
                f"{row['llama_s'] * 1e3:.1f} | {n_tok / row['llama_s']:.0f} | {row['ratio']:.3f} |"
            )
        else:
            md.append(f"| {n_tok} | {row['engine_s'] * 1e3:.1f} | {n_tok / row['engine_s']:.0f} | - | - | - |")
        res["prefill"].append(row)
        print(md[-1], flush=True)

    md.append(
        f"\n### Scoring on a held state: one SCORE vs one-by-one snapshot scoring (warm, best of {args.reps}); "
        "baseline: one SUBMIT of the stems and options in a row on the same snapshot\n"
    )
    md.append(
        "| state tokens | questions | SCORE ms | computed | one-by-one ms | computed | one-by-one / SCORE "
        "| max abs logprob diff | one sequence ms | computed |"
    )
    md.append("|---|---|---|---|---|---|---|---|---|---|")
    res["scoring"] = []
    for n, body in bodies.items():
        prefix = prompts.prefix(state_text(1, body))
        allq = [prompts.question("choice", ins, {lab: None for lab in labels}) for ins, labels in QUESTIONS.values()]
        for nq in args.questions:
            groups = [(q.stem, list(q.options)) for q in allq[:nq]]
            eng.score(prefix, groups, pin=True)  # the prefix snapshot (and the slot) hold the state
            t_score, t_one, t_seq, misses = [], [], [], 0
            in_a_row = prefix + "".join(stem + "".join(options) for stem, options in groups)
            for _ in range(args.reps):
                dt, scored, done = eng.score(prefix, groups)
                misses += done.snapshot != "hit"
                t_score.append(dt)
                c_score = done.computed
                # the same new positions as one sequence: the SCORE-specific costs are the difference
                dt, ev = eng.submit(in_a_row, max_tokens=1)
                misses += ev[-1].snapshot != "hit"
                t_seq.append(dt)
                c_seq = ev[-1].computed
                total, c_one, diff = 0.0, 0, 0.0
                for gi, (stem, options) in enumerate(groups):
                    dt, ev = eng.submit(prefix + stem, max_tokens=0, logprobs=1, pin=True)
                    total += dt
                    c_one += ev[-1].computed
                    for oi, opt in enumerate(options):
                        dt, ev = eng.submit(prefix + stem + opt, max_tokens=0, logprobs=1)
                        misses += ev[-1].snapshot != "hit"
                        total += dt
                        c_one += ev[-1].computed
                        n_opt = ev[-1].computed
                        lps = [e.logprob for e in ev if isinstance(e, Echo)][-n_opt:]
                        sc = scored[gi * 3 + oi]
                        if len(sc.logprobs) == len(lps):
                            diff = max(diff, max(abs(a - b) for a, b in zip(sc.logprobs, lps)))
                        else:
                            diff = float("inf")  # tokenised differently: flagged in the table
                t_one.append(total)
                # the one-by-one pins pushed the prefix snapshot towards eviction: take it again
                eng.score(prefix, groups[:1], pin=True)
            row = {
                "tokens": n,
                "questions": nq,
                "score_s": min(t_score),
                "score_computed": c_score,
                "one_s": min(t_one),
                "one_computed": c_one,
                "max_diff": diff,
                "snapshot_misses": misses,
                "seq_s": min(t_seq),
                "seq_computed": c_seq,
            }
            res["scoring"].append(row)
            md.append(
                f"| {n} | {nq} | {row['score_s'] * 1e3:.1f} | {c_score} | {row['one_s'] * 1e3:.1f} | {c_one} | "
                f"{row['one_s'] / row['score_s']:.1f}x | {diff:.2g} | {row['seq_s'] * 1e3:.1f} | {c_seq} |"
                + (f" ({misses} snapshot misses)" if misses else "")
            )
            print(md[-1], flush=True)


# ------------------------------------------------------------------ part 2: System One through the server


def bench_server(args, argv: list[str], bodies: dict[int, str], res: dict, md: list) -> None:
    from gateway.decision.prompts import SYSTEM, question_text

    log = Path(args.out_dir or tempfile.gettempdir()) / f"{args.tag}-server.log"
    srv = Server(
        *("--request-timeout", "600.0", "--handshake-timeout", "600", "--model", args.model, "--engine", *argv),
        log_level="INFO",
        log=log,
    )
    tag = iter(range(100, 100000))
    try:
        srv.post("/v1/systemone", {"state": state_text(next(tag), "warm-up"), "questions": jev_questions(1)})
        if "systemone" in args.server_parts:
            md.append(
                f"\n### System One through the server: cold (a new state) and warm (the same request again, "
                f"median of {args.reps})\n"
            )
            md.append(
                "| state tokens | questions | cold | warm | per question, warm | computed cold / warm | input tokens |"
            )
            md.append("|---|---|---|---|---|---|---|")
            res["systemone"] = []
            for n, body in bodies.items():
                for nq in args.questions:
                    req = {"state": state_text(next(tag), body), "questions": jev_questions(nq)}
                    cold, b_cold = srv.post("/v1/systemone", req)
                    warm_runs = [srv.post("/v1/systemone", req) for _ in range(args.reps)]
                    warm = statistics.median(r[0] for r in warm_runs)
                    pc, pw = b_cold.get("x_positions", {}), warm_runs[-1][1].get("x_positions", {})
                    row = {
                        "tokens": n,
                        "questions": nq,
                        "cold_s": cold,
                        "warm_s": warm,
                        "computed_cold": pc.get("computed"),
                        "computed_warm": pw.get("computed"),
                        "input_tokens": b_cold.get("usage", {}).get("input_tokens"),
                    }
                    res["systemone"].append(row)
                    md.append(
                        f"| {n} | {nq} | {cold * 1e3:.0f} ms | {warm * 1e3:.0f} ms | {warm / nq * 1e3:.1f} ms | "
                        f"{row['computed_cold']} / {row['computed_warm']} | {row['input_tokens']} |"
                    )
                    print(md[-1], flush=True)

        if "generation" in args.server_parts:
            nq = max(args.questions)
            md.append(
                f"\n### System One vs generating the answers ({nq} questions, generation: one chat completion "
                f"per question, same prompt, greedy, {args.gen_tokens} tokens)\n"
            )
            md.append("| state tokens | | System One | generation | generation / System One |")
            md.append("|---|---|---|---|---|")
            res["generation"] = []
            questions = jev_questions(nq)

            def generate(state: str) -> tuple[float, int]:
                t, gen = 0.0, 0
                for q in questions.values():
                    text, _ = question_text(q["type"], q["instructions"], q["criteria"])
                    dt, body = srv.post(
                        "/v1/chat/completions",
                        {
                            "messages": [
                                {"role": "system", "content": SYSTEM},
                                {"role": "user", "content": f"{state}\n\n{text}"},
                            ],
                            "max_tokens": args.gen_tokens,
                            "temperature": 0,
                        },
                    )
                    t += dt
                    gen += body["usage"]["completion_tokens"]
                return t, gen

            for n, body in bodies.items():
                s1_state, gen_state = state_text(next(tag), body), state_text(next(tag), body)
                req = {"state": s1_state, "questions": questions}
                s1_cold = srv.post("/v1/systemone", req)[0]
                s1_warm = statistics.median(srv.post("/v1/systemone", req)[0] for _ in range(args.reps))
                g_cold, n_gen = generate(gen_state)
                g_warm = statistics.median(generate(gen_state)[0] for _ in range(args.reps))
                row = {
                    "tokens": n,
                    "questions": nq,
                    "s1_cold_s": s1_cold,
                    "s1_warm_s": s1_warm,
                    "gen_cold_s": g_cold,
                    "gen_warm_s": g_warm,
                    "generated_tokens": n_gen,
                }
                res["generation"].append(row)
                md.append(f"| {n} | cold | {s1_cold * 1e3:.0f} ms | {g_cold * 1e3:.0f} ms | {g_cold / s1_cold:.1f}x |")
                md.append(f"| {n} | warm | {s1_warm * 1e3:.0f} ms | {g_warm * 1e3:.0f} ms | {g_warm / s1_warm:.1f}x |")
                print("\n".join(md[-2:]), flush=True)
    finally:
        srv.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the GGUF to serve")
    engine_options(ap)
    ap.add_argument("--ctx", type=int, default=16384, help="context per slot, tokens (engine --ctx)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="CPU threads (engine and reference)")
    ap.add_argument("--states", default="370,13500", help="state sizes in tokens, comma-separated")
    ap.add_argument("--questions", default="1,4,16", help="question counts, comma-separated (at most 16)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--gen-tokens", type=int, default=3, help="tokens generated per question (generation)")
    ap.add_argument("--engine-flags", default="", help="extra engine options, e.g. '--flash-attn --kv-type f16'")
    ap.add_argument("--only", choices=("engine", "server"), default=None)
    ap.add_argument(
        "--server-parts",
        default="systemone,generation",
        help="parts of the server benchmark, comma-separated: systemone (the cold / warm table), "
        "generation (System One against generating the answers)",
    )
    ap.add_argument("--out-dir", default=None, help="write <tag>.md and <tag>.json here")
    ap.add_argument("--tag", default="gpu_decisions", help="name of the output files")
    args = ap.parse_args(argv)
    args.states = [int(x) for x in args.states.split(",")]
    args.questions = [int(x) for x in args.questions.split(",")]
    args.server_parts = args.server_parts.split(",")
    if not set(args.server_parts) <= {"systemone", "generation"}:
        ap.error(f"--server-parts: systemone and/or generation, not {','.join(args.server_parts)}")
    if max(args.questions) > len(QUESTIONS):
        ap.error(f"--questions: at most {len(QUESTIONS)}")
    if args.ref_bin and not Path(args.ref_bin).exists():
        ap.error(f"--ref-bin {args.ref_bin} does not exist (build it, or pass --ref-bin '')")
    # the score cache off: every timed SCORE computes (a repeat would otherwise compute nothing)
    argv_eng = llama_argv(
        args.engine_bin, args.model, args.ctx, args.threads, "--score-cache-mb", "0", slots=1, flags=args.engine_flags
    )

    from gateway.decision.chat_template import ChatTemplate
    from gateway.decision.prompts import PromptBuilder

    prompts = PromptBuilder(ChatTemplate.from_gguf(args.model))
    res: dict = {"model": Path(args.model).name, "engine_argv": argv_eng, "reps": args.reps}
    md = [
        f"## {Path(args.model).name}: engine flags `{args.engine_flags or '(defaults)'}`, --ctx {args.ctx}, "
        f"3 options per question"
    ]
    print(md[0], flush=True)
    if args.out_dir:
        Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    err = Path(args.out_dir or tempfile.gettempdir()) / f"{args.tag}-engine.log"
    t0 = time.perf_counter()
    try:
        with TimedEngine(argv_eng, err, timeout=600) as eng:
            res["caps"] = eng.caps.values
            bodies = sized_bodies(eng, args.states)
            res["state_tokens"] = {n: eng.count(state_text(0, b)) for n, b in bodies.items()}
            print(f"states: {res['state_tokens']} tokens; engine ready in {time.perf_counter() - t0:.1f} s", flush=True)
            if args.only in (None, "engine"):
                bench_engine(args, argv_eng, prompts, bodies, eng, res, md)
        if args.only in (None, "server"):
            bench_server(args, argv_eng, bodies, res, md)
    except BaseException as exc:  # the tables so far still get written, marked as cut short
        md.append(f"\n(cut short: {type(exc).__name__}: {str(exc)[:300]})")
        raise
    finally:
        text = "\n".join(md) + "\n"
        print("\n" + text)
        if args.out_dir:
            Path(args.out_dir).mkdir(parents=True, exist_ok=True)
            (Path(args.out_dir) / f"{args.tag}.md").write_text(text)
            (Path(args.out_dir) / f"{args.tag}.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
