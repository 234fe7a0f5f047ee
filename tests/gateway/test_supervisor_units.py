"""The supervisor's pure parts: slot routing and FIFO queues, restart backoff,
which read-out positions an option owns, softmax."""

from __future__ import annotations

import math

import anyio
import pytest

from gateway.decision.arithmetic import softmax
from gateway.engine import RequestError
from gateway.engine.score import OptionScore, option_tokens
from gateway.engine.slots import MAX_KEY_BYTES, MIN_SHARED_BYTES, PREFIX_CACHE_BYTES, READY_BYTES, SlotRouter
from gateway.engine.supervisor import RestartPolicy
from serveproto import Echo

pytestmark = pytest.mark.anyio


def echoes(start: int, texts: list[bytes], lps: list[float]) -> list[Echo]:
    return [Echo(id=1, position=start + i, logprob=lp, top=(), text=t) for i, (t, lp) in enumerate(zip(texts, lps))]


def test_option_tokens_after_a_snapshot_hit():
    # prefix+stem is 4 tokens, restored from its snapshot: the read-out starts at 4.
    known = {0: b"The", 1: b" sky", 2: b" is", 3: b":"}
    got = option_tokens(echoes(4, [b" blue", b"!"], [-0.5, -2.0]), known, 4)
    assert got == (4, (-0.5, -2.0))


def test_option_tokens_when_the_option_merges_with_the_stem():
    # The stem ended in " " (token 3); the option " blue" retokenised as " blue" at 3.
    known = {0: b"The", 1: b" sky", 2: b" is", 3: b" "}
    ev = echoes(0, [b"The", b" sky", b" is", b" blue"], [math.nan, -1.0, -2.0, -3.0])
    assert option_tokens(ev, known, 4) == (3, (-3.0,))


def test_option_tokens_unknown_positions_count_as_shared():
    # The option was read from position 2 on (positions 0-1 reused); the stem's
    # read-out began at 1. Divergence is past the stem's end (3 tokens).
    known = {1: b" b", 2: b" c"}
    ev = echoes(2, [b" c", b" d", b" e"], [-1.0, -2.0, -3.0])
    assert option_tokens(ev, known, 3) == (3, (-2.0, -3.0))


def test_option_tokens_refusals_name_the_option():
    known = {0: b"a", 1: b"b"}
    with pytest.raises(RequestError) as info:
        option_tokens(echoes(0, [b"a", b"b"], [math.nan, -1.0]), known, 2, where="groups[0].options[3]")
    assert info.value.code == "BAD_REQUEST" and info.value.reason.startswith("groups[0].options[3]")
    with pytest.raises(RequestError, match="first token"):
        option_tokens(echoes(0, [b"x"], [math.nan]), {0: b"a"}, 1)


def test_option_score_sums_in_nats():
    o = OptionScore(3, (-0.25, -0.5, -1.25), "x")
    assert (o.n_tokens, o.logprob, o.mean_logprob) == (3, -2.0, -2.0 / 3)


def test_softmax_values():
    assert softmax([0.0, 0.0]) == [0.5, 0.5]
    p = softmax([math.log(1.0), math.log(3.0)])
    assert p == pytest.approx([0.25, 0.75], abs=1e-15)
    assert softmax([-1000.0, -1001.0, -math.inf])[2] == 0.0
    assert softmax([-1000.0, -1001.0])[0] == pytest.approx(1 / (1 + math.exp(-1)), rel=1e-15)
    for bad in ([], [math.nan], [math.inf], [-math.inf, -math.inf]):
        with pytest.raises(ValueError, match="scores"):
            softmax(bad)


def test_restart_policy_backoff_doubles_to_its_cap():
    policy = RestartPolicy(max_restarts=5, period=10, backoff_initial=0.1, backoff_max=1.0)
    assert [policy.delay(n) for n in range(1, 7)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    with pytest.raises(ValueError, match="backoff_max"):
        RestartPolicy(backoff_max=-1)


def test_router_prefers_the_slot_sharing_a_long_prefix():
    r = SlotRouter(3)
    r._slots[0].key = b"S" * 200 + b"state one"
    r._slots[1].key = b"S" * 10 + b"x" * 200
    r._slots[0].last_used, r._slots[1].last_used = 1, 2  # slot 2 never used
    assert r.route(b"S" * 200 + b"state one, question 2") == 0
    # A shared prefix under MIN_SHARED_BYTES, or under half the key, does not count:
    # the least loaded, least recently used slot wins.
    assert r.route(b"S" * (MIN_SHARED_BYTES - 1)) == 2
    # Not affine (200 shared bytes are under half of this key), but slot 0 keeps 200 bytes and drops 9:
    # among free slots, the one that keeps the most and drops the least wins.
    assert r.route(b"S" * 200 + b"y" * 300) == 0
    with pytest.raises(ValueError, match="slots"):
        SlotRouter(0)


DOC = b"D" * 1000
TICKET = b"T" * 500


async def test_router_a_state_waits_for_its_slot_until_it_is_ready_then_takes_any():
    r = SlotRouter(3)
    first = await r.acquire(key=DOC)  # slot 0 now holds the document
    assert first.slot == 0
    assert r.route(DOC) is None  # no snapshot yet: it would wait for slot 0
    got = []
    async with anyio.create_task_group() as tg:

        async def second():
            lease = await r.acquire(key=DOC, pin=True)
            got.append(lease.slot)
            lease.begin()
            lease.close()
            await anyio.sleep(0.01)
            lease.end(ok=True)  # its DONE: the document's snapshot exists

        tg.start_soon(second)
        await anyio.wait_all_tasks_blocked()
        assert r.waiting() == 1 and got == []  # slots 1 and 2 are free, yet it waits
        first.close()
    assert got == [0] and r.is_ready(DOC)
    a, b, c = [await r.acquire(key=DOC) for _ in range(3)]
    assert sorted((a.slot, b.slot, c.slot)) == [0, 1, 2]  # ready: every slot serves it at once


async def test_router_requests_queued_for_a_state_take_the_free_slots_once_it_is_ready():
    """A burst of requests on a state with no snapshot yet queues for its slot; when the pinned one ends
    well (the snapshot exists), those still queued take the free slots at once. Before, they kept waiting
    for slot 0 and were served one after another although three slots were free."""
    r = SlotRouter(4)
    first = await r.acquire(key=DOC, pin=True)  # slot 0 computes the document, no snapshot yet
    got = []
    async with anyio.create_task_group() as tg:

        async def later():
            got.append((await r.acquire(key=DOC)).slot)

        for _ in range(3):
            tg.start_soon(later)
        await anyio.wait_all_tasks_blocked()
        assert r.waiting() == 3 and got == []
        first.begin()
        first.end(ok=True)  # its DONE: ready, while slot 0 still runs its window
        await anyio.wait_all_tasks_blocked()
        assert sorted(got) == [1, 2, 3] and r.waiting() == 0
        first.close()


async def test_router_a_waiter_whose_slot_moved_to_another_state_takes_a_free_slot_at_once():
    """A request waits for the slot that holds its state (no snapshot yet). When that slot goes to a
    request that named it, the slot no longer holds the state: the waiter may take any slot, and takes the
    one already free then, not at the next release."""
    r = SlotRouter(3)
    doc = await r.acquire(key=DOC)  # slot 0
    others = [await r.acquire(key=TICKET), await r.acquire(key=b"O" * 500)]  # slots 1 and 2
    got = {}
    async with anyio.create_task_group() as tg:

        async def wait(name, slot, key):
            got[name] = (await r.acquire(slot=slot, key=key)).slot

        tg.start_soon(wait, "named", 0, b"X" * 500)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(wait, "doc", None, DOC)
        await anyio.wait_all_tasks_blocked()
        others[1].close()  # slot 2 frees: "doc" may not take it (slot 0 holds its state), "named" wants 0
        await anyio.wait_all_tasks_blocked()
        assert got == {} and r.waiting() == 2
        doc.close()  # slot 0 goes to "named" and holds X now: "doc" takes the free slot 2 at once
        await anyio.wait_all_tasks_blocked()
        assert got == {"named": 0, "doc": 2} and r.waiting() == 0
        others[0].close()


async def test_router_a_pinned_request_that_failed_does_not_make_its_state_ready():
    r = SlotRouter(2)
    lease = await r.acquire(key=DOC, pin=True)
    lease.begin()
    lease.close()
    lease.end(ok=False)
    assert not r.is_ready(DOC) and r.route(DOC) == 0


async def test_router_keeps_no_more_than_its_byte_bounds_of_refused_keys():
    # issue 30, item 0: 100 refused 15 MB states kept 1.5 GB alive through the shared-prefix cache
    # (an lru_cache of 2048 pairs). 2 MB keys here: the cache, the slots and the ready keys are
    # bounded by bytes, and a key is routed by (and kept as) its first MAX_KEY_BYTES bytes.
    import tracemalloc

    r = SlotRouter(2)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(100):
        key = b"%06d" % i + b"x" * (2 << 20)
        lease = await r.acquire(key=key, pin=True)
        lease.begin()
        lease.close()
        lease.end(ok=False)  # the engine refused it
        del key, lease
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert grown < 2 * MAX_KEY_BYTES + PREFIX_CACHE_BYTES + (1 << 20)
    # both slots hold a truncated key; the cache is full: 16 pairs of two 1 MiB keys
    assert [len(s.key) for s in r._slots] == [MAX_KEY_BYTES, MAX_KEY_BYTES]
    assert r.kept_bytes() == 2 * MAX_KEY_BYTES + PREFIX_CACHE_BYTES
    assert len(r._prefix) == PREFIX_CACHE_BYTES // (2 * MAX_KEY_BYTES)


async def test_router_ready_keys_are_bounded_by_bytes_and_a_long_key_by_its_head():
    r = SlotRouter(1)
    for i in range(40):
        r.mark_ready(b"%06d" % i + b"r" * (2 << 20))
    assert r.kept_bytes() == READY_BYTES  # 16 keys of 1 MiB, not 40 of 2 MiB
    assert r.is_ready(b"%06d" % 39 + b"r" * (2 << 20)) and r.is_ready(b"%06d" % 39 + b"r" * MAX_KEY_BYTES)
    assert not r.is_ready(b"%06d" % 23 + b"r" * (2 << 20))  # the 17th newest was forgotten
    assert r.is_ready(b"%06d" % 24 + b"r" * (2 << 20))


async def test_router_a_prefix_of_a_document_goes_to_an_empty_slot_not_the_documents():
    r = SlotRouter(2)
    (await r.acquire(key=b"H" * 100 + DOC)).close()  # slot 0: the template head + the document
    assert r.route(b"H" * 100) == 1  # the head alone (a content-free reading) would truncate it
    assert r.route(b"H" * 100 + DOC + b"q") == 0


async def test_router_a_waiter_that_cannot_use_the_freed_slot_does_not_hold_back_one_that_can():
    r = SlotRouter(2)
    doc = await r.acquire(key=DOC)
    ticket = await r.acquire(key=TICKET)
    assert (doc.slot, ticket.slot) == (0, 1)
    order = []
    async with anyio.create_task_group() as tg:

        async def wait(key, tag):
            lease = await r.acquire(key=key)
            order.append((tag, lease.slot))
            lease.close()

        tg.start_soon(wait, DOC, "doc")  # first in the queue, but only slot 0 will do
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(wait, b"U" * 500, "other")  # no affine slot: any will do
        await anyio.wait_all_tasks_blocked()
        ticket.close()  # slot 1 frees: the second waiter takes it
        await anyio.wait_all_tasks_blocked()
        assert order == [("other", 1)]
        doc.close()
    assert order == [("other", 1), ("doc", 0)]


async def test_router_queues_fifo_and_hands_over_on_close():
    r = SlotRouter(1)
    first = await r.acquire(0)
    order = []
    async with anyio.create_task_group() as tg:
        for tag in "abc":

            async def wait(tag=tag):
                lease = await r.acquire(0)
                order.append(tag)
                lease.close()

            tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
        assert r.waiting() == 3 and r.busy() == 1
        first.begin()  # one request in flight under the lease
        first.close()  # the holder is done, but its request has not ended
        await anyio.wait_all_tasks_blocked()
        assert order == []
        first.end()  # the engine ended it: the slot passes on, FIFO
    assert order == ["a", "b", "c"] and r.busy() == 0


async def test_router_cancelled_waiter_leaves_the_queue():
    r = SlotRouter(1)
    lease = await r.acquire(0)
    with anyio.move_on_after(0.01):
        await r.acquire(0)
    assert r.waiting() == 0
    lease.close()
    assert r.busy() == 0
    with pytest.raises(ValueError, match="slot: 1"):
        await r.acquire(1)


async def test_router_close_fails_waiters_and_later_acquires():
    r = SlotRouter(1)
    await r.acquire(0)
    boom = RuntimeError("engine gone")
    errors = []
    async with anyio.create_task_group() as tg:

        async def wait():
            try:
                await r.acquire(0)
            except RuntimeError as exc:
                errors.append(exc)

        tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        r.close(boom)
    assert errors == [boom]
    with pytest.raises(RuntimeError):
        await r.acquire(0)
