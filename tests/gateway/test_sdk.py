"""The official ``typesafe-sdk==0.7.5``, unmodified, against the server (in-process, over loopback HTTP).

Sync and async clients, a body over 1 KiB (the SDK sends it zstd-compressed),
``models.list()``, the errors it raises for our 401 / 422 / 503. The engine is
the fake of ``test_routes_support`` (its numbers are checked in
``test_routes.py``); the same client against real engines is in
``test_server_e2e.py``.
"""

from __future__ import annotations

import anyio
import pytest
import typesafe_sdk
from typesafe_sdk import (
    AsyncTypeSafeClient,
    TypeSafeAuthenticationError,
    TypeSafeClient,
    TypeSafeUnprocessableEntityError,
)

from test_routes_support import TICKET, EngineCrashed, FakeCaps, FakeEngine, Recorder, make_app, running

pytestmark = pytest.mark.anyio

#: the route tests' ticket, as the SDK takes it: the state and the questions apart
STATE, QUESTIONS = TICKET["state"], TICKET["questions"]


def check_result(result):
    assert set(result.answers) == {"urgency", "department", "severity"}
    assert 0.0 <= result.nouls["urgency"].noul <= 1.0
    dep = result.choices["department"]
    assert dep.choice in {"billing", "technical", "sales"}
    assert abs(sum(dep.probabilities.values()) - 1.0) < 1e-9
    sev = result.scores["severity"]
    assert set(sev.probabilities) == {0, 1, 2, 3, 4} and sev.legend[3] == "losing money"
    assert isinstance(result.usage.input_tokens, int) and result.usage.output_tokens > 0


async def test_sync_client_system_one_and_models():
    rec = Recorder(make_app(FakeEngine()))
    async with running(rec) as base:

        def call():
            with TypeSafeClient(api_key="k", base_url=base) as client:
                return client.system_one(state=STATE, questions=QUESTIONS), client.models.list()

        result, models = await anyio.to_thread.run_sync(call)
    check_result(result)
    assert result.model == "fake-model"
    assert result.request_id == rec.requests[0].request_id
    assert [m.name for m in models.models] == ["fake-model"]
    sent = rec.requests[0]
    assert sent.header("authorization") == "Bearer k" and sent.header("content-encoding") is None


async def test_async_client_zstd_body_over_1kib():
    rec = Recorder(make_app(FakeEngine()))
    long_state = {"ticket": STATE, "history": [f"message {i}: the integration failed again" for i in range(60)]}
    async with running(rec) as base:
        async with AsyncTypeSafeClient(api_key="k", base_url=base) as client:
            result = await client.system_one(state=long_state, questions=QUESTIONS, model="jev-latest")
            models = await client.models.list()
    check_result(result)
    sent = rec.requests[0]
    assert sent.header("content-encoding") == "zstd"
    assert len(sent.body) > 1024  # decoded by the server
    assert models.models[0].release_date == "2026-11-30"


async def test_sdk_sees_our_errors():
    async with running(make_app(FakeEngine(), api_key="right")) as base:

        def call(key, questions):
            with TypeSafeClient(api_key=key, base_url=base, retry=typesafe_sdk.RetryPolicy(max_retries=0)) as client:
                return client.system_one(state="s", questions=questions)

        with pytest.raises(TypeSafeAuthenticationError):
            await anyio.to_thread.run_sync(call, "wrong", QUESTIONS)
        with pytest.raises(TypeSafeUnprocessableEntityError) as info:
            await anyio.to_thread.run_sync(call, "right", {"q": {"type": "score", "criteria": {"a": "b"}}})
        assert "questions.q.criteria" in str(info.value)


async def test_sdk_on_a_dead_engine_gets_503_fast():
    eng = FakeEngine(FakeCaps(chat=False, decide=True, slots=1), fail=EngineCrashed("gone"))
    async with running(make_app(eng)) as base:

        def call():
            with TypeSafeClient(api_key="k", base_url=base, retry=typesafe_sdk.RetryPolicy(max_retries=0)) as client:
                return client.system_one(state="s", questions=QUESTIONS)

        with pytest.raises(typesafe_sdk.TypeSafeInternalServerError) as info:
            await anyio.to_thread.run_sync(call)
    assert info.value.status == 503 and info.value.headers["retry-after"] == "1"
