"""Issue 48, item 1: when the gateway photographs a fixed ``prefix`` again, against an engine whose
counters the test sets.

The photograph is a read-out of the prefix (``pin``) taken before the first SCORE on it; it is taken
again only when a SCORE says it is gone: ``snapshot=stale``, or fewer positions reused than it holds.
A SCORE that found the prefix in the slot's live KV says ``none`` with the positions reused: kept
(main took it again each time, from position 0). The photograph's positions count in ``x_positions``.
"""

from __future__ import annotations

import httpx2
import pytest

from gateway.engine import OptionScore, ReadOut, ScoreResult
from serveproto import Done
from test_routes_support import FakeEngine, make_app, running

pytestmark = pytest.mark.anyio

PHOTO = 70  # the photograph's tokens


class CountingEngine(FakeEngine):
    """Each SCORE answers with the next ``(reused, snapshot)`` of ``script``; a read-out holds PHOTO tokens."""

    def __init__(self, script: list[tuple[int, str]]) -> None:
        super().__init__()
        self.script = list(script)

    async def read_out(self, prompt, logprobs=1, pin=False, slot=None, route=None):
        self.calls.append(("read_out", prompt, logprobs, pin, slot))
        return ReadOut([], Done(1, 0, 0.0, 0.0, 0.1, PHOTO, False, computed=PHOTO, reused=0, snapshot="none"))

    async def score(self, prefix, groups, pin=False, slot=None, route=None, beside=None):
        self.calls.append(("score", prefix, groups, pin, slot))
        reused, snapshot = self.script.pop(0)
        out = [[OptionScore(len(prefix) + len(stem), (-1.0 - len(o),)) for o in opts] for stem, opts in groups]
        done = Done(1, 0, 0.0, 0.0, 0.1, 100, False, computed=30, reused=reused, snapshot=snapshot)
        return ScoreResult(out, done, 30, reused)


async def run(script: list[tuple[int, str]]) -> tuple[list[str], list[dict]]:
    eng = CountingEngine(script)
    positions = []
    async with running(make_app(eng)) as base:
        async with httpx2.AsyncClient(base_url=base) as client:
            for i in range(len(script)):
                body = {"state": f"frame {i}", "prefix": "RULES.\n\n", "questions": {"q": {"type": "noul"}}}
                r = await client.post("/v1/systemone", json={**body, "x_debias": "none"})
                assert r.status_code == 200, r.text
                positions.append(r.json()["x_positions"])
    return [c[0] for c in eng.calls], positions


async def test_a_prefix_found_in_the_live_kv_is_not_read_again():
    kinds, positions = await run([(PHOTO, "hit"), (PHOTO + 5, "none"), (PHOTO + 5, "none")])
    assert kinds == ["read_out", "score", "score", "score"]
    # the photograph's positions are counted on the request that took it
    assert [p["computed"] for p in positions] == [PHOTO + 30, 30, 30]
    assert [p["reused"] for p in positions] == [PHOTO, PHOTO + 5, PHOTO + 5]


async def test_the_photograph_is_taken_again_once_a_score_shows_it_gone():
    # kept, then evicted (fewer reused than it holds), taken again, then stale, taken again
    script = [(PHOTO, "hit"), (PHOTO - 1, "none"), (PHOTO, "hit"), (PHOTO + 3, "stale"), (PHOTO, "hit")]
    kinds, _ = await run(script)
    assert kinds == ["read_out", "score", "score", "read_out", "score", "score", "read_out", "score"]


async def test_a_photograph_that_is_not_a_token_prefix_of_its_prompt_is_not_taken_again():
    # right after the photograph the SCORE reused less than it: its tokens are not the prompt's
    # (a tokenizer joining the prefix's end with the state); taking it again would read it for nothing
    kinds, _ = await run([(PHOTO - 1, "none"), (PHOTO - 1, "none"), (0, "none")])
    assert kinds == ["read_out", "score", "score", "score"]


async def test_the_photograph_ends_at_the_prefix_last_character():
    eng = CountingEngine([(PHOTO, "hit")])
    body = {"state": "frame", "prefix": "RULES.  \n\n", "questions": {"q": {"type": "noul"}}}
    async with running(make_app(eng)) as base:
        async with httpx2.AsyncClient(base_url=base) as client:
            assert (await client.post("/v1/systemone", json=body)).status_code == 200
    (_, photo, _, pin, _), (_, prompt, *_) = eng.calls
    # the blank line is the prompt's, before the state: a BPE tokenizer reads it otherwise at a text's end
    assert pin is True and photo.endswith("<|im_start|>user\nRULES.") and prompt.startswith(photo)
    assert prompt.endswith("RULES.  \n\n\n\nframe")
