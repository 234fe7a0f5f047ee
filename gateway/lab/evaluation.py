"""Quality of probabilistic answers against gold labels: accuracy, macro-F1, ECE, Brier, NLL, order stability.

Every function takes answers as rows: ``probs[k]`` one answer's
probabilities over its own options (shape ``(n_k,)``, questions of different
sizes mixed), ``gold[k]`` the index of its gold option, and optional
``weights[k]`` (a question asked under three option orders counts three rows
of weight 1/3, so each question weighs the same). Used by
``bench/quality.py`` and ``serveproto calibrate``; numpy, float64.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Union

import numpy as np

#: Probabilities are reported in millionths, so a gold option's probability can be 0: NLL clips at this.
NLL_FLOOR = 1e-6

#: One float per answer: a list, or a float64 array of shape ``(m,)``.
Floats = Union[Sequence[float], np.ndarray]  # noqa: UP007  (a runtime alias)


def _w(weights: Floats | None, n: int) -> np.ndarray:
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != (n,) or n == 0 or (w < 0).any() or w.sum() <= 0:
        raise ValueError("weights: expected one non-negative weight per answer, with a positive sum")
    return w


def argmax(p: Sequence[float]) -> int:
    """The reported answer: the most likely option, the first on ties (as
    :func:`gateway.server.jev.protocol.answer`)."""
    best = 0
    for i, x in enumerate(p):
        if x > p[best]:
            best = i
    return best


def accuracy(probs: Sequence[Sequence[float]], gold: Sequence[int], weights: Sequence[float] | None = None) -> float:
    """Weighted share of answers whose :func:`argmax` is the gold option. Raises ``ValueError`` for no answers."""
    w = _w(weights, len(probs))
    hit = np.array([argmax(p) == g for p, g in zip(probs, gold)], dtype=np.float64)
    return float((w * hit).sum() / w.sum())


def confidences(probs: Sequence[Sequence[float]], gold: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Top-label confidence ``max(p)`` and correctness (1.0 / 0.0) per answer: two arrays of shape ``(m,)``."""
    conf = np.array([max(p) for p in probs], dtype=np.float64)
    correct = np.array([argmax(p) == g for p, g in zip(probs, gold)], dtype=np.float64)
    return conf, correct


def bins(conf: np.ndarray, w: np.ndarray, n_bins: int) -> np.ndarray:
    """Equal-mass bin of each answer: sorted by confidence, cut where the cumulative weight crosses
    k/n_bins; answers of equal confidence share the bin of their group's middle (so that bins do not
    split ties arbitrarily: reported probabilities are rounded, and ties are common)."""
    order = np.argsort(conf, kind="stable")
    c, ws = conf[order], w[order]
    cum = np.cumsum(ws)
    mid = np.empty(len(c))
    start = 0
    for end in range(1, len(c) + 1):
        if end == len(c) or c[end] != c[start]:
            lo = cum[start - 1] if start else 0.0
            mid[start:end] = (lo + cum[end - 1]) / 2
            start = end
    b = np.minimum((mid / w.sum() * n_bins).astype(int), n_bins - 1)
    out = np.empty(len(conf), dtype=int)
    out[order] = b
    return out


def ece(conf: Floats, correct: Floats, weights: Floats | None = None, n_bins: int = 10) -> float:
    """Expected calibration error of top-label confidences, with equal-mass bins.

    ``sum_b (W_b / W) |acc_b - conf_b|`` over ``n_bins`` bins holding equal
    weight of answers sorted by confidence, ties kept in one bin (the adaptive binning of Nixon et
    al. 2019, "Measuring Calibration in Deep Learning", CVPR workshops; ECE of
    Naeini et al. 2015 and Guo et al. 2017, "On Calibration of Modern Neural
    Networks", ICML). ``conf``, ``correct``: shape ``(m,)``. In [0, 1].
    """
    conf = np.asarray(conf, dtype=np.float64)
    correct = np.asarray(correct, dtype=np.float64)
    w = _w(weights, len(conf))
    b = bins(conf, w, n_bins)
    total = 0.0
    for k in range(n_bins):
        m = b == k
        wk = w[m].sum()
        if wk > 0:
            total += abs((w[m] * correct[m]).sum() - (w[m] * conf[m]).sum())
    return float(total / w.sum())


def ece_floor(
    conf: Floats, weights: Floats | None = None, n_bins: int = 10, rounds: int = 200, seed: int = 0
) -> tuple[float, float]:
    """The ECE a perfectly calibrated model with these confidences would show on this many answers.

    Parametric bootstrap: ``rounds`` times, each answer is drawn correct with
    probability equal to its confidence and :func:`ece` is taken. Returns
    ``(mean, 95th percentile)``: an ECE near the mean is noise, not
    miscalibration. Deterministic for a ``seed``.
    """
    conf = np.asarray(conf, dtype=np.float64)
    w = _w(weights, len(conf))
    rng = np.random.default_rng(seed)
    draws = [ece(conf, (rng.random(len(conf)) < conf).astype(np.float64), w, n_bins) for _ in range(rounds)]
    return float(np.mean(draws)), float(np.percentile(draws, 95))


def brier(probs: Sequence[Sequence[float]], gold: Sequence[int], weights: Sequence[float] | None = None) -> float:
    """Multi-class Brier score: the weighted mean of ``sum_i (p_i - [i = gold])^2`` (Brier 1950). In [0, 2]."""
    w = _w(weights, len(probs))
    s = np.array([sum((x - (i == g)) ** 2 for i, x in enumerate(p)) for p, g in zip(probs, gold)])
    return float((w * s).sum() / w.sum())


def nll(probs: Sequence[Sequence[float]], gold: Sequence[int], weights: Sequence[float] | None = None) -> float:
    """Weighted mean of ``-ln max(p_gold, NLL_FLOOR)`` (nats; :data:`NLL_FLOOR` for a reported 0)."""
    w = _w(weights, len(probs))
    s = np.array([-math.log(max(p[g], NLL_FLOOR)) for p, g in zip(probs, gold)])
    return float((w * s).sum() / w.sum())


def macro_f1(
    pred: Sequence[Hashable], gold: Sequence[Hashable], tasks: Sequence[str], weights: Sequence[float] | None = None
) -> float:
    """Macro-F1 per task, averaged over tasks.

    ``pred[k]``, ``gold[k]``: answer ``k``'s predicted and gold class (any
    hashable: a label, a level); ``tasks[k]``: which question it answers.
    Per task, ``F1_c = 2 TP / (2 TP + FP + FN)`` (weighted counts) for every
    class that is gold or predicted at least once, averaged; then the mean
    over tasks, each task weighing the same.
    """
    w = _w(weights, len(pred))
    by_task: dict[str, list[int]] = {}
    for k, t in enumerate(tasks):
        by_task.setdefault(t, []).append(k)
    scores = []
    for ks in by_task.values():
        classes = {gold[k] for k in ks} | {pred[k] for k in ks}
        f1s = []
        for c in classes:
            tp = sum(w[k] for k in ks if pred[k] == c and gold[k] == c)
            fp = sum(w[k] for k in ks if pred[k] == c and gold[k] != c)
            fn = sum(w[k] for k in ks if pred[k] != c and gold[k] == c)
            f1s.append(2 * tp / (2 * tp + fp + fn))
        scores.append(sum(f1s) / len(f1s))
    return float(sum(scores) / len(scores))


def jsd(p: Sequence[float], q: Sequence[float]) -> float:
    """Jensen-Shannon divergence in bits (base 2, so in [0, 1]): ``(KL(p||m) + KL(q||m)) / 2``, ``m = (p+q)/2``."""
    out = 0.0
    for a, b in zip(p, q):
        m = (a + b) / 2
        if a > 0:
            out += a * math.log2(a / m) / 2
        if b > 0:
            out += b * math.log2(b / m) / 2
    return max(0.0, out)


def order_stability(by_order: Sequence[dict[str, float]]) -> tuple[bool, float]:
    """One question asked under several option orders: (did the answer change, mean pairwise JSD).

    ``by_order[j]``: label -> probability under order ``j``, in the order
    the options were sent (so a tie goes to the first-listed, as a reply's
    ``choice`` does). A flip: two orders whose answers (:func:`argmax`)
    name different labels. Raises ``ValueError`` for fewer than two orders.
    """
    if len(by_order) < 2:
        raise ValueError("order stability needs at least two orders")

    def top(d: dict[str, float]) -> str:
        order = list(d)
        return max(d, key=lambda k: (d[k], -order.index(k)))

    winners = {top(d) for d in by_order}
    labels = list(by_order[0])
    pairs = [(a, b) for i, a in enumerate(by_order) for b in by_order[i + 1 :]]
    mean = sum(jsd([a[x] for x in labels], [b[x] for x in labels]) for a, b in pairs) / len(pairs)
    return len(winners) > 1, mean
