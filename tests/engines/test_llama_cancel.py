"""CANCEL and PING inside a llama_decode: the llama engine on the default model.

The engine reads stdin from llama.cpp's abort callback, between the graph
nodes of a decode, so a CANCEL stops the running decode within one ubatch and
a PING is answered while it runs (spec/llama-engine.md, "Cancellation").

What the tests observe is causal, not timed. The score cache keeps every
option a finished decode scored; a SCORE cancelled after its decode finished
(what the engine did before the abort callback: it read CANCEL only between
decodes) leaves its options in the cache, and an identical SCORE afterwards
computes none of them. Cancelled inside the decode, nothing was kept, and the
repeat computes every position a fresh engine computes, with the same digits
(``--float-digits 17``, compared with ``==``). Likewise a SUBMIT cancelled
inside its first prefill ubatch leaves the slot empty (the repeat reuses 0
positions, not one ubatch). The requests take seconds of decoding on this
model; a CANCEL written right after ACCEPT reaches the engine within
milliseconds, well inside them.
"""

from __future__ import annotations

import json

import pytest

from serveproto import Accept, Cancel, Data, Done, Echo, Error, Ping, Pong, Score, Scored, Submit
from test_llama_engine import Engine

pytestmark = pytest.mark.slow

WORDS = "the quick brown fox jumps over the lazy dog while a customer writes about billing".split()
PREFIX = "Ticket: " + " ".join(WORDS[i % len(WORDS)] for i in range(40)) + "\n"
STEMS = [f"Question {g}: is the {WORDS[g % len(WORDS)]} of item {g} relevant? Answer:" for g in range(12)]


def score_payload(options, pin=False) -> bytes:
    groups = [{"stem": s, "options": [o.format(g=g) for o in options]} for g, s in enumerate(STEMS)]
    return json.dumps({"prefix": PREFIX, "groups": groups, "pin": pin}).encode()


#: Same prefix and stems (so the same trunk, restored from PIN's snapshot),
#: options that share nothing with each other's cache entries.
PIN = score_payload([" yes", " no"], pin=True)
LONG_A = score_payload([" it depends on the size of item {g} today", " only when item {g} is late again"])
LONG_B = score_payload([" perhaps if item {g} is the billing one", " never for item {g} at all"])


def engine(model_path, *args) -> Engine:
    return Engine(model_path, "--float-digits", "17", *args)


def scored(events) -> list[tuple[int, int, int, tuple[float, ...]]]:
    assert isinstance(events[-1], Done), events[-1]
    return [(e.group, e.option, e.context_tokens, tuple(e.logprobs)) for e in events if isinstance(e, Scored)]


def start(eng: Engine, ev) -> None:
    """Sends a request and waits for its ACCEPT: its decoding has begun."""
    eng.send(ev)
    while True:
        got = eng.next_event()
        if getattr(got, "id", None) == ev.id:
            assert isinstance(got, Accept), got
            return
        eng.backlog.setdefault(got.id, []).append(got)


def test_cancel_and_ping_inside_a_score_decode(model_path):
    fresh = engine(model_path)
    try:
        assert isinstance(fresh.request(Score(id=1, slot=0, payload=PIN))[-1], Done)
        want_a = fresh.request(Score(id=2, slot=0, payload=LONG_A))
        want_b = fresh.request(Score(id=3, slot=0, payload=LONG_B))
    finally:
        fresh.close()
    nodes_a, nodes_b = want_a[-1].computed, want_b[-1].computed
    assert want_a[-1].snapshot == "hit" and nodes_a > 300  # the trie only: one long decode

    eng = engine(model_path)
    try:
        assert isinstance(eng.request(Score(id=1, slot=0, payload=PIN))[-1], Done)
        # CANCEL right after ACCEPT: the decode stops, nothing of it is kept
        start(eng, Score(id=2, slot=0, payload=LONG_A))
        eng.send(Cancel(id=2))
        out = eng.collect(2)
        assert isinstance(out[-1], Error) and out[-1].code == "CANCELLED", out[-1]
        assert not any(isinstance(e, Scored) for e in out)
        again = eng.request(Score(id=3, slot=0, payload=LONG_A))
        assert again[-1].computed == nodes_a, "the cancelled decode ran to its end"
        assert scored(again) == scored(want_a)

        # PING during the decode: its PONG comes while the decode runs, so the
        # CANCEL sent on reading it still finds the decode unfinished
        start(eng, Score(id=4, slot=0, payload=LONG_B))
        pong = eng.request(Ping(id=5))
        assert isinstance(pong[-1], Pong) and pong[-1].values["active"] == "1"
        eng.send(Cancel(id=4))
        out = eng.collect(4)
        assert isinstance(out[-1], Error) and out[-1].code == "CANCELLED", out[-1]
        again = eng.request(Score(id=6, slot=0, payload=LONG_B))
        assert again[-1].computed == nodes_b, "PONG waited for the decode's end"
        assert scored(again) == scored(want_b)
        assert eng.close() == 0
    finally:
        if eng.proc.poll() is None:
            eng.proc.kill()


def submit(rid: int, prompt: bytes, **kw) -> Submit:
    args = dict(max_tokens=4, temperature=0.0, top_p=1.0, counters=True)
    args.update(kw)
    return Submit(id=rid, slot=0, prompt=prompt, **args)


def test_cancel_inside_a_prefill_ubatch(model_path):
    prompt = (PREFIX * 6).encode()  # about 350 tokens: two ubatches of 256
    fresh = engine(model_path, "--ubatch", "256")
    try:
        want = fresh.request(submit(1, prompt))
    finally:
        fresh.close()
    assert want[-1].prompt_tokens > 256

    eng = engine(model_path, "--ubatch", "256")
    try:
        start(eng, submit(1, prompt))
        eng.send(Cancel(id=1))
        out = eng.collect(1)
        assert isinstance(out[-1], Error) and out[-1].code == "CANCELLED", out[-1]
        again = eng.request(submit(2, prompt))
        # cancelled between ubatches (the engine before the abort callback),
        # the slot would keep the first 256 positions
        assert again[-1].reused == 0, again[-1]
        assert again[-1].computed == want[-1].computed
        assert [e.text for e in again if isinstance(e, Data)] == [e.text for e in want if isinstance(e, Data)]
        # and a read-out on the same engine gives the fresh digits
        ro = eng.request(submit(3, prompt, max_tokens=0, logprobs=1))
        fresh = engine(model_path, "--ubatch", "256")
        try:
            ro_want = fresh.request(submit(1, prompt, max_tokens=0, logprobs=1))
        finally:
            fresh.close()

        def lps(events):  # position 0 is nan, which equals nothing
            return [(e.position, e.logprob) for e in events if isinstance(e, Echo) and e.position > 0]

        assert lps(ro) == lps(ro_want) and len(lps(ro)) == want[-1].prompt_tokens - 1
        assert eng.close() == 0
    finally:
        if eng.proc.poll() is None:
            eng.proc.kill()
