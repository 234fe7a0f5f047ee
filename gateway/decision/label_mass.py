"""How much of the model's next-token probability a question's options held, and the gap between its two
best answers: the ``x_label_mass``, ``x_argmax_is_label`` and ``x_margin`` of an answer (issue 48).

Seeds 001 and 003 read one answer token and report ``label_mass`` (the probability the labels held
among every token the model could write next), ``argmax_is_label`` and ``margin``. Our options are
scored as continuations (SCORE, spec/serve-protocol.md 9.1): each scored text's tokens after the
question's prompt, with no top-k. What the SCORED frames give is each text's first-token logprob at
the position that predicts it (``context_tokens``), and that is what is summed here:

- a read's **label mass** is ``sum exp(lp_1)`` over the *distinct* first tokens of its scored texts
  (a single-token option: its own probability; a multi-token option: that of its first token only),
  defined when every text's first token is predicted at one position (equal ``context_tokens``);
  two texts share a first token when they start at that position with bit-identical first logprobs
  and a common leading character (the same token id gives the same logits row and so the same bits;
  the shared character guards against two different tokens whose logprobs happen to tie). Counting a
  shared first token once keeps the mass a probability (at most 1);
- the question's mass is the mean over its reads (one per cyclic rotation); with ``spellings`` or
  ``letters`` every spelling scored counts; the content-free readings never do;
- **argmax is a label** is ``True`` when the likeliest of those first tokens has at least the
  probability every other token holds together (``1 - mass``), so no token outside the options can
  be likelier, in every read; ``None`` when that cannot be told without the top-k row (the mass left
  over could sit on one token or be spread); never ``False``, which would need the top-k;
- the **margin** is the difference between the answer's two largest reported probabilities.

Plain Python floats.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs


@attrs.frozen
class Mass:
    """One question's read-out: ``mass`` (0 to 1) and ``argmax_is_label`` (``True`` or ``None``)."""

    mass: float
    argmax_is_label: bool | None


def read_mass(scored: Sequence[tuple[str, int, float]]) -> tuple[float, bool | None] | None:
    """One read's ``(mass, argmax_is_label)`` from its scored texts, each ``(text, context_tokens,
    first-token logprob)``; None when their first tokens are not predicted at one position (module doc)."""
    if not scored or len({ctx for _, ctx, _ in scored}) != 1:
        return None
    distinct: list[tuple[str, float]] = []
    for text, _, lp in scored:
        if not math.isfinite(lp):
            return None
        if not any(lp == lp2 and text[:1] == t2[:1] for t2, lp2 in distinct):
            distinct.append((text, lp))
    probs = [math.exp(lp) for _, lp in distinct]
    mass = min(1.0, math.fsum(probs))
    return mass, (True if max(probs) >= 1.0 - mass else None)


def question_mass(reads: Sequence[Sequence[tuple[str, int, float]]]) -> Mass | None:
    """The question's :class:`Mass` over its reads (the mean of :func:`read_mass`; ``True`` only when every
    read says so), None when any read's is undefined."""
    per_read = [read_mass(r) for r in reads]
    if not per_read or any(m is None for m in per_read):
        return None
    masses = [m[0] for m in per_read if m is not None]
    argmax = True if all(m is not None and m[1] for m in per_read) else None
    return Mass(math.fsum(masses) / len(masses), argmax)


def margin(probabilities: Sequence[float]) -> float:
    """The two largest of ``probabilities`` (shape ``(n,)``, ``n >= 2``) less each other: 0 on a tie, 1 when
    one option holds all the mass."""
    top = sorted(probabilities, reverse=True)
    return top[0] - top[1]
