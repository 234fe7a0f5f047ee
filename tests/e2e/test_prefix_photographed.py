"""A fixed ``prefix`` is read once per KV slot (issue 48, item 1), on the default model.

Fresh states after a shared ``prefix`` once paid for the prefix again on every request: the SCORE
found the prefix in the slot's live KV (``snapshot: "none"``), the gateway took that for an
eviction and photographed the prefix again from position 0, and ``x_positions`` did not count that
read-out. The photograph also ended with the blank line before the state, which SmolLM2's tokenizer
reads as another token at a text's end than before the state, so it was never restored. Here the
same prompts are sent twice, on two fresh servers: the rules as ``prefix``, then the rules inside
``state``; the positions computed (the photograph included) and the digits must match.
"""

from __future__ import annotations

import anyio
import httpx2
import orjson
import pytest

from gateway.paths import default_model_path
from test_routes_support import serving

pytestmark = [pytest.mark.slow]

RULES = (
    "You triage support tickets for a payments company. Escalate anything that mentions lost money, "
    "failed payouts or legal threats; route integration errors to the technical team and pricing to sales."
)
QUESTIONS = {
    "urgency": {"type": "noul", "instructions": "Does this message express urgency?"},
    "department": {
        "type": "choice",
        "instructions": "Which team should handle this?",
        "criteria": {"billing": "payments, invoices", "technical": "bugs, integration errors", "sales": "pricing"},
    },
}
STATES = [f"Ticket {i}: payout #{4100 + 7 * i} has not arrived after {i + 2} days." for i in range(4)]


def bodies(as_prefix: bool) -> list[dict]:
    """The four requests: the rules as ``prefix``, or the same text inside ``state`` (the prompt is the
    same: ``prefix``, a blank line, the state)."""
    out = []
    for s in STATES:
        body = {"state": s, "prefix": RULES} if as_prefix else {"state": RULES + "\n\n" + s}
        out.append({**body, "questions": QUESTIONS, "x_debias": "none"})
    return out


async def replies(as_prefix: bool) -> list[dict]:
    async with serving("--threads", "2", "--model", str(default_model_path())) as base:
        async with httpx2.AsyncClient(base_url=base, timeout=120) as client:
            out = []
            for body in bodies(as_prefix):
                r = await client.post(
                    "/v1/systemone", content=orjson.dumps(body), headers={"content-type": "application/json"}
                )
                assert r.status_code == 200, r.text
                out.append(r.json())
            return out


def test_three_fresh_states_after_a_prefix_compute_what_the_same_text_in_state_computes(model_path):
    with_prefix = anyio.run(replies, True)
    in_state = anyio.run(replies, False)
    computed_p = [r["x_positions"]["computed"] for r in with_prefix]
    computed_s = [r["x_positions"]["computed"] for r in in_state]
    # the first request reads the photograph, then the state on it: no more than the whole prompt read once
    assert computed_p[0] == computed_s[0], (computed_p, computed_s)
    # each fresh state after it: its own positions only, as with the text in state (main read the
    # prefix's 70 positions again each time, and x_positions did not show them)
    assert computed_p[1:] == computed_s[1:], (computed_p, computed_s)
    # the system turn and the rules (69 tokens on SmolLM2) are not read again
    assert all(computed_p[0] - c >= 60 for c in computed_p[1:]), computed_p
    assert [r["x_positions"]["snapshot"] for r in with_prefix[1:]] == ["hit"] * 3
    # the same prompts, the same digits, wherever the prefix's rows came from
    for p, s in zip(with_prefix, in_state):
        assert p["answers"] == s["answers"]
