"""What tests of several tiers share: a request they ask, and ``serveproto`` started as a command.

Importing it starts nothing (the quick tier may import it too): its helpers start a process only when a
test calls them. The route tests' fake engine and in-process server stay in ``gateway/test_routes_support.py``.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx2

from gateway.paths import ROOT

#: The support ticket the llama engine's serve tests ask: a refund (noul) and the team (choice).
INVOICE = {
    "state": "The invoice was paid twice and the customer wants the money back before Friday.",
    "questions": {
        "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
        "team": {
            "type": "choice",
            "instructions": "Who handles it?",
            "criteria": {"billing": "invoices and payments", "customer success": None, "legal": "contracts"},
        },
    },
}

#: The ``serveproto`` command as this interpreter runs it from the clone (``python -m gateway.cli``); a test
#: adds the subcommand and its arguments: ``[*SERVEPROTO, "serve", "--port", "0"]``.
SERVEPROTO = [sys.executable, "-m", "gateway.cli"]


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago (bound to port 0, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_process(*argv: str, **popen) -> Iterator[subprocess.Popen]:
    """``serveproto serve *argv`` as a process run from the clone (``popen``: ``subprocess.Popen``'s keywords,
    ``cwd`` the clone unless given); yields it, then terminates it if it still runs (SIGTERM, 30 s, SIGKILL)
    and waits for it."""
    popen.setdefault("cwd", ROOT)
    with subprocess.Popen([*SERVEPROTO, "serve", *argv], **popen) as proc:
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def first_reply(client: httpx2.Client, path: str, seconds: float = 20.0) -> httpx2.Response:
    """``GET path`` every 50 ms until the server has bound its port; the first answer, whatever its status.

    Raises AssertionError if nothing answers within ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return client.get(path)
        except httpx2.TransportError:  # not bound yet
            if time.monotonic() > deadline:
                raise AssertionError(f"nothing answered GET {path} within {seconds} s") from None
            time.sleep(0.05)
