"""SCORE groups on a shorter base (spec 9.1, ``x_score_base``): a reading beside the state, not in its place.

A group with ``"base": b`` continues the prefix's first ``b`` bytes instead of
the whole prefix: the content-free reading of a question (the template head,
"N/A", the question) read in the same SCORE as the question on the state.
Three promises, on the default model with ``--float-digits 17``:

* **Same digits.** Every option of a mixed SCORE has the bits of the same
  option scored in a SCORE of its own prefix alone (a fresh engine each, no
  score cache), whatever the order of the groups.
* **The state stays.** The slot keeps the whole trunk (the state): the next
  request on it restores the snapshot (``hit``) and computes its new question
  only; the based groups' rows are dropped with their scratch sequences.
* **Counted once.** ``computed`` is the trunk plus the trie nodes of both
  kinds of group; an exact repeat computes nothing.
"""

from __future__ import annotations

import json

import pytest

from serveproto import Done, Error, Score, Scored
from test_llama_engine import Engine

pytestmark = pytest.mark.slow

HEAD = "<|im_start|>system\nYou answer questions about the text.<|im_end|>\n<|im_start|>user\n"
STATE = (
    "My card was charged twice for the March invoice and I want the duplicate refunded before Friday, "
    "or I will close the account. The order number is 4471 and the second charge is still pending."
)
PREFIX = HEAD + STATE
BASE = len(HEAD.encode())

Q1 = ("\n\nDoes the customer ask for a refund?\nAnswer yes or no.<|im_end|>\n<|im_start|>assistant\n", ["yes", "no"])
Q2 = (
    "\n\nWhich team should handle this?\nbilling: payments\nsales: plans\ntechnical: bugs\n"
    "Answer with one label.<|im_end|>\n<|im_start|>assistant\n",
    ["billing", "sales", "technical support team"],
)
Q3 = ("\n\nIs the customer angry?\nAnswer yes or no.<|im_end|>\n<|im_start|>assistant\n", ["yes", "no"])


def engine(model_path, *args: str) -> Engine:
    return Engine(model_path, "--float-digits", "17", "--slots", "2", "--ctx", "1024", "--score-cache-mb", "0", *args)


def score(rid: int, prefix: str, groups: list[dict], pin: bool = False, slot: int = 0) -> Score:
    payload = {"prefix": prefix, "groups": groups, "pin": pin}
    return Score(id=rid, slot=slot, payload=json.dumps(payload).encode())


def group(q: tuple[str, list[str]], base: int | None = None, na: bool = False) -> dict:
    stem, options = q
    g = {"stem": ("N/A" if na else "") + stem, "options": options}
    if base is not None:
        g["base"] = base
    return g


def scored(events) -> tuple[list[tuple], Done]:
    assert isinstance(events[-1], Done), events[-1]
    rows = [(e.group, e.option, e.context_tokens, tuple(e.logprobs)) for e in events if isinstance(e, Scored)]
    return rows, events[-1]


def alone(model_path, prefix: str, groups: list[dict]) -> list[tuple]:
    eng = engine(model_path)
    try:
        return scored(eng.request(score(1, prefix, groups)))[0]
    finally:
        eng.close()


@pytest.fixture(scope="module")
def alone_rows(model_path) -> dict[str, list[tuple]]:
    return {
        "state": alone(model_path, PREFIX, [group(Q1), group(Q2)]),
        "free": alone(model_path, HEAD, [group(Q1, na=True), group(Q2, na=True)]),
    }


def relabel(rows: list[tuple], groups: list[int]) -> list[tuple]:
    """``rows`` (group, option, ctx, lps) with group ``i`` renumbered ``groups[i]``."""
    return [(groups[g], o, c, lps) for g, o, c, lps in rows]


@pytest.mark.parametrize("based_first", [False, True], ids=["state groups first", "based groups first"])
def test_based_groups_score_the_bits_of_their_own_prefix(model_path, alone_rows, based_first):
    plain = [group(Q1), group(Q2)]
    based = [group(Q1, BASE, na=True), group(Q2, BASE, na=True)]
    groups = based + plain if based_first else plain + based
    eng = engine(model_path)
    try:
        rows, done = scored(eng.request(score(7, PREFIX, groups, pin=True)))
    finally:
        eng.close()
    want = (
        relabel(alone_rows["free"], [0, 1]) + relabel(alone_rows["state"], [2, 3])
        if based_first
        else relabel(alone_rows["state"], [0, 1]) + relabel(alone_rows["free"], [2, 3])
    )
    assert rows == want
    assert done.snapshot == "none"


def test_the_slot_keeps_the_state_and_the_next_question_hits_its_snapshot(model_path):
    eng = engine(model_path)
    try:
        first = scored(eng.request(score(1, PREFIX, [group(Q1), group(Q1, BASE, na=True)], pin=True)))[1]
        again = eng.request(score(2, PREFIX, [group(Q3), group(Q3, BASE, na=True)], pin=True))
        rows, second = scored(again)
        n_state = first.reused + first.computed  # nothing reused on a fresh engine: the trunk and the nodes
        assert first.reused == 0
        assert second.snapshot == "hit"
        # the second request computes its two stems' nodes only, not the state again
        assert second.reused > 0 and second.computed < n_state - second.reused
        repeat = scored(eng.request(score(3, PREFIX, [group(Q3), group(Q3, BASE, na=True)])))
        assert repeat[0] == rows  # the same bits again, from the snapshot
    finally:
        eng.close()


def test_computed_counts_the_trunk_and_both_tries(model_path):
    eng = engine(model_path)
    try:
        alone_state = scored(eng.request(score(1, PREFIX, [group(Q1)], slot=0)))[1]
        alone_free = scored(eng.request(score(2, HEAD, [group(Q1, na=True)], slot=1)))[1]
    finally:
        eng.close()
    eng = engine(model_path)
    try:
        both = scored(eng.request(score(3, PREFIX, [group(Q1), group(Q1, BASE, na=True)])))[1]
    finally:
        eng.close()
    head_tokens = alone_free.computed - (both.computed - alone_state.computed)
    # the mixed SCORE computes the state request's positions and the content-free stem's nodes, not the head twice
    assert both.computed == alone_state.computed + alone_free.computed - head_tokens
    assert 10 < head_tokens < 40
    assert both.reused == 0


@pytest.mark.parametrize(
    ("base", "reason"),
    [
        (-1, "groups[1].base: expected a whole number of bytes from 0 to the prefix's {n}"),
        (1.5, "groups[1].base: expected a whole number of bytes from 0 to the prefix's {n}"),
        ("3", "groups[1].base: expected a whole number of bytes from 0 to the prefix's {n}"),
        (10**6, "groups[1].base: expected a whole number of bytes from 0 to the prefix's {n}"),
    ],
)
def test_a_bad_base_is_refused_naming_the_group(model_path, base, reason):
    eng = engine(model_path)
    try:
        events = eng.request(score(1, PREFIX, [group(Q1), {**group(Q1, na=True), "base": base}]))
        assert isinstance(events[-1], Error)
        assert (events[-1].code, events[-1].reason) == ("BAD_REQUEST", reason.format(n=len(PREFIX.encode())))
    finally:
        eng.close()


def test_caps_advertise_based_groups(model_path):
    eng = engine(model_path)
    try:
        assert eng.caps.values.get("x_score_base") == "1"
    finally:
        eng.close()


# --- a question of more options than scratch sequences: the stem is kept for the next chunk ------------

MANY = [f"queue_{k}" for k in range(40)]
LISTING = "\n\nWhich queue?\n" + "\n".join(f"{o}: tickets of queue {k}" for k, o in enumerate(MANY))
QMANY = (LISTING + "\nAnswer with one label.<|im_end|>\n<|im_start|>assistant\n", MANY)


def many(model_path, seqs: str, *groups: dict) -> tuple[list[tuple], Done]:
    eng = engine(model_path, "--score-seqs", seqs)
    try:
        return scored(eng.request(score(1, PREFIX, list(groups))))
    finally:
        eng.close()


@pytest.mark.parametrize("seqs", ["7", "16"])
def test_a_question_cut_between_chunks_keeps_its_stem_and_its_bits(model_path, seqs):
    """40 options on 7 (or 16) scratch sequences: 6 (or 3) chunks, the stem computed in the first only
    (each later chunk recomputes the stem's last position); the bits those of one chunk of 64."""
    groups = (group(QMANY), group(QMANY, BASE, na=True), group(Q1))
    want, whole = many(model_path, "64", *groups)
    got, cut = many(model_path, seqs, *groups)
    assert got == want
    later = 2 * (-(-40 // int(seqs)) - 1)  # later chunks of the two questions of 40 (the state's, its twin's)
    # each later chunk of a cut question recomputes the stem's last position and the nodes its options
    # share ("queue", "_", a digit), at most 4; without the carry it computed the stem's 477 positions again
    assert later <= cut.computed - whole.computed <= 4 * later
