"""``serveproto drive`` at a terminal (a pseudo-terminal): the prompt, a command, quit."""

from __future__ import annotations

import sys

import pexpect


def test_drive_at_a_terminal(fixture_engine):
    child = pexpect.spawn(
        sys.executable, ["-m", "gateway.cli", "drive", "--", str(fixture_engine)], encoding="utf-8", timeout=30
    )
    try:
        child.expect(r"engine serveproto-fixture pid \d+: chat=1")
        child.expect_exact("drive> ")
        child.sendline("ping")
        child.expect_exact("PONG     active=0")
        child.expect_exact("drive> ")
        child.sendline('readout "ab" --logprobs 1')
        child.expect_exact("ECHO     id=2 pos=0 logprob=nan 'a'")
        child.expect_exact("DONE     id=2 emitted=0")
        child.expect_exact("drive> ")
        child.sendline("quit")
        child.expect_exact("closing engine serveproto-fixture (restarts: 0)")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0


def test_ctrl_c_interrupts_the_running_command_only(fixture_engine):
    child = pexpect.spawn(
        sys.executable,
        ["-m", "gateway.cli", "drive", "--", str(fixture_engine), "--token-delay-ms", "20"],
        encoding="utf-8",
        timeout=30,
    )
    try:
        child.expect_exact("drive> ")
        child.sendline('submit "x" --max-tokens 100000')
        child.expect_exact("DATA     id=1 ")
        child.sendintr()  # Ctrl-C: the engine gets CANCEL, not SIGINT
        child.expect_exact("(interrupted)")
        child.expect_exact("drive> ")
        child.sendline("ping")  # answered after the CANCEL was handled
        child.expect_exact("PONG     active=0")
        child.expect_exact("drive> ")
        child.sendline("status")
        child.expect(r"healthy=1 pid=\d+ restarts=0 in_flight=0 waiting=0")
        child.expect_exact("drive> ")
        child.sendintr()  # nothing running: a hint, still alive
        child.expect_exact("nothing to interrupt")
        child.sendeof()
        child.expect_exact("closing engine serveproto-fixture (restarts: 0)")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
