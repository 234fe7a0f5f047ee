"""The servers a benchmark starts as child processes: ours (``python -m gateway.cli serve``) and llama.cpp's
``llama-server``, on loopback, each with its URL (``base``), its CPU time and its memory.

The one server helper of ``bench/``: every script that measures through HTTP starts its servers here.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx2

from bench import ROOT

# The servers a benchmark starts keep nothing on disk (serve --cache-dir): each run measures its own cold costs.
os.environ.setdefault("SERVEPROTO_PERSIST", "off")


def free_port() -> int:
    """A TCP port of 127.0.0.1 free at the time of the call."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/<pid>/stat``, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    """``python -m gateway.cli serve --port 0 ...`` as a child process; ``base`` is its URL, ``port`` its port.

    ``argv``: more ``serve`` arguments (``--model M --engine ...``); ``tree``: the source tree whose
    ``gateway`` serves (another commit's, exported, for a before/after); ``log_level``: INFO writes the
    access log (one JSON line a request). The server's stderr (its log: an engine's crash and its last
    stderr lines among it) goes to the file ``log`` (truncated), else is appended to the file the
    environment's ``BENCH_SERVER_LOG`` names, else to /dev/null. Raises ``SystemExit`` when the server
    does not print its address.
    """

    def __init__(self, *argv: str, tree: Path = ROOT, log_level: str = "WARNING", log: Path | None = None) -> None:
        named = os.environ.get("BENCH_SERVER_LOG")
        self.log = open(log, "wb") if log else open(named, "ab") if named else None
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", "--port", "0", "--log-level", log_level, *argv],
            cwd=tree,
            stdout=subprocess.PIPE,
            stderr=self.log or subprocess.DEVNULL,
            text=True,
        )
        self.http: http.client.HTTPConnection | None = None
        line = self.proc.stdout.readline()
        if " on http://" not in line:
            self.close()
            raise SystemExit(f"the server did not start: {line!r}" + (f"; its log: {log}" if log else ""))
        self.base = line.split(" on ")[1].strip()
        self.port = int(self.base.rsplit(":", 1)[1])

    def post(self, path: str, body: dict, timeout: float = 600.0) -> tuple[float, dict]:
        """(seconds from the request's write to the whole response, its JSON), over one keep-alive
        ``http.client`` connection (made by the first call, with that call's ``timeout``, seconds).
        Raises ``RuntimeError`` on a status other than 200."""
        if self.http is None:
            self.http = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = json.dumps(body).encode()
        t0 = time.perf_counter()
        self.http.request("POST", path, body=data, headers={"content-type": "application/json"})
        r = self.http.getresponse()
        payload = r.read()
        dt = time.perf_counter() - t0
        if r.status != 200:
            raise RuntimeError(f"{path}: HTTP {r.status} {payload[:500]!r}")
        return dt, json.loads(payload)

    def cpu_seconds(self) -> float:
        """User + system CPU time the server process has used so far, seconds."""
        return cpu_seconds(self.proc.pid)

    def rss_mb(self) -> float:
        """The server process's resident memory now (``VmRSS``), MiB; NaN if the kernel does not say."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def close(self) -> None:
        """Terminate the server (killed if it has not exited 30 s later) and close its log."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.log:
            self.log.close()


class LlamaServer(Server):
    """``engines/bin/llama-server`` on the model, loopback; ``base`` is its URL (``close`` as :class:`Server`'s).

    ``slots``: its ``-np`` (continuous batching is llama-server's default); ``ctx``: its ``-c``, the
    context of all slots together (each slot gets ``ctx / slots`` cells: its KV is not unified);
    ``extra``: more of its flags. ``argv`` is the command line it was started with. Raises
    ``SystemExit`` when it is not healthy within 120 s.
    """

    def __init__(
        self, binary: Path, model: Path, threads: int, slots: int = 1, ctx: int = 4096, extra: tuple[str, ...] = ()
    ) -> None:
        port = free_port()
        self.argv = [
            str(binary),
            "-m",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-t",
            str(threads),
            "-tb",
            str(threads),
            "-c",
            str(ctx),
            "-np",
            str(slots),
            "--no-webui",
            *extra,
        ]
        self.log = None
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.base = f"http://127.0.0.1:{port}"
        self.port = port
        self.http = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx2.get(self.base + "/health", timeout=2).status_code == 200:
                    return
            except httpx2.HTTPError:
                pass
            time.sleep(0.2)
        self.close()
        raise SystemExit("llama-server did not become healthy within 120 s")
