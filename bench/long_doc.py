"""Long documents, side by side with llama-server (issue 45): cold reads and new questions on 2K- and 8K-token states.

For each document length and each number of other long states the server already holds (read before the
clock starts, one question each), and for 1, 3 and 8 yes/no questions:

- **cold**: a document neither server has read, with that many questions: ours is one ``POST
  /v1/systemone`` (the default correction: no ``x_debias``); llama-server's is one ``/completion`` a
  question (``load.PeerPrompts``: the prompt ``x_debias: "none"`` scores, ``n_predict: 1``, the
  first-token read-out of llama-server-based System One servers), the first reading the document and the
  others served from its prompt cache;
- **new**: as many new questions on that same document, right after.

The servers take turns request by request, so the machine's load falls on both alike; each (length,
others) cell gets a fresh ``serveproto serve`` (its own empty cache folder, as ``make serve`` writes one)
and a fresh llama-server (one slot, its context the document's plus room for the question). Documents are
ticket-like sentences cut to the length by llama-server's ``/tokenize``; every document and question is
new to both servers. Prints seconds for each cell, ours / llama-server (below 1: ours faster) and the
positions our engine computed (``x_positions.computed``) against llama-server's (``timings.prompt_n``).

    .venv/bin/python -m bench.long_doc [--lengths 2000,7500] [--others 0,4] [--questions 1,3,8]
        [--threads 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import anyio
import httpx2
import orjson

from bench.load import PeerPrompts
from bench.servers import LlamaServer, Server
from gateway.paths import default_model_path, engine_bin

SUBJECTS = "The invoice|My order|The refund|Our account|The courier|The support agent|The new router|The app".split("|")
EVENTS = (
    "was charged twice|arrived two weeks late|still has not been processed|keeps logging me out|"
    "lost the parcel|closed the ticket without an answer|drops the connection every hour|crashes on start"
).split("|")
FEELINGS = "I am annoyed.|Please fix this today.|This is the third time.|Thanks for looking.|We may cancel.".split("|")
ASKS = (
    "Is the customer angry?|Does the ticket mention money?|Should a manager answer it?|Is it about shipping?|"
    "Is the customer asking for a refund?|Is the product broken?|Is this urgent?|Will the customer cancel?|"
    "Is the tone polite?|Does it mention an account?|Is a phone call needed?|Is it a repeated complaint?"
).split("|")


def document_words(seed: int, n_sentences: int) -> str:
    rng = random.Random(seed)
    return " ".join(
        f"{rng.choice(SUBJECTS)} {rng.choice(EVENTS)} on day {rng.randrange(1, 400)}. {rng.choice(FEELINGS)}"
        for _ in range(n_sentences)
    )


def document(peer: str, seed: int, tokens: int) -> str:
    """A ticket-like text of about ``tokens`` tokens (the model's tokenizer, by llama-server's /tokenize)."""
    text = document_words(seed, tokens // 8 + 10)
    ids = httpx2.post(peer + "/tokenize", json={"content": text}, timeout=60).json()["tokens"]
    while len(ids) < tokens:
        text += " " + document_words(seed + 10_000, tokens // 8 + 10)
        ids = httpx2.post(peer + "/tokenize", json={"content": text}, timeout=60).json()["tokens"]
    return httpx2.post(peer + "/detokenize", json={"tokens": ids[:tokens]}, timeout=60).json()["content"]


def questions(tag: str, n: int) -> dict:
    """``n`` yes/no questions, new to both servers (their instructions carry ``tag``)."""
    return {f"q{i}": {"type": "noul", "instructions": f"({tag}, {i + 1}) {ASKS[i % len(ASKS)]}"} for i in range(n)}


def ours(client: httpx2.Client, base: str, state: str, qs: dict) -> tuple[float, int, float, str]:
    t = time.perf_counter()
    r = client.post(
        base + "/v1/systemone",
        content=orjson.dumps({"state": state, "questions": qs}),
        headers={"content-type": "application/json"},
    )
    dt = time.perf_counter() - t
    if r.status_code != 200:
        raise SystemExit(f"serveproto: HTTP {r.status_code}: {r.content[:300]!r}")
    reply = r.json()
    return (
        dt,
        int(reply["x_positions"]["computed"]),
        float(reply["x_engine_ms"]) / 1e3,
        reply["x_positions"]["snapshot"],
    )


def peer_ask(peer: PeerPrompts, base: str, state: str, qs: dict) -> tuple[float, int]:
    async def go() -> tuple[float, int]:
        async with httpx2.AsyncClient(base_url=base, timeout=1800) as http:
            t = time.perf_counter()
            _, computed, _, _ = await peer.ask(http, {"state": state, "questions": qs})
            return time.perf_counter() - t, computed

    return anyio.run(go)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="2000,7500", help="document lengths, tokens")
    ap.add_argument("--others", default="0,4", help="other long states read before the clock starts")
    ap.add_argument("--questions", default="1,3,8", help="questions a request")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-server", type=Path, default=engine_bin("llama-server"))
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = ap.parse_args(argv)
    if not args.llama_server.exists():
        print(f"missing {args.llama_server}: make -C engines llama-server", file=sys.stderr)
        return 2
    model = default_model_path()
    lengths = [int(x) for x in args.lengths.split(",")]
    others_list = [int(x) for x in args.others.split(",")]
    counts = [int(x) for x in args.questions.split(",")]
    prompts = PeerPrompts(model, 1)
    rows = []
    print(f"long documents: default model, {args.threads} threads; seconds, ours / llama-server; positions computed")
    print(
        f"{'tokens':>6} {'others':>6} {'kind':>5} {'q':>2}  {'ours s':>8} {'llama s':>8} {'ratio':>6}  {'ours pos':>8} {'llama pos':>9}  {'engine s':>8} snapshot"
    )
    seed = 0
    for length in lengths:
        for others in others_list:
            with tempfile.TemporaryDirectory() as cache:
                peer = LlamaServer(args.llama_server, model, args.threads, slots=1, ctx=min(length + 1024, 8192))
                server = Server("--threads", str(args.threads), "--cache-dir", cache)
                try:
                    with httpx2.Client(timeout=1800) as client:
                        for k in range(others):
                            seed += 1
                            ours(client, server.base, document(peer.base, seed, length), questions(f"other {k}", 1))
                        for n in counts:
                            seed += 1
                            state = document(peer.base, seed, length)
                            for kind in ("cold", "new"):
                                qs = questions(f"{kind} {seed}", n)
                                t_ours, p_ours, t_engine, snap = ours(client, server.base, state, qs)
                                t_peer, p_peer = peer_ask(prompts, peer.base, state, qs)
                                row = dict(
                                    tokens=length, others=others, kind=kind, questions=n,
                                    ours_s=t_ours, llama_s=t_peer, ours_positions=p_ours, llama_positions=p_peer,
                                    ours_engine_s=t_engine, snapshot=snap,
                                )  # fmt: skip
                                rows.append(row)
                                print(
                                    f"{length:>6} {others:>6} {kind:>5} {n:>2}  {t_ours:8.2f} {t_peer:8.2f} "
                                    f"{t_ours / t_peer:6.2f}  {p_ours:>8} {p_peer:>9}  {t_engine:8.2f} {snap}",
                                    flush=True,
                                )
                finally:
                    server.close()
                    peer.close()
    if args.json:
        args.json.write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
