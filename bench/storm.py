"""A storm of departed clients (issue 30, item 1): a live request's latency while others leave mid-request.

``--leavers`` clients (default 16) each send ``--rounds`` requests (default 1; 0: over and over until
``--seconds`` have passed) of 16 questions the server has not seen (each needs its content-free
reading under the default correction), hanging up on each after ``--leave-after`` seconds (default
0.1). Meanwhile, for ``--seconds``, one live client asks one new
question at a time on another ticket and waits for its answers. The live request's latency alone
(before the storm, the same kind of request) and during the storm are printed, with their ratio (the
issue's goal: at most 5x). Until the content-free reading moved into the question's own SCORE (and
stopped being shielded from cancellation), departed clients' readings kept the engine busy for
minutes: a 0.17 s request waited 103 s.

    .venv/bin/python -m bench.storm [--leavers 16] [--leave-after 0.1] [--seconds 20] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import anyio
import httpx2
import orjson

from bench.decisions import QUESTIONS_16, TICKET
from bench.servers import Server


def body(state: str, serial: int, n: int) -> bytes:
    qs = {
        f"{qid}_{serial}": {**q, "instructions": f"Question {serial}. {q['instructions']}"}
        for qid, q in list(QUESTIONS_16.items())[:n]
    }
    return orjson.dumps({"state": state, "questions": qs})


async def post(http: httpx2.AsyncClient, data: bytes) -> float:
    t = time.perf_counter()
    r = await http.post("/v1/systemone", content=data, headers={"content-type": "application/json"})
    r.raise_for_status()
    return time.perf_counter() - t


async def run(args, base: str) -> dict:
    live_state = "Ticket L. " + TICKET
    serial = iter(range(1, 10**9))
    async with httpx2.AsyncClient(base_url=base, timeout=600) as live:
        await post(live, body(live_state, next(serial), 1))  # the live ticket's state, read once
        alone = [await post(live, body(live_state, next(serial), 1)) for _ in range(args.alone)]
        during: list[float] = []
        left = 0

        async def leaver(k: int) -> None:
            nonlocal left
            state = f"Ticket S{k}. " + TICKET
            async with httpx2.AsyncClient(base_url=base, timeout=args.leave_after) as http:
                sent = 0
                while time.perf_counter() < stop and (args.rounds == 0 or sent < args.rounds):
                    sent += 1
                    try:
                        await post(http, body(state, next(serial), 16))
                    except httpx2.TimeoutException:
                        left += 1

        async def asker() -> None:
            await anyio.sleep(args.leave_after * 3)
            while time.perf_counter() < stop:
                during.append(await post(live, body(live_state, next(serial), 1)))

        stop = time.perf_counter() + args.seconds
        async with anyio.create_task_group() as tg:
            for k in range(args.leavers):
                tg.start_soon(leaver, k)
            tg.start_soon(asker)
    return {"alone": alone, "during": during, "left": left}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--leavers", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=1, help="requests per leaver (0: until --seconds)")
    ap.add_argument("--leave-after", type=float, default=0.1, help="seconds before a leaver hangs up")
    ap.add_argument("--seconds", type=float, default=10.0, help="how long the live client asks (default 10)")
    ap.add_argument("--alone", type=int, default=5, help="live requests measured before the storm")
    ap.add_argument("--threads", default="2")
    args = ap.parse_args(argv)
    srv = Server("--threads", args.threads)  # the default model, with its default x_debias
    try:
        out = anyio.run(run, args, srv.base)
    finally:
        srv.close()
    a, d = statistics.median(out["alone"]), out["during"]
    print(f"leavers {args.leavers}, hanging up after {args.leave_after} s, {out['left']} requests left")
    print(f"live request alone: median {a:.3f} s over {len(out['alone'])}")
    if d:
        print(
            f"live request during the storm: median {statistics.median(d):.3f} s, max {max(d):.3f} s over {len(d)}; "
            f"median / alone {statistics.median(d) / a:.2f}, max / alone {max(d) / a:.2f}"
        )
    else:
        print("live request during the storm: none answered")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
