"""The drive-by-hand API (gateway.engine.Engine) on the fixture engine, both anyio backends.

Numbers are checked against fixtures/toy_model.py, the fixture's independent
Python reference: a logprob the engine prints is ``float(fmt(x))`` of the
reference's ``x``.
"""

from __future__ import annotations

import math

import anyio
import pytest

from fixtures import toy_model as tm
from gateway.decision.arithmetic import probabilities, softmax
from gateway.engine import Engine, EngineUnavailable, ReadOut, RequestError, ScoreResult
from serveproto import Accept, Data, Done, Echo

pytestmark = pytest.mark.anyio


def toy_logprob(text: bytes, p: int) -> float:
    """The reference logprob of byte ``p`` of ``text`` given the bytes before it, as printed."""
    return float(tm.fmt(tm.position_logprobs(list(text), p)[text[p]]))


def toy_option(prefix: bytes, option: bytes) -> tuple[int, tuple[float, ...]]:
    """(context_tokens, logprobs) of ``option`` after ``prefix`` on the byte-level toy model."""
    text = prefix + option
    return len(prefix), tuple(toy_logprob(text, p) for p in range(len(prefix), len(text)))


async def until(condition) -> None:
    """Wait (at most 10 s) until ``condition()`` holds; test-side only."""
    with anyio.fail_after(10):
        while not condition():
            await anyio.sleep(0.001)


async def test_caps_are_typed(fixture_engine):
    async with Engine.spawn([fixture_engine, "--slots", "3"], name="fx") as eng:
        assert eng.healthy and eng.name == "fx" and eng.pid > 0
        assert eng.caps.slots == 3
        assert eng.caps.n_vocab == tm.VOCAB
        assert eng.caps.x_score and eng.caps.x_counters and eng.caps.x_health
        assert eng.caps.model == "fixture"
    assert not eng.healthy
    with pytest.raises(EngineUnavailable):
        eng.caps  # noqa: B018  (reading the property is what raises)


async def test_read_out_matches_the_reference(fixture_engine):
    text = b"Hello, world"
    async with Engine.spawn([fixture_engine]) as eng:
        r = await eng.read_out(text, logprobs=3)
    assert isinstance(r, ReadOut)
    assert r.accept.prompt_tokens == len(text)
    assert [e.position for e in r.echoes] == list(range(len(text)))
    assert r.tokens == [bytes([b]) for b in text]
    assert math.isnan(r.logprobs[0]) and r.echoes[0].top == ()
    assert r.logprobs[1:] == [toy_logprob(text, p) for p in range(1, len(text))]
    lp5 = tm.position_logprobs(list(text), 5)
    assert [tid for tid, _ in r.echoes[5].top] == tm.top_k(lp5, 3)
    assert r.done.prompt_tokens == len(text) and r.done.emitted == 0
    assert (r.done.computed, r.done.reused, r.done.snapshot) == (len(text), 0, "none")


async def test_submit_streams_the_reference_frames(fixture_engine):
    prompt = b"Once upon"
    async with Engine.spawn([fixture_engine]) as eng:
        events = [ev async for ev in eng.submit(prompt, max_tokens=5, logprobs=1)]
    assert isinstance(events[0], Accept) and events[0].prompt_tokens == len(prompt)
    echoes = [e for e in events if isinstance(e, Echo)]
    data = [e for e in events if isinstance(e, Data)]
    done = events[-1]
    assert isinstance(done, Done) and done.emitted == len(data)
    assert len(echoes) == len(prompt)
    # The reference's exact frames, greedy: compare the generated text and logprobs.
    ref = tm.ToyEngine().submit(1, prompt, max_tokens=5, logprobs=1, counters=True)
    ref_data = [line for line in ref.split(b"\n") if line.startswith(b"DATA ")]
    assert [float(line.split()[3]) for line in ref_data] == [d.logprob for d in data]
    assert done.length_limited == (len(data) == 5)


async def test_counters_are_not_sent_to_an_engine_without_them(fixture_engine):
    async with Engine.spawn([fixture_engine, "--mode", "plain"]) as eng:
        assert not eng.caps.x_counters
        r = await eng.read_out(b"abc", logprobs=1)  # counters=True is dropped, not refused
    assert r.done.computed is None


async def test_score_fast_and_fallback_agree_with_the_reference(fixture_engine):
    prefix, stem = b"Q: is it red? ", b"A:"
    options = [b" yes", b" no", b" maybe"]
    async with Engine.spawn([fixture_engine]) as full, Engine.spawn([fixture_engine, "--mode", "plain"]) as plain:
        assert full.caps.x_score and not plain.caps.x_score
        fast = await full.score(prefix, [(stem, options)])
        forced = await full.score(prefix, [(stem, options)], fast=False)
        fallback = await plain.score(prefix, [(stem, options)])
    assert isinstance(fast, ScoreResult) and fast.fast and not fallback.fast
    want = [toy_option(prefix + stem, o) for o in options]
    for result in (fast, forced, fallback):
        got = [(o.context_tokens, o.logprobs) for o in result.groups[0]]
        assert got == want
        assert [o.option for o in result.groups[0]] == [" yes", " no", " maybe"]
    # Each option processed only its own tokens (spec 9.2 counters): the fallback
    # computed prefix+stem once, then each option's bytes on top of its snapshot.
    assert forced.computed == len(prefix + stem) + sum(len(o) for o in options)
    assert forced.reused == len(options) * len(prefix + stem)
    assert fallback.computed is None  # plain mode has no counters
    sums = [math.fsum(lps) for _, lps in want]
    assert probabilities(fast) == softmax(sums)
    assert math.isclose(sum(probabilities(fast)), 1.0, rel_tol=1e-12)


async def test_score_groups_and_flat_options(fixture_engine):
    prefix = b"The sky is"
    groups = [(b" very", [b" blue", b" grey"]), (b"", [b" green", b" red", b" x"])]
    async with Engine.spawn([fixture_engine]) as full, Engine.spawn([fixture_engine, "--mode", "plain"]) as plain:
        a = await full.score(prefix, groups, pin=True)
        b = await plain.score(prefix, groups, pin=True)
        flat = await plain.score(prefix, [" blue", " grey"])
    for gi, (stem, options) in enumerate(groups):
        want = [toy_option(prefix + stem, o) for o in options]
        assert [(o.context_tokens, o.logprobs) for o in a.groups[gi]] == want
        assert [(o.context_tokens, o.logprobs) for o in b.groups[gi]] == want
    assert [(o.context_tokens, o.logprobs) for o in flat.groups[0]] == [
        toy_option(prefix, b" blue"),
        toy_option(prefix, b" grey"),
    ]


async def test_score_refuses_bad_groups_naming_the_field(fixture_engine):
    async with Engine.spawn([fixture_engine, "--mode", "plain"]) as eng:
        with pytest.raises(ValueError, match=r"groups\[0\]\.options"):
            await eng.score(b"p", [(b"s", [])])
        with pytest.raises(ValueError, match=r"groups\[0\]\.stem"):
            await eng.score(b"", [(b"", [b"a"])])
        with pytest.raises(RequestError) as info:  # an option with no token of its own
            await eng.score(b"abc", [(b"", [b"", b"d"])])
        assert info.value.code == "BAD_REQUEST" and "groups[0].options[0]" in info.value.reason
        r = await eng.score(b"abc", [b"d", b"e"])  # the engine still serves
    assert r.groups[0][0].context_tokens == 3


async def test_engine_errors_become_request_errors(fixture_engine):
    async with Engine.spawn([fixture_engine, "--ctx", "8", "--slots", "2"]) as eng:
        with pytest.raises(RequestError) as info:
            await eng.read_out(b"far longer than eight bytes", logprobs=1)
        assert info.value.code == "BAD_REQUEST" and info.value.request_id > 0
        with pytest.raises(ValueError, match="slot"):
            await eng.read_out(b"abc", slot=2)
        assert (await eng.read_out(b"abc", logprobs=1)).done.prompt_tokens == 3
        assert eng.restarts == 0 and eng.healthy


async def test_decide_returns_the_reference_decision(fixture_engine):
    record = {
        "state": "The invoice is overdue by 40 days.",
        "state_type": "string",
        "questions": [
            {
                "id": "q1",
                "type": "choice",
                "instructions": "Which team?",
                "options": [{"label": "billing", "text": "money"}, {"label": "support", "text": None}],
            }
        ],
    }
    async with Engine.spawn([fixture_engine, "--mode", "decide"]) as eng:
        decision, done = await eng.decide(record)
        with pytest.raises(RequestError) as info:
            await eng.decide(b'{"state": "x"}')
        assert info.value.code == "DECIDE_INVALID"
        with pytest.raises(RequestError) as info:
            async for _ in eng.submit(b"hi", max_tokens=1):
                pass
        assert info.value.code == "NOT_SUPPORTED"
    decision.pop("engine_ms", None)
    assert decision == tm.decide(record)
    assert isinstance(done, Done)


async def test_decide_needs_a_decision_engine(fixture_engine):
    async with Engine.spawn([fixture_engine]) as eng:
        with pytest.raises(RequestError) as info:
            await eng.decide({"state": "", "questions": []})
    assert info.value.code == "NOT_SUPPORTED"


async def test_ping(fixture_engine):
    async with Engine.spawn([fixture_engine]) as eng:
        assert (await eng.ping())["active"] == "0"


async def test_concurrent_requests_are_multiplexed_by_id(fixture_engine):
    texts = [f"request number {i} ".encode() * (i + 1) for i in range(8)]
    results: dict[int, ReadOut] = {}
    async with Engine.spawn([fixture_engine, "--slots", "3"]) as eng:
        async with anyio.create_task_group() as tg:
            for i, t in enumerate(texts):

                async def one(i=i, t=t):
                    results[i] = await eng.read_out(t, logprobs=1)

                tg.start_soon(one)
        assert eng.in_flight == 0 and eng.waiting == 0
    for i, t in enumerate(texts):
        assert results[i].logprobs[1:] == [toy_logprob(t, p) for p in range(1, len(t))]


async def test_slot_routing_by_shared_prefix(fixture_engine):
    state_a = b"A" * 100 + b" the first conversation"
    state_b = b"B" * 100 + b" the second conversation"
    async with Engine.spawn([fixture_engine, "--slots", "2"]) as eng:
        slots = []
        for text in (state_a + b" q1", state_b + b" q1", state_a + b" q2", state_b + b" q2"):
            stream = eng.submit(text, max_tokens=0, logprobs=1)
            async with stream:
                async for _ in stream:
                    pass
            slots.append(stream.slot)
        # Same state, same slot; the two states on different slots.
        assert slots[0] == slots[2] and slots[1] == slots[3] and slots[0] != slots[1]
        # The second question on a state resumed from its KV: pinned, it reuses the state.
        r1 = await eng.read_out(state_a + b" q3", pin=True)
        r2 = await eng.read_out(state_a + b" q3 and more")
    assert r2.done.snapshot == "hit" and r2.done.reused == len(state_a + b" q3")
    assert r1.done.snapshot == "none"


async def test_one_slot_queues_fifo(fixture_engine):
    order = []
    async with Engine.spawn([fixture_engine, "--token-delay-ms", "5"]) as eng:
        async with anyio.create_task_group() as tg:
            long_scope = anyio.CancelScope()

            async def gen(tag: str, n: int):
                async for ev in eng.submit(tag.encode(), max_tokens=n, slot=0):
                    if isinstance(ev, Done):
                        order.append(tag)

            async def long():
                with long_scope:
                    await gen("long", 1000)
                order.append("long cancelled")

            tg.start_soon(long)
            await until(lambda: eng.in_flight == 1)
            for i, tag in enumerate(("a", "b", "c")):
                tg.start_soon(gen, tag, 1)
                await until(lambda: eng.waiting == i + 1)  # noqa: B023  (awaited within the same iteration)
            long_scope.cancel()
        assert eng.in_flight == 0 and eng.waiting == 0
    assert order == ["long cancelled", "a", "b", "c"]


async def test_fallback_score_gives_other_clients_turns_between_groups(fixture_engine):
    """A many-group fallback score holds the slot one group at a time (FIFO): a
    request queued behind the score's first group runs before its later groups."""
    events = []
    groups = [(f" q{g}:".encode(), [b" yes", b" no"]) for g in range(4)]
    async with Engine.spawn([fixture_engine, "--mode", "plain", "--token-delay-ms", "5"]) as eng:
        async with anyio.create_task_group() as tg:
            blocker_scope = anyio.CancelScope()

            async def blocker():
                with blocker_scope:
                    async for _ in eng.submit(b"blocker", max_tokens=1000, slot=0):
                        pass
                events.append("blocker cancelled")

            async def scorer():
                await eng.score(b"shared state", groups, slot=0)
                events.append("score done")

            async def other():
                await eng.read_out(b"another client", logprobs=1, slot=0)
                events.append("other done")

            tg.start_soon(blocker)
            await until(lambda: eng.in_flight == 1)
            tg.start_soon(scorer)
            await until(lambda: eng.waiting == 1)
            tg.start_soon(other)
            await until(lambda: eng.waiting == 2)
            blocker_scope.cancel()
    assert events == ["blocker cancelled", "other done", "score done"]


async def test_many_clients_with_random_cancellations(fixture_engine):
    """Stress: 40 concurrent clients over 3 slots, a third of them cancelled at a
    random point. Nobody meets SLOT_BUSY or another client's frames, every
    finished answer is the reference's, and the engine ends idle, never restarted."""
    import random

    rng = random.Random(20261130)
    finished, cancelled = [], 0
    async with Engine.spawn([fixture_engine, "--slots", "3", "--token-delay-ms", "1"]) as eng:
        async with anyio.create_task_group() as tg:
            for i in range(40):
                text = f"client {i} says {'la' * rng.randrange(1, 20)}".encode()
                kind = rng.choice(["read_out", "submit", "score", "score_fallback", "ping"])
                slot = rng.choice([None, None, 0, 1, 2])
                deadline = rng.choice([None, None, rng.uniform(0.0, 0.03)])

                async def client(text=text, kind=kind, slot=slot, deadline=deadline):
                    nonlocal cancelled
                    with anyio.CancelScope(
                        deadline=math.inf if deadline is None else anyio.current_time() + deadline
                    ) as scope:
                        if kind == "read_out":
                            r = await eng.read_out(text, logprobs=1, slot=slot)
                            got = r.logprobs[1:]
                            want = [toy_logprob(text, p) for p in range(1, len(text))]
                        elif kind == "submit":
                            events = [e async for e in eng.submit(text, max_tokens=20, slot=slot)]
                            got = [e.emitted for e in events if isinstance(e, Done)]
                            want = [sum(isinstance(e, Data) for e in events)]
                        elif kind == "ping":
                            got, want = [(await eng.ping())["active"].isdigit()], [True]
                        else:
                            s = await eng.score(text, [b" yes", b" no"], slot=slot, fast=kind == "score")
                            got = [(o.context_tokens, o.logprobs) for o in s.groups[0]]
                            want = [toy_option(text, o) for o in (b" yes", b" no")]
                        finished.append((kind, got == want))
                    if scope.cancelled_caught:
                        cancelled += 1

                tg.start_soon(client)
        assert eng.in_flight == 0 and eng.waiting == 0
        assert eng.restarts == 0 and eng.healthy
        assert (await eng.ping())["active"] == "0"
    assert len(finished) + cancelled == 40 and cancelled > 0
    assert all(ok for _, ok in finished), [k for k, ok in finished if not ok]
