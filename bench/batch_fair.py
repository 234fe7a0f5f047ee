"""A single request's latency while a 1,000-state batch runs, against its latency alone (issue 50, item 1).

One server (``--serve-args``; default: the fixture engine, 4 slots, each SCORE held ``20 ms`` a group).
First ``--singles`` single requests one after another on an idle server (alone); then ``POST
/v1/systemone/batch`` with ``--states`` states, and while it runs the same number of single requests, one
after another (during the batch); then, side by side, the same states sent as that many single requests at
once (what a client without the batch route does: a flood), with single requests measured during it too.
Every state is new (cold), long and different from its first bytes (two short tickets share most of their
prompt, and the slot router keeps such affine requests on one slot). Prints the p50 and the slowest of each,
their ratio to alone, and the batch's and the flood's states a second.

    .venv/bin/python -m bench.batch_fair [--states 1000] [--singles 20] [--no-flood] [--serve-args '--engine ... ']
"""

from __future__ import annotations

import argparse
import random
import shlex
import time

import anyio
import httpx2
import orjson

from bench import ROOT
from bench.decisions import pct
from bench.servers import Server

QUESTIONS = {
    "urgent": {"type": "noul", "instructions": "Is it urgent?"},
    "team": {"type": "choice", "instructions": "Who handles it?", "criteria": {"billing": None, "support": None}},
}
WORDS = "invoice refund login error printer contract renewal outage password delivery late broken screen".split()
DEFAULT_SERVE = f"--engine {ROOT / 'engines/bin/serveproto-fixture'} --slots 4 --score-delay-ms 20"


def state(tag: str, i: int) -> str:
    """A new ticket of about 40 words, its first bytes its own."""
    rng = random.Random(f"{tag}{i}")
    return f"{tag}{i:05d}: " + " ".join(rng.choice(WORDS) for _ in range(40))


async def single(c: httpx2.AsyncClient, text: str) -> float:
    """One ``/v1/systemone`` request; its seconds (a non-200 ends the bench)."""
    t = time.perf_counter()
    r = await c.post("/v1/systemone", content=orjson.dumps({"state": text, "questions": QUESTIONS}))
    if r.status_code != 200:
        raise SystemExit(f"single request: {r.status_code} {r.text[:300]}")
    return time.perf_counter() - t


async def singles_while(c: httpx2.AsyncClient, tag: str, n: int, running: anyio.Event) -> list[float]:
    """Up to ``n`` single requests one after another, while ``running`` is not set (the first after 0.5 s)."""
    await anyio.sleep(0.5)
    out = []
    for i in range(n):
        if running.is_set():
            break
        out.append(await single(c, state(tag, i)))
    return out


async def bench(base: str, n_states: int, n_singles: int, flood: bool) -> list[str]:
    """The table's rows, printed as each is measured, then the batch's (and the flood's) rate."""
    alone: list[float] = []

    def row(name: str, xs: list[float]) -> str:
        a50 = pct(alone, 50)
        if not xs:
            return f"| {name} | 0 | - | - | - | - |"
        return (
            f"| {name} | {len(xs)} | {pct(xs, 50) * 1e3:.1f} | {max(xs) * 1e3:.1f} "
            f"| {pct(xs, 50) / a50:.2f}x | {max(xs) / a50:.2f}x |"
        )

    print("| single requests | n | p50 ms | slowest ms | p50 / alone p50 | slowest / alone p50 |", flush=True)
    print("|---|---|---|---|---|---|", flush=True)
    limits = httpx2.Limits(max_connections=n_states + 8)
    async with httpx2.AsyncClient(base_url=base, timeout=3600, limits=limits) as c:
        await single(c, state("warm", 0))
        alone += [await single(c, state("alone", i)) for i in range(n_singles)]

        got: dict[str, object] = {}

        async def run_batch(done: anyio.Event) -> None:
            t = time.perf_counter()
            items = [{"state": state("batch", i)} for i in range(n_states)]
            body = {"questions": QUESTIONS, "items": items}
            r = await c.post("/v1/systemone/batch", content=orjson.dumps(body))
            got["batch_s"] = time.perf_counter() - t
            if r.status_code != 200 or len(r.json()["items"]) != n_states:
                raise SystemExit(f"batch: {r.status_code} {r.text[:300]}")
            done.set()

        print(row("alone", alone), flush=True)
        done = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_batch, done)
            during = await singles_while(c, "during", n_singles, done)
        print(row(f"during a {n_states}-state batch", during), flush=True)
        if not flood:
            return [f"batch: {n_states} states in {got['batch_s']:.2f} s ({n_states / got['batch_s']:.1f} states/s)"]  # type: ignore[operator]

        async def run_flood(done: anyio.Event) -> None:
            t = time.perf_counter()
            async with anyio.create_task_group() as flood:
                for i in range(n_states):
                    flood.start_soon(single, c, state("flood", i))
            got["flood_s"] = time.perf_counter() - t
            done.set()

        done = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_flood, done)
            flooded = await singles_while(c, "flooded", n_singles, done)

    print(row(f"during {n_states} single requests at once", flooded), flush=True)
    batch_s, flood_s = float(got["batch_s"]), float(got["flood_s"])  # type: ignore[arg-type]
    return [
        f"batch: {n_states} states in {batch_s:.2f} s ({n_states / batch_s:.1f} states/s); "
        f"{n_states} single requests at once: {flood_s:.2f} s ({n_states / flood_s:.1f} states/s)",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--states", type=int, default=1000, help="states in the batch (default 1000)")
    ap.add_argument("--singles", type=int, default=20, help="single requests measured each time (default 20)")
    ap.add_argument("--serve-args", default=DEFAULT_SERVE, help="`serve` flags, one string (default: the fixture)")
    ap.add_argument("--no-flood", action="store_true", help="skip the flood of single requests")
    args = ap.parse_args()
    print(f"serve {args.serve_args}", flush=True)
    server = Server("--max-inflight", str(args.states + 64), *shlex.split(args.serve_args))
    try:
        lines = anyio.run(bench, server.base, args.states, args.singles, not args.no_flood)
    finally:
        server.close()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
