"""Benchmarks of the decision server, measured side by side in one run; prints ratios.

    .venv/bin/python bench/decisions.py [--model PATH] [--threads N] [--load 10000] [--concurrency 64]
                                        [--skip-llm] [--skip-fixture] [--gen-tokens 8]

On the default model (``serveproto serve`` with the llama engine):
  1. System One against answering the same questions by generation on the same
     model and the same prompts (the chat route, greedy, at most ``--gen-tokens`` tokens),
     for 16 questions on one state, cold (a state never seen) and warm;
  2. cold vs warm, and the per-question cost as 1, 4 and 16 questions share one
     state (the shape of seed 001's table).
On the fixture engine (``--mode decide``, the DECIDE path):
  3. the gateway's own share per request: a keep-alive client's latency minus
     the same DECIDE sent straight to an engine through the supervisor;
  4. a bounded load run on loopback: ``--load`` requests at ``--concurrency``
     connections, requests/s, p50/p99, errors, the server's RSS before and after.
Each server runs as its own process (``python -m gateway.cli serve``).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx2
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.paths import default_model_path, engine_bin  # noqa: E402

TICKET = ("Hi, I have been trying to connect my Stripe account for 3 days and the integration keeps failing. "
          "I am losing sales. Please help ASAP. I already reinstalled the plugin twice and checked the API keys, "
          "the dashboard says the webhook endpoint returns 500 since Monday. Our shop runs on WooCommerce.")

QUESTIONS_16 = {
    "urgency": {"type": "noul", "instructions": "Does this message express urgency?"},
    "department": {"type": "choice", "instructions": "Which team should handle this?",
                   "criteria": {"billing": "payments, invoices, Stripe payouts", "technical": "bugs, outages, integration errors",
                                "sales": "pricing, plans, upgrades"}},
    "severity": {"type": "score", "instructions": "How severe is the customer impact?",
                 "criteria": ["no impact", "minor inconvenience", "blocked on one task", "losing money", "business down"]},
    "sentiment": {"type": "choice", "instructions": "What is the customer's mood?",
                  "criteria": {"calm": None, "frustrated": None, "angry": None}},
    "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
    "churn": {"type": "noul", "instructions": "Does the customer threaten to leave?"},
    "platform": {"type": "choice", "instructions": "Which shop platform is it?",
                 "criteria": {"Shopify": None, "WooCommerce": None, "Magento": None, "unknown": None}},
    "tried": {"type": "noul", "instructions": "Has the customer already tried to fix it?"},
    "channel": {"type": "choice", "instructions": "What failed?",
                "criteria": {"webhook": None, "login": None, "checkout page": None}},
    "priority": {"type": "score", "instructions": "What priority should the ticket get?", "criteria": ["low", "normal", "high", "urgent"]},
    "language": {"type": "choice", "instructions": "Which language is the message in?",
                 "criteria": {"English": None, "German": None, "French": None}},
    "polite": {"type": "noul", "instructions": "Is the message polite?"},
    "bug": {"type": "noul", "instructions": "Is this likely a bug on our side?"},
    "next": {"type": "choice", "instructions": "What should the agent do first?",
             "criteria": {"ask for logs": None, "escalate": None, "send docs": None, "close": None}},
    "effort": {"type": "score", "instructions": "How much work will this take?", "criteria": ["minutes", "hours", "days"]},
    "duration": {"type": "noul", "instructions": "Has the problem lasted more than a day?"},
}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


class Server:
    """``python -m gateway.cli serve --port 0 ...`` as a child process; ``base`` is its URL."""

    def __init__(self, *argv: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--port", "0", "--log-level", "WARNING", *argv],
                                     cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()
        if " on http://" not in line:
            self.proc.kill()
            raise SystemExit(f"the server did not start: {line!r}")
        self.base = line.split(" on ")[1].strip()
        self.port = int(self.base.rsplit(":", 1)[1])

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# ---------------------------------------------------------------- the default model


def systemone(client: httpx2.Client, state: str, questions: dict) -> tuple[float, dict]:
    t = time.perf_counter()
    r = client.post("/v1/systemone", content=orjson.dumps({"state": state, "questions": questions}),
                    headers={"content-type": "application/json"})
    dt = time.perf_counter() - t
    r.raise_for_status()
    return dt, r.json()


def by_generation(client: httpx2.Client, state: str, questions: dict, gen_tokens: int) -> tuple[float, int]:
    """Each question as its own chat completion, with the prompt System One scores (same template, same text)."""
    from gateway.prompts import SYSTEM, question_text

    t = time.perf_counter()
    generated = 0
    for q in questions.values():
        text, _ = question_text(q["type"], q.get("instructions"), q.get("criteria"))
        r = client.post("/v1/chat/completions", content=orjson.dumps({
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"{state}\n\n{text}"}],
            "max_tokens": gen_tokens, "temperature": 0}), headers={"content-type": "application/json"})
        r.raise_for_status()
        generated += r.json()["usage"]["completion_tokens"]
    return time.perf_counter() - t, generated


def bench_llm(args) -> None:
    """Rounds interleave System One and generation on fresh states, so that load from other
    processes on the machine falls on both alike; every figure is the median over the rounds."""
    model = args.model or str(default_model_path())
    srv = Server("--model", model, "--threads", str(args.threads), "--request-timeout", "600")
    med = statistics.median
    try:
        client = httpx2.Client(base_url=srv.base, timeout=600)
        systemone(client, "warm-up: " + TICKET, {"q": QUESTIONS_16["urgency"]})  # load pages, first decode
        rows: dict[str, list[float]] = {k: [] for k in ("s1_cold", "s1_warm", "gen_cold", "gen_warm")}
        n_gen = 0
        body: dict = {}
        for r in range(args.rounds):
            state_s1, state_gen = f"Ticket {1000 + r}. " + TICKET, f"Ticket {2000 + r}. " + TICKET
            t, body = systemone(client, state_s1, QUESTIONS_16)
            rows["s1_cold"].append(t)
            t, n_gen = by_generation(client, state_gen, QUESTIONS_16, args.gen_tokens)
            rows["gen_cold"].append(t)
            rows["s1_warm"].append(systemone(client, state_s1, QUESTIONS_16)[0])
            rows["gen_warm"].append(by_generation(client, state_gen, QUESTIONS_16, args.gen_tokens)[0])
        c1, c2, w1, w2 = med(rows["s1_cold"]), med(rows["gen_cold"]), med(rows["s1_warm"]), med(rows["gen_warm"])
        print(f"\n## default model ({Path(model).name}, {args.threads} threads): System One vs generation, "
              f"16 questions on one state (median of {args.rounds} interleaved rounds)\n")
        print("| | System One | generation | ratio |")
        print("|---|---|---|---|")
        print(f"| 16 questions, cold state | {c1:.2f} s | {c2:.2f} s | {c2 / c1:.1f}x |")
        print(f"| 16 questions, warm state | {w1:.2f} s | {w2:.2f} s | {w2 / w1:.1f}x |")
        print(f"| per question, warm | {w1 / 16 * 1e3:.0f} ms | {w2 / 16 * 1e3:.0f} ms | |")
        print(f"| tokens | {body['usage']['output_tokens']} option tokens read, 0 generated | "
              f"{n_gen} generated (at most {args.gen_tokens} a question) | |")
        print(f"\nSystem One's cold reply: input_tokens {body['usage']['input_tokens']}, positions {body.get('x_positions')}")

        print(f"\n## per-question cost as questions share one state (cold: a new state; warm: the same request again; "
              f"median of {args.rounds})\n")
        print("| questions | cold | warm | per question, warm | computed positions cold / warm |")
        print("|---|---|---|---|---|")
        names = list(QUESTIONS_16)
        for n in (1, 4, 16):
            qs = {k: QUESTIONS_16[k] for k in names[:n]}
            colds, warms = [], []
            for r in range(args.rounds):
                state = f"Ticket {3000 + 100 * n + r}. " + TICKET
                cold, b_cold = systemone(client, state, qs)
                warm, b_warm = systemone(client, state, qs)
                colds.append(cold)
                warms.append(warm)
            pc, pw = b_cold.get("x_positions", {}), b_warm.get("x_positions", {})
            print(f"| {n} | {med(colds) * 1e3:.0f} ms | {med(warms) * 1e3:.0f} ms | {med(warms) / n * 1e3:.0f} ms | "
                  f"{pc.get('computed')} / {pw.get('computed')} |")
        client.close()
    finally:
        srv.close()


# ---------------------------------------------------------------- the fixture engine


def raw_request(body: bytes) -> bytes:
    return (b"POST /v1/systemone HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


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


async def engine_direct(record: bytes, n: int) -> list[float]:
    """The same DECIDE straight through the supervisor (no HTTP): the engine's and the pipe's share."""
    from gateway.engine import Engine

    out = []
    async with Engine.spawn([str(engine_bin("serveproto-fixture")), "--mode", "decide"]) as eng:
        for _ in range(n):
            t = time.perf_counter()
            await eng.decide(record, slot=0)
            out.append(time.perf_counter() - t)
    return out


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


def bench_fixture(args) -> None:
    from gateway import decision_record, jev

    questions = {k: QUESTIONS_16[k] for k in ("urgency", "department", "severity")}
    body = orjson.dumps({"state": TICKET, "questions": questions, "model": "jev-latest"})
    request = raw_request(body)
    record = decision_record.serialize(decision_record.build(jev.parse_request(orjson.loads(body))))
    srv = Server("--engine", str(engine_bin("serveproto-fixture")), "--mode", "decide")
    try:
        anyio.run(sequential, srv.port, request, 300)  # warm-up
        http = anyio.run(sequential, srv.port, request, args.share_n)
        direct = anyio.run(engine_direct, record, args.share_n)
        r = httpx2.post(srv.base + "/v1/systemone", content=body, headers={"content-type": "application/json"})
        engine_ms = float(r.headers["x-serveproto-engine-ms"])
        handler_ms = metrics_mean_ms(srv.base, "/v1/systemone")
        print("\n## the gateway's own share per request (fixture engine, DECIDE path, 3 questions, keep-alive client)\n")
        print("| | p50 | p99 |")
        print("|---|---|---|")
        print(f"| HTTP request at the client | {pct(http, 50) * 1e3:.3f} ms | {pct(http, 99) * 1e3:.3f} ms |")
        print(f"| the same DECIDE through the supervisor, no HTTP | {pct(direct, 50) * 1e3:.3f} ms | {pct(direct, 99) * 1e3:.3f} ms |")
        print(f"| the gateway's share (difference) | {(pct(http, 50) - pct(direct, 50)) * 1e3:.3f} ms | |")
        print(f"| (server side: mean time in the handler, from /metrics, engine call included) | {handler_ms:.3f} ms | |")
        print(f"\n(the fixture's own compute, DECISION engine_ms: {engine_ms:.3f} ms)")

        rss0 = srv.rss_mb()
        anyio.run(load, srv.port, request, 1000, args.concurrency)
        rss1 = srv.rss_mb()
        seconds, lat, errors = anyio.run(load, srv.port, request, args.load, args.concurrency)
        rss2 = srv.rss_mb()
        print(f"\n## load on loopback: {args.load} requests at {args.concurrency} concurrent connections (fixture engine, DECIDE path)\n")
        print("| requests/s | p50 | p99 | errors | server RSS: start / after 1,000 warm-up / after the run |")
        print("|---|---|---|---|---|")
        print(f"| {len(lat) / seconds:.0f} | {pct(lat, 50) * 1e3:.1f} ms | {pct(lat, 99) * 1e3:.1f} ms | {errors} | "
              f"{rss0:.1f} / {rss1:.1f} / {rss2:.1f} MB |")
    finally:
        srv.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--gen-tokens", type=int, default=16, help="tokens a generated answer may take, greedy, ending at EOS (default 16)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds on the default model (medians)")
    p.add_argument("--load", type=int, default=10_000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--share-n", type=int, default=2000, help="sequential requests for the gateway-share measurement")
    p.add_argument("--skip-llm", action="store_true")
    p.add_argument("--skip-fixture", action="store_true")
    args = p.parse_args(argv)
    print(f"# bench/decisions.py  ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f})")
    if not args.skip_fixture:
        bench_fixture(args)
    if not args.skip_llm:
        bench_llm(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
