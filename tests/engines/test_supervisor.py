"""The supervisor under the fixture engine's faults (spec/fixture-engine.md "Faults"),
on both anyio backends: every request ends with the right typed error within
its deadline, the engine is restarted and the next request succeeds, and
nothing leaks (tasks, file descriptors, child processes)."""

from __future__ import annotations

import logging
import os
import signal

import anyio
import pytest

from gateway.engine import (
    Engine,
    EngineBusy,
    EngineCrashed,
    EngineLoadError,
    EngineProtocolError,
    EngineTimeout,
    EngineUnavailable,
    RequestError,
)
from gateway.engine.options import EngineOptions, ProcessOptions
from gateway.engine.process import EngineProcess
from serveproto import Data

pytestmark = pytest.mark.anyio

#: Generous outer deadline of every fault test: a hang fails the test, never the run.
TEST_DEADLINE = 20


def first_start_only(fixture, tmp_path, faults: str, *args: str) -> tuple[list[str], dict]:
    """(argv, env) running the fixture with ``faults`` on its first start only.

    A marker file in ``tmp_path`` remembers the first start; later starts (the
    supervisor's restarts) run the fixture clean. ``exec`` keeps the pid, so
    the supervisor watches the fixture itself.
    """
    script = '[ -e "$0" ] && unset SERVEPROTO_FIXTURE_FAULTS || : > "$0"; exec "$@"'
    argv = ["sh", "-c", script, str(tmp_path / "started"), str(fixture), *args]
    env = {**os.environ, "SERVEPROTO_FIXTURE_FAULTS": faults}
    return argv, env


def quick(**kw) -> EngineOptions:
    """Engine.spawn options for fault tests: short deadlines and backoff."""
    base = dict(
        handshake_timeout=10,
        stall_timeout=1.0,
        backoff_initial=0.01,
        backoff_max=0.05,
        drain_timeout=1.0,
        term_timeout=1.0,
    )
    base.update(kw)
    return EngineOptions().updated(**base)


async def test_crash_mid_request_fails_every_request_then_restarts(fixture_engine, tmp_path):
    # 3 requests of 12 frames each: the engine exits after its 5th frame.
    argv, env = first_start_only(fixture_engine, tmp_path, "exit_after=5", "--slots", "3")
    errors = []
    with anyio.fail_after(TEST_DEADLINE):
        async with Engine.spawn(argv, name="crashy", options=quick(env=env)) as eng:
            first_pid = eng.pid
            async with anyio.create_task_group() as tg:
                for i in range(3):

                    async def one(i=i):
                        try:
                            await eng.read_out(f"request {i:3d}".encode(), logprobs=1)
                        except EngineCrashed as exc:
                            errors.append(exc)

                    tg.start_soon(one)
            assert len(errors) == 3 and all(e is errors[0] for e in errors)
            assert errors[0].returncode == 3 and "exit status 3" in str(errors[0])
            r = await eng.read_out(b"after the restart", logprobs=1)
            assert r.done.prompt_tokens == len(b"after the restart")
            assert eng.restarts == 1 and eng.pid != first_pid and eng.healthy
        assert eng.exit_statuses == (3, 0)  # the crash, then a graceful EOF exit


async def test_abort_is_reported_with_its_signal(fixture_engine, tmp_path):
    argv, env = first_start_only(fixture_engine, tmp_path, "abort_after=1")
    with anyio.fail_after(TEST_DEADLINE):
        async with Engine.spawn(argv, options=quick(env=env)) as eng:
            with pytest.raises(EngineCrashed) as info:
                await eng.read_out(b"abc", logprobs=1)
            assert info.value.returncode == -signal.SIGABRT
            assert (await eng.read_out(b"abc", logprobs=1)).done.prompt_tokens == 3


async def test_hang_past_the_stall_deadline(fixture_engine, tmp_path):
    argv, env = first_start_only(fixture_engine, tmp_path, "hang_after=2")
    with anyio.fail_after(TEST_DEADLINE):
        async with Engine.spawn(argv, options=quick(stall_timeout=0.3, env=env)) as eng:
            with pytest.raises(EngineTimeout) as info:
                await eng.read_out(b"a hanging request", logprobs=1)
            assert info.value.what == "stall" and info.value.seconds == 0.3
            assert (await eng.read_out(b"abc", logprobs=1)).done.prompt_tokens == 3
            assert eng.restarts == 1
        # The hung process ignored EOF and was terminated by the ladder's kill step.
        assert eng.exit_statuses[0] in (-signal.SIGTERM, -signal.SIGKILL)


async def test_partial_payload_is_a_hang(fixture_engine, tmp_path):
    argv, env = first_start_only(fixture_engine, tmp_path, "partial_payload")
    with anyio.fail_after(TEST_DEADLINE):
        async with Engine.spawn(argv, options=quick(stall_timeout=0.3, env=env)) as eng:
            with pytest.raises(EngineTimeout) as info:
                await eng.read_out(b"abc", logprobs=1)
            assert info.value.what == "stall"
            assert (await eng.read_out(b"abc", logprobs=1)).done.prompt_tokens == 3


async def test_garbage_frame_is_a_protocol_error(fixture_engine, tmp_path):
    argv, env = first_start_only(fixture_engine, tmp_path, "garbage_after=1")
    with anyio.fail_after(TEST_DEADLINE):
        async with Engine.spawn(argv, options=quick(env=env)) as eng:
            with pytest.raises(EngineProtocolError) as info:
                await eng.read_out(b"abcdef", logprobs=1)
            assert info.value.code == "BAD_FRAME"
            assert (await eng.read_out(b"abc", logprobs=1)).done.prompt_tokens == 3
            assert eng.restarts == 1


async def test_truncated_frame_then_exit(fixture_engine, tmp_path):
    argv, env = first_start_only(fixture_engine, tmp_path, "truncate_after=1")
    with anyio.fail_after(TEST_DEADLINE):
        async with Engine.spawn(argv, options=quick(env=env)) as eng:
            with pytest.raises(EngineProtocolError, match="EOF inside a frame"):
                await eng.read_out(b"abcdef", logprobs=1)
            assert (await eng.read_out(b"abc", logprobs=1)).done.prompt_tokens == 3


@pytest.mark.parametrize("kind", ["nomem", "io", "format", "unsupported"])
async def test_load_fail_is_a_typed_load_error(fixture_engine, kind, probes):
    before = probes.child_pids()
    with pytest.raises(EngineLoadError) as info:
        async with Engine.spawn([fixture_engine, "--fault", f"load_fail={kind}"], options=quick()):
            pass
    assert info.value.kind == kind
    assert info.value.detail == f"fixture: injected {kind} failure"
    assert probes.child_pids() == before


async def test_missing_binary_is_an_io_load_error(tmp_path):
    with pytest.raises(EngineLoadError) as info:
        async with Engine.spawn([tmp_path / "no-such-engine"]):
            pass
    assert info.value.kind == "io" and "no-such-engine" in info.value.detail


async def test_bad_arguments_exit_before_ready(fixture_engine):
    with pytest.raises(EngineCrashed) as info:
        async with Engine.spawn([fixture_engine, "--no-such-flag"], options=quick()):
            pass
    assert info.value.returncode == 2
    assert any("usage" in line for line in info.value.stderr_tail)


async def test_slow_start_within_and_past_the_handshake_deadline(fixture_engine, probes):
    async with Engine.spawn([fixture_engine, "--fault", "slow_start=0.3"], options=quick(handshake_timeout=10)) as eng:
        assert eng.healthy
    before = probes.child_pids()
    with anyio.fail_after(TEST_DEADLINE):
        with pytest.raises(EngineTimeout) as info:
            async with Engine.spawn([fixture_engine, "--fault", "slow_start=30"], options=quick(handshake_timeout=0.3)):
                pass
    assert info.value.what == "handshake" and info.value.seconds == 0.3
    assert probes.child_pids() == before  # killed and reaped


async def test_stderr_flood_is_drained_and_logged_by_name(fixture_engine, caplog):
    caplog.set_level(logging.INFO, logger="gateway.engine.flood")
    with anyio.fail_after(TEST_DEADLINE):
        async with Engine.spawn(
            [fixture_engine, "--fault", "stderr_flood=20000"], name="flood", options=quick(stderr_lines_per_s=50)
        ) as eng:
            r = await eng.read_out(b"still serving", logprobs=1)
    assert r.done.prompt_tokens == len(b"still serving")
    lines = [rec for rec in caplog.records if rec.name == "gateway.engine.flood"]
    logged = [rec for rec in lines if rec.levelno == logging.INFO]
    # The rate limit bounds what reaches the log; the rest is counted, not lost silently.
    assert 50 <= len(logged) < 20000
    assert any("not logged" in rec.getMessage() for rec in lines if rec.levelno == logging.WARNING)


async def test_cancelling_a_request_sends_cancel_and_frees_the_slot(fixture_engine):
    with anyio.fail_after(TEST_DEADLINE):
        async with Engine.spawn([fixture_engine, "--token-delay-ms", "5"], options=quick()) as eng:
            got = []
            with anyio.CancelScope() as scope:
                async for ev in eng.submit(b"a long story", max_tokens=1000, slot=0):
                    got.append(ev)
                    if isinstance(ev, Data):
                        scope.cancel()
            assert scope.cancelled_caught and isinstance(got[-1], Data)
            # The slot is free again as soon as the engine confirmed the CANCEL.
            r = await eng.read_out(b"next", logprobs=1, slot=0)
            assert r.done.prompt_tokens == 4
            assert eng.in_flight == 0 and eng.restarts == 0


async def test_leaving_the_loop_early_cancels_through_the_context(fixture_engine):
    with anyio.fail_after(TEST_DEADLINE):
        async with Engine.spawn([fixture_engine, "--token-delay-ms", "5"], options=quick()) as eng:
            stream = eng.submit(b"a long story", max_tokens=1000)
            async with stream:
                async for ev in stream:
                    if isinstance(ev, Data):
                        break
            assert (await eng.ping())["active"] == "0"
            r = await eng.read_out(b"next", logprobs=1, slot=0)
            assert r.done.prompt_tokens == 4


async def test_an_engine_that_ignores_cancel_keeps_the_slot_until_done(fixture_engine):
    with anyio.fail_after(TEST_DEADLINE):
        async with Engine.spawn(
            [fixture_engine, "--token-delay-ms", "2", "--fault", "ignore_cancel"], options=quick()
        ) as eng:
            with anyio.move_on_after(0.05):
                async for _ in eng.submit(b"x", max_tokens=40, slot=0):
                    pass
            assert eng.in_flight == 1  # cancelled by us, still running there
            r = await eng.read_out(b"next", logprobs=1, slot=0)  # queued, not SLOT_BUSY
            assert r.done.prompt_tokens == 4 and eng.in_flight == 0


async def test_request_deadline_cancels_only_that_request(fixture_engine):
    with anyio.fail_after(TEST_DEADLINE):
        async with Engine.spawn([fixture_engine, "--token-delay-ms", "10"], options=quick(stall_timeout=5)) as eng:
            with pytest.raises(EngineTimeout) as info:
                async for _ in eng.submit(b"slow", max_tokens=1000, timeout=0.2):
                    pass
            assert info.value.what == "request" and info.value.seconds == 0.2
            assert eng.healthy and eng.restarts == 0
            r = await eng.read_out(b"next", logprobs=1, timeout=5)
            assert r.done.prompt_tokens == 4


async def test_restart_intensity_exceeded_fails_health(fixture_engine):
    # Every start exits right after its handshake.
    with anyio.fail_after(TEST_DEADLINE):
        async with Engine.spawn(
            [fixture_engine, "--fault", "exit_after=0"], options=quick(max_restarts=2, restart_period=60)
        ) as eng:
            with pytest.raises(EngineUnavailable) as info:
                for _ in range(10):
                    try:
                        await eng.read_out(b"abc", logprobs=1)
                    except EngineCrashed:
                        pass
            assert eng.gave_up and not eng.healthy and eng.restarts == 2
            assert isinstance(info.value.last_error, EngineCrashed)
            assert "gave up" in str(info.value)
            with pytest.raises(EngineUnavailable):
                await eng.read_out(b"abc", logprobs=1)
        assert eng.exit_statuses == (3, 3, 3)


@pytest.mark.parametrize("phase", ["backoff", "restart"])
async def test_closing_cancels_a_backoff_or_a_restart_in_progress(fixture_engine, tmp_path, probes, phase):
    # The first process exits right after its handshake. Then the supervisor waits out a 30 s backoff,
    # or starts a process whose handshake takes 30 s: closing cancels either (the supervisor's scope),
    # well within the test's deadline, and leaves no child behind.
    script = '[ -e "$0" ] && export SERVEPROTO_FIXTURE_FAULTS=slow_start=30 || : > "$0"; exec "$@"'
    argv = ["sh", "-c", script, str(tmp_path / "started"), str(fixture_engine)]
    env = {**os.environ, "SERVEPROTO_FIXTURE_FAULTS": "exit_after=0"}
    backoff = 30.0 if phase == "backoff" else 0.01
    before = probes.child_pids()
    with anyio.fail_after(TEST_DEADLINE):
        async with Engine.spawn(
            argv, options=quick(handshake_timeout=60, backoff_initial=backoff, backoff_max=backoff, env=env)
        ) as eng:
            while not isinstance(eng.last_error, EngineCrashed) or (phase == "restart" and eng.restarts < 1):
                await anyio.sleep(0.01)
            assert eng.state == "restarting" and not eng.healthy
        assert eng.state == "closed" and eng.exit_statuses == (3,)
        with pytest.raises(EngineUnavailable, match="closed"):
            await eng.wait_ready()
    assert probes.child_pids() == before


async def test_a_start_cancelled_while_it_spawns_leaves_no_child(fixture_engine, probes, monkeypatch):
    # What closing the supervisor during a restart can do: the cancellation lands after the fork,
    # at a checkpoint inside the spawn (asyncio's subprocess_exec awaits its transport there). The
    # spawn is shielded, so the handshake is what gets cancelled, and the child is killed and reaped.
    spawn = anyio.open_process

    async def spawn_then_checkpoint(*args, **kw):
        proc = await spawn(*args, **kw)
        scope.cancel()
        await anyio.sleep(0)
        return proc

    monkeypatch.setattr(anyio, "open_process", spawn_then_checkpoint)
    before = probes.child_pids()
    with anyio.fail_after(TEST_DEADLINE):
        with anyio.CancelScope() as scope:
            async with EngineProcess.start(
                [fixture_engine, "--fault", "slow_start=30"], options=ProcessOptions(handshake_timeout=60)
            ):
                pytest.fail("the start was cancelled: nothing to serve")
    assert scope.cancelled_caught
    assert probes.child_pids() == before


async def test_shutdown_ladder_eof_then_term_then_kill(fixture_engine):
    with anyio.fail_after(TEST_DEADLINE):
        async with Engine.spawn([fixture_engine], options=quick()):
            pass
        # hang_after=0: alive and silent, EOF unnoticed: SIGTERM ends it.
        async with Engine.spawn([fixture_engine, "--fault", "hang_after=0"], options=quick(drain_timeout=0.1)) as hung:
            pass
        # The same, with SIGTERM ignored (kept across exec): SIGKILL ends it.
        argv = ["sh", "-c", "trap '' TERM; exec \"$@\"", "sh", str(fixture_engine), "--fault", "hang_after=0"]
        async with Engine.spawn(argv, options=quick(drain_timeout=0.1, term_timeout=0.1)) as stubborn:
            pass
    assert hung.exit_statuses == (-signal.SIGTERM,)
    assert stubborn.exit_statuses == (-signal.SIGKILL,)


async def test_no_task_fd_or_process_leaks(fixture_engine, tmp_path, probes):
    runs = iter(range(1000))

    async def exercise():
        for fault in ["exit_after=2", "garbage_after=1", "hang_after=1"]:
            folder = tmp_path / str(next(runs))
            folder.mkdir()
            argv, env = first_start_only(fixture_engine, folder, fault)
            async with Engine.spawn(argv, options=quick(stall_timeout=0.2, env=env)) as eng:
                with pytest.raises((EngineCrashed, EngineProtocolError, EngineTimeout)):
                    await eng.read_out(b"abcdef", logprobs=1)
                await eng.read_out(b"abc", logprobs=1)
                with anyio.move_on_after(0.01):
                    async for _ in eng.submit(b"x", max_tokens=1000):
                        pass
        with pytest.raises(EngineLoadError):
            async with Engine.spawn([fixture_engine, "--fault", "load_fail=io"]):
                pass

    await exercise()  # warm-up: lazily created fds (thread pools, wakeup pipes)
    tasks, fds = len(anyio.get_running_tasks()), probes.open_fds()
    children = probes.child_pids()
    with anyio.fail_after(TEST_DEADLINE):
        await exercise()
    assert len(anyio.get_running_tasks()) == tasks
    assert probes.open_fds() == fds
    assert probes.child_pids() == children == set()


async def test_errors_are_typed_at_the_request_level(fixture_engine):
    async with Engine.spawn([fixture_engine], options=quick()) as eng:
        with pytest.raises(RequestError) as info:
            await eng.read_out(b"", logprobs=1)
    assert info.value.code == "EMPTY_PROMPT"
    assert eng.exit_statuses == (0,)
    assert isinstance(eng.last_error, EngineUnavailable)  # closed, not failed
    assert not eng.healthy and not eng.gave_up


async def test_max_waiting_refuses_at_once_when_the_queue_is_full(fixture_engine):
    async with Engine.spawn([fixture_engine, "--token-delay-ms", "5"], options=quick(max_waiting=1)) as eng:
        async with anyio.create_task_group() as tg:

            async def gen(n: int):
                async for _ in eng.submit(b"x", max_tokens=n, slot=0):
                    pass

            tg.start_soon(gen, 1000)  # runs
            with anyio.fail_after(10):
                while eng.in_flight == 0:
                    await anyio.sleep(0.001)
            tg.start_soon(gen, 1)  # waits
            with anyio.fail_after(10):
                while eng.waiting == 0:
                    await anyio.sleep(0.001)
            with pytest.raises(EngineBusy) as info:
                await eng.read_out(b"third", logprobs=1)
            assert info.value.waiting == 1
            tg.cancel_scope.cancel()
        assert eng.healthy and eng.restarts == 0


async def test_an_idle_hung_engine_is_found_by_the_heartbeat(fixture_engine, tmp_path):
    # Hangs right after its handshake; no request is sent: the PING finds it.
    argv, env = first_start_only(fixture_engine, tmp_path, "hang_after=0")
    with anyio.fail_after(TEST_DEADLINE):
        async with Engine.spawn(argv, options=quick(health_interval=0.05, stall_timeout=0.2, env=env)) as eng:
            first = eng.pid
            while eng.restarts == 0:
                await anyio.sleep(0.01)
            await eng.wait_ready()
            assert eng.pid != first and eng.healthy
            assert isinstance(eng.last_error, EngineTimeout) and eng.last_error.what == "stall"
            assert (await eng.ping())["active"] == "0"


@pytest.mark.parametrize("mode", ["chat", "plain"])
async def test_score_deadline_covers_the_whole_scoring(fixture_engine, tmp_path, mode):
    # The engine hangs after 3 frames: inside SCORE, or inside the fallback's SUBMITs.
    argv, env = first_start_only(fixture_engine, tmp_path, "hang_after=3", "--mode", mode)
    with anyio.fail_after(TEST_DEADLINE):
        async with Engine.spawn(argv, options=quick(stall_timeout=30, drain_timeout=0.1, env=env)) as eng:
            with pytest.raises(EngineTimeout) as info:
                await eng.score(b"prefix", [(b" q1", [b" a", b" b"]), (b" q2", [b" c"])], timeout=0.3)
            assert info.value.what == "request" and info.value.seconds == 0.3
            assert eng.restarts == 0  # one request's deadline is not the engine's
