"""A decision log (:mod:`gateway.decision.decision_log`) read back: its judged lines as
``serveproto calibrate --data FILE`` fits on them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gateway.decision.decision_log import KEYS
from gateway.decision.schema import QUESTION_TYPES, Question
from gateway.lab.evalset import gold_index, json_lines


class DecisionLogError(ValueError):
    """A decision log that cannot be fitted on: the message names the line and the field."""


def is_log_line(obj: Any) -> bool:
    """Whether a decoded JSON line is a decision-log line (not a labelled request)."""
    return isinstance(obj, dict) and all(k in obj for k in KEYS)


def gold_of(entry: Mapping[str, Any], where: str) -> int | None:
    """The reply-order index of ``entry["answer"]``, or None when it is null (not judged).

    The forms are those of a labelled file (:func:`gateway.lab.evalset.gold_index`). Raises
    :class:`DecisionLogError` naming ``where`` for an answer that is not one of the options.
    """
    if entry.get("answer") is None:
        return None
    qtype, options = entry["type"], entry["options"]
    criteria = None if qtype == "noul" else dict.fromkeys(options) if qtype == "choice" else list(options)
    try:
        return gold_index(Question(str(entry["question_id"]), qtype, None, criteria, False), entry["answer"])
    except ValueError as exc:
        raise DecisionLogError(f"{where}: answer: {exc}") from None


def read_answers(path: str | Path) -> tuple[list[tuple[str, list[float], int, str]], dict[str, Any]]:
    """The judged lines of a decision log as :func:`gateway.lab.calibration_fit.fit` takes them, and
    their common config.

    Returns ``([(type, uncalibrated probabilities, gold index, request id), ...], config)``,
    ``config`` being the lines' ``config`` less ``x_calibration``. Raises :class:`DecisionLogError`
    naming the line for a line that is not a decision-log line, an answer that is not an option,
    probabilities that do not match the options, lines read under different models or
    ``x_debias`` (one calibration fits one of each), or no judged line at all; ``OSError`` as
    reading does.
    """
    answers: list[tuple[str, list[float], int, str]] = []
    config: dict[str, Any] | None = None
    for where, entry in json_lines(path, DecisionLogError):
        if not is_log_line(entry):
            raise DecisionLogError(f"{where}: not a decision-log line (needs {', '.join(KEYS)})")
        if entry["type"] not in QUESTION_TYPES or not isinstance(entry["options"], list):
            raise DecisionLogError(f"{where}: type: expected one of {', '.join(QUESTION_TYPES)} with a list of options")
        gold = gold_of(entry, where)
        if gold is None:
            continue
        p = entry.get("uncalibrated") or entry["probabilities"]
        if not isinstance(p, list) or len(p) != len(entry["options"]):
            raise DecisionLogError(f"{where}: uncalibrated: expected {len(entry['options'])} probabilities")
        here = {k: v for k, v in dict(entry["config"]).items() if k != "x_calibration"}
        if config is None:
            config = here
        elif (here.get("model_sha256"), here.get("x_debias")) != (config.get("model_sha256"), config.get("x_debias")):
            raise DecisionLogError(
                f"{where}: config: read under model {here.get('model_sha256')} and x_debias "
                f"{here.get('x_debias')}, earlier lines under {config.get('model_sha256')} and "
                f"{config.get('x_debias')}: one calibration fits one model and one x_debias"
            )
        answers.append((entry["type"], [float(x) for x in p], gold, str(entry["request_id"])))
    if config is None:
        raise DecisionLogError(f"{path}: no line has an answer: fill 'answer' on the lines you have judged")
    return answers, config
