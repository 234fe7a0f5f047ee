"""SIGUSR2 makes an engine write its main thread's stack to stderr and go on (CAPS ``x_stack=SIGUSR2``,
spec/serve-protocol.md 9.3, engines/common/stack.h): the llama engine on the tiny fixture GGUF and the
fixture engine, idle. The frames must name the engine's own functions (linked with -rdynamic), and the
engine must still answer a PING after. An engine without the handler dies of the signal, so each test
fails on a build without it."""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from gateway.paths import engine_bin
from serveproto import Ping, Pong
from test_llama_engine import Engine, readout, tiny  # noqa: F401  (tiny is a fixture)

FIXTURE = engine_bin("serveproto-fixture")
TIMEOUT_S = 60.0
#: One frame as glibc's backtrace_symbols_fd writes it: binary(symbol+0xoff)[0xaddr] (symbol may be empty).
FRAME = re.compile(r"^\S+\((?:[A-Za-z_][\w.@]*)?(?:\+0x[0-9a-f]+)?\)\[0x[0-9a-f]+\]$")


def stack_block(stderr_text, engine: str) -> list[str]:
    """Waits (up to TIMEOUT_S) for one whole stack block on stderr; returns its frame lines."""
    head, tail = f"{engine}: stack at a stall (SIGUSR2), thread main:", f"{engine}: end of stack"
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        lines = stderr_text().splitlines()
        if head in lines and tail in lines[lines.index(head) :]:
            i = lines.index(head)
            j = lines.index(tail, i)
            frames = lines[i + 1 : j]
            assert frames and all(FRAME.match(f) for f in frames), frames
            return frames
        assert time.monotonic() < deadline, f"no stack block in {TIMEOUT_S} s; stderr: {stderr_text()[-2000:]}"
        time.sleep(0.05)


def named(frames: list[str], binary: str) -> list[str]:
    """The functions of ``binary`` the frames name, innermost first."""
    out = []
    for f in frames:
        m = re.match(r"^(\S+)\(([A-Za-z_][\w.@]*)\+0x", f)
        if m and Path(m.group(1)).name == binary:
            out.append(m.group(2))
    return out


def test_llama_engine_writes_its_stack_and_serves_on(tiny):  # noqa: F811
    eng = Engine(tiny)
    try:
        assert eng.caps.values["x_stack"] == "SIGUSR2"
        os.kill(eng.proc.pid, signal.SIGUSR2)
        frames = stack_block(eng.stderr_text, "serveproto-llama")
        # idle: the frame loop, called from main (reading stdin, or still writing the handshake)
        fns = named(frames, "serveproto-llama")
        assert fns[-2:] == ["main", "_start"] and fns[0].startswith("sp_"), frames
        assert eng.proc.poll() is None
        assert eng.request(Ping(id=7))[-1] == Pong(id=7, values={"active": "0"})  # PONG 7: it serves on
        # and a request after it answers as before
        assert readout(eng, 8, b"19556 905 1024")[-1].id == 8
    finally:
        assert eng.close() == 0


def test_llama_engine_stack_is_the_main_threads_from_another_thread(tiny):  # noqa: F811
    """The kernel may give the signal to any thread (an OpenMP worker, a CUDA thread): the handler
    forwards it, and the stack written is still main's."""
    eng = Engine(tiny, "--threads", "2")
    try:
        readout(eng, 1, b"19556 905 1024 2451")  # a decode on 2 threads starts OpenMP's worker
        pid = eng.proc.pid
        others = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid)
        if not others:
            pytest.skip("the engine has no thread besides main after a decode")
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.tgkill(pid, others[0], int(signal.SIGUSR2)) == 0, os.strerror(ctypes.get_errno())
        fns = named(stack_block(eng.stderr_text, "serveproto-llama"), "serveproto-llama")
        assert fns[-2:] == ["main", "_start"], fns
        assert readout(eng, 2, b"19556 905 1024")[-1].id == 2
    finally:
        assert eng.close() == 0


def test_fixture_engine_writes_its_stack_twice_and_serves_on():
    if not os.access(FIXTURE, os.X_OK):
        pytest.skip(f"{FIXTURE} is not built yet (make -C engines all)")
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([str(FIXTURE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)

        def stderr_text() -> str:
            err.seek(0)
            return err.read().decode(errors="replace")

        def line() -> bytes:
            return proc.stdout.readline()

        try:
            while not line().startswith(b"STAT "):
                pass
            for n in (1, 2):  # a second signal gives a second block: the handler is not one-shot
                os.kill(proc.pid, signal.SIGUSR2)
                deadline = time.monotonic() + TIMEOUT_S
                while stderr_text().count("serveproto-fixture: end of stack") < n:
                    assert time.monotonic() < deadline and proc.poll() is None, stderr_text()
                    time.sleep(0.05)
            fns = named(stack_block(stderr_text, "serveproto-fixture"), "serveproto-fixture")
            # the frame loop's, from main (where in it depends on whether the last write has returned)
            assert fns[-2:] == ["main", "_start"], fns
            proc.stdin.write(b"PING 5\n")
            proc.stdin.flush()
            assert line() == b"PONG 5 active=0\n"
            proc.stdin.close()
            assert proc.wait(TIMEOUT_S) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
