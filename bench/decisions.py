"""Benchmarks of the decision server, measured side by side in one run; prints ratios.

    .venv/bin/python -m bench.decisions [--model PATH] [--threads N] [--questions 16] [--samples 20]
        [--sample-questions 4] [--gen-tokens 16] [--rounds 1] [--no-growth] [--share-n 2000]
        [--load 10000] [--concurrency 64] [--baseline-tree DIR] [--skip-llm | --fixture-only] [--skip-fixture]

On the default model (``serveproto serve`` with the llama engine), about 2-3 minutes at 1 thread:
  1. System One against answering the same questions by generation on the same model and the
     same prompts (the chat route), cold (a state never seen) and warm: greedy, one answer a
     question (one label, no probabilities); and ``--samples`` answers a question at temperature 1,
     counted into probabilities (the same information System One gives), with how far those
     counts are from System One's probabilities;
  2. the bound: prefill ms per token and decode ms per token measured in the same run, and the
     ratio they allow, (question prefill + tokens written x decode) / (question prefill);
  3. cold vs warm, and the per-question cost as 1, 4 and 16 questions share one state.
On the fixture engine (``--mode decide``, the DECIDE path; no model needed):
  4. the gateway's own share per request: a keep-alive client's latency minus the same DECIDE
     sent straight to an engine through the supervisor, taken in turns; also with the access log
     on, and from another source tree (``--baseline-tree``: a before/after in one run);
  5. a bounded load run on loopback: ``--load`` requests at ``--concurrency``
     connections, requests/s, p50/p99, errors, the server's RSS before and after.
Each server runs as its own process (``python -m gateway.cli serve``).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx2
import orjson

from bench.servers import Server
from gateway.paths import default_model_path, engine_bin

TICKET = (
    "Hi, I have been trying to connect my Stripe account for 3 days and the integration keeps failing. "
    "I am losing sales. Please help ASAP. I already reinstalled the plugin twice and checked the API keys, "
    "the dashboard says the webhook endpoint returns 500 since Monday. Our shop runs on WooCommerce."
)

QUESTIONS_16 = {
    "urgency": {"type": "noul", "instructions": "Does this message express urgency?"},
    "department": {
        "type": "choice",
        "instructions": "Which team should handle this?",
        "criteria": {
            "billing": "payments, invoices, Stripe payouts",
            "technical": "bugs, outages, integration errors",
            "sales": "pricing, plans, upgrades",
        },
    },
    "severity": {
        "type": "score",
        "instructions": "How severe is the customer impact?",
        "criteria": ["no impact", "minor inconvenience", "blocked on one task", "losing money", "business down"],
    },
    "sentiment": {
        "type": "choice",
        "instructions": "What is the customer's mood?",
        "criteria": {"calm": None, "frustrated": None, "angry": None},
    },
    "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
    "churn": {"type": "noul", "instructions": "Does the customer threaten to leave?"},
    "platform": {
        "type": "choice",
        "instructions": "Which shop platform is it?",
        "criteria": {"Shopify": None, "WooCommerce": None, "Magento": None, "unknown": None},
    },
    "tried": {"type": "noul", "instructions": "Has the customer already tried to fix it?"},
    "channel": {
        "type": "choice",
        "instructions": "What failed?",
        "criteria": {"webhook": None, "login": None, "checkout page": None},
    },
    "priority": {
        "type": "score",
        "instructions": "What priority should the ticket get?",
        "criteria": ["low", "normal", "high", "urgent"],
    },
    "language": {
        "type": "choice",
        "instructions": "Which language is the message in?",
        "criteria": {"English": None, "German": None, "French": None},
    },
    "polite": {"type": "noul", "instructions": "Is the message polite?"},
    "bug": {"type": "noul", "instructions": "Is this likely a bug on our side?"},
    "next": {
        "type": "choice",
        "instructions": "What should the agent do first?",
        "criteria": {"ask for logs": None, "escalate": None, "send docs": None, "close": None},
    },
    "effort": {
        "type": "score",
        "instructions": "How much work will this take?",
        "criteria": ["minutes", "hours", "days"],
    },
    "duration": {"type": "noul", "instructions": "Has the problem lasted more than a day?"},
}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]  # noqa: RUF046  (kept as written)


# ---------------------------------------------------------------- the default model


#: The ``x_debias`` of the "debiased" rows: the default model's default until bench/quality.py chose
#: canonical,content_free (gateway.cli.config.DEFAULT_MODEL_DEBIAS), kept so that the tables in bench/results/NOTEBOOK.md
#: still say what they measured.
DEBIASED = ["cyclic", "content_free"]


def systemone(
    client: httpx2.Client, state: str, questions: dict, debias: str | list[str] = "none"
) -> tuple[float, dict]:
    """One ``/v1/systemone`` request; returns (seconds, reply). ``debias``: its ``x_debias`` (sent always,
    so that the figures do not depend on the server's default)."""
    t = time.perf_counter()
    r = client.post(
        "/v1/systemone",
        content=orjson.dumps({"state": state, "questions": questions, "x_debias": debias}),
        headers={"content-type": "application/json"},
    )
    dt = time.perf_counter() - t
    r.raise_for_status()
    return dt, r.json()


def chat(client: httpx2.Client, user: str, max_tokens: int, temperature: float, system: str | None = None) -> dict:
    """One whole (not streamed) chat completion; returns the response body."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    r = client.post(
        "/v1/chat/completions",
        content=orjson.dumps({"messages": messages, "max_tokens": max_tokens, "temperature": temperature}),
        headers={"content-type": "application/json"},
    )
    r.raise_for_status()
    return r.json()


def by_generation(
    client: httpx2.Client,
    state: str,
    questions: dict,
    gen_tokens: int,
    samples: int = 1,
    temperature: float = 0.0,
    reread: bool = False,
) -> tuple[float, int, dict[str, list[str]], int]:
    """Each question as ``samples`` chat completions on the prompt System One scores (same template, same text).

    ``reread``: each request starts with a new number (``Request <n>.`` before the system text), so
    that no prefix is reused and the state is read again for every question: a server without a
    prefix cache, the seed's generation baseline. Returns (seconds, tokens generated, the answers'
    texts by question id, prompt tokens of the last request).
    """
    from gateway.decision.prompts import SYSTEM, question_text

    t = time.perf_counter()
    generated = 0
    answers: dict[str, list[str]] = {}
    for qid, q in questions.items():
        text, _ = question_text(q["type"], q.get("instructions"), q.get("criteria"))
        for _ in range(samples):
            system = f"Request {time.time_ns()}. {SYSTEM}" if reread else SYSTEM
            body = chat(client, f"{state}\n\n{text}", gen_tokens, temperature, system)
            generated += body["usage"]["completion_tokens"]
            answers.setdefault(qid, []).append(body["choices"][0]["message"]["content"])
    return time.perf_counter() - t, generated, answers, body["usage"]["prompt_tokens"]


def options_of(question: dict) -> tuple[str, ...]:
    """The option strings System One scores for ``question``, in reply order (gateway.decision.prompts.question_text)."""
    from gateway.decision.prompts import question_text

    return question_text(question["type"], question.get("instructions"), question.get("criteria"))[1]


def parse_answer(text: str, options: tuple[str, ...]) -> int | None:
    """The index of the option a generated ``text`` names first, or None when it names none.

    A lenient reader, the one a generation user would write: the option that occurs earliest in
    the text as a whole word, case-insensitive (``"The mood is frustrated."`` -> ``frustrated``,
    ``"No, it does not"`` -> ``no``); at the same position the longest option wins.
    """
    best: tuple[int, int, int] | None = None  # (position, -length, index)
    for i, opt in enumerate(options):
        m = re.search(r"(?<!\w)" + re.escape(opt) + r"(?!\w)", text, re.IGNORECASE)
        if m is not None and (best is None or (m.start(), -len(opt)) < best[:2]):
            best = (m.start(), -len(opt), i)
    return None if best is None else best[2]


def sampled_probabilities(texts: list[str], options: tuple[str, ...]) -> tuple[list[float], int]:
    """The frequency of each option among the answers that name one, and how many named none.

    Returns ``((n_options,) frequencies summing to 1, unparsed count)``; uniform when no answer
    names an option (what a user who counts answers is left with).
    """
    counts = [0] * len(options)
    unparsed = 0
    for text in texts:
        i = parse_answer(text, options)
        if i is None:
            unparsed += 1
        else:
            counts[i] += 1
    n = sum(counts)
    if n == 0:
        return [1.0 / len(options)] * len(options), unparsed
    return [c / n for c in counts], unparsed


def systemone_probabilities(question: dict, answer: dict) -> list[float]:
    """System One's probabilities for ``question`` in the order of :func:`options_of` (noul: no, yes)."""
    if question["type"] == "noul":
        return [1.0 - answer["noul"], answer["noul"]]
    probs = answer["probabilities"]
    keys = (
        list(question["criteria"])
        if question["type"] == "choice"
        else [str(i) for i in range(len(question["criteria"]))]
    )
    return [probs[k] for k in keys]


def expected_sampling_error(p: list[float], k: int) -> float:
    """E|c/k - p_i| averaged over options, c ~ Binomial(k, p_i): the error of ``k`` samples drawn from ``p`` itself.

    The floor of the sampled estimate (a sampler that followed System One's distribution exactly):
    the mean absolute deviation of a binomial proportion, summed exactly over c = 0..k.
    """
    out = 0.0
    for pi in p:
        out += sum(math.comb(k, c) * pi**c * (1 - pi) ** (k - c) * abs(c / k - pi) for c in range(k + 1))
    return out / len(p)


def prefill_and_decode(client: httpx2.Client, reps: int = 3) -> tuple[float, float]:
    """Prefill ms per prompt token and decode ms per generated token, measured through the chat route.

    Prefill: two fresh prompts (a new number in front, so nothing is reused) of different lengths,
    one token generated each; the slope of time over prompt tokens. Decode: the same warm prompt with
    1 and with 48 tokens to generate; (difference) / (extra tokens generated). Medians of ``reps``.
    """
    filler = " ".join(f"item {i} is on the list;" for i in range(60))
    slopes, steps = [], []
    for r in range(reps):
        tag = f"{time.time_ns()}-{r}"
        timed = []
        for text in (f"Run {tag}. Say ok.", f"Run {tag}. {filler} Say ok."):
            t = time.perf_counter()
            body = chat(client, text, 1, 0.0)
            timed.append((time.perf_counter() - t, body["usage"]["prompt_tokens"]))
        (t0, n0), (t1, n1) = timed
        slopes.append((t1 - t0) / (n1 - n0))
        story = f"Run {tag}. Count from one to one hundred in words, separated by commas."
        chat(client, story, 1, 0.0)  # the prompt into the slot
        t = time.perf_counter()
        chat(client, story, 1, 0.0)
        one = time.perf_counter() - t
        t = time.perf_counter()
        body = chat(client, story, 48, 0.0)
        many = time.perf_counter() - t
        n = body["usage"]["completion_tokens"]
        if n > 1:
            steps.append((many - one) / (n - 1))
    med = statistics.median
    return med(slopes) * 1e3, (med(steps) * 1e3 if steps else float("nan"))


def bench_llm(args) -> None:
    """Rounds interleave System One and generation on fresh states, so that load from other
    processes on the machine falls on both alike; every figure is the median over the rounds."""
    model = args.model or str(default_model_path())
    # the score cache off: a repeated request here measures computing it (bench/repeat.py: the cache)
    srv = Server("--model", model, "--threads", str(args.threads), "--request-timeout", "600", "--score-cache-mb", "0")
    med = statistics.median
    names = list(QUESTIONS_16)[: args.questions]
    questions = {k: QUESTIONS_16[k] for k in names}
    nq = len(questions)
    try:
        client = httpx2.Client(base_url=srv.base, timeout=600)
        systemone(client, "warm-up: " + TICKET, {"q": QUESTIONS_16["urgency"]})  # load pages, first decode
        prefill_ms, decode_ms = prefill_and_decode(client)
        rows: dict[str, list[float]] = {k: [] for k in ("s1_cold", "s1_warm", "gen_cold", "gen_warm", "gen_reread")}
        n_gen = 0
        body: dict = {}
        warm_body: dict = {}
        greedy: dict[str, list[str]] = {}
        for r in range(args.rounds):
            # cold then warm back to back: with one KV slot, anything in between would evict the state
            state_s1, state_gen = f"Ticket {1000 + r}. " + TICKET, f"Ticket {2000 + r}. " + TICKET
            t, body = systemone(client, state_s1, questions)
            rows["s1_cold"].append(t)
            t, warm_body = systemone(client, state_s1, questions)
            rows["s1_warm"].append(t)
            rows["gen_reread"].append(by_generation(client, state_gen, questions, args.gen_tokens, reread=True)[0])
            t, n_gen, greedy, prompt_tokens = by_generation(client, state_gen, questions, args.gen_tokens)
            rows["gen_cold"].append(t)
            rows["gen_warm"].append(by_generation(client, state_gen, questions, args.gen_tokens)[0])
        # k sampled answers a question, on the state generation has warmed (the last round's), against
        # System One on the same state (the first request reads it and is the reference for the greedy
        # and the sampled answers; the second, on the sampled questions only, is timed warm)
        sq = {k: questions[k] for k in names[: args.sample_questions]}
        t_samp, n_samp, sampled, _ = by_generation(client, state_gen, sq, args.gen_tokens, args.samples, 1.0)
        _, ref = systemone(client, state_gen, questions)  # the reference: System One on generation's own state
        t_s1_sq, _ = systemone(client, state_gen, sq)
        # System One debiased, on the same (warm) state: the first request also reads each question's
        # content-free state (remembered by the server from then on), the second is the steady cost
        t_db_first, ref_db = systemone(client, state_gen, questions, DEBIASED)
        t_db_warm, db_warm_body = systemone(client, state_gen, questions, DEBIASED)
        t_db_sq, _ = systemone(client, state_gen, sq, DEBIASED)

        c1, c2, w1, w2 = med(rows["s1_cold"]), med(rows["gen_cold"]), med(rows["s1_warm"]), med(rows["gen_warm"])
        r2 = med(rows["gen_reread"])
        d1, dw = t_db_first, t_db_warm
        errs, errs_db, floors, unparsed, agree = [], [], [], 0, 0
        for qid, q in sq.items():
            opts = options_of(q)
            p = systemone_probabilities(q, ref["answers"][qid])
            ps, bad = sampled_probabilities(sampled[qid], opts)
            unparsed += bad
            errs.append(sum(abs(a - b) for a, b in zip(ps, p)) / len(p))
            p_db = systemone_probabilities(q, ref_db["answers"][qid])
            errs_db.append(sum(abs(a - b) for a, b in zip(ps, p_db)) / len(p))
            floors.append(expected_sampling_error(p, args.samples))
        for qid, q in questions.items():
            opts = options_of(q)
            p = systemone_probabilities(q, ref["answers"][qid])
            agree += parse_answer(greedy[qid][0], opts) == max(range(len(p)), key=lambda i: (p[i], -i))
        print(
            f"\n## default model ({Path(model).name}, {args.threads} threads): System One vs generation, "
            f"{nq} questions on one state (median of {args.rounds} interleaved rounds)\n"
        )
        print("| | System One | greedy generation, one answer a question | ratio |")
        print("|---|---|---|---|")
        print(f"| {nq} questions, cold state | {c1:.2f} s | {c2:.2f} s | {c2 / c1:.1f}x |")
        print(f"| {nq} questions, warm state | {w1:.2f} s | {w2:.2f} s | {w2 / w1:.1f}x |")
        print(
            f"| {nq} questions, generation re-reading the state for each (no prefix cache, the seed's baseline) | "
            f"{w1:.2f} s (warm) | {r2:.2f} s | {r2 / w1:.1f}x |"
        )
        print(
            f"| {nq} questions, warm state, System One debiased as served on the default model (x_debias cyclic + "
            f"content_free), its first request (the questions' content-free readings included) | {d1:.2f} s | "
            f"{w2:.2f} s | {w2 / d1:.1f}x |"
        )
        print(
            f"| {nq} questions, warm state, System One debiased, the next request | {dw:.2f} s | {w2:.2f} s | {w2 / dw:.1f}x |"
        )
        print(
            f"| {nq} questions, warm, System One debiased, generation re-reading the state | {dw:.2f} s | {r2:.2f} s | "
            f"{r2 / dw:.1f}x |"
        )
        print(
            f"| per question, warm | {w1 / nq * 1e3:.0f} ms ({dw / nq * 1e3:.0f} ms debiased) | {w2 / nq * 1e3:.0f} ms | |"
        )
        print(
            f"| tokens | {body['usage']['output_tokens']} option tokens read, 0 generated | "
            f"{n_gen} generated (at most {args.gen_tokens} a question) | |"
        )
        pw_raw, pw_db = (warm_body.get("x_positions") or {}), (db_warm_body.get("x_positions") or {})
        print(f"| positions computed, warm | {pw_raw.get('computed')} ({pw_db.get('computed')} debiased) | | |")
        print(
            f"| what comes back | a probability per option | one label; it is System One's most likely option "
            f"in {agree}/{nq} questions | |"
        )
        ns = len(sq)
        print(
            f"\n| the same information: a probability per option, warm | System One | "
            f"generation, {args.samples} answers a question at temperature 1, counted | ratio |"
        )
        print("|---|---|---|---|")
        print(f"| {ns} questions ({', '.join(sq)}) | {t_s1_sq:.2f} s | {t_samp:.2f} s | {t_samp / t_s1_sq:.1f}x |")
        print(f"| the same, System One debiased | {t_db_sq:.2f} s | {t_samp:.2f} s | {t_samp / t_db_sq:.1f}x |")
        print(f"| tokens generated | 0 | {n_samp} ({n_samp / (ns * args.samples):.1f} an answer) | |")
        print(f"| answers naming no option (left out of the counts) | | {unparsed}/{ns * args.samples} | |")
        print(
            f"| mean abs(p_sampled - p) over options, against System One's p | 0 (exact) | {statistics.fmean(errs):.3f} "
            f"(floor for {args.samples} samples drawn from p itself: {statistics.fmean(floors):.3f}) | |"
        )
        print(f"| the same against System One's debiased p | | {statistics.fmean(errs_db):.3f} | |")

        pos = warm_body.get("x_positions") or {}
        q_tokens = (pos.get("computed") or 0) / nq
        g = n_gen / nq
        g_s = n_samp / (len(sq) * args.samples)
        greedy_bound = (q_tokens * prefill_ms + g * decode_ms) / (q_tokens * prefill_ms)
        reread_bound = (prompt_tokens * prefill_ms + g * decode_ms) / (q_tokens * prefill_ms)
        sample_bound = (q_tokens * prefill_ms + args.samples * g_s * decode_ms) / (q_tokens * prefill_ms)
        print("\n## why the ratio is what it is (same server, same run)\n")
        print("| | measured |")
        print("|---|---|")
        print(f"| prefill, per prompt token | {prefill_ms:.2f} ms |")
        print(f"| decode, per generated token | {decode_ms:.2f} ms ({decode_ms / prefill_ms:.1f}x a prefill token) |")
        print(
            f"| positions System One computes per warm question (stem + options) | {q_tokens:.0f} "
            f"({w1 / nq * 1e3 / max(q_tokens, 1):.2f} ms each, warm) |"
        )
        print(f"| greedy: tokens written per question | {g:.1f} |")
        print(
            f"| bound, greedy: (q x prefill + g x decode) / (q x prefill) | {greedy_bound:.1f}x (measured {w2 / w1:.1f}x) |"
        )
        print(
            f"| bound, greedy re-reading the state: (P x prefill + g x decode) / (q x prefill), P = {prompt_tokens} "
            f"prompt tokens | {reread_bound:.1f}x (measured {r2 / w1:.1f}x) |"
        )
        print(
            f"| bound, {args.samples} samples: (q x prefill + k x g x decode) / (q x prefill) | {sample_bound:.1f}x "
            f"(measured {t_samp / t_s1_sq:.1f}x) |"
        )

        if args.share_questions:
            print(
                f"\n## per-question cost as questions share one state (cold: a new state; warm: the same request again; "
                f"median of {args.rounds})\n"
            )
            print("| questions | cold | warm | per question, warm | computed positions cold / warm |")
            print("|---|---|---|---|---|")
            for n in (1, 4, 16):
                if n > len(QUESTIONS_16):
                    continue
                qs = {k: QUESTIONS_16[k] for k in list(QUESTIONS_16)[:n]}
                colds, warms = [], []
                for r in range(args.rounds):
                    state = f"Ticket {3000 + 100 * n + r}. " + TICKET
                    cold, b_cold = systemone(client, state, qs)
                    warm, b_warm = systemone(client, state, qs)
                    colds.append(cold)
                    warms.append(warm)
                pc, pw = b_cold.get("x_positions", {}), b_warm.get("x_positions", {})
                print(
                    f"| {n} | {med(colds) * 1e3:.0f} ms | {med(warms) * 1e3:.0f} ms | {med(warms) / n * 1e3:.0f} ms | "
                    f"{pc.get('computed')} / {pw.get('computed')} |"
                )
        client.close()
    finally:
        srv.close()


# ---------------------------------------------------------------- the fixture engine


def raw_request(body: bytes) -> bytes:
    return (
        b"POST /v1/systemone HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


async def read_response(stream, buf: bytearray) -> int:
    """Read one response off a keep-alive stream; returns its status. ``buf`` keeps leftover bytes."""
    while b"\r\n\r\n" not in buf:
        buf += await stream.receive()
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
    buf[:] = rest
    while len(buf) < length:
        buf += await stream.receive()
    del buf[:length]
    return status


async def sequential(port: int, request: bytes, n: int) -> list[float]:
    out = []
    async with await anyio.connect_tcp("127.0.0.1", port) as s:
        buf = bytearray()
        for _ in range(n):
            t = time.perf_counter()
            await s.send(request)
            status = await read_response(s, buf)
            out.append(time.perf_counter() - t)
            assert status == 200, status
    return out


async def interleaved(
    servers: dict[str, Server], record: bytes, request: bytes, n: int, chunk: int = 100
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Latencies of ``n`` keep-alive requests to each server and of ``n`` DECIDEs sent straight to a
    fixture engine through the supervisor (key ``"direct"``), taken in turns of ``chunk`` so that load
    from elsewhere on the machine falls on all of them alike; and each server's CPU seconds per
    request over the recorded turns (robust to that load, unlike latency)."""
    from gateway.engine import Engine

    ports = {name: srv.port for name, srv in servers.items()}
    out: dict[str, list[float]] = {name: [] for name in [*ports, "direct"]}
    cpu: dict[str, float] = {}
    async with Engine.spawn([str(engine_bin("serveproto-fixture")), "--mode", "decide"]) as eng:
        streams = {name: await anyio.connect_tcp("127.0.0.1", port) for name, port in ports.items()}
        bufs = {name: bytearray() for name in ports}
        try:
            for turn in range(-1, max(1, n // chunk)):  # turn -1 warms every path up, unrecorded
                if turn == 0:
                    cpu = {name: -srv.cpu_seconds() for name, srv in servers.items()}
                for name, s in streams.items():
                    for _ in range(chunk):
                        t = time.perf_counter()
                        await s.send(request)
                        status = await read_response(s, bufs[name])
                        if turn >= 0:
                            out[name].append(time.perf_counter() - t)
                        assert status == 200, (name, status)
                for _ in range(chunk):
                    t = time.perf_counter()
                    await eng.decide(record, slot=0)
                    if turn >= 0:
                        out["direct"].append(time.perf_counter() - t)
            cpu = {name: (cpu[name] + srv.cpu_seconds()) / len(out[name]) for name, srv in servers.items()}
        finally:
            for s in streams.values():
                await s.aclose()
    return out, cpu


async def load(port: int, request: bytes, total: int, concurrency: int) -> tuple[float, list[float], int]:
    latencies: list[float] = []
    errors = 0
    remaining = total

    async def worker():
        nonlocal remaining, errors
        async with await anyio.connect_tcp("127.0.0.1", port) as s:
            buf = bytearray()
            while remaining > 0:
                remaining -= 1
                t = time.perf_counter()
                await s.send(request)
                status = await read_response(s, buf)
                latencies.append(time.perf_counter() - t)
                errors += status != 200

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(worker)
    return time.perf_counter() - t0, latencies, errors


def metrics_mean_ms(base: str, route: str) -> float:
    """Mean handler time of ``route`` in ms, from the server's Prometheus histogram (sum / count)."""
    text = httpx2.get(base + "/metrics").text
    values = {}
    for line in text.splitlines():
        for kind in ("sum", "count"):
            if line.startswith(f'serveproto_http_request_duration_seconds_{kind}{{route="{route}"}}'):
                values[kind] = float(line.rsplit(" ", 1)[1])
    return values["sum"] / values["count"] * 1e3


#: Where a sampled frame belongs, by the start of its file's path as py-spy prints it (first match wins).
#: The kernel's part is the time spent inside the calls that enter it (no Python frame below them).
KERNEL_CALLS = {
    ("asyncio/selector_events.py", "_SelectorSocketTransport.write"),
    ("asyncio/unix_events.py", "_UnixWritePipeTransport.write"),
}
#: The event loop's wait: py-spy cannot always tell waiting from working there, so it is counted apart.
EPOLL_WAIT = ("selectors.py", "EpollSelector.select")
CPU_PARTS = (
    ("h11", ("h11/",)),
    ("anyio", ("anyio/", "sniffio/")),
    ("asyncio scheduling", ("asyncio/", "selectors.py", "contextlib.py")),
    ("gateway/http and gateway/server/app", ("gateway/http/", "gateway/server/app.py", "gateway/server/auth.py")),
    (
        "the route: Jev, the DECIDE record, scoring, metrics",
        (
            "gateway/server/jev/serving.py",
            "gateway/decision/schema.py",
            "gateway/decision/pipeline.py",
            "gateway/decision/scoring.py",
            "gateway/engine/score.py",
            "gateway/decision/readings.py",
            "gateway/decision/record.py",
            "gateway/server/metrics.py",
            "gateway/decision/debias.py",
            "gateway/decision/prompts.py",
            "json/",
            "prometheus_client/",
        ),
    ),
    ("the supervisor and serveproto", ("gateway/engine/", "serveproto/")),
)


def cpu_parts(raw: str) -> dict[str, float]:
    """Share of py-spy samples (``record -f raw``: ``frame;frame;... count`` lines, a frame being
    ``function (path:line)``) by part, from each sample's innermost frame: the kernel calls of
    :data:`KERNEL_CALLS`, then :data:`CPU_PARTS`; the rest is ``"other"``. Largest first; samples in
    the loop's epoll wait are left out of the shares and given as ``"(epoll wait, left out)"``, a
    fraction of all samples."""
    counts: dict[str, int] = {}
    waiting = 0
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        func, _, where = stack.rsplit(";", 1)[-1].rpartition(" (")
        path = where.rsplit(":", 1)[0]
        if (path, func) == EPOLL_WAIT:
            waiting += int(n)
            continue
        if (path, func) in KERNEL_CALLS:
            key = "the kernel: socket send (loopback delivery), pipe write"
        else:
            key = next((name for name, prefixes in CPU_PARTS if path.startswith(prefixes)), "other")
        counts[key] = counts.get(key, 0) + int(n)
    total = sum(counts.values())
    if not total:
        return {}
    shares = {k: v / total for k, v in sorted(counts.items(), key=lambda kv: -kv[1])}
    shares["(epoll wait, left out)"] = waiting / (total + waiting)
    return shares


def profile_server(py_spy: str, srv: Server, request: bytes, n: int) -> dict[str, float]:
    """Sample ``srv`` with py-spy (500 Hz, its own binary: not a dependency) while ``n`` keep-alive requests run."""
    import signal
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "spy.txt"
        spy = subprocess.Popen(
            [py_spy, "record", "-p", str(srv.proc.pid), "-o", str(out), "-f", "raw", "-r", "500", "--nonblocking"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # attached
        anyio.run(sequential, srv.port, request, n)
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=60)
        return cpu_parts(out.read_text()) if out.exists() else {}


def bench_fixture(args) -> None:
    from gateway.decision import record as decision_record
    from gateway.decision import schema

    questions = {k: QUESTIONS_16[k] for k in ("urgency", "department", "severity")}
    body = orjson.dumps({"state": TICKET, "questions": questions, "model": "jev-latest"})
    request = raw_request(body)
    record = decision_record.serialize(decision_record.build(schema.parse_request(orjson.loads(body))))
    engine = ["--engine", str(engine_bin("serveproto-fixture")), "--mode", "decide"]
    srv = Server(*engine)
    others = {"this tree, access log on (--log-level INFO)": Server(*engine, log_level="INFO")}
    if args.baseline_tree:
        others[f"baseline tree {args.baseline_tree}"] = Server(*engine, tree=Path(args.baseline_tree).resolve())
    try:
        servers = {"this tree": srv, **others}
        lat, cpu = anyio.run(interleaved, servers, record, request, args.share_n)
        for s in others.values():
            s.close()
        direct = lat["direct"]
        r = httpx2.post(srv.base + "/v1/systemone", content=body, headers={"content-type": "application/json"})
        engine_ms = float(r.headers["x-serveproto-engine-ms"])
        handler_ms = metrics_mean_ms(srv.base, "/v1/systemone")
        print(
            f"\n## the gateway's own share per request (fixture engine, DECIDE path, 3 questions, keep-alive client, "
            f"{len(direct)} requests each, taken in turns)\n"
        )
        print("| | p50 | p99 | the gateway's share: p50 minus the supervisor's p50 | server CPU per request |")
        print("|---|---|---|---|---|")
        d50 = pct(direct, 50)
        shares = {}
        for name in servers:
            xs = lat[name]
            shares[name] = pct(xs, 50) - d50
            print(
                f"| HTTP request at the client, {name} | {pct(xs, 50) * 1e3:.3f} ms | {pct(xs, 99) * 1e3:.3f} ms | "
                f"{shares[name] * 1e3:.3f} ms | {cpu[name] * 1e3:.3f} ms |"
            )
        print(
            f"| the same DECIDE through the supervisor, no HTTP | {d50 * 1e3:.3f} ms | {pct(direct, 99) * 1e3:.3f} ms | | |"
        )
        print(
            f"| (server side: mean time in the handler, from /metrics, engine call included) | {handler_ms:.3f} ms | | | |"
        )
        for name in servers:
            if name != "this tree":
                print(
                    f"\nthis tree / {name}: share {shares['this tree'] / shares[name]:.2f}, "
                    f"server CPU per request {cpu['this tree'] / cpu[name]:.2f}"
                )
        print(f"\n(the fixture's own compute, DECISION engine_ms: {engine_ms:.3f} ms)")
        if args.py_spy:
            parts = profile_server(args.py_spy, srv, request, args.share_n)
            print(
                f"\n## where this tree's server spends its CPU (py-spy, {args.share_n} keep-alive requests, innermost frame)\n"
            )
            print("| part | share of the samples out of the epoll wait |")
            print("|---|---|")
            for name, share in parts.items():
                print(f"| {name} | {share * 100:.1f}% |")

        rss0 = srv.rss_mb()
        warmup = min(1000, args.load)
        anyio.run(load, srv.port, request, warmup, args.concurrency)
        rss1 = srv.rss_mb()
        seconds, lat, errors = anyio.run(load, srv.port, request, args.load, args.concurrency)
        rss2 = srv.rss_mb()
        print(
            f"\n## load on loopback: {args.load} requests at {args.concurrency} concurrent connections (fixture engine, DECIDE path)\n"
        )
        print(f"| requests/s | p50 | p99 | errors | server RSS: start / after {warmup:,} warm-up / after the run |")
        print("|---|---|---|---|---|")
        print(
            f"| {len(lat) / seconds:.0f} | {pct(lat, 50) * 1e3:.1f} ms | {pct(lat, 99) * 1e3:.1f} ms | {errors} | "
            f"{rss0:.1f} / {rss1:.1f} / {rss2:.1f} MB |"
        )
    finally:
        srv.close()
        for s in others.values():
            s.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--gen-tokens",
        type=int,
        default=16,
        help="tokens a generated answer may take, greedy, ending at EOS (default 16)",
    )
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds on the default model (medians)")
    p.add_argument(
        "--questions", type=int, default=16, help="questions on one state, System One vs generation (1..16, default 16)"
    )
    p.add_argument("--samples", type=int, default=20, help="sampled answers a question at temperature 1 (default 20)")
    p.add_argument(
        "--sample-questions", type=int, default=4, help="questions answered by sampling (the first N; default 4)"
    )
    p.add_argument(
        "--no-growth",
        dest="share_questions",
        action="store_false",
        help="skip the table of 1, 4 and 16 questions on one state",
    )
    p.add_argument("--load", type=int, default=10_000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--share-n", type=int, default=2000, help="sequential requests for the gateway-share measurement")
    p.add_argument(
        "--baseline-tree",
        default=None,
        help="also serve from this source tree (e.g. `git archive <commit> gateway serveproto | tar -x -C DIR`) "
        "and print its share beside this tree's",
    )
    p.add_argument(
        "--py-spy",
        default=None,
        metavar="BINARY",
        help="a py-spy binary (e.g. `pip install --target /tmp/spy py-spy`): also profile this tree's server",
    )
    p.add_argument(
        "--skip-llm",
        "--fixture-only",
        action="store_true",
        help="skip the default-model part (only the fixture engine is needed)",
    )
    p.add_argument("--skip-fixture", action="store_true")
    args = p.parse_args(argv)
    print(
        f"# bench/decisions.py  ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f})"
    )
    if not args.skip_fixture:
        bench_fixture(args)
    if not args.skip_llm:
        bench_llm(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
