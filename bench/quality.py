"""Decision quality on labelled questions, per prompt format and correction, in one run.

Asks the labelled requests of :mod:`gateway.lab.evalset` (the generated set, or
``--data FILE``, a user's labelled JSONL) on the llama engine and prints, per
configuration (:data:`CONFIGS`: a :class:`gateway.decision.readings.Method`, plus
batch calibration or PriDe for two of them), one table row:

- accuracy (all questions; nouls, choices and scores apart; the nouls of
  mostly-"no" tasks and of mostly-"yes" tasks apart, each beside its majority
  baseline, the accuracy of always answering the group's majority), the share
  of nouls answered yes beside the gold share, macro-F1 (per task, averaged);
- ECE (top label, 10 equal-mass bins) with its noise floor (the mean ECE of
  a perfectly calibrated model with the same confidences, by bootstrap),
  Brier and NLL (:mod:`gateway.lab.evaluation`);
- option-order stability over choices: each choice task is asked under 3
  orders of its labels (any permutations, drawn so that they are not all
  rotations of one another; both orders for two labels): the share of
  questions whose answer changes, and the mean Jensen-Shannon divergence
  (bits) between the orders' probabilities;
- question-order invariance: every ``--qorder-every``-th request asked again
  with its questions reversed, read afresh: the share of answers that change
  and the mean largest probability change;
- cost: positions computed a request and seconds a request, measured by
  serving ``--cost-requests`` requests per domain through the server's own
  path (:func:`gateway.decision.pipeline.decide` over the same engine and
  prompts, ``x_debias`` set to the configuration; the engine's score cache off), state cold, content-free
  readings remembered after the first request (that first request is the "first" column); and each
  later request asked again on its state with new instructions (``Question <k>.`` before each): new
  questions on a known state and known options, the issue's document workload ("new questions").

``--nouls`` also reads every noul with yes or no listed first, one spelling or every spelling summed,
raw, against "N/A" under its own or the default instructions, and batch-calibrated
(:func:`noul_variants`: why the nouls answer as they do).

The quality columns are computed from the reads the server's path would make
(:func:`gateway.decision.readings.plan` and :func:`~gateway.decision.readings.content_free_plan`, the
same prompts), each distinct read made
once through ``Engine.score`` on the request's state and shared by every
configuration that needs it, then combined by the server's functions
(:mod:`gateway.decision.readings`); the cost requests check that serving the same
requests gives the same probabilities (the largest difference is printed: on
quantized weights a reading's last digits depend on the engine's batch).
Batch calibration uses each task's batch under one order (Zhou et al. 2024's
test batch); PriDe estimates its place prior on a task's first
``ceil(0.1 n)`` requests (at least 2) read under every rotation (answered by
those rotations) and divides it out of the others' single read.

    .venv/bin/python -m bench.quality [--subset N] [--data FILE] [--cache FILE] [--readme]

Positions are exact; seconds move with the machine's load.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import random
import subprocess
import time
from pathlib import Path

import anyio
import attrs
import orjson

from gateway.decision import debias, pipeline, readings, schema, scoring
from gateway.decision.arithmetic import softmax
from gateway.decision.readings import Method
from gateway.lab import evalset, evaluation

#: (name, method, stateful correction or None). The first row is the letter read-out of
#: llama-server-based System One servers; "listed" is today's prompt.
CONFIGS = [
    ("letters (peer baseline)", Method("letters"), None),
    ("listed (x_debias none)", Method(), None),
    ("listed + content_free", Method(content_free=True), None),
    ("listed + cyclic", Method(cyclic=True), None),
    ("listed + cyclic + content_free (default until now)", Method(cyclic=True, content_free=True), None),
    ("listed + batch calibration", Method(), "batch"),
    ("listed + PriDe", Method(), "pride"),
    ("canonical", Method(canonical=True), None),
    ("canonical + content_free", Method(canonical=True, content_free=True), None),
    ("canonical + cyclic", Method(canonical=True, cyclic=True), None),
    ("canonical + cyclic + content_free", Method(canonical=True, cyclic=True, content_free=True), None),
    ("canonical + batch calibration", Method(canonical=True), "batch"),
    ("canonical + content_free_listing", Method(canonical=True, content_free=True, listing_only=True), None),
    ("canonical + content_free + batch calibration", Method(canonical=True, content_free=True), "batch"),
    (
        "canonical + content_free_listing + batch calibration",
        Method(canonical=True, content_free=True, listing_only=True),
        "batch",
    ),
    ("canonical + spellings + content_free", Method(canonical=True, content_free=True, spellings=True), None),
    (
        "canonical + spellings + content_free_listing",
        Method(canonical=True, content_free=True, listing_only=True, spellings=True),
        None,
    ),
    (
        "canonical + spellings + content_free_listing + batch calibration",
        Method(canonical=True, content_free=True, listing_only=True, spellings=True),
        "batch",
    ),
    ("canonical + PriDe", Method(canonical=True), "pride"),
    ("letters, canonical order", Method("letters", canonical=True), None),
    ("letters, canonical order + content_free", Method("letters", canonical=True, content_free=True), None),
    ("cloze", Method("cloze"), None),
    ("cloze + content_free (PMI)", Method("cloze", content_free=True), None),
    ("cloze + batch calibration", Method("cloze"), "batch"),
]

CONFIGS_ALL = list(CONFIGS)

#: The rows of bench/results/NOTEBOOK.md's table (``--configs readme``): the peer's read-out, raw, the default
#: before and after issue 23, and the corrections that compute nothing extra, alone and with content-free.
README_ROWS = [
    "letters (peer baseline)",
    "listed (x_debias none)",
    "canonical",
    "canonical + content_free",
    "canonical + content_free_listing",
    "canonical + spellings + content_free",
    "canonical + spellings + content_free_listing",
    "canonical + batch calibration",
    "canonical + content_free + batch calibration",
    "canonical + content_free_listing + batch calibration",
    "canonical + spellings + content_free_listing + batch calibration",
]

PASSES = 3

#: The columns ``--reuse`` takes from an earlier run: those that need the engine beyond the cached reads.
REUSED = ("positions", "first", "newq", "seconds", "served_diff", "qorder_changed", "qorder_moved", "qorder_n")
README_START = "<!-- bench/quality.py table: start -->"
README_END = "<!-- bench/quality.py table: end -->"


# --- the questions under each order ----------------------------------------------------------------


def is_rotation(a: tuple, b: tuple) -> bool:
    """Whether order ``b`` is a cyclic rotation of order ``a``."""
    n = len(a)
    return any(tuple(a[r:] + a[:r]) == tuple(b) for r in range(n))


def orders(labels: list[str], rng: random.Random, k: int = PASSES) -> list[list[str]]:
    """``k`` distinct random orders of ``labels``, not all rotations of the first (so that cyclic
    reads are tested on other orders too); both orders (the first again for the rest) for two labels."""
    n = len(labels)
    if n == 2:
        first = labels[:] if rng.random() < 0.5 else labels[::-1]
        return [first, first[::-1]] + [first] * (k - 2)
    while True:
        out: list[list[str]] = []
        while len(out) < k:
            o = labels[:]
            rng.shuffle(o)
            if o not in out:
                out.append(o)
        if n < 3 or any(not is_rotation(tuple(out[0]), tuple(o)) for o in out[1:]):
            return out


def task_key(item: evalset.Labelled, qid: str) -> str:
    """The task of a question, with its criteria: requests of one task share its corrections."""
    q = item.body["questions"][qid]
    return (
        item.tasks[qid]
        + "\x00"
        + orjson.dumps([q.get("type"), q.get("instructions"), q.get("criteria")], option=orjson.OPT_SORT_KEYS).decode()
    )


def pass_bodies(items: list[evalset.Labelled], seed: int) -> tuple[list[list[dict]], list[list[dict[str, int]]]]:
    """Per pass, per request: the body with each choice's labels in that pass's order, and the gold
    index in that order. Orders are drawn per task (every request of a task shares them)."""
    rng = random.Random(seed)
    by_task: dict[str, list[list[str]]] = {}
    for item in items:
        for qid, q in item.body["questions"].items():
            key = task_key(item, qid)
            if q["type"] == "choice" and key not in by_task:
                by_task[key] = orders(list(q["criteria"]), rng)
    bodies: list[list[dict]] = [[] for _ in range(PASSES)]
    golds: list[list[dict[str, int]]] = [[] for _ in range(PASSES)]
    for item in items:
        for p in range(PASSES):
            qs, gold = {}, {}
            for qid, q in item.body["questions"].items():
                if q["type"] == "choice":
                    order = by_task[task_key(item, qid)][p]
                    q = {**q, "criteria": {lab: q["criteria"][lab] for lab in order}}
                    if qid in item.gold:
                        gold[qid] = order.index(list(item.body["questions"][qid]["criteria"])[item.gold[qid]])
                elif qid in item.gold:
                    gold[qid] = item.gold[qid]
                qs[qid] = q
            bodies[p].append({**item.body, "questions": qs})
            golds[p].append(gold)
    return bodies, golds


# --- reading ----------------------------------------------------------------------------------


class Reader:
    """Every distinct read (prefix, stem, scored texts) made once through ``Engine.score``; kept in ``cache``."""

    def __init__(self, engine, prompts, cache: dict | None = None) -> None:
        self.engine = engine
        self.prompts = prompts
        self.cache: dict[tuple, list[tuple[float, ...]]] = cache if cache is not None else {}
        self.computed = 0
        self.seconds = 0.0

    def keys(self, request: schema.SystemOneRequest, method: Method) -> list[tuple[tuple, list[tuple]]]:
        """Per question of ``request``: (its reads' keys, its content-free reads' keys)."""
        prefix = self.prompts.prefix(request.state, request.prefix)
        cf_prefix = self.prompts.prefix("", request.prefix)
        out = []
        for q in request.questions:
            reads = readings.plan(q.type, q.instructions, q.criteria, q.n_options, method)
            real = tuple((prefix, self.prompts.stem(rd.text), rd.scored) for rd in reads)
            free = (
                [
                    (cf_prefix, s + self.prompts.stem(rd.text), rd.scored)
                    for s in debias.CONTENT_FREE_STATES
                    for rd in readings.content_free_plan(q.type, q.instructions, q.criteria, q.n_options, method)
                ]
                if method.content_free
                else []
            )
            out.append((real, free))
        return out

    async def read(self, keys: list[tuple], fresh: bool = False, chunk: int = 48) -> dict[tuple, list]:
        """Read ``keys`` (all of one prefix or several), missing ones only unless ``fresh``; returns key -> logprobs."""
        todo = list(dict.fromkeys(k for k in keys if fresh or k not in self.cache))
        got: dict[tuple, list] = {}
        by_prefix: dict[str, list[tuple]] = {}
        for k in todo:
            by_prefix.setdefault(k[0], []).append(k)
        for prefix, ks in by_prefix.items():
            for i in range(0, len(ks), chunk):
                part = ks[i : i + chunk]
                t0 = time.perf_counter()
                result = await self.engine.score(prefix, [(stem, list(scored)) for _, stem, scored in part], pin=True)
                self.seconds += time.perf_counter() - t0
                self.computed += result.computed or 0
                for k, group in zip(part, result.groups):
                    got[k] = [tuple(o.logprobs) for o in group]
        if not fresh:
            self.cache.update(got)
        return {k: got.get(k, self.cache.get(k)) for k in keys}


def probabilities(method: Method, q: schema.Question, keys: tuple, lookup) -> list[float]:
    """A question's unrounded probabilities (reply order) under a stateless ``method``, from read logprobs."""
    real, free = keys
    reads = readings.plan(q.type, q.instructions, q.criteria, q.n_options, method)
    per_read = [readings.log_probs(rd.owner, lookup(k)) for rd, k in zip(reads, real)]
    cf = None
    if free:
        cf_reads = readings.content_free_plan(q.type, q.instructions, q.criteria, q.n_options, method)
        cf = readings.mean_log_probs(
            [readings.log_probs(rd.owner, lookup(k)) for k, rd in zip(free, itertools.cycle(cf_reads))]
        )
    return softmax(readings.combine(per_read, cf))


# --- the run ------------------------------------------------------------------------------------


def domain_of(item: evalset.Labelled) -> str:
    return item.id.rsplit("-", 1)[0] if "-" in item.id else "all"


async def run(args) -> dict:
    from gateway.decision.chat_template import read_gguf
    from gateway.decision.prompts import PromptBuilder
    from gateway.engine import Engine
    from gateway.paths import engine_bin

    if args.configs:
        wanted = README_ROWS if args.configs == "readme" else [c.strip() for c in args.configs.split(";")]
        CONFIGS[:] = sorted((c for c in CONFIGS if c[0] in wanted), key=lambda c: wanted.index(c[0]))
        if len(CONFIGS) != len(wanted):
            raise SystemExit(f"--configs: unknown names; the rows are named {[c[0] for c in CONFIGS_ALL]}")
    items = evalset.read_jsonl(args.data) if args.data else evalset.generate(args.seed)
    if args.subset:
        by_dom: dict[str, list] = {}
        for it in items:
            by_dom.setdefault(domain_of(it), []).append(it)
        items = [it for its in by_dom.values() for it in its[: args.subset]]
    bodies, golds = pass_bodies(items, args.seed)
    requests = [[schema.parse_request(b) for b in bodies[p]] for p in range(PASSES)]
    n_q = sum(len(g) for g in golds[0])
    print(f"{len(items)} requests, {n_q} labelled questions, {PASSES} option orders per choice", flush=True)

    reused = {r["name"]: r for r in orjson.loads(Path(args.reuse).read_bytes())["rows"]} if args.reuse else None
    cache_file = Path(args.cache) if args.cache else None
    cache: dict = {}
    ident = [Path(args.model).name, Path(args.model).stat().st_size]
    if cache_file and cache_file.exists():
        saved = orjson.loads(cache_file.read_bytes())
        if saved.get("model") == ident:
            cache = {(p, s, tuple(sc)): [tuple(x) for x in lp] for p, s, sc, lp in saved["reads"]}
            print(f"{len(cache)} reads from {cache_file}", flush=True)

    # No score cache: the cost requests would be answered from the reads just made (and from each other).
    cmd = [
        str(engine_bin("serveproto-llama")),
        "--model",
        args.model,
        "--threads",
        str(args.threads),
        "--score-cache-mb",
        "0",
    ]
    out: dict = {"items": len(items), "questions": n_q}
    async with Engine.spawn(cmd, name="quality") as eng:
        template, _ = await anyio.to_thread.run_sync(read_gguf, Path(args.model))
        prompts = PromptBuilder(template)
        reader = Reader(eng, prompts, cache)
        methods = list(
            dict.fromkeys(
                [m for _, m, _ in CONFIGS]
                + [Method(m.format, m.canonical, True, False) for _, m, s in CONFIGS if s == "pride"]
            )
        )
        # keys[method][p][i] = per question (real keys, content-free keys)
        keys = {m: [[reader.keys(r, m) for r in requests[p]] for p in range(PASSES)] for m in methods}
        free = [k for m in methods for p in range(PASSES) for per_req in keys[m][p] for _, f in per_req for k in f]
        t0 = time.perf_counter()
        await reader.read(free)
        print(f"content-free reads: {len(set(free))} ({reader.computed} positions computed)", flush=True)
        for i in range(len(items)):
            ks = [k for m in methods for p in range(PASSES) for real, _ in keys[m][p][i] for k in real]
            await reader.read(ks)
            if (i + 1) % 10 == 0 or i + 1 == len(items):
                print(
                    f"  {i + 1}/{len(items)} requests read: {len(reader.cache)} reads, {reader.computed} positions, "
                    f"{time.perf_counter() - t0:.0f} s",
                    flush=True,
                )

        def save() -> None:
            if cache_file:
                cache_file.write_bytes(
                    orjson.dumps(
                        {"model": ident, "reads": [[p, s, list(sc), lp] for (p, s, sc), lp in reader.cache.items()]}
                    )
                )

        save()
        out["read_positions"] = reader.computed
        out["read_seconds"] = reader.seconds

        # question order: every E-th request, its questions reversed, read afresh
        reversed_reads: dict[int, dict] = {}
        for i in range(0, len(items), args.qorder_every) if not reused else ():
            body = bodies[0][i]
            rev = {**body, "questions": dict(reversed(list(body["questions"].items())))}
            r = schema.parse_request(rev)
            ks = [k for m in methods for real, _ in reader.keys(r, m) for k in real]
            reversed_reads[i] = await reader.read(ks, fresh=True)
        print(f"question order: {len(reversed_reads)} requests read again with their questions reversed", flush=True)

        rows = evaluate(items, requests, golds, keys, reader, reversed_reads)
        if all(
            m in keys
            for m in (Method(), Method(content_free=True), Method(cyclic=True), Method(cyclic=True, content_free=True))
        ):
            out["noul_check"] = noul_check(items, requests, golds, keys, reader)
        if args.nouls:
            out["noul_variants"] = await noul_variants(items, golds, requests, reader, prompts)
            save()

        # cost, and a check against the served path
        if reused:
            served = {}
        else:
            served = await cost(eng, prompts, items, requests, keys, reader, args.cost_requests)
    for row, (name, method, state) in zip(rows, CONFIGS):
        if reused:
            old = reused.get(name)
            if old is None:
                raise SystemExit(f"--reuse: {args.reuse} has no row {name!r}")
            row.update({k: old[k] for k in REUSED})
        else:
            row.update(served[(method, state)])
    out["rows"] = rows
    return out


def evaluate(items, requests, golds, keys, reader, reversed_reads) -> list[dict]:
    """Every configuration's metrics from the reads (see the module doc)."""
    lookup = reader.cache.__getitem__
    rows = []
    for name, method, state in CONFIGS:
        # probs[p][i][qid]: unrounded probabilities, reply order of pass p's body
        probs = [
            [
                {q.id: probabilities(method, q, k, lookup) for q, k in zip(r.questions, keys[method][p][i])}
                for i, r in enumerate(requests[p])
            ]
            for p in range(PASSES)
        ]
        rev = {
            i: {
                q.id: probabilities(method, q, k, lambda key, rr=rr: rr[key] if key in rr else lookup(key))
                for q, k in zip(requests[0][i].questions, keys[method][0][i])
            }
            for i, rr in reversed_reads.items()
        }
        if state is not None:
            cyc = Method(method.format, method.canonical, True, False)
            probs, rev = stateful(state, method, cyc, items, requests, keys, lookup, probs, rev, reversed_reads)
        rows.append(metrics(name, method, state, items, requests, golds, probs, rev))
        r = rows[-1]
        print(
            f"{name:<52} acc {r['accuracy']:.3f} (noul {r['acc_noul']:.3f}: mostly no {r['acc_noul_no']:.3f} "
            f"[{r['base_noul_no']:.3f}], mostly yes {r['acc_noul_yes']:.3f} [{r['base_noul_yes']:.3f}]; "
            f"choice {r['acc_choice']:.3f} "
            f"score {r['acc_score']:.3f}) F1 {r['macro_f1']:.3f} ECE {r['ece']:.3f} (floor {r['ece_floor']:.3f}) "
            f"flips {r['flips']:.3f} JSD {r['jsd']:.4f}",
            flush=True,
        )
    return rows


def noul_check(items, requests, golds, keys, reader) -> dict:
    """The issue's hypothesis: on the content-free state "N/A" most cue nouls are truly "no", so dividing by
    it pushes answers to "yes". Per noul task (listed format): p(yes | "N/A"), the share answered yes
    raw and with content_free, and the gold share."""
    lookup = reader.cache.__getitem__
    methods = {
        "raw": Method(),
        "cf": Method(content_free=True),
        "cyc": Method(cyclic=True),
        "cyc_cf": Method(cyclic=True, content_free=True),
    }
    out = {}
    for i, item in enumerate(items):
        for qi, q in enumerate(requests[0][i].questions):
            if q.type != "noul" or q.id not in golds[0][i]:
                continue
            t = out.setdefault(item.tasks[q.id], {"n": 0, "gold_yes": 0, **{f"yes_{k}": 0 for k in methods}})
            # p(yes | "N/A") when yes is listed first and when no is
            _, free = keys[methods["cyc_cf"]][0][i][qi]
            reads = readings.content_free_plan(q.type, q.instructions, q.criteria, q.n_options, methods["cyc_cf"])
            t["p_yes_na"] = [math.exp(readings.log_probs(rd.owner, lookup(k))[1]) for rd, k in zip(reads, free)]
            for k, m in methods.items():
                t[f"yes_{k}"] += probabilities(m, q, keys[m][0][i][qi], lookup)[1] > 0.5
            t["gold_yes"] += golds[0][i][q.id] == 1
            t["n"] += 1
    print(
        "\nnouls, listed format: p(yes | N/A) with yes listed first, no listed first; questions answered yes "
        "with none / content_free / cyclic / cyclic,content_free; gold yes; of n",
        flush=True,
    )
    for task, t in out.items():
        a, b = t["p_yes_na"]
        print(
            f"  {task:<20} {a:.3f}, {b:.3f}; {t['yes_raw']} / {t['yes_cf']} / {t['yes_cyc']} / {t['yes_cyc_cf']}; "
            f"{t['gold_yes']}; of {t['n']}",
            flush=True,
        )
    return out


#: The noul reads compared by :func:`noul_variants`: the listing (yes first, as canonical lists it, no
#: first, or the instructions alone, as the cloze format asks) and the scored texts (the one spelling
#: "yes" / "no" of the listed format, or every spelling summed, as the letter format reads them).
NOUL_LISTINGS = {"yes first": "\nAnswer yes or no.", "no first": "\nAnswer no or yes.", "not listed (cloze)": ""}


async def noul_variants(items, golds, requests, reader, prompts) -> list[dict]:
    """Why the nouls answer as they do: every noul read with yes or no listed first, one spelling or all
    summed, raw, against "N/A" under its own instructions (``content_free``) or the default ones
    (``content_free_listing``), and batch-calibrated. Per variant: accuracy and share answered yes on the
    mostly-no and mostly-yes nouls, and the mean per-task AUC of log p(yes) - log p(no) (how well the
    model tells yes from no at any threshold: 0.5 is no signal). Also the in-sample best threshold per
    task (an optimistic bound for any per-question correction)."""
    from gateway.decision.prompts import DEFAULT_INSTRUCTIONS, as_text, spellings

    scored = spellings("no") + spellings("yes")
    cf_prefix = prompts.prefix("", None)
    rec = []  # (task, gold, {(listing, spell): (real, cf question, cf listing)})
    keys = []
    for i, item in enumerate(items):
        prefix = prompts.prefix(requests[0][i].state, requests[0][i].prefix)
        for q in requests[0][i].questions:
            if q.type != "noul" or q.id not in golds[0][i] or q.criteria:
                continue
            head = as_text(q.instructions) if q.instructions is not None else DEFAULT_INSTRUCTIONS["noul"]
            ks = {}
            for name, tail in NOUL_LISTINGS.items():
                ks[name] = (
                    (prefix, prompts.stem(head + tail), scored),
                    (cf_prefix, "N/A" + prompts.stem(head + tail), scored),
                    (cf_prefix, "N/A" + prompts.stem(DEFAULT_INSTRUCTIONS["noul"] + tail), scored),
                )
                keys.extend(ks[name])
            rec.append((item.tasks[q.id], golds[0][i][q.id], ks))
    if not rec:
        return []
    got = await reader.read(keys)

    def logit(key, spell):
        p = [math.exp(math.fsum(lp)) for lp in got[key]]
        no, yes = (math.fsum(p[:4]), math.fsum(p[4:])) if spell else (p[0], p[4])
        return math.log(yes) - math.log(no)

    tasks = sorted({t for t, _, _ in rec})
    share = {t: sum(g for tt, g, _ in rec if tt == t) / sum(tt == t for tt, _, _ in rec) for t in tasks}
    group = {t: "yes" if share[t] > 0.5 else "no" for t in tasks}

    def auc(xs):
        pos = [x for x, g in xs if g]
        neg = [x for x, g in xs if not g]
        if not pos or not neg:
            return float("nan")
        return sum((a > b) + 0.5 * (a == b) for a in pos for b in neg) / (len(pos) * len(neg))

    out = []
    for listing in NOUL_LISTINGS:
        for spell in (False, True):
            for corr in ("none", "content_free", "content_free_listing", "batch", "content_free + batch"):
                per_task: dict[str, list[tuple[float, int]]] = {}
                for t, g, ks in rec:
                    real, cfq, cfl = ks[listing]
                    x = logit(real, spell)
                    if "content_free_listing" in corr:
                        x -= logit(cfl, spell)
                    elif "content_free" in corr:
                        x -= logit(cfq, spell)
                    per_task.setdefault(t, []).append((x, g))
                if "batch" in corr:  # divide by the task's mean p(yes), p(no) (readings.batch_prior)
                    for t, xs in per_task.items():
                        m = math.fsum(1 / (1 + math.exp(-x)) for x, _ in xs) / len(xs)
                        per_task[t] = [(x - math.log(m) + math.log(1 - m), g) for x, g in xs]
                row = {"listing": listing, "spellings": "all summed" if spell else "one", "correction": corr}
                for grp in ("no", "yes"):
                    xs = [xg for t in tasks if group[t] == grp for xg in per_task[t]]
                    row[f"acc_{grp}"] = sum((x > 0) == bool(g) for x, g in xs) / len(xs) if xs else float("nan")
                    row[f"yes_{grp}"] = sum(x > 0 for x, _ in xs) / len(xs) if xs else float("nan")
                    best = 0
                    for t in tasks:
                        if group[t] == grp:
                            ts = per_task[t]
                            best += max(
                                sum((x >= th) == bool(g) for x, g in ts) for th in [x for x, _ in ts] + [math.inf]
                            )
                    row[f"oracle_{grp}"] = best / len(xs) if xs else float("nan")
                row["auc"] = math.fsum(auc(per_task[t]) for t in tasks) / len(tasks)
                out.append(row)
    n = {grp: [g for t, g, _ in rec if group[t] == grp] for grp in ("no", "yes")}
    print(
        f"\nnouls read every way ({len(rec)}; mostly no: {len(n['no'])}, majority "
        f"{1 - sum(n['no']) / max(1, len(n['no'])):.3f}; mostly yes: {len(n['yes'])}, majority "
        f"{sum(n['yes']) / max(1, len(n['yes'])):.3f})",
        flush=True,
    )
    print(noul_table(out))
    return out


def noul_table(rows: list[dict]) -> str:
    lines = [
        "| listed | spellings | correction | mostly no: accuracy (answered yes) | mostly yes: accuracy (answered yes) "
        "| mean AUC per task | best threshold per task, in sample: no / yes |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['listing']} | {r['spellings']} | {r['correction']} | {r['acc_no']:.3f} ({r['yes_no']:.2f}) "
            f"| {r['acc_yes']:.3f} ({r['yes_yes']:.2f}) | {r['auc']:.3f} | {r['oracle_no']:.3f} / {r['oracle_yes']:.3f} |"
        )
    return "\n".join(lines)


def stateful(state, method, cyc, items, requests, keys, lookup, probs, rev, reversed_reads):
    """Batch calibration or PriDe on top of ``method``'s probabilities, per (task, pass)."""
    groups: dict[tuple[str, int], list[tuple[int, schema.Question]]] = {}
    for p in range(PASSES):
        for i, r in enumerate(requests[p]):
            for q in r.questions:
                groups.setdefault((task_key(items[i], q.id), p), []).append((i, q))
    new = [[dict(d) for d in per_p] for per_p in probs]
    new_rev = {i: dict(d) for i, d in rev.items()}
    for (task, p), members in groups.items():  # noqa: B007  (kept as written)
        if members[0][1].n_options < 2:
            continue
        if state == "batch":
            prior = readings.batch_prior([probs[p][i][q.id] for i, q in members])
            for i, q in members:
                new[p][i][q.id] = readings.divide(probs[p][i][q.id], prior)
                if p == 0 and i in rev:
                    new_rev[i][q.id] = readings.divide(rev[i][q.id], prior)
            continue
        k = max(2, math.ceil(0.1 * len(members)))
        samples = []
        for i, q in members[:k]:
            qi = [x.id for x in requests[p][i].questions].index(q.id)
            reads = readings.plan(q.type, q.instructions, q.criteria, q.n_options, cyc)
            real, _ = keys[cyc][p][i][qi]
            per_rot = [readings.log_probs(rd.owner, lookup(key)) for rd, key in zip(reads, real)]
            samples.append((per_rot, [rd.places for rd in reads]))
            new[p][i][q.id] = softmax(readings.combine(per_rot, None))  # answered by its rotations
            if p == 0 and i in rev:
                rr = reversed_reads[i]
                new_rev[i][q.id] = softmax(
                    readings.combine([readings.log_probs(rd.owner, rr[key]) for rd, key in zip(reads, real)], None)
                )
        prior = readings.pride_prior(samples)
        places = readings.plan(
            members[0][1].type, members[0][1].instructions, members[0][1].criteria, members[0][1].n_options, method
        )[0].places
        for i, q in members[k:]:
            new[p][i][q.id] = readings.divide(probs[p][i][q.id], prior, places)
            if p == 0 and i in rev:
                new_rev[i][q.id] = readings.divide(rev[i][q.id], prior, places)
    return new, new_rev


def metrics(name, method, state, items, requests, golds, probs, rev) -> dict:
    rows_p, rows_g, rows_w, rows_t, rows_type = [], [], [], [], []
    flips = jsds = n_choice = 0
    yes = gold_yes = n_noul = 0.0
    changed = moved = n_rev = 0
    for i, item in enumerate(items):
        for q in requests[0][i].questions:
            if q.id not in golds[0][i]:
                continue
            if q.type == "choice":
                distinct = []
                for p in range(PASSES):
                    order = list(
                        requests[p][i].questions[[x.id for x in requests[p][i].questions].index(q.id)].criteria
                    )
                    if order not in [d[0] for d in distinct]:
                        distinct.append((order, p))
                for order, p in distinct:
                    rows_p.append(scoring.report(probs[p][i][q.id]))
                    rows_g.append(golds[p][i][q.id])
                    rows_w.append(1 / len(distinct))
                    rows_t.append((item.tasks[q.id], order))
                    rows_type.append("choice")
                by_order = [dict(zip(order, scoring.report(probs[p][i][q.id]))) for order, p in distinct]
                f, j = evaluation.order_stability(by_order)
                flips += f
                jsds += j
                n_choice += 1
            else:
                p0 = scoring.report(probs[0][i][q.id])
                rows_p.append(p0)
                rows_g.append(golds[0][i][q.id])
                rows_w.append(1.0)
                rows_t.append((item.tasks[q.id], None))
                rows_type.append(q.type)
                if q.type == "noul":
                    n_noul += 1
                    yes += evaluation.argmax(p0) == 1
                    gold_yes += golds[0][i][q.id] == 1
            if i in rev:
                a, b = scoring.report(probs[0][i][q.id]), scoring.report(rev[i][q.id])
                changed += evaluation.argmax(a) != evaluation.argmax(b)
                moved += max(abs(x - y) for x, y in zip(a, b))
                n_rev += 1
    conf, correct = evaluation.confidences(rows_p, rows_g)
    floor, floor95 = evaluation.ece_floor(conf, rows_w)
    pred_labels = [_label(t, evaluation.argmax(p)) for t, p in zip(rows_t, rows_p)]
    gold_labels = [_label(t, g) for t, g in zip(rows_t, rows_g)]

    def acc_of(kind):
        sel = [k for k, t in enumerate(rows_type) if t == kind]
        return (
            evaluation.accuracy([rows_p[k] for k in sel], [rows_g[k] for k in sel], [rows_w[k] for k in sel])
            if sel
            else float("nan")
        )

    groups = noul_groups(rows_t, rows_g, rows_type)

    def acc_group(group):
        sel = [k for k, t in enumerate(rows_type) if t == "noul" and groups[rows_t[k][0]] == group]
        if not sel:
            return float("nan"), float("nan"), 0
        majority = 1 if group == "yes" else 0
        acc = evaluation.accuracy([rows_p[k] for k in sel], [rows_g[k] for k in sel], [rows_w[k] for k in sel])
        return acc, sum(rows_g[k] == majority for k in sel) / len(sel), len(sel)

    (acc_no, base_no, n_no), (acc_yes, base_yes, n_yes) = acc_group("no"), acc_group("yes")
    return {
        "name": name,
        "x_debias": ",".join(method.names) or "none",
        "acc_noul_no": acc_no,
        "base_noul_no": base_no,
        "n_noul_no": n_no,
        "acc_noul_yes": acc_yes,
        "base_noul_yes": base_yes,
        "n_noul_yes": n_yes,
        "state": state,
        "accuracy": evaluation.accuracy(rows_p, rows_g, rows_w),
        "acc_noul": acc_of("noul"),
        "acc_choice": acc_of("choice"),
        "acc_score": acc_of("score"),
        "noul_yes": yes / n_noul if n_noul else float("nan"),
        "gold_yes": gold_yes / n_noul if n_noul else float("nan"),
        "macro_f1": evaluation.macro_f1(pred_labels, gold_labels, [t for t, _ in rows_t], rows_w),
        "ece": evaluation.ece(conf, correct, rows_w),
        "ece_floor": floor,
        "ece_floor95": floor95,
        "brier": evaluation.brier(rows_p, rows_g, rows_w),
        "nll": evaluation.nll(rows_p, rows_g, rows_w),
        "flips": flips / n_choice if n_choice else float("nan"),
        "jsd": jsds / n_choice if n_choice else float("nan"),
        "qorder_changed": changed / n_rev if n_rev else float("nan"),
        "qorder_moved": moved / n_rev if n_rev else float("nan"),
        "qorder_n": n_rev,
    }


def noul_groups(rows_t, rows_g, rows_type) -> dict[str, str]:
    """Each noul task's group: ``"yes"`` when most of its labelled questions are true, else ``"no"``."""
    yes: dict[str, list[int]] = {}
    for (task, _), g, kind in zip(rows_t, rows_g, rows_type):
        if kind == "noul":
            yes.setdefault(task, []).append(g)
    return {task: "yes" if sum(gs) > len(gs) / 2 else "no" for task, gs in yes.items()}


def _label(task_order, index):
    """A class name comparable across orders: a choice's label, else the index."""
    _, order = task_order
    return order[index] if order is not None else index


async def cost(eng, prompts, items, requests, keys, reader, per_domain):
    """Serve ``per_domain`` requests of each domain (pass 0 orders) per stateless configuration; positions,
    seconds, and the largest difference from the composed probabilities. Batch calibration costs its
    base's reads; PriDe its base's plus, on a task's first k of n requests, its rotations."""
    picked: list[int] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        d = domain_of(item)
        if seen.get(d, 0) < per_domain:
            picked.append(i)
            seen[d] = seen.get(d, 0) + 1
    firsts = {min(i for i in picked if domain_of(items[i]) == d) for d in seen}
    lookup = reader.cache.__getitem__
    measured: dict[Method, dict] = {}
    for method in list(
        dict.fromkeys(
            [m for _, m, _ in CONFIGS]
            + [Method(m.format, m.canonical, True, False) for _, m, s in CONFIGS if s == "pride"]
        )
    ):
        settings = pipeline.Settings(prompts, debias=method.names)
        memory = pipeline.Memory()
        steady, first, newq, secs, diff = [], [], [], [], 0.0
        for i in picked:
            r = requests[0][i]
            t0 = time.perf_counter()
            decided = await pipeline.decide(r, eng, settings, memory)
            secs.append(time.perf_counter() - t0)
            (first if i in firsts else steady).append(decided.computed or 0)
            if i not in firsts:
                # new questions on the state just read, on option sets already seen (the document workload)
                again = await pipeline.decide(new_questions(r, i), eng, settings, memory)
                newq.append(again.computed or 0)
            for q, k in zip(r.questions, keys[method][0][i]):
                composed = scoring.report(probabilities(method, q, k, lookup))
                diff = max(diff, max(abs(a - b) for a, b in zip(composed, decided.probs[q.id])))
        measured[method] = {
            "positions": sum(steady) / max(1, len(steady)),
            "first": sum(first) / max(1, len(first)),
            "newq": sum(newq) / max(1, len(newq)),
            "seconds": sum(secs) / len(secs),
            "served_diff": diff,
        }
        print(
            f"  cost {','.join(method.names) or 'none':<32} {measured[method]['positions']:.0f} positions a request "
            f"({measured[method]['first']:.0f} first, {measured[method]['newq']:.0f} new questions), "
            f"{measured[method]['seconds']:.2f} s; served vs composed "
            f"max |dp| {diff:.6f}",
            flush=True,
        )
    # tasks' sizes, for PriDe's amortised cost
    n_task: dict[str, int] = {}
    for i, item in enumerate(items):  # noqa: B007  (kept as written)
        for qid in item.body["questions"]:
            n_task[task_key(item, qid)] = n_task.get(task_key(item, qid), 0) + 1
    mean_n = sum(n_task.values()) / len(n_task)
    k = max(2, math.ceil(0.1 * mean_n))
    out = {}
    for _, method, state in CONFIGS:
        base = dict(measured[method])
        if state == "pride":
            cyc = measured[Method(method.format, method.canonical, True, False)]
            for f in ("positions", "seconds"):
                base[f] = (k * cyc[f] + (mean_n - k) * base[f]) / mean_n
            base["served_diff"] = float("nan")
        elif state == "batch":
            base["served_diff"] = float("nan")
        out[(method, state)] = base
    return out


def new_questions(request: schema.SystemOneRequest, serial: int) -> schema.SystemOneRequest:
    """``request`` with every question's instructions opened by ``Question <serial>.``: new questions (their
    stems never read) on the same state and the same options."""
    return attrs.evolve(
        request,
        questions=tuple(
            attrs.evolve(q, instructions=f"Question {serial}. {prompts_text(q.instructions)}")
            for q in request.questions
        ),
    )


def prompts_text(instructions) -> str:
    from gateway.decision.prompts import as_text

    return as_text(instructions) if instructions is not None else ""


# --- the table --------------------------------------------------------------------------------


def table(out: dict) -> str:
    rows = out["rows"]
    raw = next((r for r in rows if r["name"].startswith("listed (x_debias none)")), rows[0])
    lines = [
        "| configuration (`x_debias`) | accuracy | noul / choice / score | nouls mostly no (majority) "
        "| nouls mostly yes (majority) | nouls answered yes (gold) | macro-F1 "
        "| ECE (noise floor) | Brier | NLL | order flips | order JSD (bits) | question order: changed, mean max dp "
        "| positions a request (first) | x raw | new questions: positions, x raw | s a request |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        xd = r["x_debias"] + {"batch": " + batch", "pride": " + PriDe"}.get(r["state"], "")
        lines.append(
            f"| {r['name']} (`{xd}`) | {r['accuracy']:.3f} | {r['acc_noul']:.3f} / {r['acc_choice']:.3f} / {r['acc_score']:.3f} "
            f"| {r['acc_noul_no']:.3f} ({r['base_noul_no']:.3f}) | {r['acc_noul_yes']:.3f} ({r['base_noul_yes']:.3f}) "
            f"| {r['noul_yes']:.2f} ({r['gold_yes']:.2f}) | {r['macro_f1']:.3f} | {r['ece']:.3f} ({r['ece_floor']:.3f}) "
            f"| {r['brier']:.3f} | {r['nll']:.3f} | {r['flips']:.3f} | {r['jsd']:.4f} "
            f"| {r['qorder_changed']:.3f}, {r['qorder_moved']:.4f} | {r['positions']:.0f} ({r['first']:.0f}) "
            f"| {_ratio(r['positions'], raw['positions'])} | {r['newq']:.0f}, {_ratio(r['newq'], raw['newq'])} "
            f"| {r['seconds']:.2f} |"
        )
    return "\n".join(lines)


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "n/a"


def write_readme(text: str, path: Path) -> None:
    """Replace the table between :data:`README_START` and :data:`README_END` in ``path``."""
    doc = path.read_text()
    if README_START not in doc or README_END not in doc:
        raise SystemExit(f"{path}: no {README_START} ... {README_END} markers")
    head, rest = doc.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    path.write_text(head + README_START + "\n" + text + "\n" + README_END + tail)


def main() -> None:
    from gateway.paths import default_model_path

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(default_model_path()), help="GGUF (default: the default model)")
    parser.add_argument("--threads", type=int, default=1, help="engine CPU threads (default 1)")
    parser.add_argument("--data", help="a labelled JSONL file (gateway.lab.evalset); default: the generated set")
    parser.add_argument("--seed", type=int, default=evalset.SEED, help="the generator's and the orders' seed")
    parser.add_argument("--subset", type=int, default=0, help="only the first N requests of each domain (quick runs)")
    parser.add_argument(
        "--qorder-every", type=int, default=4, help="re-ask every Nth request with its questions reversed"
    )
    parser.add_argument("--cost-requests", type=int, default=2, help="requests per domain served for the cost columns")
    parser.add_argument("--cache", help="a file keeping the reads between runs of the same model")
    parser.add_argument(
        "--configs",
        help="only these rows, by name, separated by ';', in that order; 'readme': the notebook's (default: all)",
    )
    parser.add_argument("--json", help="write the rows as JSON here")
    parser.add_argument(
        "--reuse",
        help="an earlier run's --json: take its cost and question-order columns "
        "(with --cache, the rest is recomputed from the reads without the engine)",
    )
    parser.add_argument("--readme", action="store_true", help="write the table into bench/results/NOTEBOOK.md")
    parser.add_argument(
        "--nouls", action="store_true", help="also read every noul each way (listing, spellings, correction)"
    )
    args = parser.parse_args()
    started = time.perf_counter()
    out = anyio.run(run, args)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent,
    ).stdout.strip()
    text = table(out)
    print()
    print(text)
    print(
        f"\n{out['items']} requests, {out['questions']} questions; reads: {out['read_positions']} positions in "
        f"{out['read_seconds']:.0f} s; whole run {time.perf_counter() - started:.0f} s; commit {commit}"
        f"{' (with local changes)' if dirty else ''}; load average {os.getloadavg()[0]:.1f}"
    )
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(out, option=orjson.OPT_SERIALIZE_NUMPY))
    if args.readme:
        write_readme(text, Path(__file__).parent / "results" / "NOTEBOOK.md")


if __name__ == "__main__":
    main()
