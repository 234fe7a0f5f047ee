"""The DECIDE record a decision engine reads, and its DECISION read back into probabilities.

The record's two forms follow the seed's "Decision engines" section (and
``spec/decision-record.md``): the **default** form, every text already text
(a string as sent, JSON as ``json.dumps(value, ensure_ascii=False)``),
missing instructions replaced by the language-model path's default text;
and the **raw** form (``decide_record=raw`` in CAPS), ``"record": "raw"``,
instructions ``null`` when none was sent, descriptions kept as sent (``""``
included; a noul side not described has no ``"text"`` key), JSON values
written compact with sorted keys and ``"json": true`` on such an option;
with ``x_decide_json=sent`` too, the raw form's JSON keeps the caller's key
order (an engine whose reference renders the value as sent: engines/sparrow).
The record is serialized with ``json.dumps(record, ensure_ascii=False)``
(default separators), UTF-8: byte for byte what the seed's engines read.
"""

from __future__ import annotations

import json
import math
from typing import Any

from gateway.decision import jsontext
from gateway.decision.errors import UnusableDecision
from gateway.decision.prompts import DEFAULT_INSTRUCTIONS
from gateway.decision.schema import Question, SystemOneRequest


def state_type(value: Any) -> str:
    """What the caller sent as the state: ``string``, ``object`` or ``array``."""
    return "string" if isinstance(value, str) else "object" if isinstance(value, dict) else "array"


def _default_text(value: Any) -> str | None:
    if value is None or value == "":
        return None
    return value if isinstance(value, str) else jsontext.dumps(value)


def _raw_json(value: Any, sort_keys: bool = True) -> str:
    return jsontext.dumps(value, separators=(",", ":"), sort_keys=sort_keys)


def _raw_option(label: str, value: Any, described: bool = True, sort_keys: bool = True) -> dict[str, Any]:
    option: dict[str, Any] = {"label": label}
    if not described:
        return option
    if isinstance(value, (dict, list)):
        option["text"] = _raw_json(value, sort_keys)
        option["json"] = True
    else:
        option["text"] = value
    return option


def _options(q: Question, raw: bool, sort_keys: bool) -> list[dict[str, Any]]:
    if q.type == "noul":
        crit = q.criteria or {}
        if raw:
            return [_raw_option(side, crit.get(side), side in crit, sort_keys) for side in ("false", "true")]
        return [{"label": side, "text": _default_text(crit.get(side))} for side in ("false", "true")]
    if q.type == "choice":
        items = list(q.criteria.items())
    else:
        items = [(str(i), level) for i, level in enumerate(q.criteria)]
    if raw:
        return [_raw_option(label, value, True, sort_keys) for label, value in items]
    return [{"label": label, "text": _default_text(value)} for label, value in items]


def build(
    request: SystemOneRequest,
    questions: tuple[Question, ...] | None = None,
    *,
    raw: bool = False,
    sort_keys: bool = True,
) -> dict[str, Any]:
    """The record (a dict, in serialization order) for ``questions`` (default: all of the request's);
    ``sort_keys=False`` (CAPS ``x_decide_json=sent``) keeps the raw form's JSON in the caller's key order."""
    qs = request.questions if questions is None else questions
    state = request.state
    if raw:
        state_text = state if isinstance(state, str) else _raw_json(state, sort_keys)
    else:
        state_text = state if isinstance(state, str) else jsontext.dumps(state)
    out_q = []
    for q in qs:
        if raw:
            instr = (
                None
                if not q.has_instructions
                else (q.instructions if isinstance(q.instructions, str) else _raw_json(q.instructions, sort_keys))
            )
        else:
            instr = _default_text(q.instructions) if q.has_instructions else None
            if instr is None:
                instr = DEFAULT_INSTRUCTIONS[q.type]
        out_q.append({"id": q.id, "type": q.type, "instructions": instr, "options": _options(q, raw, sort_keys)})
    record: dict[str, Any] = {"record": "raw"} if raw else {}
    record.update({"state": state_text, "state_type": state_type(state), "questions": out_q})
    return record


def serialize(record: dict[str, Any]) -> bytes:
    """The DECIDE payload: ``json.dumps(record, ensure_ascii=False)`` as UTF-8."""
    return json.dumps(record, ensure_ascii=False).encode("utf-8")


def probabilities(decision: dict[str, Any], questions: tuple[Question, ...]) -> dict[str, list[float]]:
    """The engine's ``probs`` per question id, checked against the record's questions.

    ``decision["answers"]`` is a list of ``{"id", "probs", ...}``; each
    question must be answered once with ``n_options`` finite non-negative
    numbers whose sum is positive (renormalized to 1 here: the engine's float
    sum is not exact). Raises :class:`UnusableDecision` naming what is wrong.
    """
    answers = decision.get("answers") if isinstance(decision, dict) else None
    if not isinstance(answers, list):
        raise UnusableDecision("DECISION has no 'answers' list")
    by_id: dict[str, Any] = {}
    for a in answers:
        if not isinstance(a, dict) or not isinstance(a.get("id"), str):
            raise UnusableDecision(f"DECISION answer without an id: {a!r}"[:200])
        by_id[a["id"]] = a
    out: dict[str, list[float]] = {}
    for q in questions:
        a = by_id.get(q.id)
        if a is None:
            raise UnusableDecision(f"DECISION does not answer question {q.id!r}")
        probs = a.get("probs")
        if (
            not isinstance(probs, list)
            or len(probs) != q.n_options
            or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0 for x in probs
            )
            or sum(probs) <= 0
        ):
            raise UnusableDecision(
                f"DECISION probs of {q.id!r} are not {q.n_options} non-negative numbers: {probs!r}"[:200]
            )
        total = float(sum(probs))
        out[q.id] = [float(x) / total for x in probs]
    return out
