"""One model over several devices: the llama engine with its layers on ggml-rpc-servers.

Starts ``--servers`` CPU ``engines/bin/ggml-rpc-server`` processes on 127.0.0.1 (free ports,
``GGML_CPU_USE_REF=1`` unless ``--no-ref``), runs issue 12's digits matrix (``bench/digits.py``) on an
engine with ``--rpc`` over them and on the local engine, and prints each cell's largest difference
from the local read-out and whether the bits are equal; then the time of the same work both ways
(best of ``--reps``; the servers share this machine's cores, so the ratio is the RPC backend's own
cost: graph and tensor transfers over loopback, one round trip per device and decode)::

    .venv/bin/python -m bench.rpc [--model M.gguf] [--servers 2] [--no-ref] [--reps 3]

``rpc_servers`` is the context manager the tests use to start the servers.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio

from bench.digits import GROUPS, STATE, differences, spawn, the_matrix
from bench.servers import free_port
from gateway.paths import default_model_path, engine_bin

#: Seconds a started ggml-rpc-server may take to listen.
LISTEN_TIMEOUT = 20.0


def _wait_listening(proc: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + LISTEN_TIMEOUT
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"ggml-rpc-server on port {port} exited with status {proc.returncode}")
        try:
            # the server takes this connection as a client that leaves at once, and accepts the next
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"ggml-rpc-server on port {port} not listening after {LISTEN_TIMEOUT} s")  # noqa: B904  (implicit chaining kept as written)
            time.sleep(0.05)


@dataclass(frozen=True)
class RpcServer:
    """A started ``ggml-rpc-server``: its ``host:port`` and process id."""

    endpoint: str
    pid: int

    def rss_bytes(self) -> int:
        """The server's resident memory now (``VmRSS`` of ``/proc/<pid>/status``), bytes."""
        with open(f"/proc/{self.pid}/status") as f:
            line = next(x for x in f if x.startswith("VmRSS:"))
        return int(line.split()[1]) * 1024


@contextmanager
def rpc_servers(n: int, *, use_ref: bool = True, threads: int = 1):
    """``n`` CPU ``ggml-rpc-server`` processes on 127.0.0.1, each on a free port, with
    ``GGML_CPU_USE_REF=1`` (our reference kernels, spec/llama-engine.md) when ``use_ref``; yields
    a list of ``n`` :class:`RpcServer` once all listen, stops them on exit. Each serves one engine
    at a time. Raises RuntimeError / TimeoutError when one does not start."""
    binary = engine_bin("ggml-rpc-server")
    env = {k: v for k, v in os.environ.items() if k != "GGML_CPU_USE_REF"}
    if use_ref:
        env["GGML_CPU_USE_REF"] = "1"
    procs: list[subprocess.Popen] = []
    try:
        ports = []
        for _ in range(n):
            port = free_port()
            procs.append(
                subprocess.Popen(
                    [str(binary), "-H", "127.0.0.1", "-p", str(port), "-t", str(threads)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    env=env,
                )
            )
            ports.append(port)
        for proc, port in zip(procs, ports):
            _wait_listening(proc, port)
        yield [RpcServer(f"127.0.0.1:{port}", proc.pid) for proc, port in zip(procs, ports)]
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def timed_work(model, *args: str, reps: int, threads: int) -> dict[str, float]:
    """Seconds (best of ``reps``) of a cold read-out of STATE and a SCORE of GROUPS on it, cache off."""
    best: dict[str, float] = {}
    async with spawn(model, "--score-cache-mb", "0", *args, threads=threads) as eng:
        for _ in range(reps):
            t0 = time.perf_counter()
            await eng.read_out(STATE, logprobs=1)
            t1 = time.perf_counter()
            await eng.score(STATE, GROUPS)
            t2 = time.perf_counter()
            for key, t in (("read-out", t1 - t0), ("score", t2 - t1)):
                best[key] = min(best.get(key, t), t)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(default_model_path()))
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="the engine's and each server's threads")
    ap.add_argument("--no-ref", action="store_true", help="servers without GGML_CPU_USE_REF=1")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    with rpc_servers(args.servers, use_ref=not args.no_ref, threads=args.threads) as servers:
        rpc = ["--rpc", ",".join(s.endpoint for s in servers), "--numerics", "invariant"]
        local = anyio.run(lambda: the_matrix(args.model, threads=args.threads))
        remote = anyio.run(lambda: the_matrix(args.model, *rpc, threads=args.threads))
        t_local = anyio.run(lambda: timed_work(args.model, reps=args.reps, threads=args.threads))
        t_remote = anyio.run(lambda: timed_work(args.model, *rpc, reps=args.reps, threads=args.threads))
    print(
        f"rpc: {Path(args.model).name}, {args.servers} servers{' without GGML_CPU_USE_REF' if args.no_ref else ''}, "
        f"{args.threads} threads each"
    )
    cells = {"local read-out": local["read-out"], **{f"rpc {k}": v for k, v in remote.items()}}
    cells["read-out"] = local["read-out"]
    for name, d in differences(cells).items():
        if name != "read-out":
            print(f"  {name:34s} max |d| {d:.3e}  {'equal bits' if cells[name] == local['read-out'] else 'DIFFERENT'}")
    for key in t_local:
        print(
            f"  {key:10s} local {t_local[key] * 1e3:8.1f} ms   rpc {t_remote[key] * 1e3:8.1f} ms   "
            f"ratio {t_remote[key] / t_local[key]:.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
