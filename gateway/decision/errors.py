"""What the decision pipeline raises besides the engine's own errors: typed, and no HTTP.

:mod:`gateway.server.errors` maps each to the status the client sees, in one place:
:class:`Refused` 422 naming the request's field, :class:`DecisionTimeout` 503 with
``Retry-After``, :class:`UnusableScores` 502, :class:`UnusableDecision` 500. The
engine's errors (:mod:`gateway.engine.errors`) pass through the pipeline as they are.
"""

from __future__ import annotations

from gateway.decision.schema import JevValidationError

__all__ = ["Refused", "DecisionTimeout", "UnusableScores", "UnusableDecision"]


class Refused(JevValidationError):
    """A valid request the served engine cannot take (``cache_slot`` past its slots, ``prefix``
    on a decision engine, a text over its context, an option it cannot score, a field its
    DECIDE refused). ``errors``: the 422 ``detail`` entries, each naming the request's own field
    (``{"loc": ["body", ...], "msg", "type"}``, as :class:`JevValidationError`)."""


class DecisionTimeout(Exception):
    """The engine did not answer one call within ``seconds`` (the server's ``--request-timeout``)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"the engine did not answer within {seconds:g} s")
        self.seconds = seconds


class UnusableScores(Exception):
    """Option logprobs the pipeline cannot read (:func:`gateway.decision.arithmetic.option_scores`'s
    ``ValueError``): the message names the question (or the content-free reading) and why."""


class UnusableDecision(Exception):
    """A DECISION that does not answer the record it was given (the decision engine's fault);
    the message names what is wrong (:func:`gateway.decision.record.probabilities`)."""
