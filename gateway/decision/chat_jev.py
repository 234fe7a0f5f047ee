"""The ``jev`` extension of ``/v1/chat/completions``, its decision half: typed questions about a conversation.

:func:`parse` validates the body's ``jev`` object into a :class:`ChatDecision`: the
:class:`~gateway.decision.schema.SystemOneRequest` whose state is the conversation
(:func:`gateway.decision.conversation.conversation_state`, the text the terminal's ``/decide``
sends too), the mode (``beside``, ``instead``, ``then``) and, for ``then``, the question the text
is generated after. Decide-then-generate (seed ``003_*``): the designated question's answer is its
most probable option (:func:`chosen`, first on ties, as the reply's ``choice``), written into the
conversation's system turn as :data:`THEN_NOTE` (:func:`conditioned`) before the text is generated.
No I/O: the server's route does the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from gateway.decision import schema
from gateway.decision.conversation import conversation_state
from gateway.decision.prompts import DEFAULT_INSTRUCTIONS, as_text
from gateway.decision.schema import JevValidationError, Question, SystemOneRequest

#: The fields of the ``jev`` object; any other is an unknown field (``x_warnings``; ``serve --strict``: a 422).
JEV_FIELDS = ("questions", "mode", "question", "normalize", "x_debias", "x_head")
#: ``beside``: answers and the completion of the conversation as sent; ``instead``: answers only, nothing
#: generated (the default with ``max_tokens: 0``); ``then``: answers, then the completion conditioned on the
#: designated question's answer.
MODES = ("beside", "instead", "then")

#: The text decide-then-generate adds to the conversation's system turn (after its text and a blank line; a
#: system turn of its own, first, when the conversation has none): ``{question}`` is the designated
#: question's instructions (:func:`gateway.decision.prompts.as_text`; the type's default instructions when
#: it has none), ``{answer}`` the chosen option's words (:func:`answer_words`).
THEN_NOTE = (
    "A decision about this conversation is already taken.\n"
    "Question: {question}\n"
    "Answer: {answer}\n"
    "Write your reply in keeping with this answer."
)


@attrs.frozen
class ChatDecision:
    """A validated ``jev`` object: ``request`` (the questions, the conversation as ``state``), ``mode``
    (one of :data:`MODES`) and ``then`` (the id of the question the text follows; None unless ``then``)."""

    request: SystemOneRequest
    mode: str
    then: str | None


def _err(loc: list[Any], msg: str, type_: str) -> dict[str, Any]:
    return {"loc": ["body", "jev", *loc], "msg": msg, "type": type_}


def in_jev(entry: dict[str, Any]) -> dict[str, Any]:
    """A ``/v1/systemone`` error entry (``{"loc": ["body", "questions", ...], ...}``) as the chat body's:
    its questions and options live under ``jev``, its state is the ``messages``."""
    path = list(entry["loc"][1:])
    loc = ["body", "messages", *path[1:]] if path[:1] == ["state"] else ["body", "jev", *path]
    return {**entry, "loc": loc}


def parse(jev: Any, messages: Sequence[dict[str, Any]], *, generates: bool, strict: bool = False) -> ChatDecision:
    """Validate a chat body's ``jev`` object (``{"questions", "mode"?, "question"?, "normalize"?, "x_debias"?,
    "x_head"?}``) over the conversation ``messages``.

    ``generates``: False when the body asks for no text (``max_tokens`` 0): ``mode`` then defaults to
    ``instead`` (else to ``beside``, or to ``then`` when ``question`` is sent), and ``beside`` / ``then``
    are refused. ``questions`` are read by :func:`gateway.decision.schema.parse_request` (the same shapes,
    checks and messages as ``/v1/systemone``). Unknown fields of ``jev`` and of its questions are kept for
    ``x_warnings`` (``jev.questions.q1.critera: unknown field``); ``strict`` refuses them. Raises
    :class:`JevValidationError` listing every problem, each ``loc`` under ``["body", "jev", ...]``.
    """
    if not isinstance(jev, dict):
        raise JevValidationError([_err([], "Input should be an object with 'questions'", "dict_type")])
    errors: list[dict[str, Any]] = []
    body = {
        "state": conversation_state(messages),
        **{k: jev[k] for k in ("normalize", "x_debias", "x_head") if k in jev},
    }
    if "questions" in jev:
        body["questions"] = jev["questions"]
    parsed: SystemOneRequest | None = None
    try:
        parsed = schema.parse_request(body, strict=strict)
    except JevValidationError as exc:
        errors += [in_jev(e) for e in exc.errors]
    mode = jev.get("mode")
    then = jev.get("question")
    if mode is None:
        mode = "then" if then is not None else "beside" if generates else "instead"
    elif mode not in MODES:
        errors.append(_err(["mode"], "Input should be 'beside', 'instead' or 'then'", "literal_error"))
    if mode in ("beside", "then") and not generates:
        errors.append(
            _err(["mode"], f"mode {mode!r} generates text and max_tokens is 0: use mode 'instead'", "value_error")
        )
    ids = [q.id for q in parsed.questions] if parsed is not None else None
    if then is not None:
        if mode != "then":
            errors.append(
                _err(["question"], "names the question the text follows: only read with mode 'then'", "value_error")
            )
        elif not isinstance(then, str):
            errors.append(_err(["question"], "Input should be a valid string (a question id)", "string_type"))
        elif ids is not None and then not in ids:
            errors.append(_err(["question"], f"names no question of jev.questions: {then!r}", "value_error"))
    elif mode == "then" and ids is not None and len(ids) != 1:
        errors.append(
            _err(["question"], "Field required: with several questions, name the one the text follows", "missing")
        )
    unknown = [k for k in jev if k not in JEV_FIELDS]
    if strict:
        errors += [_err([k], "Extra inputs are not permitted", "extra_forbidden") for k in unknown]
    if errors or parsed is None:
        raise JevValidationError(errors)
    parsed = attrs.evolve(parsed, unknown=tuple(("jev", *p) for p in [(k,) for k in unknown] + list(parsed.unknown)))
    if mode == "then" and then is None:
        then = parsed.questions[0].id
    return ChatDecision(parsed, mode, then if mode == "then" else None)


def chosen(probabilities: Sequence[float]) -> int:
    """The position of the most probable option (reply order), the first of equals: the answer the
    reply's ``choice`` names (:func:`gateway.server.jev.protocol.answer`)."""
    return max(range(len(probabilities)), key=lambda i: (probabilities[i], -i))


def answer_words(question: Question, i: int) -> str:
    """Option ``i`` (reply order) of ``question`` in words: a noul's ``no`` / ``yes``, a choice's label, a
    score's level as sent (:func:`gateway.decision.prompts.as_text`)."""
    if question.type == "noul":
        return ("no", "yes")[i]
    if question.type == "choice":
        return str(list(question.criteria)[i])
    return as_text(question.criteria[i])


def then_note(question: Question, i: int) -> str:
    """:data:`THEN_NOTE` for ``question`` answered with option ``i``."""
    asked = as_text(question.instructions) if question.instructions is not None else DEFAULT_INSTRUCTIONS[question.type]
    return THEN_NOTE.format(question=asked, answer=answer_words(question, i))


def conditioned(messages: Sequence[dict[str, str]], note: str, *, system_in_user: bool = False) -> list[dict[str, str]]:
    """``messages`` with ``note`` in their system turn: appended to the first message's text after a blank
    line when it is a system turn, else a system turn of its own put first. ``system_in_user`` (a template
    that refuses system turns, :class:`gateway.decision.prompts.PromptBuilder`): the note goes at the head of
    the first user turn instead, followed by a blank line, as the decision prompts' system text does."""
    out = [dict(m) for m in messages]
    if system_in_user:
        for m in out:
            if m["role"] == "user":
                m["content"] = f"{note}\n\n{m['content']}"
                return out
        return [{"role": "user", "content": note}, *out]
    if out and out[0]["role"] == "system":
        out[0]["content"] = f"{out[0]['content']}\n\n{note}" if out[0]["content"] else note
        return out
    return [{"role": "system", "content": note}, *out]
