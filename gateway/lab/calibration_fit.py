"""Fitting a calibration (:mod:`gateway.decision.calibration`, the maps as served) and measuring it.

Each slope is fitted by minimising the negative log-likelihood, which is
convex in the inverse temperature (and in each slope), by golden-section
search on a bracket (:func:`fit_inverse_temperature`). A noul gets
``two_slope`` only when it beats ``temperature`` on held-out data
(:func:`fit`). :func:`document` is the file ``serveproto calibrate`` writes and
:func:`gateway.decision.calibration.load` reads. The maps themselves (``temperature``,
``two_slope``, :class:`~gateway.decision.calibration.TypeMap`) are the serving room's.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from gateway.decision.calibration import (
    BETA_RANGE,
    EPS,
    FORMAT,
    VERSION,
    TypeMap,
    clip,
    file_id,
)
from gateway.lab import evaluation


def _golden(f: Callable[[float], float], lo: float, hi: float, iters: int = 80) -> float:
    """The minimum of a convex ``f`` on ``[lo, hi]`` (golden-section search on ``ln beta``)."""
    a, b = math.log(lo), math.log(hi)
    g = (math.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(math.exp(c)), f(math.exp(d))
    for _ in range(iters):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(math.exp(c))
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(math.exp(d))
    return math.exp((a + b) / 2)


def fit_inverse_temperature(probs: Sequence[Sequence[float]], gold: Sequence[int]) -> float:
    """The ``beta`` in :data:`BETA_RANGE` minimising the mean NLL of :func:`temperature` (1.0 for no data)."""
    if not probs:
        return 1.0
    logs = [[math.log(max(x, EPS)) for x in p] for p in probs]

    def nll(beta: float) -> float:
        total = 0.0
        for lp, g in zip(logs, gold):
            s = [beta * x for x in lp]
            m = max(s)
            total += m + math.log(math.fsum(math.exp(x - m) for x in s)) - s[g]
        return total / len(logs)

    return _golden(nll, *BETA_RANGE)


def fit_two_slope(probs: Sequence[Sequence[float]], gold: Sequence[int]) -> tuple[float, float]:
    """``(a_yes, a_no)`` for :func:`two_slope`: each side's slope fitted on the answers of that side."""
    sides: dict[bool, tuple[list[Sequence[float]], list[int]]] = {True: ([], []), False: ([], [])}
    for p, g in zip(probs, gold):
        z = math.log(clip(p[1])) - math.log(clip(p[0]))
        sides[z >= 0][0].append(p)
        sides[z >= 0][1].append(g)
    return fit_inverse_temperature(*sides[True]), fit_inverse_temperature(*sides[False])


def _folds(groups: Sequence[str], k: int, seed: int) -> list[int]:
    """Fold of each answer: requests (``groups``) shuffled with ``seed`` and dealt into ``k`` folds."""
    names = sorted(set(groups))
    random.Random(seed).shuffle(names)
    fold_of = {g: i % k for i, g in enumerate(names)}
    return [fold_of[g] for g in groups]


def fit_type(qtype: str, probs: Sequence[Sequence[float]], gold: Sequence[int], kind: str) -> TypeMap:
    """Fit one map of ``kind`` on answers of one type (module doc)."""
    if kind == "two_slope":
        a_yes, a_no = fit_two_slope(probs, gold)
        return TypeMap("two_slope", {"a_yes": a_yes, "a_no": a_no})
    return TypeMap("temperature", {"beta": fit_inverse_temperature(probs, gold)})


def cross_validate(
    qtype: str,
    probs: Sequence[Sequence[float]],
    gold: Sequence[int],
    groups: Sequence[str],
    kind: str,
    k: int = 5,
    seed: int = 0,
) -> list[list[float]]:
    """Out-of-fold calibrated probabilities: each answer mapped by a fit on the folds without its request."""
    folds = _folds(groups, k, seed)
    out: list[list[float]] = [list(p) for p in probs]
    for f in range(k):
        train = [i for i, x in enumerate(folds) if x != f]
        test = [i for i, x in enumerate(folds) if x == f]
        if not test:
            continue
        m = fit_type(qtype, [probs[i] for i in train], [gold[i] for i in train], kind)
        for i in test:
            out[i] = m.apply(probs[i])
    return out


def report(probs: Sequence[Sequence[float]], gold: Sequence[int]) -> dict[str, float]:
    """ECE (10 equal-mass bins), Brier, NLL and accuracy of answers (:mod:`gateway.lab.evaluation`)."""
    conf, correct = evaluation.confidences(probs, gold)
    return {
        "ece": evaluation.ece(conf, correct),
        "brier": evaluation.brier(probs, gold),
        "nll": evaluation.nll(probs, gold),
        "accuracy": evaluation.accuracy(probs, gold),
        "n": len(probs),
    }


@attrs.frozen
class Fit:
    """The outcome of :func:`fit`: the maps by type, and held-out figures per type and overall.

    ``held_out[type or "all"] = {"before": report, "after": report}`` on
    out-of-fold answers; ``pooled``: (probabilities before, after, gold) of
    every answer, for the reliability diagram.
    """

    maps: dict[str, TypeMap]
    held_out: dict[str, dict[str, dict[str, float]]]
    pooled: tuple[list[list[float]], list[list[float]], list[int]]
    folds: int


def fit(answers: Sequence[tuple[str, Sequence[float], int, str]], k: int = 5, seed: int = 0) -> Fit:
    """Fit every type's map on ``answers`` and measure it by ``k``-fold cross-validation.

    ``answers[j] = (question type, probabilities in reply order, gold index,
    request id)``; folds are by request, so a request's questions are never
    split between fitting and measuring. A noul takes ``two_slope`` only
    when its held-out NLL beats ``temperature``'s. Raises ``ValueError`` for
    fewer than ``k`` requests.
    """
    if len({a[3] for a in answers}) < k:
        raise ValueError(f"cross-validation over {k} folds needs at least {k} labelled requests")
    maps: dict[str, TypeMap] = {}
    held: dict[str, dict[str, dict[str, float]]] = {}
    before_all, after_all, gold_all = [], [], []
    for qtype in ("noul", "choice", "score"):
        rows = [a for a in answers if a[0] == qtype]
        if not rows:
            continue
        probs = [list(a[1]) for a in rows]
        gold = [a[2] for a in rows]
        groups = [a[3] for a in rows]
        kind = "temperature"
        oof = cross_validate(qtype, probs, gold, groups, kind, k, seed)
        if qtype == "noul":
            alt = cross_validate(qtype, probs, gold, groups, "two_slope", k, seed)
            if evaluation.nll(alt, gold) < evaluation.nll(oof, gold):
                kind, oof = "two_slope", alt
        maps[qtype] = fit_type(qtype, probs, gold, kind)
        held[qtype] = {"before": report(probs, gold), "after": report(oof, gold)}
        before_all += probs
        after_all += oof
        gold_all += gold
    held["all"] = {"before": report(before_all, gold_all), "after": report(after_all, gold_all)}
    return Fit(maps, held, (before_all, after_all, gold_all), k)


def document(result: Fit, model_name: str, model_sha256: str, methods: Sequence[str], source: str) -> dict[str, Any]:
    """The calibration file's JSON (``format``, ``version``, ``id``, ``model``, ``x_debias``, ``maps``,
    and how it was fitted: ``data``, ``held_out`` figures, ``folds``)."""
    maps = {t: m.to_json() for t, m in result.maps.items()}
    return {
        "format": FORMAT,
        "version": VERSION,
        "id": file_id(maps, model_sha256, methods),
        "model": {"name": model_name, "sha256": model_sha256},
        "x_debias": list(methods),
        "maps": maps,
        "data": source,
        "folds": result.folds,
        "held_out": result.held_out,
    }
