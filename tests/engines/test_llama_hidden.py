"""SCORE's ``hidden`` (spec 9.1, CAPS ``x_hidden``): layer outputs at each group's context end.

On the default model with ``--float-digits 17`` and invariant numerics:

* **Where it is read.** The vector of a question is the same bits whether the question's stem is
  in the group (read in the trie) or folded into the prefix (its last row recomputed beside a
  restored snapshot), and an exact repeat gives it again although its options come from the
  score cache.
* **Batch composition.** The vectors and logprobs of a SCORE sent beside seven other requests on
  other slots, with ``--ubatch 16`` (the rows split over many ubatches, the wanted row in a later
  one), are the bits it has alone on a fresh engine with the default ubatch; the last layer (whose
  tensor keeps only output rows) included.
* **The logprobs do not move.** A SCORE with ``hidden`` answers the SCORED frames of the same
  SCORE without it; ``computed`` counts the recomputed context end only where the stem was in
  the prefix.
* **Bad input.** A layer out of range, a non-array and too many layers are refused naming the field.
"""

from __future__ import annotations

import json

import pytest

from serveproto import Done, Error, Hidden, Score, Scored
from test_llama_engine import Engine
from test_llama_sched import eight_requests

pytestmark = pytest.mark.slow

HEAD = "<|im_start|>system\nYou answer questions about the text.<|im_end|>\n<|im_start|>user\n"
STATE = (
    "My card was charged twice for the March invoice and I want the duplicate refunded before Friday, "
    "or I will close the account. The order number is 4471 and the second charge is still pending."
)
Q1 = ("\n\nDoes the customer ask for a refund?\nAnswer yes or no.<|im_end|>\n<|im_start|>assistant\n", ["yes", "no"])
Q2 = (
    "\n\nWhich team should handle this?\nbilling: payments\nsales: plans\ntechnical: bugs\n"
    "Answer with one label.<|im_end|>\n<|im_start|>assistant\n",
    ["billing", "sales", "technical support team"],
)
LAYERS = [19, 29, 0]


def engine(model_path, *args: str) -> Engine:
    return Engine(model_path, "--float-digits", "17", "--slots", "8", "--ctx", "1024", *args)


def score(rid: int, prefix: str, groups, hidden=None, pin: bool = False, slot: int = 0) -> Score:
    payload: dict = {"prefix": prefix, "groups": [{"stem": s, "options": o} for s, o in groups], "pin": pin}
    if hidden is not None:
        payload["hidden"] = hidden
    return Score(id=rid, slot=slot, payload=json.dumps(payload).encode())


def parts(events) -> tuple[dict, list, Done]:
    assert isinstance(events[-1], Done), events[-1]
    hid = {(e.group, e.layer): e.values for e in events if isinstance(e, Hidden)}
    rows = [(e.group, e.option, e.context_tokens, e.logprobs) for e in events if isinstance(e, Scored)]
    return hid, rows, events[-1]


@pytest.fixture(scope="module")
def alone(model_path):
    eng = engine(model_path)
    try:
        plain = parts(eng.request(score(1, HEAD + STATE, [Q1, Q2])))
        with_h = parts(eng.request(score(2, HEAD + STATE, [Q1, Q2], hidden=LAYERS)))
        repeat = parts(eng.request(score(3, HEAD + STATE, [Q1, Q2], hidden=LAYERS)))
        folded = [
            parts(eng.request(score(4 + i, HEAD + STATE + Q1[0], [("", Q1[1])], hidden=LAYERS, pin=True)))
            for i in range(2)
        ]
    finally:
        eng.close()
    return plain, with_h, repeat, folded


def test_one_vector_per_group_and_layer(alone, model_path) -> None:
    _, (hid, _, done), _, _ = alone
    assert sorted(hid) == [(g, layer) for g in range(2) for layer in sorted(LAYERS)]
    assert all(len(v) == 576 for v in hid.values())
    # different layers and different questions are different vectors
    assert hid[0, 19] != hid[0, 29] and hid[0, 19] != hid[1, 19] and hid[0, 0] != hid[0, 19]
    assert isinstance(done, Done)


def test_logprobs_unchanged_and_repeat_same_bits(alone) -> None:
    (h0, rows0, d0), (hid, rows, d), (hid_r, rows_r, d_r), _ = alone
    assert h0 == {}
    assert rows == rows0
    assert hid_r == hid and rows_r == rows
    # after the plain SCORE only each group's first option is computed again (its context end's rows
    # are not kept; the other options come from the score cache), the same in an exact repeat
    assert 0 < d.computed == d_r.computed < d0.computed


def test_stem_in_prefix_same_bits(alone) -> None:
    _, (hid, rows, _), _, folded = alone
    for hf, rf, _ in folded:
        assert {layer: v for (_, layer), v in hf.items()} == {layer: hid[0, layer] for layer in LAYERS}
        assert [r[2:] for r in rf] == [r[2:] for r in rows if r[0] == 0]
    # the second one restores the pinned snapshot and recomputes the context end's row only
    assert folded[1][2].snapshot == "hit" and folded[1][2].computed == 1


def test_beside_others_small_ubatch_same_bits(alone, model_path) -> None:
    _, (hid, rows, _), _, _ = alone
    eng = engine(model_path, "--ubatch", "16", "--score-cache-mb", "0")
    try:
        others = eight_requests()[:7]
        mine = score(99, HEAD + STATE, [Q1, Q2], hidden=LAYERS, slot=7)
        eng.send(*others, mine)
        got = parts(eng.collect(99))
        for o in others:
            assert isinstance(eng.collect(o.id)[-1], Done)
    finally:
        eng.close()
    assert got[0] == hid
    assert got[1] == rows


@pytest.mark.parametrize(
    ("hidden", "reason"),
    [
        ([30], "hidden[0]: expected a layer from 0 to 29"),
        ([-1], "hidden[0]: expected a layer from 0 to 29"),
        ([1.5], "hidden[0]: expected a layer from 0 to 29"),
        (19, "hidden: expected an array of 1 to 4 layers"),
        ([], "hidden: expected an array of 1 to 4 layers"),
        ([0, 1, 2, 3, 4], "hidden: expected an array of 1 to 4 layers"),
    ],
)
def test_bad_hidden(model_path, hidden, reason) -> None:
    eng = engine(model_path)
    try:
        assert eng.request(score(1, HEAD, [Q1], hidden=hidden)) == [Error(id=1, code="BAD_REQUEST", reason=reason)]
    finally:
        eng.close()


def test_without_the_eval_callback_no_hidden_states(model_path, monkeypatch) -> None:
    """SERVEPROTO_NO_EVAL_CALLBACK=1 (the benchmark of the callback's cost) creates the context without
    llama.cpp's graph callback: CAPS says x_hidden=0 and a SCORE asking for hidden states is refused, while
    one without them answers its numbers as with the callback."""
    eng = engine(model_path)
    try:
        want = eng.request(score(1, HEAD + STATE, [Q1]))
    finally:
        eng.close()
    monkeypatch.setenv("SERVEPROTO_NO_EVAL_CALLBACK", "1")
    eng = engine(model_path)
    try:
        assert eng.caps.values["x_hidden"] == "0"
        assert eng.request(score(2, HEAD, [Q1], hidden=[19])) == [
            Error(id=2, code="BAD_REQUEST", reason="hidden: this engine reads no hidden states (x_hidden=0)")
        ]
        got = eng.request(score(1, HEAD + STATE, [Q1]))
        assert [e for e in got if isinstance(e, Scored)] == [e for e in want if isinstance(e, Scored)]
        assert len([e for e in want if isinstance(e, Scored)]) == 2
    finally:
        eng.close()
