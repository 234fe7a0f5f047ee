"""``serveproto heads fit``: one trained head per recurring question, from labelled requests.

Every labelled request (the JSONL ``calibrate --data`` reads: ``{"request": <System One
body>, "gold": {question id: answer}}`` per line; default: the generated evaluation set) is
answered on the llama engine through the server's path under ``--debias`` (default none: the
logprob reading, whose one prompt a head is served on), with the hidden state of ``--layer``
(default: two thirds of the model's depth) at each question's prompt end read in the same
SCORE. The questions are grouped by signature (:func:`gateway.decision.heads.signature`: type,
instructions, options); each signature with at least ``--min-labels`` labels gets a head
(:func:`gateway.lab.head_fit.fit`), written to
``$SERVEPROTO_CACHE/heads/<model sha256>.json`` (``serve`` loads it for that model).

Printed per signature, held out by request (``--folds`` folds: a head fitted on the others,
read on each fold): accuracy and ECE of the head against the logprob reading under ``--debias``
(default none, uncalibrated; not necessarily what ``serve`` answered, whose default correction
may differ).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from gateway.cli import sub_command
from gateway.paths import default_model_path

if TYPE_CHECKING:
    import numpy as np

    from gateway.lab.evalset import Labelled

#: The help text (the module docstring is for readers of the code: it cites functions).
HELP = """\
Fit one trained head per recurring question from labelled requests, and write them where
`serve` finds them for this model: $SERVEPROTO_CACHE/heads/<model sha256>.json (or --out).

Each line of --data is {"request": <a /v1/systemone body>, "gold": {question id: answer}}, the
format `serveproto calibrate --data` reads (default: the generated evaluation set). The decision
log (serve --log-decisions) keeps no text: keep the bodies of the requests you judge, matched by
x_request_id, and write them in this format (docs/http-api.md, "Trained heads").

Every request is answered on the llama engine under --debias (default none), reading the hidden
state of --layer at each question's prompt end; questions are grouped by signature (type,
instructions, options) and each signature with --min-labels labels or more gets a head (ridge
logistic regression, its strength and a temperature chosen by cross-validation over requests).
The table printed gives, per signature and held out by request, the accuracy and ECE of the head
against the logprob reading under --debias (default none). A fit that gets no head writes nothing and exits 1.
"""


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub_command(sub, "heads", "trained heads: one per recurring question (fit them on labelled requests)", HELP)
    hs = p.add_subparsers(dest="heads_cmd", required=True)
    f = sub_command(hs, "fit", "fit a head per question signature on labelled requests", HELP)
    f.add_argument("--data", help="labelled JSONL (as calibrate --data; default: the generated evaluation set)")
    f.add_argument("--model", help="GGUF model (default: the fetched SmolLM2-135M-Instruct)")
    f.add_argument("--threads", type=int, default=1, help="CPU threads of the llama engine (default 1)")
    f.add_argument(
        "--debias",
        default=None,
        metavar="METHODS",
        help="the x_debias a head's prompt is read under, when fitting and serving (default none: the logprob "
        "reading's one prompt, its cost)",
    )
    f.add_argument("--layer", type=int, default=None, help="the layer read (default: two thirds of the depth)")
    f.add_argument("--min-labels", type=int, default=20, help="labels a signature needs for a head (default 20)")
    f.add_argument("--folds", type=int, default=5, help="held-out folds over requests for the table (default 5)")
    f.add_argument("--seed", type=int, default=0, help="seed of the folds")
    f.add_argument("--limit", type=int, default=0, help="answer only the first N requests")
    f.add_argument("--out", help="the heads file (default: $SERVEPROTO_CACHE/heads/<model sha256>.json)")
    f.set_defaults(func=run)


def default_layer(n_layer: int) -> int:
    """Two thirds of the depth: block ``round(2 n / 3) - 1`` (19 of SmolLM2-135M's 30)."""
    return max(0, round(2 * n_layer / 3) - 1)


async def read_all(
    items: Sequence[Labelled],
    model: str,
    threads: int,
    methods: tuple[str, ...],
    layer: int | None,
    log: Callable[[str], None] = print,
) -> tuple[int, list[tuple[Any, ...]]]:
    """``(layer, rows)``: per labelled question ``(signature, name, k, hidden, served probs, gold, request id)``."""
    import anyio

    from gateway.cli.plan import engine_or_exit
    from gateway.decision import heads, pipeline, schema
    from gateway.decision.chat_template import read_gguf
    from gateway.decision.prompts import PromptBuilder
    from gateway.engine import Engine

    cmd = [str(engine_or_exit("serveproto heads", "serveproto-llama")), "--model", model, "--threads", str(threads)]
    rows = []
    async with Engine.spawn(cmd, name="heads") as eng:
        n_layer = int(eng.caps.x_hidden)
        if not n_layer:
            raise SystemExit("serveproto heads: the engine does not read hidden states (CAPS x_hidden)")
        layer = default_layer(n_layer) if layer is None else layer
        if not 0 <= layer < n_layer:
            raise SystemExit(f"serveproto heads: --layer: expected 0 to {n_layer - 1}, got {layer}")
        template, _ = await anyio.to_thread.run_sync(read_gguf, Path(model))
        settings = pipeline.Settings(PromptBuilder(template), debias=methods, hidden=(layer,))
        memory = pipeline.Memory()
        t0 = time.perf_counter()
        for n, item in enumerate(items, start=1):
            parsed = schema.parse_request(item.body)
            decided = await pipeline.decide(parsed, eng, settings, memory)
            for q in parsed.questions:
                if q.id in item.gold and q.n_options > 1 and layer in decided.hidden.get(q.id, {}):
                    rows.append(
                        (
                            heads.signature(q),
                            f"{q.type}:{q.id}",
                            q.n_options,
                            decided.hidden[q.id][layer],
                            list(decided.probs[q.id]),
                            item.gold[q.id],
                            item.id,
                            (q.type, q.instructions or "", heads.options_of(q)),
                        )
                    )
            if n % 10 == 0 or n == len(items):
                log(f"  {n}/{len(items)} requests answered ({time.perf_counter() - t0:.0f} s)")
    return layer, rows


def held_out(X: np.ndarray, y: np.ndarray, k: int, ids: list[str], folds: int, seed: int) -> np.ndarray:
    """Out-of-fold probabilities ``(n, k)`` of heads fitted on the other folds (by request)."""
    import numpy as np

    from gateway.lab import head_fit

    f = head_fit._folds(ids, min(folds, len(set(ids))), seed)
    P = np.zeros((len(y), k))
    for j in range(f.max() + 1):
        tr, te = f != j, f == j
        h = head_fit.fit(X[tr], y[tr], k, [i for i, m in zip(ids, tr) if m], seed=seed)
        P[te] = head_fit.predict(h, X[te])
    return P


def run(args: argparse.Namespace) -> int:
    import anyio
    import numpy as np

    from gateway.decision import calibration, debias, heads
    from gateway.lab import evalset, evaluation, head_fit

    model = args.model or str(default_model_path())
    if not Path(model).exists():
        print(f"serveproto heads: model {model} not found (run `make model`, or pass --model PATH)", file=sys.stderr)
        return 1
    try:
        methods = debias.parse(args.debias) if args.debias is not None else ()
    except ValueError as exc:
        print(f"serveproto heads: --debias: {exc}", file=sys.stderr)
        return 2
    try:
        items = evalset.read_jsonl(args.data) if args.data else evalset.generate()
    except (OSError, evalset.LabelledFileError) as exc:
        print(f"serveproto heads: {exc}", file=sys.stderr)
        return 1
    if args.limit:
        items = items[: args.limit]
    print(f"serveproto heads: {len(items)} labelled requests; x_debias {','.join(methods) or 'none'}", flush=True)
    layer, rows = anyio.run(read_all, items, model, args.threads, methods, args.layer, lambda s: print(s, flush=True))
    by_sig: dict[str, list[tuple[Any, ...]]] = {}
    for r in rows:
        by_sig.setdefault(r[0], []).append(r)
    sha = calibration.sha256_file(model)
    out_heads = []
    print(f"\nlayer {layer}; held out by request ({args.folds} folds)\n")
    print("| question | labels | reading accuracy | head accuracy | reading ECE | head ECE |")
    print("|---|---|---|---|---|---|")
    for sig, rs in sorted(by_sig.items(), key=lambda kv: kv[1][0][1]):
        name, k = rs[0][1], rs[0][2]
        if len(rs) < args.min_labels or len({r[6] for r in rs}) < 2:
            print(f"| {name} | {len(rs)} | - | (fewer than {args.min_labels} labels: no head) | - | - |")
            continue
        X = np.array([r[3] for r in rs], dtype=np.float64)
        y = np.array([r[5] for r in rs])
        ids = [r[6] for r in rs]
        served = [r[4] for r in rs]
        P = held_out(X, y, k, ids, args.folds, args.seed)
        gold = list(y)
        cells = [
            evaluation.accuracy(served, gold),
            evaluation.accuracy(P.tolist(), gold),
            evaluation.ece(*evaluation.confidences(served, gold)),
            evaluation.ece(*evaluation.confidences(P.tolist(), gold)),
        ]
        print(f"| {name} | {len(rs)} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
        h = head_fit.fit(X, y, k, ids, seed=args.seed)
        qtype, instructions, options = rs[0][7]
        out_heads.append(
            {
                "name": f"head-{sig}",
                "signature": sig,
                "type": qtype,
                "instructions": instructions,
                "options": options,
                "x_debias": list(methods),
                "layer": layer,
                **{key: h[key] for key in ("mean", "scale", "W", "b", "T")},
                "fit": {
                    "labels": len(rs),
                    "lam": h["lam"],
                    "cv_nll": h["cv_nll"],
                    "held_out": dict(zip(("served_accuracy", "accuracy", "served_ece", "ece"), cells)),
                },
            }
        )
    out = Path(args.out) if args.out else heads.default_path(sha)
    if not out_heads:  # an empty file would replace the heads a user fitted before
        print(
            f"serveproto heads: no question has --min-labels ({args.min_labels}) labels from two requests or more: "
            f"no head fitted, nothing written ({out} left as it was)",
            file=sys.stderr,
        )
        return 1
    doc = {"format": heads.FORMAT, "model": {"name": Path(model).stem, "sha256": sha}, "heads": out_heads}
    heads.load_document(doc, "the fitted heads")  # what serve will read
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(orjson.dumps(doc))
    tmp.replace(out)
    print(f"\n{len(out_heads)} heads written to {out}")
    return 0
