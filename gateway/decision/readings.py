"""How a question's options are read and how the readings become probabilities.

A *method* (:class:`Method`) says which prompts a question is read under and
which correction applies; :func:`plan` turns a question and a method into
*reads* (one prompt each, scored in the request's ``SCORE``), and
:func:`combine` turns the reads' option log-probabilities (and the
content-free ones) into the scores the softmax takes. The server
(:mod:`gateway.decision.pipeline`) and ``bench/quality.py`` both go through here.

The parts of a method (``x_debias`` names, :mod:`gateway.decision.debias`):

- the **format** (:mod:`gateway.decision.prompts`): ``listed`` (today's prompt, the
  options listed), ``cloze`` (not listed; each option's own text scored as
  the answer) or ``letters`` (the letter read-out of llama-server-based
  servers: one answer token, every spelling of each letter summed);
- the **order** the options are listed in: the request's, or ``canonical``:
  a choice's labels sorted by label (code points), a score's levels from
  level 0, a noul's yes then no. A canonical prompt is the same whatever order
  the request lists its labels in, so the answer cannot depend on it, and any
  prior or calibration read on it is keyed by label name;
- ``spellings``: a listed noul's answer read in every spelling of each word, summed (``yes``,
  `` yes``, ``Yes``, `` Yes`` against the same of ``no``; :func:`gateway.decision.prompts.spellings`),
  as the letter format reads it: the toy model puts its "no" on ``No`` and its "yes" on ``yes``, so
  the one spelling the listed format scores answers yes to almost every noul (``bench/results/NOTEBOOK.md``).
  Each spelling is one token, read from the logits the prompt's last position already holds;
- ``cyclic``: one read per rotation of that order, log-probabilities averaged
  (Zheng et al. 2024, ICLR, arXiv:2309.03882: the cyclic permutation their
  PriDe estimates its prior from);
- ``content_free``: each option's log-probability on a content-free state
  ("N/A") subtracted (Zhao et al. 2021, "Calibrate Before Use", ICML, sec.
  5); ``content_free_listing`` the same with the type's default instructions
  in place of the question's on "N/A" (:func:`content_free_plan`), read once per
  option set, not once per question. With ``cloze`` this is the domain-conditional PMI of Holtzman et al.
  2021 ("Surface Form Competition", EMNLP, eq. 3), the content-free premise as
  the domain premise: ``log P(y | x, q) - log P(y | "N/A", q)``.

Two corrections that need more than one request, for ``bench/quality.py``
(pure functions; the server does not keep them): batch calibration
(:func:`batch_prior`, Zhou et al. 2024) and PriDe (:func:`pride_prior`).
All arithmetic is on Python floats.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs

from gateway.decision import debias
from gateway.decision.arithmetic import log_softmax, option_scores, softmax
from gateway.decision.prompts import cloze_text, letters_text, listing_order, question_text, spellings

FORMATS = ("listed", "cloze", "letters")


@attrs.frozen
class Method:
    """One way of reading a question: ``format`` (:data:`FORMATS`), ``canonical`` order,
    ``cyclic`` rotations, ``content_free`` calibration (module doc)."""

    format: str = "listed"
    canonical: bool = False
    cyclic: bool = False
    content_free: bool = False
    #: with ``content_free``: the content-free side reads the type's default instructions in place of the
    #: question's (``content_free_listing``, :func:`content_free_plan`)
    listing_only: bool = False
    #: a listed noul's yes and no each read in every spelling, summed (``spellings``)
    spellings: bool = False

    @classmethod
    def from_names(cls, names: Sequence[str]) -> Method:
        """The method of a parsed ``x_debias`` (:func:`gateway.decision.debias.parse`): ``()`` is today's listed raw."""
        fmt = "cloze" if "cloze" in names else "letters" if "letters" in names else "listed"
        listing = "content_free_listing" in names
        return cls(
            fmt,
            "canonical" in names,
            "cyclic" in names,
            "content_free" in names or listing,
            listing,
            "spellings" in names,
        )

    @property
    def names(self) -> tuple[str, ...]:
        """The ``x_debias`` names of this method, in :data:`gateway.decision.debias.METHODS` order."""
        on = {
            "cloze": self.format == "cloze",
            "letters": self.format == "letters",
            "canonical": self.canonical,
            "spellings": self.spellings,
            "cyclic": self.cyclic,
            "content_free": self.content_free and not self.listing_only,
            "content_free_listing": self.content_free and self.listing_only,
        }
        return tuple(m for m in debias.METHODS if on[m])


@attrs.frozen
class Read:
    """One prompt of a question: ``text`` (the question's text, :meth:`gateway.decision.prompts.PromptBuilder.stem`
    makes the stem), ``scored`` (the option texts scored after it; in the canonical order for a
    canonical or cloze read) and ``owner[k]``: the reply-order option that ``scored[k]`` counts
    for (one each, or several spellings of one letter);
    ``places[i]``: where reply option ``i`` is listed (0 first; None in the cloze format)."""

    text: str
    scored: tuple[str, ...]
    owner: tuple[int, ...]
    places: tuple[int, ...] | None


def canonical_order(qtype: str, criteria: Any) -> list[int] | None:
    """The canonical listing order (indices into the natural listing of :func:`gateway.decision.prompts.question_text`):
    a choice's labels sorted by label, None (natural) for a noul or a score."""
    if qtype != "choice":
        return None
    labels = list(criteria)
    return sorted(range(len(labels)), key=lambda i: labels[i])


def _places(qtype: str, n: int, listed_order: list[int]) -> tuple[int, ...]:
    """Reply option ``i``'s place in the listing. A noul's listing is (yes, no), its reply (no, yes)."""
    place_of_listed = {j: p for p, j in enumerate(listed_order)}
    if qtype == "noul":
        return (place_of_listed[1], place_of_listed[0])
    return tuple(place_of_listed[i] for i in range(n))


def plan(
    qtype: str, instructions: Any, criteria: Any, n_options: int, method: Method, order: Sequence[int] | None = None
) -> list[Read]:
    """The reads of one question under ``method``, in rotation order.

    ``order``: the listing order the request implies (indices into the natural
    listing), None for the request's own order; ignored when
    ``method.canonical``. Listed and letter formats read one prompt per
    rotation (:func:`gateway.decision.debias.rotations`; one without ``cyclic``); the
    cloze format reads one. Raises ``ValueError`` as the prompt functions do
    (letters over 26 options; a cloze score with two equal levels).
    """
    canon = canonical_order(qtype, criteria)
    base = canon if method.canonical else (list(order) if order is not None else None)
    n_listed = 2 if qtype == "noul" else n_options
    # A canonical or cloze read sends its scored texts in the canonical order too, so the engine gets
    # the same bytes whatever the request's order (its last digits depend on the batch's layout).
    scored_order = canon if (method.canonical or method.format == "cloze") and canon is not None else range(n_options)
    if method.format == "cloze":
        text, options = cloze_text(qtype, instructions, criteria)
        return [Read(text, tuple(options[i] for i in scored_order), tuple(scored_order), None)]
    reads = []
    for r in debias.rotations(n_options, ("cyclic",) if method.cyclic else ()):
        listed = listing_order(n_listed, base, r)
        places = _places(qtype, n_options, listed)
        if method.format == "letters":
            text, per_option = letters_text(qtype, instructions, criteria, listed)
        else:
            text, options = question_text(qtype, instructions, criteria, 0, listed)
            spelled = method.spellings and qtype == "noul"
            per_option = tuple(spellings(o) if spelled else (o,) for o in options)
        scored = tuple(s for i in scored_order for s in per_option[i])
        owner = tuple(i for i in scored_order for _ in per_option[i])
        reads.append(Read(text, scored, owner, places))
    return reads


#: ``content_free_listing`` reads a choice of more labels than this over its labels alone (:func:`content_free_plan`).
LISTING_DESCRIBED_MAX = 64


def content_free_plan(
    qtype: str, instructions: Any, criteria: Any, n_options: int, method: Method, order: Sequence[int] | None = None
) -> list[Read]:
    """The reads of a question's content-free side (``content_free``): what is read on each
    content-free state (:data:`gateway.decision.debias.CONTENT_FREE_STATES`) in place of the state.

    ``content_free``: the same reads as :func:`plan` (the question as asked, under the same
    rotations), so that :func:`combine` subtracts each read's own lean (Zhao et al. 2021: the prompt
    with the input replaced). ``content_free_listing`` (``method.listing_only``): the same listing,
    rotations and scored texts, with the type's :data:`gateway.decision.prompts.DEFAULT_INSTRUCTIONS`
    in place of the question's instructions, so the reading depends on the options alone: questions
    that list the same options share it, and a new question on known options reads nothing extra.
    A choice of more than :data:`LISTING_DESCRIBED_MAX` labels is listed there without its labels'
    descriptions (the same labels, order and scored texts): reading the whole listing a second time
    nearly doubled the cost of a long question the first time its labels were seen (255 labels with a
    sentence each, cold: 37.0 s with the whole listing, 22.3 s with the labels alone, 17.5 s without the
    correction; ``bench/many_options.py``, bench/results/NOTEBOOK.md "Many options"), while what the
    correction removes, the model's lean to a place in the list and to a label, is in the labels. Raises
    ``ValueError`` as :func:`plan`.
    """
    if method.listing_only and qtype == "choice" and n_options > LISTING_DESCRIBED_MAX:
        criteria = dict.fromkeys(criteria)
    return plan(qtype, None if method.listing_only else instructions, criteria, n_options, method, order)


def log_probs(owner: Sequence[int], logprobs: Sequence[Sequence[float]], normalize: str = "sum") -> list[float]:
    """One read's log-softmax over the reply's options: shape ``(n_options,)``, nats.

    ``owner``: a :class:`Read`'s ``owner``; ``logprobs[k]``: the token
    logprobs of its ``scored[k]`` (engine order).
    Each option's score is the log of the summed probabilities of its scored
    texts (:func:`gateway.decision.arithmetic.option_scores` per text, log-sum-exp per
    option), then :func:`gateway.decision.arithmetic.log_softmax`. Raises ``ValueError`` as
    :func:`gateway.decision.arithmetic.option_scores`.
    """
    per_text = option_scores(logprobs, normalize)
    n = max(owner) + 1
    buckets: list[list[float]] = [[] for _ in range(n)]
    for k, s in zip(owner, per_text):
        buckets[k].append(s)
    scores = []
    for b in buckets:
        m = max(b)
        scores.append(m + math.log(math.fsum(math.exp(x - m) for x in b)))
    return log_softmax(scores)


def combine(per_read: Sequence[Sequence[float]], content_free: Sequence[float] | None) -> list[float]:
    """Scores for the softmax: the reads' mean log-probabilities less the content-free ones.

    ``per_read[r]``: :func:`log_probs` of read ``r``; ``content_free``: the
    same mean over the content-free reads, or None. Shape ``(n_options,)``.
    """
    k = len(per_read)
    mean = [math.fsum(r[i] for r in per_read) / k for i in range(len(per_read[0]))]
    if content_free is None:
        return mean
    return [a - b for a, b in zip(mean, content_free)]


def mean_log_probs(per_read: Sequence[Sequence[float]]) -> list[float]:
    """The mean over reads of each option's log-probability (the content-free side of :func:`combine`)."""
    return combine(per_read, None)


# --- corrections over many requests (bench/quality.py) --------------------------------------


def batch_prior(probabilities: Sequence[Sequence[float]]) -> list[float]:
    """Batch calibration's contextual prior: the mean probability of each option over a batch.

    ``probabilities``: shape ``(m, n)``, each row one input's probabilities
    of the same question (options in one order). Returns ``(n,)``. Zhou et
    al. 2024, "Batch Calibration: Rethinking Calibration for In-Context
    Learning and Prompt Engineering" (ICLR), eq. 4: ``p̄(y) = (1/M) sum_i
    p(y | x_i)``; the calibrated answer is ``p(y | x) / p̄(y)``, renormalised
    (:func:`divide`). Raises ``ValueError`` for an empty batch.
    """
    if not probabilities:
        raise ValueError("batch calibration needs at least one input")
    m = len(probabilities)
    return [math.fsum(row[i] for row in probabilities) / m for i in range(len(probabilities[0]))]


def pride_prior(samples: Sequence[tuple[Sequence[Sequence[float]], Sequence[Sequence[int]]]]) -> list[float]:
    """PriDe's prior over the places options are listed in, from samples read under cyclic rotations.

    ``samples[k] = (per_rotation, places)``: one input's :func:`log_probs`
    per rotation (reply order) and each rotation's ``Read.places``. Zheng et
    al. 2024 (ICLR, arXiv:2309.03882), sec. 4: under the rotations each
    option visits each place once, so the place prior of one input is
    ``softmax_d( (1/n) sum_r log P_r(option listed at d) )``; the prior is
    that averaged over the samples (probability space). Returns ``(n,)`` by
    place. Raises ``ValueError`` for no samples.
    """
    if not samples:
        raise ValueError("PriDe needs at least one sample")
    total: list[float] | None = None
    for per_rotation, places in samples:
        n = len(per_rotation[0])
        at = [[0.0] * n for _ in per_rotation]
        for r, (lp, pl) in enumerate(zip(per_rotation, places)):
            for i in range(n):
                at[r][pl[i]] = lp[i]
        logit = [math.fsum(at[r][d] for r in range(len(at))) / len(at) for d in range(n)]
        prior = softmax(logit)
        total = prior if total is None else [a + b for a, b in zip(total, prior)]
    assert total is not None  # samples is not empty
    return [x / len(samples) for x in total]


def divide(probabilities: Sequence[float], prior: Sequence[float], places: Sequence[int] | None = None) -> list[float]:
    """``q_i ∝ p_i / prior_i``, renormalised: shape ``(n,)``.

    ``places``: None when ``prior`` is by option (batch calibration); a place
    prior (:func:`pride_prior`) is indexed by where each option is listed,
    ``prior[places[i]]``. Raises ``ValueError`` for a prior with a zero entry.
    """
    div = [prior[places[i]] if places is not None else prior[i] for i in range(len(probabilities))]
    if min(div) <= 0:
        raise ValueError("a prior with a zero entry cannot be divided out")
    q = [p / d for p, d in zip(probabilities, div)]
    z = math.fsum(q)
    return [x / z for x in q]
