"""Bursts on one document: ``--clients`` requests sent at once, ``--rounds`` times, each round waiting for all.

The server first answers one request on the document (``bench/load.py``'s :data:`load.DOCUMENT`, one
question): the engine holds its state on one slot, and the gateway has seen it but holds no snapshot of it
yet (a single-question request pins a state only the second time it comes). Each round then sends
``--clients`` requests at once, each one new question on the document (``load.document_body``), and
prints the round's wall time, its requests' p50 and slowest latency, and the positions each computed. The
first round is where the state's snapshot is taken: until then its requests wait for the slot that holds
the state, and once it exists they take every free slot (``gateway.engine.slots``). Before that fix the
queued ones kept waiting for that one slot and were answered one a decode.

    .venv/bin/python -m bench.burst [--clients 32] [--rounds 3] [--serve-args '--model M --slots 32 ...']

The server's environment is this process's (e.g. ``SERVEPROTO_TEST_DEVICE_US_ROW`` and the pipeline's
variables, as ``bench/late_fill_cpu.sh`` sets them).
"""

from __future__ import annotations

import argparse
import shlex
import time

import anyio
import httpx2

from bench.decisions import pct
from bench.load import Target, document_body, http_client
from bench.servers import Server


async def ask(target: Target, http: httpx2.AsyncClient, serial: int) -> tuple[float, int]:
    """One request on the document (``load.Target.ask``: ``x_debias: "none"``, every answer checked); returns
    (seconds, positions computed)."""
    t = time.perf_counter()
    _, computed, _, _ = await target.ask(http, document_body(serial))
    return time.perf_counter() - t, computed


async def one(target: Target, http: httpx2.AsyncClient, serial: int, got: list[tuple[float, int]]) -> None:
    got.append(await ask(target, http, serial))


async def rounds(base: str, clients: int, n_rounds: int) -> list[str]:
    target = Target("this tree", base, "none", 0)
    https = [http_client(base, 600) for _ in range(clients)]
    lines = []
    try:
        await ask(target, https[0], 1)  # the document's state on one slot, seen once
        for k in range(n_rounds):
            got: list[tuple[float, int]] = []
            t0 = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for i, http in enumerate(https):
                    tg.start_soon(one, target, http, 1000 * (k + 1) + i, got)
            wall = time.perf_counter() - t0
            lat = [s for s, _ in got]
            lines.append(
                f"| {k + 1} | {wall:.3f} | {pct(lat, 50) * 1e3:.1f} | {max(lat) * 1e3:.1f} "
                f"| {sum(c for _, c in got) / len(got):.1f} |"
            )
    finally:
        for http in https:
            await http.aclose()
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=32, help="requests sent at once a round (default 32)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    ap.add_argument("--serve-args", default="", help="`serve` flags, one string (default: the default model)")
    args = ap.parse_args()
    server = Server(*shlex.split(args.serve_args))
    try:
        lines = anyio.run(rounds, server.base, args.clients, args.rounds)
    finally:
        server.close()
    print(f"`bench/burst.py --clients {args.clients} --rounds {args.rounds} --serve-args '{args.serve_args}'`\n")
    print("| round | wall s | p50 ms | slowest ms | computed a request |")
    print("|---|---|---|---|---|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
