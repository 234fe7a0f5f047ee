"""The shipped calibration on a set it was not fitted on (issue 48, item 5).

Scores a labelled set through the server's scoring path (``serveproto calibrate``'s own
:func:`gateway.cli.calibrate.score_all`: the default model, the server's default ``x_debias``, no
calibration), applies a calibration file to the answers, and prints ECE, Brier, NLL and accuracy
before and after, per question type and overall. The default set is the generated evaluation set
of seed 14 (``bench/quality.py``'s, 400 questions); the shipped file was fitted on the set of seed 48
(same generator, other states), so every answer measured here is held out.

    .venv/bin/python -m bench.calibration_holdout [--calibration FILE] [--seed 14] [--threads 1]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import anyio

from gateway.cli.calibrate import score_all
from gateway.cli.config import DEFAULT_MODEL_DEBIAS
from gateway.decision import calibration
from gateway.lab import calibration_fit, evalset
from gateway.paths import default_model_path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calibration", type=Path, default=None, help="default: the shipped file for the default model")
    ap.add_argument("--seed", type=int, default=evalset.SEED, help="the generated set's seed (default 14)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    model = default_model_path()
    sha = calibration.sha256_file(model)
    path = args.calibration or calibration.shipped_path(sha)
    cal = calibration.load(path)
    items = evalset.generate(seed=args.seed)
    print(f"{len(items)} requests of the generated set, seed {args.seed}; calibration {cal.id} ({path})")
    answers = anyio.run(score_all, items, str(model), args.threads, DEFAULT_MODEL_DEBIAS)
    print("| questions | n | map | ECE before -> after | Brier before -> after | NLL before -> after | accuracy |")
    print("|---|---|---|---|---|---|---|")
    rows: dict[str, tuple[list[list[float]], list[list[float]], list[int]]] = {}
    for qtype, p, gold, _ in answers:
        after, _ = cal.apply(qtype, p, DEFAULT_MODEL_DEBIAS)
        for key in (qtype, "all"):
            b, a, g = rows.setdefault(key, ([], [], []))
            b.append(list(p))
            a.append(after)
            g.append(gold)
    for key in ("noul", "choice", "score", "all"):
        if key not in rows:
            continue
        b, a, g = rows[key]
        rb, ra = calibration_fit.report(b, g), calibration_fit.report(a, g)
        kind = cal.maps[key].kind if key in cal.maps else "per type"
        print(
            f"| {key} | {rb['n']} | {kind} | {rb['ece']:.3f} -> {ra['ece']:.3f} | {rb['brier']:.3f} -> "
            f"{ra['brier']:.3f} | {rb['nll']:.3f} -> {ra['nll']:.3f} | {rb['accuracy']:.3f} -> {ra['accuracy']:.3f} |"
        )


if __name__ == "__main__":
    main()
