"""gateway.engine.pool: several fixture engines behind one object, both anyio backends."""

from __future__ import annotations

import anyio
import pytest

from fixtures import toy_model as tm
from gateway.engine import EngineLoadError, EngineUnavailable
from gateway.engine.pool import EngineSpec, Pool

pytestmark = pytest.mark.anyio


def spec(fixture, name: str, *args: str, **options) -> EngineSpec:
    return EngineSpec(name, (str(fixture), "--model", name, *args), options)


async def test_pick_by_model_and_least_loaded(fixture_engine):
    specs = [
        spec(fixture_engine, "alpha"),
        spec(fixture_engine, "beta"),
        EngineSpec("beta-2", (str(fixture_engine), "--model", "beta")),
    ]
    async with Pool.spawn(specs) as pool:
        assert pool.healthy and pool.models() == ["alpha", "beta"]
        assert pool.pick("alpha").name == "alpha"
        assert pool.pick("beta-2").name == "beta-2"  # by engine name too
        with pytest.raises(EngineUnavailable, match="model: no engine serves 'gamma'"):
            pool.pick("gamma")
        # Two idle engines serve beta: turns alternate between equals.
        assert {pool.pick("beta").name for _ in range(4)} == {"beta", "beta-2"}
        # The same routing key sticks to the engine that served it.
        first = pool.pick("beta", route=b"state X").name
        assert all(pool.pick("beta", route=b"state X").name == first for _ in range(5))
        r = await pool.read_out(b"Hello", model="alpha", logprobs=1)
    want = float(tm.fmt(tm.position_logprobs(list(b"Hello"), 1)[ord("e")]))
    assert r.logprobs[1] == want


async def test_a_busy_engine_is_skipped(fixture_engine):
    specs = [
        spec(fixture_engine, "m", "--token-delay-ms", "5"),
        EngineSpec("m-2", (str(fixture_engine), "--model", "m")),
    ]
    async with Pool.spawn(specs) as pool:
        busy = pool.engines[0]
        async with anyio.create_task_group() as tg:

            async def long():
                async for _ in busy.submit(b"x", max_tokens=1000):
                    pass

            tg.start_soon(long)
            with anyio.fail_after(10):
                while busy.in_flight == 0:
                    await anyio.sleep(0.001)
            assert [pool.pick("m").name for _ in range(3)] == ["m-2"] * 3
            tg.cancel_scope.cancel()


async def test_decide_goes_to_a_decision_engine(fixture_engine):
    record = {
        "state": "s",
        "state_type": "string",
        "questions": [
            {
                "id": "q",
                "type": "noul",
                "instructions": "?",
                "options": [{"label": "false", "text": None}, {"label": "true", "text": None}],
            }
        ],
    }
    specs = [spec(fixture_engine, "lm"), spec(fixture_engine, "judge", "--mode", "decide")]
    async with Pool.spawn(specs) as pool:
        decision, _ = await pool.decide(record)
        with pytest.raises(EngineUnavailable, match="no healthy decision engine"):
            await pool.decide(record, model="lm")
    decision.pop("engine_ms", None)
    assert decision == tm.decide(record)


async def test_one_engine_failing_to_start_stops_the_others(fixture_engine, probes):
    before = probes.child_pids()
    specs = [spec(fixture_engine, "ok"), spec(fixture_engine, "bad", "--fault", "load_fail=nomem")]
    with pytest.raises(EngineLoadError) as info:
        async with Pool.spawn(specs):
            pass
    assert info.value.kind == "nomem"
    assert probes.child_pids() == before
    with pytest.raises(ValueError, match="unique"):
        async with Pool.spawn([spec(fixture_engine, "x"), spec(fixture_engine, "x")]):
            pass


def test_affinity_then_load_within_a_slack():
    """A key stays with its engine while that engine is at most AFFINITY_SLACK requests busier than the
    least loaded; past that it moves to the least loaded, and stays there."""
    import types

    from gateway.engine.pool import AFFINITY_SLACK

    def fake(name):
        return types.SimpleNamespace(
            name=name, healthy=True, gave_up=False, in_flight=0, waiting=0, caps=types.SimpleNamespace(model="m")
        )

    a, b = fake("a"), fake("b")
    pool = Pool([a, b], {"a": "m", "b": "m"})
    first = pool.pick("m", route="doc")
    other = b if first is a else a
    first.in_flight = AFFINITY_SLACK
    assert pool.pick("m", route="doc") is first
    first.waiting = 1
    assert pool.pick("m", route="doc") is other
    first.in_flight = first.waiting = 0
    assert pool.pick("m", route="doc") is other
    assert pool.model_of(a) == "m" and pool.models() == ["m"]
