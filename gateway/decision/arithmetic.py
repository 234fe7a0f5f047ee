"""Design step 4, written once: option logprobs -> scores (sum or mean) -> softmax.

This is the one scoring path of the gateway: the server's decision pipeline
(:mod:`gateway.decision.pipeline`, through :mod:`gateway.decision.readings` and
:mod:`gateway.decision.scoring`), the ``serveproto score`` command
(:func:`probabilities` of the engine API's :class:`~gateway.engine.api.ScoreResult`)
and the benchmarks all call :func:`option_scores`, :func:`softmax` and
:func:`log_softmax` here, and every check of ``normalize`` is :func:`check_normalize`.
The engine API returns option logprobs only; this arithmetic is the decision room's.
Plain Python floats, no numpy (at a few options per question numpy's per-call
overhead is most of the cost).

Formulas: the seed (``000_*``, "What a language model is asked", "Scoring by
hand") and DESIGN.md's data flow step 4: an option's score is the sum
(``normalize="sum"``, the default) or the mean (``"mean"``, per token) of its
tokens' logprobs; probabilities are the softmax of the scores over the options.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.engine.api import ScoreResult


#: The values of ``normalize``: an option's score is the ``sum`` or the ``mean`` of its tokens' logprobs.
NORMALIZE = ("sum", "mean")


def check_normalize(normalize: object) -> str:
    """``normalize`` itself when it is one of :data:`NORMALIZE`; ``ValueError`` naming it otherwise.

    The one check of ``normalize``: a request's field (:func:`gateway.decision.schema.parse_request`
    turns the error into its 422), the CLI's ``--normalize`` and :func:`option_scores` all use it.
    """
    if normalize not in NORMALIZE:
        raise ValueError(f"normalize must be 'sum' or 'mean', got {normalize!r}")
    return normalize


def option_scores(logprobs: Sequence[Sequence[float]], normalize: str = "sum") -> list[float]:
    """One score per option from its tokens' logprobs (nats): the sum, or the mean per token.

    ``logprobs[o]``: option ``o``'s scored tokens' logprobs, shape ``(n_tokens,)``; an engine
    sends 1 to 200 finite ones (spec 9.1), so anything else is an unusable answer, not an
    option to rank. Returns ``(n_options,)`` floats (``math.fsum``, then ``/ n_tokens`` for the
    mean). Raises ``ValueError`` for an unknown ``normalize`` (:func:`check_normalize`), an
    option with no tokens (``"option 1 has no scored tokens"``) or with a NaN or infinite logprob.
    """
    check_normalize(normalize)
    out = []
    for i, lps in enumerate(logprobs):
        if len(lps) == 0:
            raise ValueError(f"option {i} has no scored tokens")
        if not all(math.isfinite(x) for x in lps):
            raise ValueError(f"option {i} has a non-finite logprob: {list(lps)!r}")
        try:
            total = math.fsum(lps)
        except OverflowError:  # finite logprobs whose sum is not (e.g. two of -1e308)
            raise ValueError(f"option {i} has a logprob sum past the float range: {list(lps)!r}") from None
        out.append(total if normalize == "sum" else total / len(lps))
    return out


def _check_scores(scores: Sequence[float]) -> float:
    """The largest of ``scores``, after refusing what no softmax can take (see :func:`softmax`)."""
    if len(scores) == 0:
        raise ValueError("scores: empty")
    if any(math.isnan(s) or s == math.inf for s in scores):
        raise ValueError(f"scores: NaN or +inf in {list(scores)}")
    top = max(scores)
    if top == -math.inf:
        raise ValueError("scores: every score is -inf")
    return top


def softmax(scores: Sequence[float]) -> list[float]:
    """Softmax of ``scores`` (shape ``(n,)``, nats): ``exp(s_i - max) / sum_j exp(s_j - max)``.

    Subtracting the max keeps it finite; a ``-inf`` score gets probability 0.
    Returns ``n`` floats summing to 1 (``math.fsum``). Raises ``ValueError``
    (``"scores: ..."``) for an empty sequence, a NaN or ``+inf`` score, or
    every score ``-inf``.
    """
    top = _check_scores(scores)
    weights = [math.exp(s - top) for s in scores]
    total = math.fsum(weights)
    return [w / total for w in weights]


def log_softmax(scores: Sequence[float]) -> list[float]:
    """``s_i - log(sum_j exp(s_j))``, computed from the max: shape ``(n,)``, nats.

    The log of :func:`softmax`, for the corrections that average in log space
    (:mod:`gateway.decision.readings`). Raises ``ValueError`` as :func:`softmax`.
    """
    top = _check_scores(scores)
    log_z = top + math.log(math.fsum(math.exp(s - top) for s in scores))
    return [s - log_z for s in scores]


def probabilities(result: ScoreResult, group: int = 0, normalize: str = "sum") -> list[float]:
    """Softmax over group ``group``'s options of their sum (or ``"mean"``) logprob: ``(n_options,)``.

    ``result``: what :meth:`gateway.engine.Engine.score` returned. The seed's "Scoring by hand"
    step 3 and DESIGN.md's data flow step 4, the same arithmetic as the server's
    (:func:`option_scores`, then :func:`softmax`). Raises ``ValueError`` for another
    ``normalize``, or for an option with no token or a non-finite logprob (which no
    engine sends: a hand-made result).
    """
    return softmax(option_scores([o.logprobs for o in result.groups[group]], normalize))
