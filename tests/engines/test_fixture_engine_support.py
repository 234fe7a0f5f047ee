"""A small synchronous driver for serveproto-fixture used by tests/engines/test_fixture_engine*.py.

Frames are read off the engine's stdout with ``select`` and ``os.read`` (no
userspace buffering, so "nothing arrived within t seconds" is a real check).
"""

from __future__ import annotations

import os
import select
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "engines" / "bin" / "serveproto-fixture"
PAYLOAD_KINDS = {b"ECHO", b"DATA", b"DECISION"}
HANDSHAKE_STAT = b"STAT 0 0 0 0\n"
CAPS_CHAT = (
    b"CAPS chat=1 slots=%d n_ctx=%d n_vocab=257 model=fixture pin_slots=%d "
    b"max_logprobs=32 x_score=1 x_counters=1 x_health=1 x_stack=SIGUSR2\n"
)


class Fixture:
    """One serveproto-fixture process. ``Fixture(*args, env=..., stderr=...)``."""

    def __init__(self, *args: str, env: dict | None = None, stderr=subprocess.DEVNULL, handshake: bool = True):
        full_env = dict(os.environ)
        full_env.pop("SERVEPROTO_FIXTURE_FAULTS", None)
        full_env.update(env or {})
        self.proc = subprocess.Popen(
            [str(FIXTURE), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, bufsize=0, env=full_env
        )
        self.fd = self.proc.stdout.fileno()
        self.buf = b""
        self.eof = False
        self.handshake = b""
        if handshake:
            self.handshake = self.read_frame() + self.read_frame() + self.read_frame()

    # -- reading --
    def _fill(self, timeout: float) -> bool:
        """Reads what is there; False when nothing came within timeout seconds."""
        if self.eof:
            return False
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return False
        chunk = os.read(self.fd, 65536)
        if not chunk:
            self.eof = True
            return False
        self.buf += chunk
        return True

    def _need(self, pred, timeout: float) -> None:
        while not pred():
            if not self._fill(timeout):
                raise TimeoutError(f"engine output stalled or ended; buffered {self.buf[:200]!r}")

    def read_frame(self, timeout: float = 10.0) -> bytes:
        """The next whole frame (line, and payload with its ``\\n``)."""
        self._need(lambda: b"\n" in self.buf, timeout)
        nl = self.buf.index(b"\n") + 1
        fields = self.buf[: nl - 1].split(b" ")
        size = nl
        if fields[0] in PAYLOAD_KINDS:
            size += int(fields[2]) + 1
            self._need(lambda: len(self.buf) >= size, timeout)
        frame, self.buf = self.buf[:size], self.buf[size:]
        return frame

    def read_until_end(self, rid: int, timeout: float = 10.0) -> bytes:
        """Frames up to and including the DONE, ERROR or PONG of request ``rid``."""
        out = []
        while True:
            f = self.read_frame(timeout)
            out.append(f)
            if f.startswith((b"DONE %d " % rid, b"ERROR %d " % rid, b"PONG %d" % rid)):
                return b"".join(out)

    def read_all(self, timeout: float = 10.0) -> bytes:
        """Everything up to EOF."""
        while self._fill(timeout):
            pass
        if not self.eof:
            raise TimeoutError("no EOF")
        data, self.buf = self.buf, b""
        return data

    def silent_for(self, seconds: float) -> bool:
        """True when no byte arrives within ``seconds`` (and the stream is not at EOF)."""
        return not self._fill(seconds) and not self.eof

    # -- writing --
    def send(self, data: bytes) -> None:
        """Writes to the engine's stdin; an engine that already exited is not an error here
        (the tests that kill it look at its output and exit status instead)."""
        try:
            self.proc.stdin.write(data)
        except BrokenPipeError:
            pass

    def request(self, data: bytes, rid: int) -> bytes:
        self.send(data)
        return self.read_until_end(rid)

    def close(self, timeout: float = 10.0) -> int:
        """Closes stdin (a graceful shutdown) and waits for the exit status."""
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass

    def __enter__(self) -> Fixture:
        return self

    def __exit__(self, *exc) -> None:
        self.kill()


def submit(
    rid: int, prompt: bytes, *, slot: int = 0, max_tokens: int = 0, temp: str = "0", top_p: str = "1", keys: str = ""
) -> bytes:
    """A SUBMIT frame (keys: e.g. ``"logprobs=2 pin=1"``)."""
    line = f"SUBMIT {rid} {slot} {len(prompt)} {max_tokens} {temp} {top_p}"
    if keys:
        line += " " + keys
    return line.encode() + b"\n" + prompt + b"\n"


def payload_frame(kind: str, rid: int, slot: int, payload: bytes) -> bytes:
    """A DECIDE or SCORE frame."""
    return f"{kind} {rid} {slot} {len(payload)}\n".encode() + payload + b"\n"
