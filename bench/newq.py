"""New questions on a known state (issue 23): what the default correction costs against ``x_debias: none`` and llama-server.

The *document workload*: one text the server already holds (``load.DOCUMENT``, read once before the
clock starts), asked questions it has not seen, one request after another on one connection. Two
sweeps, each request's questions new (their instructions open with the request's own number):

- **questions**: 1, 3, 8 and 16 questions a request (``decisions.QUESTIONS_16``: choices, nouls and
  scores of 2 to 5 options);
- **options**: one choice of 2, 26, 128 and 255 labels, each described by a sentence
  ("queue_17": "Tickets routed to queue 17.").

Each sweep is run twice: ``known options`` (the labels recur, only the instructions are new: the
recurring question of a real deployment, "Question 812. Which queue?") and ``new options`` (the labels
carry the request's number too, so no reading of an earlier request applies: the worst case).

Each server is sent its own questions (no reply comes from what another computed). Servers, measured
in turns request by request, so that the machine's load falls on all alike:
``serveproto serve`` with no ``x_debias`` (the server's default on the default model) and with
``x_debias: "none"``; and llama-server from the same sdist (``make -C engines llama-server``;
``load.PeerPrompts``: for each question one ``/completion`` of the prompt ``none`` scores,
``n_predict: 1, n_probs: 20``, the first-token read-out of llama-server-based servers; one slot, prompt
cache on). The table gives each cell's median seconds a request and positions computed a request
(ours: ``x_positions.computed``; llama-server: ``timings.prompt_n``), and the ratios the issue's goals
are written in: default / none (time and positions) and each of ours against llama-server's time.

    .venv/bin/python -m bench.newq [--reps 5] [--threads 2] [--sweeps questions,options]
        [--kinds known,new] [--no-llama-server] [--json PATH]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import anyio
import httpx2
import orjson

from bench.decisions import QUESTIONS_16
from bench.load import DOCUMENT, PeerPrompts
from bench.servers import LlamaServer, Server
from gateway.paths import default_model_path, engine_bin

QUESTION_COUNTS = (1, 3, 8, 16)
OPTION_COUNTS = (2, 26, 128, 255)


def questions_body(serial: int, n: int, new_options: bool) -> dict:
    """``n`` questions of :data:`QUESTIONS_16`, their instructions opened by ``Question <serial>.<k>``; with
    ``new_options`` a choice's labels (and a score's levels) end with the serial too."""
    out = {}
    for k, (qid, q) in enumerate(list(QUESTIONS_16.items())[:n]):
        q = {**q, "instructions": f"Question {serial}.{k}. {q['instructions']}"}
        if new_options and q["type"] == "choice":
            q["criteria"] = {f"{label} {serial}": desc for label, desc in q["criteria"].items()}
        elif new_options and q["type"] == "score":
            q["criteria"] = [f"{level} ({serial})" for level in q["criteria"]]
        out[qid] = q
    return {"state": DOCUMENT, "questions": out}


def options_body(serial: int, n: int, new_options: bool) -> dict:
    """One choice of ``n`` labels ``queue_<k>`` described ``Tickets routed to queue <k>.``; with
    ``new_options`` the labels carry the serial (``queue_<serial>_<k>``)."""
    tag = f"{serial}_" if new_options else ""
    criteria = {f"queue_{tag}{k}": f"Tickets routed to queue {k}." for k in range(n)}
    q = {"type": "choice", "instructions": f"Question {serial}. Which queue should take this ticket?"}
    return {"state": DOCUMENT, "questions": {"queue": {**q, "criteria": criteria}}}


async def ours(http: httpx2.AsyncClient, body: dict, debias: str | None) -> tuple[float, int]:
    """One ``/v1/systemone`` request: (seconds, positions computed). Raises ``RuntimeError`` for a reply
    that is not 200 with every answer."""
    sent = body if debias is None else {**body, "x_debias": debias}
    t = time.perf_counter()
    r = await http.post("/v1/systemone", content=orjson.dumps(sent), headers={"content-type": "application/json"})
    dt = time.perf_counter() - t
    if r.status_code != 200:
        raise RuntimeError(f"HTTP {r.status_code}: {r.content[:300]!r}")
    reply = orjson.loads(r.content)
    if set(reply["answers"]) != set(body["questions"]):
        raise RuntimeError(f"answers {sorted(reply['answers'])}")
    return dt, int(reply["x_positions"]["computed"])


async def peer(http: httpx2.AsyncClient, prompts: PeerPrompts, body: dict) -> tuple[float, int]:
    t = time.perf_counter()
    _, computed, _, _ = await prompts.ask(http, body, slot=0)
    return time.perf_counter() - t, computed


async def sweep(args, ours_base: str, peer_base: str | None, prompts: PeerPrompts | None) -> list[dict]:
    rows = []
    serial = 1000
    timeout = httpx2.Timeout(600.0)
    async with (
        httpx2.AsyncClient(base_url=ours_base, timeout=timeout) as mine,
        httpx2.AsyncClient(base_url=peer_base or ours_base, timeout=timeout) as theirs,
    ):
        # the document, read once by each (an unmeasured question)
        warm = {"state": DOCUMENT, "questions": {"warm": {"type": "noul", "instructions": "Is this about billing?"}}}
        await ours(mine, warm, None)
        await ours(mine, warm, "none")
        if prompts is not None:
            await peer(theirs, prompts, warm)
        for name in args.sweeps:
            counts, make = (QUESTION_COUNTS, questions_body) if name == "questions" else (OPTION_COUNTS, options_body)
            for kind in args.kinds:
                new = kind == "new"
                for n in counts:
                    cell = {"sweep": name, "kind": kind, "n": n, "default": [], "none": [], "peer": []}
                    if not new:  # the recurring labels' readings, once (a deployment's first request)
                        serial += 1
                        await ours(mine, make(4 * serial, n, False), None)
                    for _ in range(args.reps):
                        # each server its own questions, so that none answers from what another computed
                        serial += 1
                        cell["default"].append(await ours(mine, make(4 * serial, n, new), None))
                        cell["none"].append(await ours(mine, make(4 * serial + 1, n, new), "none"))
                        if prompts is not None:
                            cell["peer"].append(await peer(theirs, prompts, make(4 * serial + 2, n, new)))
                    rows.append(summarize(cell))
                    print(line(rows[-1]), flush=True)
    return rows


def summarize(cell: dict) -> dict:
    out = {k: cell[k] for k in ("sweep", "kind", "n")}
    for who in ("default", "none", "peer"):
        xs = cell[who]
        out[f"{who}_s"] = statistics.median(t for t, _ in xs) if xs else None
        out[f"{who}_computed"] = statistics.median(c for _, c in xs) if xs else None
    return out


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a is not None and b else "-"


HEAD = (
    "| sweep | options | n | default s | none s | peer s | default computed | none computed | peer computed "
    "| default / none (s) | default / none (computed) | default / peer (s) | none / peer (s) |"
)


def line(r: dict) -> str:
    def s(x):
        return f"{x:.3f}" if x is not None else "-"

    def c(x):
        return f"{x:.0f}" if x is not None else "-"

    return (
        f"| {r['sweep']} | {r['kind']} | {r['n']} | {s(r['default_s'])} | {s(r['none_s'])} | {s(r['peer_s'])} "
        f"| {c(r['default_computed'])} | {c(r['none_computed'])} | {c(r['peer_computed'])} "
        f"| {ratio(r['default_s'], r['none_s'])} | {ratio(r['default_computed'], r['none_computed'])} "
        f"| {ratio(r['default_s'], r['peer_s'])} | {ratio(r['none_s'], r['peer_s'])} |"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5, help="new requests per cell and server (default 5)")
    ap.add_argument("--threads", default="2", help="engine threads of both servers (default 2)")
    ap.add_argument("--sweeps", default="questions,options", help="questions and/or options")
    ap.add_argument("--kinds", default="known,new", help="known (recurring labels) and/or new")
    ap.add_argument("--no-llama-server", action="store_true", help="leave llama-server out")
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args(argv)
    args.sweeps = args.sweeps.split(",")
    args.kinds = args.kinds.split(",")
    if not set(args.sweeps) <= {"questions", "options"} or not set(args.kinds) <= {"known", "new"}:
        ap.error("--sweeps: questions,options; --kinds: known,new")
    model = default_model_path()
    srv = Server("--threads", args.threads)  # the default model, with its default x_debias
    llama = None
    try:
        prompts = None
        if not args.no_llama_server:
            binary = engine_bin("llama-server")
            if not binary.exists():
                raise SystemExit(f"missing {binary}: make -C engines llama-server (or --no-llama-server)")
            llama = LlamaServer(binary, model, int(args.threads) if args.threads != "auto" else 2, 1, 8192)
            prompts = PeerPrompts(model, 1)
        print(HEAD)
        print("|" + "---|" * 13)
        rows = anyio.run(sweep, args, srv.base, llama.base if llama else None, prompts)
    finally:
        srv.close()
        if llama is not None:
            llama.close()
    if args.json:
        args.json.write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
