"""``serveproto drive`` (stdin piped) and ``serveproto score`` on the fixture engine."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from fixtures import toy_model as tm
from gateway.decision.arithmetic import softmax


def toy_logprob(text: bytes, p: int) -> float:
    return float(tm.fmt(tm.position_logprobs(list(text), p)[text[p]]))


def serveproto(*args: str, stdin: str = "", timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args], input=stdin, capture_output=True, text=True, timeout=timeout
    )


def test_drive_short_commands_and_typed_frames(fixture_engine):
    script = (
        "\n".join(
            [
                "caps",
                'readout "Hello" --logprobs 2',
                'submit 0 "Hi" --max-tokens 2 --logprobs 1',
                "SUBMIT 7 0 3 0 0 1 logprobs=1",
                "abc",
                "SUBMIT 8 0 3 0 0 1 logprobs=99",
                "abc",
                'readout ""',
                "bogus",
                "ping",
                "quit",
                "caps",  # never reached
            ]
        )
        + "\n"
    )
    run = serveproto("drive", "--", str(fixture_engine), stdin=script)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("engine serveproto-fixture pid ")
    assert lines[1].startswith("chat=1 slots=1 n_ctx=4096 n_vocab=257 model=fixture")
    text = b"Hello"
    lp = tm.position_logprobs(list(text), 1)
    top = " ".join(f"{t}:{tm.fmt(lp[t])}" for t in tm.top_k(lp, 2))
    assert lines[2:5] == [
        "ACCEPT   id=1 prompt_tokens=5",
        "ECHO     id=1 pos=0 logprob=nan 'H'",
        f"ECHO     id=1 pos=1 logprob={tm.fmt(toy_logprob(text, 1))} 'e'  top: {top}",
    ]
    assert lines[8] == (
        "DONE     id=1 emitted=0 tok_s=0 prompt_tokens=5 length_limited=0 rss_gb=0 computed=5 reused=0 snapshot=none"
    )
    # submit: ACCEPT, 2 ECHO, 2 DATA, DONE
    assert lines[9] == "ACCEPT   id=2 prompt_tokens=2"
    assert [ln.split()[0] for ln in lines[10:15]] == ["ECHO", "ECHO", "DATA", "DATA", "DONE"]
    assert "emitted=2" in lines[14] and "length_limited=1" in lines[14]
    # A typed frame is sent with a fresh id; its reply printed the same way.
    assert lines[15] == "(sent SUBMIT with a fresh id; typed id 7)"
    assert lines[16] == "ACCEPT   id=3 prompt_tokens=3"
    assert lines[20].startswith("DONE     id=3 emitted=0")
    # A frame an engine would refuse is refused before sending, naming the field.
    assert lines[21] == "error: bad frame: logprobs=99 out of range 0..32 (in SUBMIT line)"
    assert lines[22] == "ERROR    id=4 EMPTY_PROMPT the prompt has no tokens"
    assert lines[23] == "error: unknown command 'bogus'; try 'help'"
    assert lines[24] == "PONG     active=0"
    assert lines[25] == "closing engine serveproto-fixture (restarts: 0)"
    assert len(lines) == 26


def test_drive_background_and_cancel(fixture_engine):
    script = (
        "\n".join(
            [
                'submit "a long one" --max-tokens 100000 &',
                "status",
                "cancel 1",
                "wait",
                'readout "ok" --logprobs 1',
            ]
        )
        + "\n"
    )
    run = serveproto("drive", "--", str(fixture_engine), "--token-delay-ms", "20", stdin=script)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    # The background request streams while the next commands run.
    assert "ACCEPT   id=1 prompt_tokens=10" in lines
    assert any(ln.startswith("healthy=1 pid=") and "in_flight=1" in ln for ln in lines)
    end = lines.index("ERROR    id=1 CANCELLED closed by aclose() in another task")
    assert lines.index("cancelled 1") > end
    assert not any(ln.startswith("DATA     id=1") for ln in lines[end:])
    after = lines.index("ACCEPT   id=2 prompt_tokens=2")  # the slot is free again
    assert after > end
    assert lines[-1] == "closing engine serveproto-fixture (restarts: 0)"


def test_drive_reports_a_load_failure(fixture_engine):
    run = serveproto("drive", "--", str(fixture_engine), "--fault", "load_fail=format")
    assert run.returncode == 1
    assert "EngineLoadError" in run.stderr and "kind=format" in run.stderr


@pytest.mark.parametrize("mode", ["chat", "plain"])
def test_score_prints_tokens_logprob_and_softmax(fixture_engine, mode):
    prefix, options = "Is the sky blue? Answer:", [" yes", " no", " perhaps"]
    args = ["score", "--engine", f"{fixture_engine} --mode {mode}", "--prefix", prefix]
    for o in options:
        args += ["--option", o]
    run = serveproto(*args, "--json")
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    want_lps = []
    for o in options:
        text = (prefix + o).encode()
        want_lps.append([toy_logprob(text, p) for p in range(len(prefix), len(text))])
    assert [g["option"] for g in got["options"]] == options
    assert [g["tokens"] for g in got["options"]] == [len(o) for o in options]
    assert [g["logprobs"] for g in got["options"]] == want_lps
    assert [g["logprob"] for g in got["options"]] == [math.fsum(x) for x in want_lps]
    assert [g["probability"] for g in got["options"]] == softmax([math.fsum(x) for x in want_lps])
    assert got["fast"] == (mode == "chat")

    table = serveproto(*args)
    assert table.returncode == 0, table.stderr
    rows = table.stdout.splitlines()
    assert rows[0].split() == ["option", "tokens", "context", "logprob", "p"]
    for row, g in zip(rows[1:4], got["options"]):
        assert row.split()[-4:] == [
            str(g["tokens"]),
            str(len(prefix)),
            f"{g['logprob']:.6f}",
            f"{g['probability']:.6f}",
        ]
    assert rows[4].startswith("(SCORE;" if mode == "chat" else "(pin + SUBMIT fallback;")
