"""Trained heads against the logprob reading and the default correction, held out by request (issue 26).

Step 1 (``collect``): every labelled request (the generator's, ``--seed`` and ``--per-domain``
requests per domain, or ``--data FILE``) is answered through the server's own path
(:func:`gateway.decision.pipeline.decide`) twice on the llama engine: under the default
correction (:data:`gateway.cli.config.DEFAULT_MODEL_DEBIAS`), and with the hidden states of
``--layers`` read in the same SCORE as ``x_debias: none`` (the logprob reading, the prompt a
head is served on).
Both answers, the vectors and the gold go to ``--cache`` (JSON lines).

Step 2 (``evaluate``): per question signature (a task: the same type, instructions and
options), the requests are split into ``--folds`` folds by request; for each held-out fold a
head is fitted (:func:`gateway.lab.head_fit.fit`) on the first ``n`` labels of the others
(``n`` in ``--sizes``: the learning curve) and read on the held-out fold. Printed per size:
accuracy and ECE (top label, 10 equal-mass bins; :mod:`gateway.lab.evaluation`) of the
head, the logprob reading and the default correction over the same held-out questions, with
the nouls of mostly-"no" and mostly-"yes" tasks apart; ``--plot`` writes the reliability
diagram of the largest size.

    .venv/bin/python -m bench.heads collect --per-domain 400 --cache /tmp/heads.jsonl
    .venv/bin/python -m bench.heads evaluate --cache /tmp/heads.jsonl --layer 19 --sizes 25,50,100,300
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import orjson

from gateway.decision import schema
from gateway.lab import evalset


async def collect(args) -> None:
    import anyio

    from gateway.cli.config import DEFAULT_MODEL_DEBIAS
    from gateway.decision import pipeline
    from gateway.decision.chat_template import read_gguf
    from gateway.decision.prompts import PromptBuilder
    from gateway.engine import Engine
    from gateway.paths import default_model_path, engine_bin

    model = args.model or str(default_model_path())
    if args.data:
        items = evalset.read_jsonl(args.data)
    else:
        n = args.per_domain
        domains = args.domains.split(",") if args.domains else list(evalset.SIZES)
        items = evalset.generate(args.seed, {d: n for d in domains})
    layers = tuple(int(x) for x in args.layers.split(","))
    cmd = [str(engine_bin("serveproto-llama")), "--model", model, "--threads", str(args.threads)]
    out = Path(args.cache)
    done = set()
    if out.exists():
        done = {orjson.loads(line)["id"] for line in out.read_bytes().splitlines() if line.strip()}
    async with Engine.spawn(cmd, name="heads") as eng:
        template, _ = await anyio.to_thread.run_sync(read_gguf, Path(model))
        prompts = PromptBuilder(template)
        s_def = pipeline.Settings(prompts, debias=DEFAULT_MODEL_DEBIAS)
        s_none = pipeline.Settings(prompts, debias=(), hidden=layers)
        m_def, m_none = pipeline.Memory(), pipeline.Memory()
        t0 = time.perf_counter()
        with out.open("ab") as f:
            for k, item in enumerate(items, start=1):
                if item.id in done:
                    continue
                parsed = schema.parse_request(item.body)
                d_def = await pipeline.decide(parsed, eng, s_def, m_def) if not args.train_only else None
                d_none = await pipeline.decide(parsed, eng, s_none, m_none)
                rows = []
                for q in parsed.questions:
                    if q.id not in item.gold or q.n_options < 2:
                        continue
                    rows.append(
                        {
                            "q": q.id,
                            "task": item.tasks[q.id],
                            "type": q.type,
                            "gold": item.gold[q.id],
                            "default": d_def.probs[q.id] if d_def is not None else None,
                            "none": d_none.probs[q.id],
                            "hidden": {str(la): list(v) for la, v in d_none.hidden.get(q.id, {}).items()},
                        }
                    )
                f.write(orjson.dumps({"id": item.id, "rows": rows}) + b"\n")
                f.flush()
                if k % 20 == 0 or k == len(items):
                    print(f"  {k}/{len(items)} requests ({time.perf_counter() - t0:.0f} s)", flush=True)


async def cost(args) -> None:
    """Positions computed and seconds per request, side by side in one run: ``x_debias: none`` (the
    logprob reading), heads fitted on ``--fit-from`` (every question of the domain matched), the default
    correction; each on fresh states (requests of ``--seed``) on an engine of its own, the engines' score
    cache off."""
    import anyio
    import numpy as np

    from gateway.cli.config import DEFAULT_MODEL_DEBIAS
    from gateway.decision import heads, pipeline
    from gateway.decision.chat_template import read_gguf
    from gateway.decision.prompts import PromptBuilder
    from gateway.engine import Engine
    from gateway.lab import head_fit
    from gateway.paths import default_model_path, engine_bin

    model = args.model or str(default_model_path())
    items = evalset.generate(args.seed, {d: args.per_domain for d in args.domains.split(",")})
    # a head per question of the domain, fitted on the rows of --fit-from (the numbers do not matter here)
    by_task = load(args.fit_from)
    made = {}
    for item in items:
        for q in schema.parse_request(item.body).questions:
            rows = by_task.get(item.tasks[q.id], [])
            sig = heads.signature(q)
            if sig in made or len(rows) < 4:
                continue
            X = np.array([r["hidden"]["19"] for r in rows])
            h = head_fit.fit(X, np.array([r["gold"] for r in rows]), q.n_options, [r["id"] for r in rows])
            made[sig] = heads.Head(
                f"head-{sig}",
                sig,
                19,
                tuple(h["mean"]),
                tuple(h["scale"]),
                tuple(map(tuple, h["W"])),
                tuple(h["b"]),
                h["T"],
                (),
            )
    hs = heads.HeadSet("", made)
    cmd = [str(engine_bin("serveproto-llama")), "--model", model, "--threads", str(args.threads)]
    cmd += ["--score-cache-mb", "0"]
    # one engine per reading, so that none reuses a state another computed
    async with (
        Engine.spawn(cmd, name="cost-none") as e_none,
        Engine.spawn(cmd, name="cost-heads") as e_heads,
        Engine.spawn(cmd, name="cost-default") as e_def,
    ):
        engines = {"none": e_none, "heads": e_heads, "default": e_def}
        template, _ = await anyio.to_thread.run_sync(read_gguf, Path(model))
        prompts = PromptBuilder(template)
        configs = {
            "none": pipeline.Settings(prompts, debias=()),
            "heads": pipeline.Settings(prompts, debias=DEFAULT_MODEL_DEBIAS, heads=hs),
            "default": pipeline.Settings(prompts, debias=DEFAULT_MODEL_DEBIAS),
        }
        mems = {k: pipeline.Memory() for k in configs}
        tot = {k: [0, 0.0, 0] for k in configs}
        for i, item in enumerate(items):
            parsed = schema.parse_request(item.body)
            for name, st in configs.items():  # side by side: each request under each config in turn
                t0 = time.perf_counter()
                d = await pipeline.decide(parsed, engines[name], st, mems[name])
                if i > 0:  # the first request reads the content-free readings: left out
                    tot[name][0] += d.computed or 0
                    tot[name][1] += time.perf_counter() - t0
                    tot[name][2] += len(d.heads)
    n = len(items) - 1
    print(f"{n} requests after the first, fresh states, one engine per reading, score cache off\n")
    print("| reading | positions / request | seconds / request | questions answered by a head | vs none |")
    print("|---|---|---|---|---|")
    for name, (pos, sec, nh) in tot.items():
        print(
            f"| {name} | {pos / n:.1f} | {sec / n:.3f} | {nh} | "
            f"{pos / tot['none'][0]:.3f}x positions, {sec / tot['none'][1]:.3f}x time |"
        )


def load(path: str) -> dict[str, list[dict]]:
    """Rows by task, each with its request id, in file order."""
    by_task: dict[str, list[dict]] = {}
    for line in Path(path).read_bytes().splitlines():
        if not line.strip():
            continue
        rec = orjson.loads(line)
        for r in rec["rows"]:
            r["id"] = rec["id"]
            by_task.setdefault(r["task"], []).append(r)
    return by_task


def evaluate(args) -> None:
    import numpy as np

    from gateway.lab import evaluation, head_fit

    by_task = load(args.cache)
    train_by_task = load(args.train) if args.train else None
    sizes = [int(x) for x in args.sizes.split(",")]
    layer = str(args.layer)
    folds = args.folds
    # per size: (kind, group, probs, gold) of every held-out question, per reader
    results: dict[int, dict[str, list]] = {n: {"head": [], "none": [], "default": []} for n in sizes}
    meta: dict[int, list[tuple[str, str]]] = {n: [] for n in sizes}
    for task, rows in sorted(by_task.items()):
        rows = [r for r in rows if layer in r["hidden"]]
        if not rows:
            continue
        k = len(rows[0]["default"])
        gold_all = [r["gold"] for r in rows]
        group = ""
        if rows[0]["type"] == "noul":
            group = "yes" if sum(gold_all) > len(gold_all) / 2 else "no"
        ids = sorted({r["id"] for r in rows})
        rng = np.random.default_rng(args.seed)
        order = rng.permutation(len(ids))
        fold_of = {ids[j]: int(i % folds) for i, j in enumerate(order)}
        X = np.array([r["hidden"][layer] for r in rows], dtype=np.float64)
        y = np.array(gold_all)
        if train_by_task is not None:
            tr_rows = [r for r in train_by_task.get(task, []) if layer in r["hidden"]]
            Xt = np.array([r["hidden"][layer] for r in tr_rows], dtype=np.float64)
            yt = np.array([r["gold"] for r in tr_rows])
            for n in sizes:
                if len(tr_rows) < n:
                    continue
                h = head_fit.fit(Xt[:n], yt[:n], k, [r["id"] for r in tr_rows[:n]], seed=args.seed)
                P = head_fit.predict(h, X)
                for i, r in enumerate(rows):
                    results[n]["head"].append(list(P[i]))
                    results[n]["none"].append(r["none"])
                    results[n]["default"].append(r["default"])
                    meta[n].append((r["type"], group, int(y[i]), task))
            continue
        for f in range(folds):
            test = [i for i, r in enumerate(rows) if fold_of[r["id"]] == f]
            train_all = [i for i, r in enumerate(rows) if fold_of[r["id"]] != f]
            for n in sizes:
                train = train_all[:n]
                if len(train) < n:
                    continue
                h = head_fit.fit(X[train], y[train], k, [rows[i]["id"] for i in train], seed=args.seed)
                P = head_fit.predict(h, X[test])
                for j, i in enumerate(test):
                    results[n]["head"].append(list(P[j]))
                    results[n]["none"].append(rows[i]["none"])
                    results[n]["default"].append(rows[i]["default"])
                    meta[n].append((rows[i]["type"], group, int(y[i]), task))
    how = (
        f"fitted on the first n rows of {args.train}"
        if args.train
        else f"{folds} folds by request, heads fitted on the first n labels of the other folds"
    )
    print(f"layer {layer}, {how}\n")
    print("| n | reader | accuracy | ECE | nouls mostly-no (majority) | nouls mostly-yes (majority) | questions |")
    print("|---|---|---|---|---|---|---|")
    for n in sizes:
        if not meta[n]:
            continue
        gold = [m[2] for m in meta[n]]
        for reader in ("none", "default", "head"):
            P = results[n][reader]
            acc = evaluation.accuracy(P, gold)
            ece = evaluation.ece(*evaluation.confidences(P, gold))
            cells = []
            for grp in ("no", "yes"):
                idx = [i for i, m in enumerate(meta[n]) if m[1] == grp]
                g = [gold[i] for i in idx]
                maj = max(sum(g), len(g) - sum(g)) / len(g) if g else float("nan")
                cells.append(f"{evaluation.accuracy([P[i] for i in idx], g):.3f} ({maj:.3f})" if g else "-")
            print(f"| {n} | {reader} | {acc:.3f} | {ece:.3f} | {cells[0]} | {cells[1]} | {len(gold)} |")
    if args.plot:
        n = max(s for s in sizes if meta[s])
        plot(results[n], [m[2] for m in meta[n]], args.plot, n)


def plot(results: dict[str, list], gold: list[int], path: str, n: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(5, 5))
    ax.plot([0, 1], [0, 1], color="grey", lw=0.8)
    for reader, P in results.items():
        conf = np.array([max(p) for p in P])
        right = np.array([int(np.argmax(p) == g) for p, g in zip(P, gold)])
        order = np.argsort(conf)
        chunks = np.array_split(order, 10)
        ax.plot(
            [conf[c].mean() for c in chunks if len(c)],
            [right[c].mean() for c in chunks if len(c)],
            marker="o",
            label=reader,
        )
    ax.set_xlabel("confidence (top label)")
    ax.set_ylabel("accuracy")
    ax.set_title(f"held out by request, heads on {n} labels per signature")
    ax.legend()
    fig.savefig(path, dpi=120, bbox_inches="tight")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--model")
    c.add_argument("--data")
    c.add_argument("--seed", type=int, default=26)
    c.add_argument("--per-domain", type=int, default=400)
    c.add_argument("--domains", help="comma-separated generator domains (default: all)")
    c.add_argument("--layers", default="19,29")
    c.add_argument("--threads", type=int, default=2)
    c.add_argument("--cache", required=True)
    c.add_argument(
        "--train-only",
        action="store_true",
        help="skip the default correction (rows for fitting only: evaluate --train)",
    )
    e = sub.add_parser("evaluate")
    e.add_argument("--cache", required=True)
    e.add_argument(
        "--train",
        help="fit on the first n rows per task of this cache (other requests) and read every row of --cache, "
        "instead of folds of --cache",
    )
    e.add_argument("--layer", type=int, default=19)
    e.add_argument("--sizes", default="25,50,100,300")
    e.add_argument("--folds", type=int, default=4)
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--plot")
    k = sub.add_parser("cost")
    k.add_argument("--model")
    k.add_argument("--fit-from", required=True, help="a collect cache to fit the heads on")
    k.add_argument("--seed", type=int, default=28)
    k.add_argument("--per-domain", type=int, default=11)
    k.add_argument("--domains", default="email")
    k.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if args.cmd in ("collect", "cost"):
        import anyio

        anyio.run(collect if args.cmd == "collect" else cost, args)
    else:
        evaluate(args)


if __name__ == "__main__":
    main()
