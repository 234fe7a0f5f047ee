"""Who reads a question on a served pair of a language model and a decision engine, and how two
readings are combined.

A *pair* (``serve --pair NAME=LM,DECIDER``) holds a language model, which scores the options
(the pipeline's scoring path), and a decision engine, which answers natively (``DECIDE``). Each
question is read by one *reader* (:data:`READERS`): ``"decider"`` or ``"lm"`` alone, or a
combination of the two answers (:data:`COMBINATIONS`). ``x_reader`` on a request, at the top
level or on a question, overrides the pair's default (:func:`parse`). The combinations take the
two readers' reported probabilities (millionths, each summing to 1; the language model's after
its ``x_debias`` and calibration) and give a new distribution of the same shape:

- ``mean``: the linear opinion pool, ``p = (p_decider + p_lm) / 2`` (Stone 1961; Genest &
  Zidek 1986, "Combining probability distributions", Statistical Science 1(1)).
- ``product``: the log-linear pool with unit weights, ``p ∝ p_decider * p_lm`` (Hinton's
  product of experts; Genest & Zidek 1986), each probability clipped at :data:`FLOOR` first.
- ``gate``: the decision engine's answer where its normalized entropy
  (:func:`gateway.decision.scoring.entropy`) is at most :data:`GATE_ENTROPY`, the language
  model's where it is above (the decider first, the language model where the decider is unsure).

Which one a pair serves by default was chosen by ``bench/readers.py`` on the project's labelled
sets (bench/results/NOTEBOOK.md, "Two readers"). Pure arithmetic: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from gateway.decision import scoring

#: The readers a question can have: each reader alone, then the combinations.
COMBINATIONS = ("mean", "product", "gate")
READERS = ("decider", "lm", *COMBINATIONS)

#: The smallest probability the log-linear pool reads: a reported 0 (under half a millionth) counts as this.
FLOOR = 1e-6

#: A served pair's reader when neither ``serve --reader`` nor the request says (bench/readers.py chose it).
DEFAULT = "decider"

#: ``gate``: the decision engine's normalized entropy above which the language model reads the question.
GATE_ENTROPY = 0.5


def combine(reader: str, decider: Sequence[float], lm: Sequence[float]) -> list[float]:
    """The combined distribution of ``reader`` (one of :data:`COMBINATIONS`) from the two readers'
    probabilities of one question, both shape ``(n_options,)`` in reply order, each summing to 1.

    Returns ``n_options`` floats summing to 1 (``math.fsum``; not yet in millionths:
    :func:`gateway.decision.scoring.report` rounds them). Raises ``ValueError`` for another reader
    name or for two distributions of different sizes.
    """
    if len(decider) != len(lm) or not decider:
        raise ValueError(f"two readings of different sizes: {len(decider)} and {len(lm)} options")
    if reader == "mean":
        raw = [(a + b) / 2 for a, b in zip(decider, lm)]
    elif reader == "product":
        logs = [math.log(max(a, FLOOR)) + math.log(max(b, FLOOR)) for a, b in zip(decider, lm)]
        top = max(logs)
        raw = [math.exp(x - top) for x in logs]
    elif reader == "gate":
        raw = list(decider) if scoring.entropy(decider) <= GATE_ENTROPY else list(lm)
    else:
        raise ValueError(f"not a combination: {reader!r} (one of {', '.join(COMBINATIONS)})")
    z = math.fsum(raw)
    return [x / z for x in raw]


def needs(reader: str) -> tuple[bool, bool]:
    """``(decider, lm)``: whether a question read by ``reader`` needs the decision engine's answer
    and the language model's. ``gate`` asks both (the decision engine's entropy decides after)."""
    return reader != "lm", reader != "decider"


def _entry(loc: list[Any], value: Any) -> dict[str, Any]:
    return {
        "loc": ["body", *loc, "x_reader"],
        "msg": f"Input should be one of {', '.join(repr(r) for r in READERS)}, got {value!r}",
        "type": "literal_error",
    }


def parse(body: Any) -> tuple[str | None, dict[str, str], list[dict[str, Any]]]:
    """A ``/v1/systemone`` body's ``x_reader``: ``(top level or None, {question id: reader}, errors)``.

    ``errors`` holds one 422 ``detail`` entry per bad value, naming its field (``["body",
    "x_reader"]`` or ``["body", "questions", <id>, "x_reader"]``); a null is as absent. Reads only
    what it finds (the body's own validation is :func:`gateway.decision.schema.parse_request`'s).
    """
    errors: list[dict[str, Any]] = []
    top = body.get("x_reader") if isinstance(body, dict) else None
    if top is not None and top not in READERS:
        errors.append(_entry([], top))
        top = None
    per: dict[str, str] = {}
    questions = body.get("questions") if isinstance(body, dict) else None
    if isinstance(questions, dict):
        for qid, q in questions.items():
            value = q.get("x_reader") if isinstance(q, dict) else None
            if value is None:
                continue
            if value in READERS:
                per[qid] = value
            else:
                errors.append(_entry(["questions", qid], value))
    return top, per, errors
