"""Design step 4, written once: option logprobs -> scores (sum or mean) -> softmax; and which
read-out positions an option owns.

This is the one scoring path of the gateway: the engine API
(:meth:`gateway.engine.api.ScoreResult.probabilities`, the ``serveproto score``
command), the server's decision pipeline (:mod:`gateway.decision.pipeline`,
through :mod:`gateway.decision.readings` and :mod:`gateway.decision.scoring`) and
the benchmarks all call :func:`option_scores`, :func:`softmax` and
:func:`log_softmax` here, and every check of ``normalize`` is
:func:`check_normalize`. It lives in the engine room because rooms import one way
(``decision -> engine``, ``tests/test_layers.py``): the engine API needs the softmax
for its results and may import no room above it, while every room above may import
this one. Plain Python floats, no numpy (at a few options per question numpy's
per-call overhead is most of the cost).

Formulas: the seed (``000_*``, "What a language model is asked", "Scoring by
hand") and DESIGN.md's data flow step 4: an option's score is the sum
(``normalize="sum"``, the default) or the mean (``"mean"``, per token) of its
tokens' logprobs; probabilities are the softmax of the scores over the options.

The scored tokens of option ``o`` (spec/serve-protocol.md section 9.1) are the
tokens of ``prefix + stem + option`` after its longest common token prefix with
``prefix + stem``. Without the SCORE extension they are found in the ECHO
read-out of the option's SUBMIT: the first position whose token text differs
from the stem's read-out at that position, or that lies past the stem's end.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import attrs

from gateway.engine.errors import RequestError


@attrs.frozen
class OptionScore:
    """One option's scored tokens.

    ``context_tokens``: tokens before the option's first scored token;
    ``logprobs``: shape ``(n,)``, natural-log probability of each scored token
    given everything before it (spec 9.1); ``option``: the option text.
    """

    context_tokens: int
    logprobs: tuple[float, ...]
    option: str = ""

    @property
    def n_tokens(self) -> int:
        """How many tokens the option scored (``len(logprobs)``)."""
        return len(self.logprobs)

    @property
    def logprob(self) -> float:
        """Sum of ``logprobs``: the option's log-probability (nats)."""
        return math.fsum(self.logprobs)

    @property
    def mean_logprob(self) -> float:
        """Mean of ``logprobs`` (nats per token), the seed's ``normalize="mean"``."""
        return self.logprob / len(self.logprobs) if self.logprobs else float("nan")


def option_tokens(
    echoes: Iterable, known: Mapping[int, bytes], context_len: int, *, where: str = "option"
) -> tuple[int, tuple[float, ...]]:
    """``(context_tokens, logprobs)`` of an option from its SUBMIT's ECHO read-out.

    ``echoes``: the option's ``Echo`` events (``position``, ``logprob``, ``text``);
    ``known``: token text by position from the read-outs of ``prefix + stem``
    (and of the prefix); ``context_len``: the token count of ``prefix + stem``.
    A position the option was not read out at was reused from the KV cache or
    a snapshot, hence shared with the context. Raises :class:`RequestError`
    ``BAD_REQUEST`` (as SCORE would) when the option owns no token, or when its
    first owned token is position 0 (nothing to condition on).
    """
    echoes = sorted(echoes, key=lambda e: e.position)
    for i, ev in enumerate(echoes):
        text = known.get(ev.position)
        if ev.position >= context_len or (text is not None and text != ev.text):
            owned = echoes[i:]
            if ev.position == 0:
                raise RequestError(
                    "BAD_REQUEST", f"{where}: its first token is the text's first token; nothing conditions it"
                )
            return ev.position, tuple(float(e.logprob) for e in owned)
    raise RequestError("BAD_REQUEST", f"{where}: has no token of its own after the context")


#: The values of ``normalize``: an option's score is the ``sum`` or the ``mean`` of its tokens' logprobs.
NORMALIZE = ("sum", "mean")


def check_normalize(normalize: object) -> str:
    """``normalize`` itself when it is one of :data:`NORMALIZE`; ``ValueError`` naming it otherwise.

    The one check of ``normalize``: a request's field (:func:`gateway.decision.jev.parse_request`
    turns the error into its 422), the CLI's ``--normalize`` and :func:`option_scores` all use it.
    """
    if normalize not in NORMALIZE:
        raise ValueError(f"normalize must be 'sum' or 'mean', got {normalize!r}")
    return normalize  # type: ignore[return-value]


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
