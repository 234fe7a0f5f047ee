"""One document asked many questions at once, through the engine API's slot router.

Once a request that pins the document has ended, its snapshot is *ready*
(``gateway.engine.slots``): requests on it take any free slot, and the engine
restores the snapshot there by sharing its cells, so eight questions run on
four slots at once instead of queueing on one. The promise held here: each
question's log-probabilities are bit for bit (``--float-digits 17``, ``==``)
those of the same question asked alone, one request after another on a fresh
engine, and none of the eight computed the document again.
"""

from __future__ import annotations

import anyio
import pytest

from gateway.engine import Engine
from gateway.engine.options import EngineOptions

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

DOCUMENT = (
    "Ticket 4411. The customer was charged twice for the March invoice after the card on file "
    "expired and was replaced. She asked for a refund of the duplicate payment, wrote twice, and "
    "says she will close the account if the money is not back by Friday. The agent confirmed the "
    "duplicate charge in the billing log and opened a refund request with finance.\n"
)
QUESTIONS = [
    f"\nQuestion {i}: {q} Answer:"
    for i, q in enumerate(
        (
            "Was the customer charged twice?",
            "Is the customer angry?",
            "Did the agent confirm the charge?",
            "Is a refund open?",
            "Will she close the account?",
            "Was the card replaced?",
            "Is this about the April invoice?",
            "Did finance already pay?",
        )
    )
]
OPTIONS = [" yes", " no", " not stated"]


@pytest.fixture
def anyio_backend():
    return "asyncio"


def spawn(llama_engine):
    return Engine.spawn(
        [*llama_engine, "--slots", "4", "--float-digits", "17", "--score-cache-mb", "0"],
        name="llama",
        options=EngineOptions().updated(handshake_timeout=120),
    )


async def test_questions_on_one_document_run_on_every_slot_with_the_digits_of_each_alone(llama_engine):
    async with spawn(llama_engine) as eng:
        first = await eng.score(DOCUMENT, [(QUESTIONS[0], OPTIONS)], pin=True)
        alone = [
            [o.logprobs for o in (await eng.score(DOCUMENT, [(q, OPTIONS)], pin=True)).groups[0]] for q in QUESTIONS
        ]
    n_doc = first.groups[0][0].context_tokens - 8  # the document's tokens, at least (the stem is short)

    async with spawn(llama_engine) as eng:
        await eng.score(DOCUMENT, [(QUESTIONS[0], OPTIONS)], pin=True)  # the snapshot: ready from here on
        router = eng._sup.current.router
        together: list = [None] * len(QUESTIONS)
        slots_busy = []

        async def ask(i):
            r = await eng.score(DOCUMENT, [(QUESTIONS[i], OPTIONS)], pin=True)
            together[i] = r

        async with anyio.create_task_group() as tg:
            for i in range(len(QUESTIONS)):
                tg.start_soon(ask, i)
            await anyio.wait_all_tasks_blocked()
            slots_busy.append(router.busy())
    assert slots_busy == [4]  # all four slots at once, not one queue
    for i, r in enumerate(together):
        assert [o.logprobs for o in r.groups[0]] == alone[i], QUESTIONS[i]
        assert r.done.snapshot == "hit" and r.computed < n_doc / 4, (i, r.computed, n_doc)
