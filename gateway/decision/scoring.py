"""The reported numbers: probabilities in millionths, confidence, entropy, expected score.

Design step 4 itself (an option's score is the sum or the mean of its tokens'
logprobs; probabilities are the softmax of the scores) is written once, in
:mod:`gateway.decision.arithmetic` (:func:`~gateway.decision.arithmetic.option_scores`,
:func:`~gateway.decision.arithmetic.softmax`), which ``serveproto score`` uses too; this
module reports what it gives. Formulas from the seed (``000_*``, "Reading the
answer"): ``confidence = (n * peak - 1) / (n - 1)``; a score question's answer
is the expected level ``sum_i i * p_i``.

Rounding policy (what a reply carries): probabilities are given in whole
millionths, chosen by the largest-remainder method (Hamilton's) so that the
printed decimals of one question add up to exactly 1; ``confidence`` and
``score`` are computed from those printed probabilities and rounded to 6
decimals. No value is ever NaN or infinite.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gateway.decision.arithmetic import option_scores, softmax

#: Probabilities are reported in units of 1 / QUANTUM.
QUANTUM = 1_000_000


def quantize(probabilities: Sequence[float]) -> list[int]:
    """Probabilities in whole millionths that add up to exactly :data:`QUANTUM`.

    Largest remainder: each share is floored, and the units left over go to the
    options with the largest remainders (ties: the earlier option). Input is
    ``n`` non-negative numbers with a positive sum (normalised here).
    """
    p = [float(x) for x in probabilities]
    if not p or not all(math.isfinite(x) and x >= 0 for x in p) or sum(p) <= 0:
        raise ValueError(f"not a probability vector: {probabilities!r}")
    z = math.fsum(p)
    raw = [x / z * QUANTUM for x in p]
    units = [int(math.floor(r)) for r in raw]  # noqa: RUF046  (kept as written)
    left = QUANTUM - sum(units)
    if left > 0:
        # remainders equal up to float noise count as a tie (the earlier option wins)
        order = sorted(range(len(p)), key=lambda i: (-round(raw[i] - units[i], 6), i))
        for i in order[:left]:
            units[i] += 1
    return units


def confidence(p: Sequence[float]) -> float:
    """``(n * max(p) - 1) / (n - 1)``, and 1.0 for a single option (seed, "Reading the answer")."""
    n = len(p)
    if n == 1:
        return 1.0
    return max(0.0, (n * max(p) - 1.0) / (n - 1))


def entropy(p: Sequence[float]) -> float:
    """Shannon entropy of ``p`` divided by ``log(n)``: 0 when sure, 1 when flat; 0.0 for one option."""
    n = len(p)
    if n == 1:
        return 0.0
    h = -sum(x * math.log(x) for x in p if x > 0)
    return max(0.0, h / math.log(n))  # never -0.0 (a sure answer's -(1 * log 1)), which JSON would print


def expected_level(p: Sequence[float]) -> float:
    """``sum_i i * p_i`` over levels ``0..n-1``: a score question's answer."""
    return float(sum(i * x for i, x in enumerate(p)))


def decide(logprobs: Sequence[Sequence[float]], normalize: str = "sum") -> list[float]:
    """Option logprobs to reported probabilities: scores, softmax, quantized to millionths.

    ``logprobs[o]``: option ``o``'s token logprobs (:func:`gateway.decision.arithmetic.option_scores`,
    whose ``ValueError`` it raises). Returns a list of ``n`` floats (``k / 1e6``) whose
    decimals sum to exactly 1.
    """
    return [u / QUANTUM for u in quantize(softmax(option_scores(logprobs, normalize)))]


def report(probabilities: Sequence[float]) -> list[float]:
    """Probabilities from elsewhere (a decision engine) in the same reported form as :func:`decide`."""
    return [u / QUANTUM for u in quantize(probabilities)]


def r6(x: float) -> float:
    """Round to 6 decimals (the precision of every reported number)."""
    return round(float(x), 6)
