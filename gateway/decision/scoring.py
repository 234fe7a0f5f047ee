"""The decision math: option log-probabilities to probabilities, confidence, expected score.

Formulas from the seed (``000_*``, "What a language model is asked" and
"Reading the answer"): an option's score is the sum (default) or the mean of
its tokens' logprobs; probabilities are the softmax of the scores over the
options; ``confidence = (n * peak - 1) / (n - 1)``; a score question's answer
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

#: Probabilities are reported in units of 1 / QUANTUM.
QUANTUM = 1_000_000
NORMALIZE = ("sum", "mean")


def option_scores(logprobs: Sequence[Sequence[float]], normalize: str = "sum") -> list[float]:
    """One score per option from its tokens' logprobs.

    ``logprobs[o]`` are option ``o``'s scored tokens' log-probabilities
    (natural log, each finite, at least one). ``normalize``: ``"sum"`` (the
    option's whole log-probability) or ``"mean"`` (divided by its token
    count). Returns ``n_options`` floats. Raises ``ValueError`` for an
    unknown ``normalize``, an option with no tokens or a non-finite logprob.
    (Plain Python, not numpy: at a few options per question numpy's per-call
    overhead is most of the cost.)
    """
    if normalize not in NORMALIZE:
        raise ValueError(f"normalize must be one of {NORMALIZE}, got {normalize!r}")
    out = []
    for i, lps in enumerate(logprobs):
        if len(lps) == 0:
            raise ValueError(f"option {i} has no scored tokens")
        total = math.fsum(lps)
        if not math.isfinite(total) or not all(math.isfinite(x) for x in lps):
            raise ValueError(f"option {i} has a non-finite logprob: {lps!r}")
        out.append(total if normalize == "sum" else total / len(lps))
    return out


def softmax(scores: Sequence[float]) -> list[float]:
    """``exp(s_i - max) / sum_j exp(s_j - max)``: ``n`` floats summing to 1."""
    if len(scores) == 0:
        raise ValueError("softmax of no options")
    m = max(scores)
    e = [math.exp(x - m) for x in scores]
    z = math.fsum(e)
    return [x / z for x in e]


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
    units = [int(math.floor(r)) for r in raw]
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

    Returns a list of ``n`` floats (``k / 1e6``) whose decimals sum to exactly 1.
    """
    return [u / QUANTUM for u in quantize(softmax(option_scores(logprobs, normalize)))]


def report(probabilities: Sequence[float]) -> list[float]:
    """Probabilities from elsewhere (a decision engine) in the same reported form as :func:`decide`."""
    return [u / QUANTUM for u in quantize(probabilities)]


def r6(x: float) -> float:
    """Round to 6 decimals (the precision of every reported number)."""
    return round(float(x), 6)
