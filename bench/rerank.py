"""``POST /v1/rerank`` on the default model: ranking quality against BM25 and the raw reading, and its cost.

The labelled set is built by rules (:func:`labelled_set`): fictional towns (so the model
cannot answer from memory, only from the document) and five facts about each. A query asks
one fact of one town; its 10 candidates, shuffled with a fixed seed, are graded

- 2: the answer, worded apart from the query ("How many people live in X?" is answered by
  "X has 42,000 residents."), so a lexical match finds the town, not the fact;
- 1: another fact about the same town (on topic, not the answer);
- 0: the same fact about three other towns in the query's own words (the lexical trap), the
  answer's wording about another town, and two unrelated facts.

Quality: nDCG@10 (gain ``2^grade - 1``, Järvelin and Kekäläinen 2002) and MRR of the grade-2
document, per reading: BM25 (``rank_bm25.BM25Okapi`` over the set's distinct documents,
lowercased word tokens), ``/v1/rerank`` under ``x_debias`` ``none`` (the raw reading: P(yes)
from the one-spelling logprobs of yes and no) and under each correction. Each query is one
``/v1/rerank`` request on one in-process server (score cache on: readings that share a prompt
are read once).

Cost (``--cost N``: the first N queries, a fresh server each with the score cache off, the
server's default corrections): positions computed per document and seconds per document, for

- ``/v1/rerank``: one request per query, the query first (its prompt shared, computed once);
- ``/v1/systemone``, query first: one request per query, the same prompts as nouls (the route adds nothing);
- ``/v1/systemone``, document first: one request per document, the document as the state
  and the query in the question (how a client ranks through ``/v1/systemone`` one document at a time).

The document-first requests carry the same words in the other order
(:data:`gateway.decision.rerank.DOCUMENT_FIRST_STATE`), so their scores differ; both orders'
quality is printed.

    .venv/bin/python -m bench.rerank [--queries N] [--cost N] [--threads T]

Positions are exact; seconds move with the machine's load (measured side by side in one run).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import random
import re
import time

import anyio
import httpx2
import orjson

from gateway.decision import rerank

TOWNS = [
    "Varnholm",
    "Kestrel Bay",
    "Oszenburg",
    "Maddow Cross",
    "Telliran",
    "Brisk Hollow",
    "Quennet",
    "Harrowgate Vale",
    "Lomond Reach",
    "Ystrel",
    "Caddisford",
    "Pellinor",
]
RIVERS = ["Dwyn", "Arlow", "Mesk", "Tarrant", "Ouse-Lin", "Vell", "Corran", "Ebbe", "Sallow", "Idre", "Fenn", "Rask"]
MAYORS = [
    "Ilse Marten",
    "Tomas Vey",
    "Oona Black",
    "Piet Arlen",
    "Rhea Lund",
    "Casimir Holt",
    "Nadia Orr",
    "Evert Sand",
    "Mira Kell",
    "Jonas Pryde",
    "Lotte Fane",
    "Aurel Dunn",
]
EXPORTS = ["copper wire", "wool", "apples", "glassware", "timber", "cheese", "paper", "salt", "ceramics", "rope",
           "honey", "bicycles"]  # fmt: skip

#: fact -> (query, the answer's own wording, the query's wording as a statement)
FACTS = {
    "population": (
        "What is the population of {t}?",
        "{t} has {v} residents.",
        "The population of {o} is {v}.",
    ),
    "river": (
        "Which river flows through {t}?",
        "The {v} winds past the old quarter of {t}.",
        "The river that flows through {o} is the {v}.",
    ),
    "founded": (
        "When was {t} founded?",
        "{t} dates back to {v}, when its first houses were built.",
        "{o} was founded in {v}.",
    ),
    "mayor": (
        "Who is the mayor of {t}?",
        "{v} has led the town council of {t} since the last election.",
        "The mayor of {o} is {v}.",
    ),
    "export": (
        "What does {t} export?",
        "Most goods that leave {t} for other countries are {v}.",
        "{o} exports {v}.",
    ),
}


def value(fact: str, town: int) -> str:
    """The fact's value for a town (fixed by rule)."""
    if fact == "population":
        return f"{(town * 7919) % 90 + 10},{(town * 373) % 900 + 100}"
    if fact == "river":
        return RIVERS[town]
    if fact == "founded":
        return str(1200 + (town * 61) % 700)
    if fact == "mayor":
        return MAYORS[town]
    return EXPORTS[town]


def labelled_set(n_towns: int = 12, seed: int = 7) -> list[dict]:
    """``[{"query", "documents": [str] * 10, "grades": [int] * 10}]``: one query per (town, fact) (module doc)."""
    rng = random.Random(seed)
    out = []
    facts = list(FACTS)
    for t in range(n_towns):
        for f in facts:
            q, answer, literal = FACTS[f]
            others = [o for o in range(n_towns) if o != t]
            rng.shuffle(others)
            docs: list[tuple[str, int]] = [(answer.format(t=TOWNS[t], v=value(f, t)), 2)]
            for g in [x for x in facts if x != f][:3]:  # same town, other facts, in the statement's wording
                docs.append((FACTS[g][2].format(o=TOWNS[t], v=value(g, t)), 1))
            for o in others[:3]:  # the lexical trap: the query's words about another town
                docs.append((literal.format(o=TOWNS[o], v=value(f, o)), 0))
            docs.append((answer.format(t=TOWNS[others[3]], v=value(f, others[3])), 0))
            for o in others[4:6]:  # unrelated: another town, another fact
                g = rng.choice([x for x in facts if x != f])
                docs.append((FACTS[g][1].format(t=TOWNS[o], v=value(g, o)), 0))
            rng.shuffle(docs)
            out.append(
                {"query": q.format(t=TOWNS[t]), "documents": [d for d, _ in docs], "grades": [g for _, g in docs]}
            )
    return out


def ndcg_at(grades: list[int], order: list[int], k: int = 10) -> float:
    """nDCG@k of ranking ``order`` (document indices, best first) under graded ``grades`` (gain 2^g - 1)."""
    dcg = sum((2 ** grades[i] - 1) / math.log2(r + 2) for r, i in enumerate(order[:k]))
    ideal = sum((2**g - 1) / math.log2(r + 2) for r, g in enumerate(sorted(grades, reverse=True)[:k]))
    return dcg / ideal


def reciprocal_rank(grades: list[int], order: list[int]) -> float:
    """1 / the rank of the first grade-2 document."""
    return next(1.0 / (r + 1) for r, i in enumerate(order) if grades[i] == 2)


def ranked(scores: list[float]) -> list[int]:
    """Indices by score from the highest, ties in the documents' order (as ``/v1/rerank`` sorts)."""
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))


def words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def bm25_orders(data: list[dict]) -> list[list[int]]:
    """Each query's candidates ranked by BM25 (Okapi, rank_bm25's defaults k1=1.5, b=0.75) over the set's distinct documents."""
    from rank_bm25 import BM25Okapi

    corpus = sorted({d for item in data for d in item["documents"]})
    at = {d: i for i, d in enumerate(corpus)}
    bm = BM25Okapi([words(d) for d in corpus])
    out = []
    for item in data:
        s = bm.get_scores(words(item["query"]))
        out.append(ranked([float(s[at[d]]) for d in item["documents"]]))
    return out


@contextlib.asynccontextmanager
async def serving(*argv: str):
    """``serveproto serve`` in-process on a free port (the default model unless ``argv`` says); yields the URL."""
    from gateway.cli import build_parser
    from gateway.cli.serve import serve

    args = build_parser().parse_args(["serve", "--port", "0", "--log-level", "WARNING", *argv])
    async with anyio.create_task_group() as tg:
        port = await tg.start(lambda task_status: serve(args, task_status=task_status))
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            tg.cancel_scope.cancel()


async def post(c: httpx2.AsyncClient, path: str, body: dict) -> dict:
    r = await c.post(path, content=orjson.dumps(body), headers={"content-type": "application/json"})
    if r.status_code != 200:
        raise RuntimeError(f"{path}: {r.status_code} {r.text[:300]}")
    return r.json()


def scores_of(reply: dict, n: int) -> list[float]:
    s = [0.0] * n
    for x in reply["results"]:
        s[x["index"]] = x["relevance_score"]
    return s


#: The readings compared: (name, x_debias).
READINGS = [
    ("raw (x_debias none)", "none"),
    ("spellings", "spellings"),
    ("cyclic", "cyclic"),
    ("spellings, cyclic", "spellings,cyclic"),
    ("cyclic, content_free_listing", "cyclic,content_free_listing"),
    (
        "the server's default for decisions (canonical, spellings, content_free_listing)",
        "canonical,spellings,content_free_listing",
    ),
    ("the route's default (cyclic, content_free_listing)", None),
]


async def quality(data: list[dict], threads: int) -> list[tuple[str, float, float]]:
    rows = []
    for name, orders in [("BM25 (rank_bm25 Okapi)", bm25_orders(data))]:
        rows.append((name, *_means(data, orders)))
    async with serving("--threads", str(threads)) as base:
        async with httpx2.AsyncClient(base_url=base, timeout=600) as c:
            for name, methods in READINGS:
                orders = []
                for item in data:
                    body = {"query": item["query"], "documents": item["documents"]}
                    if methods is not None:
                        body["x_debias"] = methods
                    orders.append(ranked(scores_of(await post(c, "/v1/rerank", body), len(item["documents"]))))
                rows.append((f"/v1/rerank, {name}", *_means(data, orders)))
            # the other order, through /v1/systemone one document a request, under the route's default
            methods = ",".join(rerank.DEFAULT_DEBIAS)
            orders = []
            for item in data:
                s = [
                    (await post(c, "/v1/systemone", document_first(item["query"], d, methods)))["answers"]["r"]["noul"]
                    for d in item["documents"]
                ]
                orders.append(ranked(s))
            rows.append((f"/v1/systemone document first, {methods}", *_means(data, orders)))
    return rows


def _means(data: list[dict], orders: list[list[int]]) -> tuple[float, float]:
    n = [ndcg_at(item["grades"], o) for item, o in zip(data, orders)]
    m = [reciprocal_rank(item["grades"], o) for item, o in zip(data, orders)]
    return sum(n) / len(n), sum(m) / len(m)


#: The cost table's rows: (path, x_debias), every request of a row sent under it.
COST_ROWS = [
    ("/v1/rerank", ",".join(rerank.DEFAULT_DEBIAS)),
    ("/v1/rerank", "none"),
    ("/v1/systemone query first", ",".join(rerank.DEFAULT_DEBIAS)),
    ("/v1/systemone document first", ",".join(rerank.DEFAULT_DEBIAS)),
    ("/v1/systemone document first", "none"),
]


def document_first(query: str, document: str, methods: str) -> dict:
    """The ``/v1/systemone`` body that asks one document's relevance with the document as the state."""
    q = {"type": "noul", "instructions": rerank.DOCUMENT_FIRST_QUESTION.format(query=query)}
    return {"state": rerank.DOCUMENT_FIRST_STATE.format(document=document), "questions": {"r": q}, "x_debias": methods}


async def cost(data: list[dict], threads: int) -> list[tuple[str, str, int, float, float]]:
    """(path, x_debias, documents, positions computed per document, seconds per document), each row on a
    fresh server with the score cache off."""
    out = []
    n_docs = sum(len(item["documents"]) for item in data)
    for path, methods in COST_ROWS:
        async with serving("--threads", str(threads), "--score-cache-mb", "0") as base:
            async with httpx2.AsyncClient(base_url=base, timeout=600) as c:
                computed = 0
                t0 = time.perf_counter()
                for item in data:
                    q, docs = item["query"], item["documents"]
                    if path == "/v1/rerank":
                        replies = [await post(c, path, {"query": q, "documents": docs, "x_debias": methods})]
                    elif path == "/v1/systemone query first":
                        qs = {
                            str(i): {"type": "noul", "instructions": rerank.QUESTION.format(document=d)}
                            for i, d in enumerate(docs)
                        }
                        body = {"state": rerank.QUERY.format(query=q), "questions": qs, "x_debias": methods}
                        replies = [await post(c, "/v1/systemone", body)]
                    else:
                        replies = [await post(c, "/v1/systemone", document_first(q, d, methods)) for d in docs]
                    computed += sum(r["x_positions"]["computed"] for r in replies)
                seconds = time.perf_counter() - t0
        out.append((path, methods, n_docs, computed / n_docs, seconds / n_docs))
    return out


async def main(args: argparse.Namespace) -> None:
    data = labelled_set()[: args.queries]
    print(f"{len(data)} queries x 10 documents (grades 2/1/0: {sum(g == 2 for x in data for g in x['grades'])} / "
          f"{sum(g == 1 for x in data for g in x['grades'])} / {sum(g == 0 for x in data for g in x['grades'])})")  # fmt: skip
    if args.cost:
        print("\n| path | x_debias | documents | positions computed / document | ms / document |")
        print("|---|---|---|---|---|")
        for path, methods, n, pos, sec in await cost(data[: args.cost], args.threads):
            print(f"| {path} | {methods} | {n} | {pos:.1f} | {sec * 1e3:.1f} |")
    if not args.no_quality:
        print("\n| reading | nDCG@10 | MRR |\n|---|---|---|")
        for name, ndcg, mrr in await quality(data, args.threads):
            print(f"| {name} | {ndcg:.3f} | {mrr:.3f} |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--queries", type=int, default=60, help="queries of the labelled set (12 towns x 5 facts: 60)")
    ap.add_argument("--cost", type=int, default=10, help="queries of the cost table (0: none)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-quality", action="store_true", help="the cost table only")
    anyio.run(main, ap.parse_args())
