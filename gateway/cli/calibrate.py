"""``serveproto calibrate``: fit a calibration on labelled requests and write it where ``serve`` finds it.

    serveproto calibrate [--data FILE] [--model GGUF] [--debias METHODS] [--folds 5] [--out FILE] [--png FILE]

Scores every labelled request (``--data``: a labelled JSONL file,
:mod:`gateway.lab.evalset`; default: the generated set) through the server's own
scoring path on the llama engine (:func:`gateway.decision.pipeline.decide`, the
server's prompts from the model's chat template, no calibration applied), under the
``x_debias`` that ``serve`` applies to that model by default (or
``--debias``), fits one map per question type (:mod:`gateway.lab.calibration_fit`),
measures it by cross-validation over requests, prints ECE, Brier, NLL and
accuracy before and after on the held-out answers and a reliability diagram
in text, writes the calibration file (default
``$SERVEPROTO_CACHE/calibration/<model sha256>.json``, which ``serve``
loads for that model) and a reliability diagram as PNG beside it (with
matplotlib installed).

``--data`` may also be a judged decision log (``serve --log-decisions``,
:mod:`gateway.lab.logged_answers`): its lines already hold the
uncalibrated probabilities, so nothing is scored and no model is loaded;
the model's sha256 and the ``x_debias`` come from the log.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.cli import sub_command
from gateway.paths import default_model_path

if TYPE_CHECKING:
    from gateway.decision.pipeline import Decided
    from gateway.decision.schema import SystemOneRequest
    from gateway.lab.calibration_fit import Fit
    from gateway.lab.evalset import Labelled

#: One labelled answer as the fit takes it: (question type, probabilities in reply order, gold index, request id).
Answer = tuple[str, list[float], int, str]

HELP = __doc__.split("\n\n", 1)[1]


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub_command(sub, "calibrate", "fit a calibration on labelled requests (serve applies it to that model)", HELP)
    p.add_argument(
        "--data",
        help='labelled JSONL: {"request": <System One body>, "gold": {qid: answer}} per line, '
        "or a decision log (serve --log-decisions) with 'answer' filled in "
        "(default: the generated evaluation set)",
    )
    p.add_argument("--model", help="GGUF model (default: the fetched SmolLM2-135M-Instruct)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads of the llama engine (default 1)")
    p.add_argument(
        "--debias",
        default=None,
        metavar="METHODS",
        help="the x_debias the answers are read under (default: serve's default for this model)",
    )
    p.add_argument("--folds", type=int, default=5, help="cross-validation folds over requests (default 5)")
    p.add_argument("--seed", type=int, default=0, help="seed of the folds")
    p.add_argument("--limit", type=int, default=0, help="score only the first N requests")
    p.add_argument(
        "--scale",
        type=int,
        default=1,
        metavar="K",
        help="without --data: K times the generated set's requests per domain (default 1: 64 requests, "
        "292 questions); more data fits and measures the maps more precisely",
    )
    p.add_argument("--out", help="the calibration file (default: $SERVEPROTO_CACHE/calibration/<model sha256>.json)")
    p.add_argument("--png", help="the reliability diagram (default: the calibration file with .png; 'none' to skip)")
    p.set_defaults(func=run)


def answers_of(
    parsed: SystemOneRequest, decided: Decided, gold: dict[str, int], rid: str
) -> list[tuple[str, list[float], int, str]]:
    """(type, probabilities in reply order, gold index, request id) for each labelled question answered."""
    return [
        (q.type, list(decided.probs[q.id]), gold[q.id], rid)
        for q in parsed.questions
        if q.id in gold and q.n_options > 1
    ]


async def score_all(
    items: Sequence[Labelled],
    model: str,
    threads: int,
    methods: tuple[str, ...],
    log: Callable[[str], None] = print,
) -> list[Answer]:
    """Every labelled question's probabilities as served (no calibration) on the llama engine."""
    import anyio

    from gateway.cli.plan import engine_or_exit
    from gateway.decision import pipeline, schema
    from gateway.decision.chat_template import read_gguf
    from gateway.decision.prompts import PromptBuilder
    from gateway.engine import Engine

    cmd = [str(engine_or_exit("serveproto calibrate", "serveproto-llama")), "--model", model, "--threads", str(threads)]
    out = []
    async with Engine.spawn(cmd, name="calibrate") as eng:
        template, _ = await anyio.to_thread.run_sync(read_gguf, Path(model))
        settings = pipeline.Settings(PromptBuilder(template), debias=methods)
        memory = pipeline.Memory()
        t0 = time.perf_counter()
        for k, item in enumerate(items, start=1):
            parsed = schema.parse_request(item.body)
            decided = await pipeline.decide(parsed, eng, settings, memory)
            out += answers_of(parsed, decided, item.gold, item.id)
            if k % 10 == 0 or k == len(items):
                log(f"  {k}/{len(items)} requests scored ({time.perf_counter() - t0:.0f} s)")
    return out


def table(result: Fit) -> str:
    lines = [
        "| questions | n | map | ECE before -> after | Brier before -> after | NLL before -> after | accuracy |",
        "|---|---|---|---|---|---|---|",
    ]
    for t, h in result.held_out.items():
        b, a = h["before"], h["after"]
        kind = result.maps[t].kind if t in result.maps else "per type"
        lines.append(
            f"| {t} | {b['n']} | {kind} | {b['ece']:.3f} -> {a['ece']:.3f} | {b['brier']:.3f} -> "
            f"{a['brier']:.3f} | {b['nll']:.3f} -> {a['nll']:.3f} | {b['accuracy']:.3f} -> {a['accuracy']:.3f} |"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    import anyio

    from gateway.cli.config import DEFAULT_MODEL_DEBIAS
    from gateway.decision import calibration, debias
    from gateway.lab import evalset

    if args.data and _is_decision_log(args.data):
        return _fit_and_write(args, *_log_answers(args))
    model = args.model or str(default_model_path())
    if not Path(model).exists():
        print(
            f"serveproto calibrate: model {model} not found (run `make model`, or pass --model PATH)", file=sys.stderr
        )
        return 1
    if args.debias is not None:
        try:
            methods = debias.parse(args.debias)
        except ValueError as exc:
            print(f"serveproto calibrate: --debias: {exc}", file=sys.stderr)
            return 2
    else:
        methods = DEFAULT_MODEL_DEBIAS if not args.model else ()
    try:
        if args.scale < 1:
            raise SystemExit(f"serveproto calibrate: --scale: expected a positive integer, got {args.scale}")
        items = (
            evalset.read_jsonl(args.data)
            if args.data
            else evalset.generate(sizes={domain: n * args.scale for domain, n in evalset.SIZES.items()})
        )
    except (OSError, evalset.LabelledFileError) as exc:
        print(f"serveproto calibrate: {exc}", file=sys.stderr)
        return 1
    if args.limit:
        items = items[: args.limit]
    source = args.data or (
        f"the generated evaluation set (gateway.lab.evalset, seed {evalset.SEED}"
        + (f", scale {args.scale})" if args.scale > 1 else ")")
    )
    print(
        f"serveproto calibrate: {len(items)} labelled requests from {source}; x_debias {','.join(methods) or 'none'}",
        flush=True,
    )
    answers = anyio.run(score_all, items, model, args.threads, methods, lambda s: print(s, flush=True))
    return _fit_and_write(args, answers, Path(model).stem, calibration.sha256_file(model), methods, source)


def _is_decision_log(path: str) -> bool:
    """Whether ``path``'s first non-empty line is a decision-log line (``serve --log-decisions``)."""
    import orjson

    from gateway.lab.logged_answers import is_log_line

    try:
        with open(path, "rb") as f:
            first = next((line for line in f if line.strip()), b"")
        return is_log_line(orjson.loads(first))
    except (OSError, orjson.JSONDecodeError):
        return False  # read_jsonl reports it


def _log_answers(args: argparse.Namespace) -> tuple[list[Answer], str, str, tuple[str, ...], str]:
    """``(answers, model name, model sha256, x_debias, source)`` from a judged decision log (no scoring:
    the log holds the uncalibrated probabilities). Exits 1 naming the line for a log that cannot be fitted."""
    from gateway.decision import calibration
    from gateway.lab.logged_answers import DecisionLogError, read_answers

    try:
        answers, config = read_answers(args.data)
    except (OSError, DecisionLogError) as exc:
        raise SystemExit(f"serveproto calibrate: {exc}") from None
    sha = config.get("model_sha256")
    if sha is None:
        if not args.model:
            raise SystemExit(
                f"serveproto calibrate: {args.data}: the log does not name the model file's sha256 "
                "(the server did not know its path): pass --model PATH"
            )
        sha = calibration.sha256_file(args.model)
    methods = tuple(config.get("x_debias") or ())
    print(
        f"serveproto calibrate: {len(answers)} judged answers from the decision log {args.data}; x_debias "
        f"{','.join(methods) or 'none'}",
        flush=True,
    )
    return answers, str(config.get("model") or "model"), sha, methods, f"decision log {args.data}"


def _fit_and_write(
    args: argparse.Namespace, answers: list[Answer], model_name: str, sha: str, methods: Sequence[str], source: str
) -> int:
    """Fit, print the held-out table and the reliability diagrams, write the file (and the PNG)."""
    from gateway.decision import calibration
    from gateway.lab import calibration_fit, reliability

    try:
        result = calibration_fit.fit(answers, k=args.folds, seed=args.seed)
    except ValueError as exc:
        print(f"serveproto calibrate: {exc}", file=sys.stderr)
        return 1
    doc = calibration_fit.document(result, model_name, sha, methods, source)
    out = Path(args.out) if args.out else calibration.default_path(sha)
    out.parent.mkdir(parents=True, exist_ok=True)
    import orjson

    out.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
    before, after, gold = result.pooled
    print(f"\nheld out ({result.folds}-fold cross-validation over requests):\n{table(result)}\n")
    print("before:\n" + reliability.reliability_text(before, gold))
    print("after:\n" + reliability.reliability_text(after, gold))
    png = args.png if args.png is not None else str(out.with_suffix(".png"))
    if png != "none":
        try:
            reliability.reliability_png(
                (before, gold), (after, gold), png, f"{model_name}\nx_debias {','.join(methods) or 'none'}, held out"
            )
            print(f"\nreliability diagram: {png}")
        except ImportError:
            print("\nno reliability diagram: matplotlib is not installed (pip install 'serveproto[calibrate]')")
    where = f"serve loads it with --calibration {out}" if args.out else "serve loads it for this model"
    print(f"calibration {doc['id']} written to {out} ({where})")
    return 0
