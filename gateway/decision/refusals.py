"""An engine's refusal, told as the field of the request the client sent.

The engine refuses a SCORE with ``BAD_REQUEST <field>: <reason>`` naming a
field of the payload the gateway built (``groups[3].options[1]``, spec 9.1), or
a prompt with the token counts and no field at all; a decision engine refuses a
DECIDE with ``DECIDE_INVALID <field>: <reason>`` naming a field of the record.
None of these means anything to the client: :func:`scoring_refusal` and
:func:`decide_refusal` turn them into a 422 ``detail`` entry naming the
request's own field (``state``, ``questions.<id>``,
``questions.<id>.criteria.<label>``) with the limit in the message, which
:mod:`gateway.decision.pipeline` raises as :class:`gateway.decision.errors.Refused`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from gateway.decision.prompts import as_text, question_text
from gateway.decision.schema import MAX_OPTION_TOKENS, Question, SystemOneRequest

#: ``groups[g].options[o]: why`` (the llama engine) or ``groups.g.options.o: why`` (the fixture).
_OPTION_FIELD = re.compile(r"groups(?:\[(\d+)\]|\.(\d+))\.options(?:\[(\d+)\]|\.(\d+)):\s*(.*)", re.S)
#: A refusal of a text longer than the context or one batch: the llama engine's ("is longer than the
#: context", "does not fit one batch", "the prompt has N tokens, the context M") and the fixture's
#: ("N tokens exceed n_ctx=M", "prompt of N tokens exceeds n_ctx=M").
_TOO_LONG = re.compile(r"longer than|does not fit|exceed|n_ctx|has \d+ tokens, the context")
#: A refusal of an option over the scored-token bound: "has more than 200 scored tokens" (llama),
#: "201 scored tokens, expected 1 to 200" (fixture).
_OPTION_TOO_LONG = re.compile(r"more than \d+ scored tokens|\d+ scored tokens, expected")


def max_prompt(caps: object) -> int | None:
    """The longest prompt in tokens an engine accepts: CAPS ``x_max_prompt`` (the llama engine's
    ``--ctx-max``, by default the model's trained context), else ``n_ctx`` (a slot's context, which
    is the limit on an engine that does not say more); None when the engine says neither."""
    values = getattr(caps, "values", None)
    raw = values.get("x_max_prompt") if isinstance(values, dict) else None
    if isinstance(raw, str) and raw.isdigit() and int(raw) > 0:
        return int(raw)
    n = getattr(caps, "n_ctx", None)
    return n if isinstance(n, int) and n > 0 else None


def too_long(reason: str) -> bool:
    """Whether an engine's refusal is of a text longer than its context (or one batch)."""
    return _TOO_LONG.search(reason) is not None


def option_loc(question: Question, index: int) -> list[Any]:
    """The request path of option ``index`` of ``question`` (its reply order): a choice's label, a
    score's level number, a noul's ``false`` / ``true``."""
    loc: list[Any] = ["body", "questions", question.id, "criteria"]
    if question.type == "choice":
        labels = list(question.criteria)
        return loc + [labels[index]] if index < len(labels) else loc
    if question.type == "score":
        return loc + [index]
    return loc + [("false", "true")[index]] if index < 2 else loc


def _longest_part(request: SystemOneRequest, questions: Sequence[Question]) -> list[Any]:
    """The path of the longest text (UTF-8 bytes) of a prompt: the fixed ``prefix``, the ``state``,
    or one of ``questions`` (its instructions and criteria as listed); the earlier one on ties."""
    parts: list[tuple[int, list[Any]]] = []
    if request.prefix:
        parts.append((len(request.prefix.encode()), ["body", "prefix"]))
    parts.append((len(as_text(request.state).encode()), ["body", "state"]))
    for q in questions:
        text, _ = question_text(q.type, q.instructions, q.criteria)
        parts.append((len(text.encode()), ["body", "questions", q.id]))
    return max(parts, key=lambda p: p[0])[1]


def over_any_context(
    request: SystemOneRequest, n_ctx: int | None, max_token_bytes: int | None
) -> dict[str, Any] | None:
    """The 422 ``detail`` entry for a request with a part no context of ``n_ctx`` tokens can hold,
    found before the engine reads anything; None when every part might fit (the engine decides).

    A token stands for at most ``max_token_bytes`` bytes of text (the model's longest token piece),
    so a part (``prefix``, ``state``, a question's text) of ``B`` UTF-8 bytes is at least
    ``ceil(B / max_token_bytes)`` tokens: over ``n_ctx * max_token_bytes`` bytes it cannot fit, and
    the engine need not spend seconds tokenizing it to say so (a 15 MB state once kept the llama
    engine past its PING timeout: killed, restarted, a 503; issue 30, item 0). The entry is the one
    the engine's refusal gives (:func:`scoring_refusal`): the first question whose prompt holds the
    part, and its longest part. ``None`` for either bound: no check.
    """
    if not n_ctx or not max_token_bytes or not request.questions:
        return None
    bound = n_ctx * max_token_bytes  # bytes

    def over(text: str) -> bool:
        # a str of n code points is n to 4n UTF-8 bytes: encode only where the bound lies between
        return len(text) > bound or (4 * len(text) > bound and len(text.encode("utf-8", "surrogatepass")) > bound)

    shared = (request.prefix is not None and over(request.prefix)) or over(as_text(request.state))
    for q in request.questions:
        if shared or over(question_text(q.type, q.instructions, q.criteria)[0]):
            return {
                "loc": _longest_part(request, [q]),
                "type": "too_long",
                "msg": f"The prompt of question {q.id!r} (the state, then the question and its options) is "
                f"longer than the engine's context of {n_ctx} tokens; this is its longest part",
            }
    return None


def scoring_refusal(
    reason: str,
    owners: Sequence[Question | None],
    request: SystemOneRequest,
    n_ctx: int | None,
    read_owners: Sequence[Sequence[int]] | None = None,
) -> dict[str, Any] | None:
    """The 422 ``detail`` entry for an engine's ``BAD_REQUEST <reason>`` on a scoring call, or None
    when the refusal is not about the request (left to the generic engine error).

    ``owners[g]``: the question whose prompt is group ``g`` of the call (None where a group is
    not a question's). ``read_owners[g][k]``: the reply option that scored text ``k`` of group
    ``g`` counts for (a canonical read scores them in another order; None: the reply's order).
    ``n_ctx``: the engine's context per slot in tokens (CAPS), for the message.
    An option over :data:`gateway.decision.schema.MAX_OPTION_TOKENS` names the label; a prompt over the
    context names its longest part (:func:`_longest_part`), the state or the question most often;
    another refusal of one option names that option.
    """
    context = f"the engine's context of {n_ctx} tokens" if n_ctx else "the engine's context"
    m = _OPTION_FIELD.match(reason)
    if m is not None:
        g = int(m.group(1) or m.group(2))
        o = int(m.group(3) or m.group(4))
        if read_owners is not None and g < len(read_owners) and o < len(read_owners[g]):
            o = read_owners[g][o]
        why = m.group(5).strip()
        q = owners[g] if g < len(owners) else None
        if q is None:
            return None
        if _OPTION_TOO_LONG.search(why):
            return {
                "loc": option_loc(q, o),
                "type": "too_long",
                "msg": f"An option may have at most {MAX_OPTION_TOKENS} tokens: the engine scores at most "
                f"{MAX_OPTION_TOKENS} tokens per option",
            }
        if _TOO_LONG.search(why):
            return {
                "loc": _longest_part(request, [q]),
                "type": "too_long",
                "msg": f"The prompt of question {q.id!r} (the state, then the question and its options) is "
                f"longer than {context}; this is its longest part",
            }
        return {"loc": option_loc(q, o), "type": "value_error", "msg": f"The engine cannot score this option: {why}"}
    if _TOO_LONG.search(reason):
        questions = [q for q in dict.fromkeys(owners) if q is not None]
        return {
            "loc": _longest_part(request, questions),
            "type": "too_long",
            "msg": f"A prompt (the state, then a question and its options) is longer than {context}; "
            "this is its longest part",
        }
    return None


def decide_refusal(reason: str, questions: Sequence[Question]) -> dict[str, Any]:
    """A ``DECIDE_INVALID <field>: <reason>`` as a 422 ``detail`` entry naming the request's field.

    The engine names a field of the record (``questions.2.options.1.label``,
    spec/decision-record.md); the client gets the path in what it sent:
    the question by its id, an option by its label (choice) or level index
    (score), ``criteria`` for options, the side (``false`` / ``true``) of a noul.
    """
    field, sep, why = reason.partition(": ")
    if not sep:
        field, why = "record", reason
    parts = [p for p in field.split(".") if p]
    loc: list[Any] = ["body"]
    if parts[:1] == ["questions"] and len(parts) >= 2 and parts[1].isdigit() and int(parts[1]) < len(questions):
        q = questions[int(parts[1])]
        loc += ["questions", q.id]
        rest = parts[2:]
        if rest[:1] == ["options"]:
            loc.append("criteria")
            if len(rest) >= 2 and rest[1].isdigit():
                j = int(rest[1])
                if q.type == "choice" and j < len(q.criteria):
                    loc.append(list(q.criteria)[j])
                elif q.type == "score":
                    loc.append(j)
                elif q.type == "noul" and j < 2:
                    loc.append(("false", "true")[j])
        elif rest:
            loc.append(rest[0])
    elif parts and parts[0] not in ("record",):
        loc += parts
    return {"loc": loc, "msg": why or "refused by the decision engine", "type": "decide_invalid"}
