"""The prompts a language model is asked, per the seed's table ("What a language model is asked").

Every question becomes one chat: a fixed system turn, then a user turn with
the state first and the question after it (its options listed once, never in
the state), then the assistant's turn, which each option continues. The text
splits at the end of the state: ``prefix`` (system turn, optional fixed
prefix, state) is shared by every question of a request and photographed once;
``stem`` is the question and the assistant's opening; options are scored as
``prefix + stem + option``.

| type | scored options | question text |
|---|---|---|
| noul | ``yes``, ``no`` | instructions, ``yes: <true>`` / ``no: <false>`` when given, "Answer yes or no." |
| choice | the labels | instructions, one line per label (``label: description``), "Answer with one label." |
| score | ``"1".."n"`` | instructions, ``k: <level>`` per level, "Answer with the number." |
"""
from __future__ import annotations

import json
from typing import Any

import attrs

from gateway.chat_template import ChatTemplate

#: The system turn of every decision prompt.
SYSTEM = "You answer questions about the text you are given. Reply with exactly one of the allowed answers and nothing else."

#: Instructions used when a question has none (the language-model path and the default DECIDE record).
DEFAULT_INSTRUCTIONS = {
    "noul": "Is this true of the text?",
    "choice": "Which of these fits the text best?",
    "score": "Which level fits the text best?",
}

_SENTINEL = "\x00serveproto-question\x00"


def as_text(value: Any) -> str:
    """A state, instructions or criterion as text: a string as sent, anything else as JSON.

    JSON is ``json.dumps(value, ensure_ascii=False)``, the serialization the
    seed's decision record uses, so both paths read the same bytes.
    """
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


@attrs.frozen
class QuestionPrompt:
    """One question, ready to score: ``stem`` (text after the prefix) and ``options`` (the texts scored).

    ``options[i]`` answers to the question's ``i``-th option in the order the
    reply reports (labels in request order; levels 0..n-1; noul: no, yes).
    """

    stem: str
    options: tuple[str, ...]


def question_text(qtype: str, instructions: Any, criteria: Any, rotation: int = 0) -> tuple[str, tuple[str, ...]]:
    """The question's text and its scored option strings, per the module table.

    ``criteria``: noul ``{"true"?, "false"?}`` or None; choice ``{label:
    description | None}``; score ``[level, ...]``. Options come back in the
    reply's order: noul ``("no", "yes")``, choice the labels, score ``"1".."n"``.
    ``rotation``: the options are listed from the ``rotation``-th on, cyclically
    (:mod:`gateway.debias`); each keeps its own text and scored string, so the
    options tuple does not change. A noul lists yes before no, ``rotation`` 1
    the other way round ("Answer no or yes.").
    """
    head = as_text(instructions) if instructions is not None else DEFAULT_INSTRUCTIONS[qtype]
    if qtype == "noul":
        crit = criteria or {}
        listed = [(word, f"{word}: {as_text(crit[key])}" if crit.get(key) is not None else None)
                  for word, key in (("yes", "true"), ("no", "false"))]
        options = ("no", "yes")
    elif qtype == "choice":
        listed = [(label, f"{label}: {as_text(desc)}" if desc is not None and desc != "" else label)
                  for label, desc in criteria.items()]
        options = tuple(criteria)
    elif qtype == "score":
        listed = [(str(k), f"{k}: {as_text(level)}") for k, level in enumerate(criteria, start=1)]
        options = tuple(str(k) for k in range(1, len(criteria) + 1))
    else:
        raise ValueError(f"unknown question type {qtype!r}")
    r = rotation % len(listed)
    listed = listed[r:] + listed[:r]
    lines = [head] + [line for _, line in listed if line is not None]
    if qtype == "noul":
        lines.append(f"Answer {listed[0][0]} or {listed[1][0]}.")
    else:
        lines.append("Answer with one label." if qtype == "choice" else "Answer with the number.")
    return "\n".join(lines), options


class PromptBuilder:
    """Renders decision prompts with the served model's chat template.

    ``prefix(state, fixed=None)`` is the shared text up to the end of the state
    (``fixed``: the request's ``prefix`` field, read before the state);
    ``question(...)`` the stem and options of one question. The two
    concatenate to exactly what the template renders for the whole chat.
    Raises :class:`gateway.chat_template.TemplateError` when the template
    rewrites the user text so that the split cannot be made.
    """

    def __init__(self, template: ChatTemplate | None = None) -> None:
        from gateway.chat_template import TemplateError

        self.template = template or ChatTemplate.chatml()
        # Templates that refuse a system turn (raise_exception) get the system text
        # at the head of the user turn instead.
        self.system_in_user = False
        try:
            rendered = self.template.render(
                [{"role": "system", "content": SYSTEM}, {"role": "user", "content": _SENTINEL}], add_generation_prompt=True)
        except TemplateError:
            self.system_in_user = True
            rendered = self.template.render(
                [{"role": "user", "content": SYSTEM + "\n\n" + _SENTINEL}], add_generation_prompt=True)
        if rendered.count(_SENTINEL) != 1:
            raise TemplateError("the chat template does not keep the user's text verbatim")
        self._head, self._tail = rendered.split(_SENTINEL)

    def user_text_head(self, state: Any, fixed: str | None = None) -> str:
        state_text = as_text(state)
        return f"{fixed}\n\n{state_text}" if fixed else state_text

    def fixed_prefix(self, fixed: str) -> str:
        """The text of the request's fixed ``prefix`` alone (photographed per slot)."""
        return self._head + fixed + "\n\n"

    def prefix(self, state: Any, fixed: str | None = None) -> str:
        return self._head + self.user_text_head(state, fixed)

    def question(self, qtype: str, instructions: Any, criteria: Any, rotation: int = 0) -> QuestionPrompt:
        """One question's stem and options; ``rotation`` as in :func:`question_text`."""
        text, options = question_text(qtype, instructions, criteria, rotation)
        return QuestionPrompt(stem="\n\n" + text + self._tail, options=options)

    def chat(self, messages: list[dict[str, str]]) -> str:
        """A chat for generation (the OpenAI chat route): the template over ``messages``.

        Raises :class:`gateway.chat_template.TemplateError` when the template
        refuses the conversation (e.g. roles that do not alternate).
        """
        return self.template.render(messages, add_generation_prompt=True)
