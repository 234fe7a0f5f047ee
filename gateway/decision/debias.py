"""Debiasing a language model's option scores: cyclic orders and content-free calibration.

A small model answering a closed question favours options for reasons that
have nothing to do with the text: where an option is listed (on the default
SmolLM2-135M the first-listed label wins 0.78 of the time against a chance
of 0.33, ``bench/position_bias.py``) and which option it likes whatever it
reads. Two standard corrections, each opt-in (``x_debias`` on a request,
``serve --debias`` for a default):

``cyclic``
    The question is asked once per cyclic rotation of its listed options
    (each option keeps its own text: a choice's label, a score's number, a
    noul's yes/no; only the order of the lines changes), so each option is
    listed first, second, ... exactly once; an option's log-probability is
    the mean of its log-softmax over the rotations (a geometric mean of the
    probabilities). Position effects that shift all rotations alike cancel.
    Cost: one question prompt per rotation, read in the same ``SCORE`` as the
    rest. Above :data:`MAX_ROTATIONS` options, that many evenly spaced
    rotations. Source: the cyclic permutation of option contents that Zheng
    et al. 2024, "Large Language Models Are Not Robust Multiple Choice
    Selectors" (ICLR; arXiv:2309.03882), average over as a debiasing baseline
    and use to estimate the prior of their PriDe.

``content_free``
    Contextual calibration: the same question is asked about a content-free
    state (:data:`CONTENT_FREE_STATES`: "N/A"), and each option's
    log-probability there is subtracted from its log-probability on the real
    state before the softmax: ``q_i ∝ p_i / p_cf_i``, the diagonal
    calibration ``W = diag(p_cf)^-1, b = 0`` of Zhao et al. 2021, "Calibrate
    Before Use: Improving Few-Shot Performance of Language Models" (ICML),
    sec. 5. They also average over "N/A", "" and "[MASK]"; on the default
    model that average and "N/A" alone did equally well
    (``bench/position_bias.py``: the labelled answer wins 46 and 45 of 72
    with cyclic orders, mean probability 0.479 and 0.480; "" alone 42, 0.464)
    and "N/A" alone reads a third as much. With several states the mean is
    taken over logprobs, so both corrections are means and one subtraction in
    log space. The content-free scores depend on the question only, not the
    state: the server computes them once per question and remembers them.

``content_free_listing``
    Contextual calibration as above, but "N/A" is asked the type's default
    question (:data:`gateway.decision.prompts.DEFAULT_INSTRUCTIONS`, "Is this
    true of the text?" for a noul) over the question's own listing of its
    options, so the reading depends on the options alone: questions that list
    the same options share it, and a new question on options the server has
    read costs no extra position (``bench/quality.py``: the new-question
    column). It corrects the model's lean to an option or a place, not a
    question's own wording (Zhao et al.'s content-free input keeps the
    prompt; this keeps the listing). A separate name rather than a new
    meaning of ``content_free``: answers and calibration files
    (:mod:`gateway.decision.calibration`, keyed by these names) read under one
    are not mistaken for the other.

The two combine: the content-free scores are then read under the same
rotations. Four more names choose how the question is asked
(:mod:`gateway.decision.readings`): ``canonical`` (the options listed in a fixed
order, a choice's labels sorted, whatever order the request sent them in),
``spellings`` (a listed noul's yes and no each read in every spelling, summed),
``cloze`` (options not listed, each scored as the answer; with
``content_free`` this is the domain-conditional PMI of Holtzman et al. 2021)
and ``letters`` (the letter read-out of llama-server-based servers). All
functions here are pure arithmetic on Python floats.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

METHODS = ("cloze", "letters", "canonical", "spellings", "cyclic", "content_free", "content_free_listing")

_NAMES = "'none', " + ", ".join(repr(m) for m in METHODS)

#: The content-free states read (Zhao et al. 2021, sec. 5; see the module doc for why one).
CONTENT_FREE_STATES = ("N/A",)

#: Rotations read at most per question (a question of n options reads min(n, MAX_ROTATIONS) prompts).
MAX_ROTATIONS = 16


def parse(value: Any) -> tuple[str, ...]:
    """The methods asked for by an ``x_debias`` value or a ``--debias`` flag, in :data:`METHODS` order.

    ``value``: ``"none"`` or ``[]`` (no correction), a method name, a
    comma-separated string of method names (``"cyclic,content_free"``, the
    flag's form), or a list of method names. ``None`` is not taken here: a
    request's ``null`` means the server's default (:mod:`gateway.decision.schema`).
    Raises ``ValueError`` with a message fit for a 422 for anything else:
    ``"none"`` mixed with a method, ``cloze`` with ``letters``, ``cloze``
    with ``canonical`` or ``cyclic`` (a cloze prompt lists no options),
    ``content_free`` with ``content_free_listing``, or ``spellings`` with
    ``cloze`` or ``letters``.
    """
    if isinstance(value, str):
        names = [x.strip() for x in value.split(",")]
    elif isinstance(value, list) and all(isinstance(x, str) for x in value):
        names = value
    else:
        raise ValueError(f"Input should be {_NAMES} or a list of those")
    if names == ["none"]:
        return ()
    if "none" in names:
        raise ValueError("'none' cannot be combined with a debias method")
    unknown = [x for x in names if x not in METHODS]
    if unknown:
        raise ValueError(f"Unknown debias method {unknown[0]!r}: use {_NAMES} or a list of those")
    if "cloze" in names and "letters" in names:
        raise ValueError("'cloze' and 'letters' are two prompt formats: choose one")
    if "content_free" in names and "content_free_listing" in names:
        raise ValueError("'content_free' and 'content_free_listing' are two content-free readings: choose one")
    if "cloze" in names and ("cyclic" in names or "canonical" in names):
        raise ValueError("a 'cloze' prompt lists no options: 'cyclic' and 'canonical' do not apply to it")
    if "spellings" in names and ("cloze" in names or "letters" in names):
        raise ValueError("'spellings' is a reading of the listed format ('letters' already sums spellings)")
    return tuple(m for m in METHODS if m in names)


def rotations(n_options: int, methods: Sequence[str]) -> list[int]:
    """The rotation offsets a question of ``n_options`` options is asked under.

    ``[0]`` without ``cyclic``; with it ``0..n-1``, or :data:`MAX_ROTATIONS`
    offsets ``floor(j * n / MAX_ROTATIONS)`` when ``n`` is larger.
    """
    if "cyclic" not in methods or n_options < 2:
        return [0]
    if n_options <= MAX_ROTATIONS:
        return list(range(n_options))
    return [j * n_options // MAX_ROTATIONS for j in range(MAX_ROTATIONS)]
