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

Two other formats, compared in ``bench/quality.py`` and served on request
(``x_debias``, :mod:`gateway.decision.readings`):

- **cloze** (:func:`cloze_text`): the options are not listed; the question is
  the instructions alone and each option's own text is scored as the answer
  (noul ``no`` / ``yes``, a choice's labels, a score's level descriptions), so
  no option has a place in the prompt (the cloze format of Holtzman et al.
  2021, "Surface Form Competition", EMNLP).
- **letters** (:func:`letters_text`): the read-out of llama-server-based
  System One servers (seed ``001_*``): a choice's options lettered ``A``,
  ``B``, ... (a score's levels numbered ``0``, ``1``, ...; a noul answered
  ``yes`` / ``no``) and the first answer token read, each option's spellings
  (:func:`spellings`) summed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from gateway.decision import jsontext
from gateway.decision.chat_template import ChatTemplate

#: The system turn of every decision prompt.
SYSTEM = (
    "You answer questions about the text you are given. Reply with exactly one of the allowed answers and nothing else."
)

#: Instructions used when a question has none (the language-model path and the default DECIDE record).
DEFAULT_INSTRUCTIONS = {
    "noul": "Is this true of the text?",
    "choice": "Which of these fits the text best?",
    "score": "Which level fits the text best?",
}

_SENTINEL = "\x00serveproto-question\x00"


def spellings(word: str) -> tuple[str, ...]:
    """The spellings of one letter-format answer whose probabilities are summed: the word in its
    own case and the other (``A``/``a``; ``yes``/``Yes``; a digit has one), each bare and after a
    space: ``spellings("A") == ("A", " A", "a", " a")``."""
    other = word.lower() if word != word.lower() else (word.upper() if len(word) == 1 else word.capitalize())
    out: list[str] = []
    for w in (word, other):
        for s in (w, " " + w):
            if s not in out:
                out.append(s)
    return tuple(out)


#: Letters of the letter format's options, in listed order (a question of more options is refused).
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def as_text(value: Any) -> str:
    """A state, instructions or criterion as text: a string as sent, anything else as JSON.

    JSON is ``json.dumps(value, ensure_ascii=False)``, the serialization the
    seed's decision record uses, so both paths read the same bytes; at any depth the parser
    accepts (:func:`gateway.decision.jsontext.dumps`).
    """
    if isinstance(value, str):
        return value
    return jsontext.dumps(value)


@attrs.frozen
class QuestionPrompt:
    """One question, ready to score: ``stem`` (text after the prefix) and ``options`` (the texts scored).

    ``options[i]`` answers to the question's ``i``-th option in the order the
    reply reports (labels in request order; levels 0..n-1; noul: no, yes).
    """

    stem: str
    options: tuple[str, ...]


def _listed(qtype: str, criteria: Any) -> tuple[list[tuple[str, str | None]], tuple[str, ...]]:
    """The listed lines of a question in its natural order, and its options in reply order.

    ``listed[j] = (word, line)``: the word an answer gives (a label, a level
    number, yes / no) and the line that lists it (None: not listed, a noul
    side without a description). Natural order: a noul's yes then no, a
    choice's labels as sent, a score's levels from level 0.
    """
    if qtype == "noul":
        crit = criteria or {}
        listed = [
            (word, f"{word}: {as_text(crit[key])}" if crit.get(key) is not None else None)
            for word, key in (("yes", "true"), ("no", "false"))
        ]
        return listed, ("no", "yes")
    if qtype == "choice":
        return (
            [
                (label, f"{label}: {as_text(desc)}" if desc is not None and desc != "" else label)
                for label, desc in criteria.items()
            ],
            tuple(criteria),
        )
    if qtype == "score":
        return (
            [(str(k), f"{k}: {as_text(level)}") for k, level in enumerate(criteria, start=1)],
            tuple(str(k) for k in range(1, len(criteria) + 1)),
        )
    raise ValueError(f"unknown question type {qtype!r}")


def listing_order(n_listed: int, order: Sequence[int] | None, rotation: int) -> list[int]:
    """Indices into the natural listing (:func:`_listed`) in the order the prompt lists them.

    ``order``: a permutation of ``range(n_listed)`` (None: the natural order),
    then rotated left by ``rotation``. Raises ``ValueError`` for an ``order``
    that is not a permutation of ``range(n_listed)``.
    """
    base = list(range(n_listed)) if order is None else list(order)
    if sorted(base) != list(range(n_listed)):
        raise ValueError(f"order {order!r} is not a permutation of range({n_listed})")
    r = rotation % n_listed
    return base[r:] + base[:r]


def question_text(
    qtype: str, instructions: Any, criteria: Any, rotation: int = 0, order: Sequence[int] | None = None
) -> tuple[str, tuple[str, ...]]:
    """The question's text and its scored option strings, per the module table.

    ``criteria``: noul ``{"true"?, "false"?}`` or None; choice ``{label:
    description | None}``; score ``[level, ...]``. Options come back in the
    reply's order: noul ``("no", "yes")``, choice the labels, score ``"1".."n"``.
    ``order`` (:func:`listing_order`): the listed lines' order as indices into
    the natural one (yes, no; the labels as sent; level 0 first), None for the
    natural order; ``rotation``: that order is listed from its
    ``rotation``-th line on, cyclically (:mod:`gateway.decision.debias`). Each option
    keeps its own text and scored string, so the options tuple does not
    change. A noul lists yes before no, ``rotation`` 1 the other way round
    ("Answer no or yes.").
    """
    head = as_text(instructions) if instructions is not None else DEFAULT_INSTRUCTIONS[qtype]
    listed, options = _listed(qtype, criteria)
    listed = [listed[j] for j in listing_order(len(listed), order, rotation)]
    lines = [head] + [line for _, line in listed if line is not None]
    if qtype == "noul":
        lines.append(f"Answer {listed[0][0]} or {listed[1][0]}.")
    else:
        lines.append("Answer with one label." if qtype == "choice" else "Answer with the number.")
    return "\n".join(lines), options


def cloze_text(qtype: str, instructions: Any, criteria: Any) -> tuple[str, tuple[str, ...]]:
    """The cloze format: the instructions alone, and each option's own text as the answer scored.

    Options in reply order: noul ``("no", "yes")``, choice the labels, score
    each level's description (:func:`as_text`). Nothing is listed, so the
    text does not depend on the options' order. Raises ``ValueError`` when two
    options would be scored as the same text (a score with two equal levels).
    """
    head = as_text(instructions) if instructions is not None else DEFAULT_INSTRUCTIONS[qtype]
    if qtype == "noul":
        options: tuple[str, ...] = ("no", "yes")
    elif qtype == "choice":
        options = tuple(criteria)
    elif qtype == "score":
        options = tuple(as_text(level) for level in criteria)
    else:
        raise ValueError(f"unknown question type {qtype!r}")
    if len(set(options)) != len(options):
        raise ValueError("two options have the same text: the cloze format cannot tell them apart")
    return head, options


def letters_text(
    qtype: str, instructions: Any, criteria: Any, order: Sequence[int] | None = None
) -> tuple[str, tuple[tuple[str, ...], ...]]:
    """The letter format (seed ``001_*``): the question with one-token answer words, and their spellings.

    A choice's labels are listed ``A. label: description`` (``A`` ... ``Z`` in
    listed order), a score's levels ``0. level`` (letters past 10 levels), a
    noul's sides as in :func:`question_text`; "Answer with the letter." /
    "Answer with the number." / "Answer yes or no.". ``order`` as in
    :func:`question_text` (the letters follow the listed places, so ``A`` is
    whichever option is listed first). Returns the text and, per option in
    reply order, the strings scored for it (:func:`spellings` of its word),
    whose probabilities are summed. Raises ``ValueError`` for more than
    26 options.
    """
    head = as_text(instructions) if instructions is not None else DEFAULT_INSTRUCTIONS[qtype]
    listed, options = _listed(qtype, criteria)  # noqa: RUF059  (kept as written)
    n = len(listed)
    if n > len(LETTERS):
        raise ValueError(f"the letter format takes at most {len(LETTERS)} options, got {n}")
    places = listing_order(n, order, 0)
    if qtype == "noul":
        text, _ = question_text(qtype, instructions, criteria, 0, order)
        words = ["no", "yes"]
        return text, tuple(spellings(w) for w in words)
    digits = qtype == "score" and n <= 10
    marks = [str(i) if digits else LETTERS[i] for i in range(n)]
    lines = [head]
    word_of = [""] * n
    for place, j in enumerate(places):
        label, _ = listed[j]
        if qtype == "choice":
            desc = criteria[label]
            body = f"{label}: {as_text(desc)}" if desc is not None and desc != "" else label
        else:
            body = as_text(criteria[j])
        lines.append(f"{marks[place]}. {body}")
        word_of[j] = marks[place]
    lines.append("Answer with the number." if digits else "Answer with the letter.")
    return "\n".join(lines), tuple(spellings(word_of[j]) for j in range(n))


class PromptBuilder:
    """Renders decision prompts with the served model's chat template.

    ``prefix(state, fixed=None)`` is the shared text up to the end of the state
    (``fixed``: the request's ``prefix`` field, read before the state);
    ``question(...)`` the stem and options of one question. The two
    concatenate to exactly what the template renders for the whole chat.
    Raises :class:`gateway.decision.chat_template.TemplateError` when the template
    rewrites the user text so that the split cannot be made.
    """

    def __init__(self, template: ChatTemplate | None = None) -> None:
        from gateway.decision.chat_template import TemplateError

        self.template = template or ChatTemplate.chatml()
        # Templates that refuse a system turn (raise_exception) get the system text
        # at the head of the user turn instead.
        self.system_in_user = False
        try:
            rendered = self.template.render(
                [{"role": "system", "content": SYSTEM}, {"role": "user", "content": _SENTINEL}],
                add_generation_prompt=True,
            )
        except TemplateError:
            self.system_in_user = True
            rendered = self.template.render(
                [{"role": "user", "content": SYSTEM + "\n\n" + _SENTINEL}], add_generation_prompt=True
            )
        if rendered.count(_SENTINEL) != 1:
            raise TemplateError("the chat template does not keep the user's text verbatim")
        self._head, self._tail = rendered.split(_SENTINEL)

    def user_text_head(self, state: Any, fixed: str | None = None) -> str:
        state_text = as_text(state)
        return f"{fixed}\n\n{state_text}" if fixed else state_text

    def fixed_prefix(self, fixed: str) -> str:
        """The text of the request's fixed ``prefix`` alone, photographed per slot: the prompt's head up
        to the prefix's last non-space character. The blank line after it is left out: a BPE
        pre-tokenizer reads trailing newlines at a text's end as other tokens than the same newlines
        before the state, so a photograph ending with them is not a token prefix of the prompts
        (SmolLM2: 69 of its 70 tokens) and is never restored (issue 48, item 1)."""
        return self._head + fixed.rstrip()

    def prefix(self, state: Any, fixed: str | None = None) -> str:
        return self._head + self.user_text_head(state, fixed)

    def question(
        self, qtype: str, instructions: Any, criteria: Any, rotation: int = 0, order: Sequence[int] | None = None
    ) -> QuestionPrompt:
        """One question's stem and options; ``rotation`` and ``order`` as in :func:`question_text`."""
        text, options = question_text(qtype, instructions, criteria, rotation, order)
        return QuestionPrompt(stem="\n\n" + text + self._tail, options=options)

    def stem(self, text: str) -> str:
        """The stem of a question whose text is ``text`` (:func:`cloze_text`, :func:`letters_text`)."""
        return "\n\n" + text + self._tail

    def chat(self, messages: list[dict[str, str]]) -> str:
        """A chat for generation (the OpenAI chat route): the template over ``messages``.

        Raises :class:`gateway.decision.chat_template.TemplateError` when the template
        refuses the conversation (e.g. roles that do not alternate).
        """
        return self.template.render(messages, add_generation_prompt=True)
