"""The supervisor and drive-by-hand API on the real llama engine and the default model."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys

import pytest

from gateway.decision.arithmetic import probabilities
from gateway.engine import Engine, EngineCrashed
from gateway.engine.options import EngineOptions

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

PREFIX = "The capital of France is"
OPTIONS = [" Paris", " London", " the city of"]


async def test_read_out_score_and_fallback_agree(llama_engine):
    async with Engine.spawn(llama_engine, name="llama", options=EngineOptions().updated(handshake_timeout=120)) as eng:
        assert eng.caps.n_vocab == 49152 and eng.caps.x_score
        fast = await eng.score(PREFIX, OPTIONS)
        slow = await eng.score(PREFIX, OPTIONS, fast=False)
        r = await eng.read_out(PREFIX + " Paris", logprobs=3)
    # The fallback pinned the prefix: the read-out resumed from that snapshot.
    n_prefix = r.accept.prompt_tokens - 1
    assert r.done.snapshot == "hit" and r.done.reused == n_prefix
    assert [(e.position, e.text) for e in r.echoes] == [(n_prefix, b" Paris")]
    for a, b in zip(fast.groups[0], slow.groups[0]):
        assert (a.context_tokens, a.n_tokens) == (b.context_tokens, b.n_tokens)
        assert a.context_tokens == n_prefix
        # spec 9.1: SCORE equals one-by-one SUBMIT up to float32 rounding.
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    paris = fast.groups[0][0]
    assert paris.n_tokens == 1 and paris.logprobs[0] == pytest.approx(r.logprobs[-1], abs=1e-5)
    assert slow.groups[0][0].logprobs[0] == r.logprobs[-1]  # both cold SUBMIT read-outs
    assert probabilities(fast)[0] > 0.5  # the model knows this one
    assert slow.computed == n_prefix + sum(o.n_tokens for o in slow.groups[0])


async def test_killed_engine_is_restarted(llama_engine):
    async with Engine.spawn(
        llama_engine, name="llama", options=EngineOptions().updated(handshake_timeout=120, backoff_initial=0.01)
    ) as eng:
        first = await eng.read_out(PREFIX, logprobs=1)
        os.kill(eng.pid, signal.SIGKILL)
        try:
            await eng.read_out(PREFIX, logprobs=1)
        except EngineCrashed as exc:  # met the dying process
            assert exc.returncode == -signal.SIGKILL
        again = await eng.read_out(PREFIX, logprobs=1)
        assert eng.restarts == 1
    assert again.logprobs[1:] == first.logprobs[1:]
    assert eng.exit_statuses == (-signal.SIGKILL, 0)


def test_score_cli_on_the_default_model(llama_engine):
    model = llama_engine[llama_engine.index("--model") + 1]
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "score",
            "--model",
            model,
            "--prefix",
            PREFIX,
            "--option",
            " Paris",
            "--option",
            " London",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    rows = run.stdout.splitlines()
    assert rows[0].split() == ["option", "tokens", "context", "logprob", "p"]
    paris, london = rows[1].split(), rows[2].split()
    assert paris[0] == "'" and paris[1] == "Paris'" and london[1] == "London'"
    p_paris, p_london = float(paris[-1]), float(london[-1])
    assert p_paris > p_london and math.isclose(p_paris + p_london, 1.0, abs_tol=2e-6)
    assert math.isclose(p_paris, 1 / (1 + math.exp(float(london[-2]) - float(paris[-2]))), abs_tol=1e-5)
