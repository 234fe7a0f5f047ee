"""Prompts longer than a slot: the llama engine's lease (spec/llama-engine.md, "Prompts longer than a slot").

A slot holds ``n_ctx`` positions (CAPS ``n_ctx``); the engine accepts prompts up
to ``x_max_prompt`` (``--ctx-max``, by default the model's trained context),
and one slot at a time, the lease's, may pass ``n_ctx`` into cells the cache
holds for it alone. Held here, on the default model with small slots
(``--ctx 256 --ctx-max 1024``, so that a "long" prompt costs seconds, not
minutes; the same code serves 4096 and 8192) and a small ``--ubatch``, so the
requests' rows interleave in many decodes:

* CAPS says both limits; a prompt past ``x_max_prompt`` is refused naming it.
* A long SCORE and a long read-out answer, bit for bit (``--float-digits 17``)
  as on an engine whose slot holds them whole (``--ctx 1024``).
* The same digits whether or not the other slots are busy: the long request
  beside three others, one of them long too (it waits for the lease, no
  request fails), each number equal to its request alone on a fresh engine.
* The lease takes nothing from another slot: a normal slot's state survives
  two long prompts on other slots; the idle lease slot gives back only its
  positions past ``n_ctx``.
"""

from __future__ import annotations

import json

import pytest

from serveproto import Done, Echo, Error, Score, Scored, Submit
from test_llama_engine import Engine

pytestmark = pytest.mark.slow

SMALL = ("--ctx", "256", "--ctx-max", "1024", "--ubatch", "32", "--slots", "4", "--float-digits", "17")


def state(seed: int, lines: int) -> str:
    """About 12 tokens a line on the default model."""
    return " ".join(f"Line {i}: invoice {seed * 1000 + i} was charged twice this month." for i in range(lines))


def score(rid: int, slot: int, seed: int, lines: int) -> Score:
    groups = [
        {"stem": "\nIs this urgent? Answer:", "options": [" yes", " no", " only if it is late again"]},
        {"stem": "\nWhich team? Answer:", "options": [" billing", " technical support"]},
    ]
    return Score(id=rid, slot=slot, payload=json.dumps({"prefix": state(seed, lines), "groups": groups}).encode())


def readout(rid: int, slot: int, seed: int, lines: int) -> Submit:
    return Submit(
        id=rid,
        slot=slot,
        prompt=state(seed, lines).encode(),
        max_tokens=0,
        temperature=0.0,
        top_p=1.0,
        logprobs=1,
        counters=True,
    )


def numbers(events) -> list:
    """Every number a request's replies carry, in order (floats exact); the DONE last."""
    assert isinstance(events[-1], Done), events[-1]
    out: list = []
    for e in events:
        if isinstance(e, Scored):
            out.append(("scored", e.group, e.option, e.context_tokens, tuple(e.logprobs)))
        elif isinstance(e, Echo) and e.position > 0:
            out.append(("echo", e.position, e.logprob, repr(e.top), e.text))
    return out


def engine(model_path, *args: str) -> Engine:
    return Engine(model_path, "--threads", "2", *args)


def alone(model_path, requests, *args: str) -> dict[int, list]:
    got = {}
    for r in requests:
        eng = engine(model_path, *args)
        try:
            got[r.id] = numbers(eng.request(r))
        finally:
            eng.close()
    return got


LONG = score(1, 0, 1, 60)  # about 720 tokens: past a slot of 256, within 1024
LONG_READ = readout(2, 1, 2, 50)  # about 600
BESIDE = [score(3, 2, 3, 15), readout(4, 3, 4, 12)]  # within a slot


@pytest.fixture(scope="module")
def alone_small(model_path):
    return alone(model_path, [LONG, LONG_READ, *BESIDE], *SMALL)


def test_caps_say_the_slot_and_the_longest_prompt(model_path):
    eng = engine(model_path, "--ctx", "256", "--ctx-max", "1024")
    try:
        assert eng.caps.n_ctx == 256 and eng.caps.values["x_max_prompt"] == "1024"
    finally:
        eng.close()
    eng = engine(model_path)  # the defaults: 4096 a slot, the model's trained 8192 in all
    try:
        assert eng.caps.n_ctx == 4096 and eng.caps.values["x_max_prompt"] == "8192"
    finally:
        eng.close()
    eng = engine(model_path, "--ctx", "512", "--ctx-max", "100")  # never less than a slot
    try:
        assert eng.caps.values["x_max_prompt"] == "512"
    finally:
        eng.close()


def test_a_prompt_longer_than_a_slot_answers_as_on_a_slot_that_holds_it(model_path, alone_small):
    for r in (LONG, LONG_READ):
        assert alone_small[r.id], r
    assert max(n[3] for n in alone_small[LONG.id] if n[0] == "scored") > 600  # context_tokens past the slot
    whole = alone(
        model_path, [LONG, LONG_READ], "--ctx", "1024", "--ubatch", "32", "--slots", "4", "--float-digits", "17"
    )
    assert whole[LONG.id] == alone_small[LONG.id]
    assert whole[LONG_READ.id] == alone_small[LONG_READ.id]


def test_long_prompts_beside_busy_slots_keep_their_digits_and_none_fails(model_path, alone_small):
    """Two long requests (the second waits for the lease) and two short ones, all at once."""
    eng = engine(model_path, *SMALL)
    try:
        reqs = [LONG, LONG_READ, *BESIDE]
        eng.send(*reqs)
        got = {r.id: numbers(eng.collect(r.id)) for r in reqs}
        assert "no free cells above" not in eng.stderr_text()
    finally:
        assert eng.close() == 0
    differ = [rid for rid in got if got[rid] != alone_small[rid]]
    assert not differ, f"requests whose numbers moved beside the others: {differ}"


def test_past_the_longest_prompt_is_refused_naming_the_limit(model_path):
    eng = engine(model_path, *SMALL)
    try:
        ev = eng.request(score(5, 0, 5, 100))  # about 1200 tokens
        assert isinstance(ev[-1], Error) and ev[-1].code == "BAD_REQUEST"
        assert ev[-1].reason == "groups[0].options[0]: the text is longer than the context"
        ev = eng.request(readout(6, 1, 6, 100))
        assert isinstance(ev[-1], Error) and ev[-1].code == "BAD_REQUEST"
        assert ev[-1].reason.startswith("the prompt has ") and ev[-1].reason.endswith(" tokens, the context 1024")
        assert isinstance(eng.request(score(7, 0, 7, 5))[-1], Done)  # and it keeps serving
    finally:
        assert eng.close() == 0


def test_the_lease_takes_no_other_slots_state(model_path):
    eng = engine(model_path, *SMALL, "--score-cache-mb", "0")  # no cache: the counters show the slots
    try:
        short = score(10, 2, 10, 15)
        first = eng.request(short)
        a = eng.request(score(11, 0, 11, 45))  # long on slot 0: takes the lease
        b = eng.request(score(12, 1, 12, 45))  # long on slot 1: the idle slot 0 gives back its excess
        assert isinstance(a[-1], Done) and isinstance(b[-1], Done)
        again = eng.request(score(13, 2, 10, 15))  # slot 2's state untouched: its trunk reused
        assert numbers(again) == numbers(first)
        assert again[-1].reused > 150
        assert again[-1].computed < first[-1].computed / 4
        # slot 0 kept its first 256 positions (a slot's share): reused, the rest computed again
        a2 = eng.request(score(14, 0, 11, 45))
        assert numbers(a2) == numbers(a)
        assert a2[-1].reused == 256 and a2[-1].computed == a[-1].computed - 256
    finally:
        assert eng.close() == 0
