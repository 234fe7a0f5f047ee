"""``serveproto serve`` as a command: the port is bound before the engine starts, and a port in use is one line."""
from __future__ import annotations

import socket
import subprocess
import sys

from gateway.paths import ROOT


def serve_cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gateway.cli", "serve", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def test_port_in_use_is_one_line_and_status_2_before_the_engine_starts(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # an engine that cannot start: had it been spawned first, the error would be about it
        missing = tmp_path / "no-such-engine"
        r = serve_cli("--port", str(port), "--engine", str(missing))
    assert r.returncode == 2
    assert r.stderr == f"serveproto: port {port} on 127.0.0.1 is in use (set PORT=..., e.g. PORT=8123 make serve)\n"
    assert r.stdout == ""


def test_address_that_cannot_be_bound_is_one_line_and_status_2(tmp_path):
    # 192.0.2.1 (TEST-NET-1, RFC 5737) is not an address of this machine: EADDRNOTAVAIL
    r = serve_cli("--host", "192.0.2.1", "--port", "0", "--engine", str(tmp_path / "no-such-engine"))
    assert r.returncode == 2
    assert r.stderr.startswith("serveproto: cannot listen on 192.0.2.1:0: ") and r.stderr.count("\n") == 1, r.stderr
