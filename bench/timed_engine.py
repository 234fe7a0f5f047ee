"""One engine process driven frame by frame, with each request timed: the benchmarks' engine client.

:class:`TimedEngine` is ``fixtures.sync_engine.SyncEngine`` (the tests' blocking driver: spawn, handshake,
one request's events up to its DONE or ERROR) plus the seconds from a request's write to its DONE, and the
llama.cpp reference (``llama-prefill-ref``) the engine's prefill is compared against.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench import ROOT
from fixtures.sync_engine import SyncEngine
from serveproto import Done, Error, Score, Scored, Submit


class TimedEngine(SyncEngine):
    """An engine subprocess (``argv``) whose requests are timed. ``stderr_path``: where its stderr goes
    (default nowhere); ``timeout``: seconds the handshake and each event may take (default 600).
    Every helper raises ``RuntimeError`` when the engine answers ERROR."""

    def __init__(self, argv: list[str], stderr_path: str | Path = os.devnull, timeout: float = 600.0) -> None:
        super().__init__(argv, stderr_path, timeout=timeout)
        self.timeout = timeout

    def cpu(self) -> float:
        """User + system CPU seconds the engine process has used so far."""
        from bench.servers import cpu_seconds

        return cpu_seconds(self.proc.pid)

    def run(self, make: Callable[[int], object], timeout: float | None = None) -> tuple[float, list]:
        """Sends ``make(id)`` (a request event of a fresh id); returns (seconds from the write to its
        DONE, its events)."""
        event = make(self.new_id())
        t0 = time.perf_counter()
        events = self.request(event, timeout=timeout or self.timeout)
        dt = time.perf_counter() - t0
        if isinstance(events[-1], Error):
            raise RuntimeError(f"engine answered {events[-1]}")
        return dt, events

    def submit(self, prompt: str | bytes, timeout: float | None = None, **kw) -> tuple[float, list]:
        """A SUBMIT on slot 0 (greedy, one token, counters on unless ``kw`` says otherwise): (seconds from
        the write to DONE, the request's events)."""
        args = dict(slot=0, max_tokens=1, temperature=0.0, top_p=1.0, counters=True)
        args.update(kw)
        data = prompt.encode() if isinstance(prompt, str) else prompt
        return self.run(lambda rid: Submit(id=rid, prompt=data, **args), timeout)

    def score(
        self, prefix: str, groups: list[tuple[str, list[str]]], pin: bool = False, timeout: float | None = None
    ) -> tuple[float, list, Done]:
        """(seconds, SCORED events in order, DONE) of one SCORE of ``groups`` (stem, options) on slot 0."""
        payload = json.dumps(
            {"prefix": prefix, "groups": [{"stem": s, "options": o} for s, o in groups], "pin": pin}
        ).encode()
        dt, ev = self.run(lambda rid: Score(id=rid, slot=0, payload=payload), timeout)
        return dt, [e for e in ev if isinstance(e, Scored)], ev[-1]

    def count(self, text: str) -> int:
        """Tokens of ``text`` as the engine reads a prompt."""
        return self.submit(text)[1][-1].prompt_tokens


def engine_options(ap: argparse.ArgumentParser, reference: bool = True) -> None:
    """Adds the engine binary's option (``--engine-bin``, default the built ``serveproto-llama``) and, with
    ``reference``, llama.cpp's prefill reference (``--ref-bin``, default the built ``llama-prefill-ref``)."""
    ap.add_argument("--engine-bin", default=str(ROOT / "engines/bin/serveproto-llama"))
    if reference:
        ap.add_argument(
            "--ref-bin",
            default=str(ROOT / "engines/bin/llama-prefill-ref"),
            help="llama.cpp's prefill reference ('' to skip the comparison)",
        )


def llama_argv(
    binary: str, model: str, ctx: int, threads: int, *more: str, slots: int | None = None, flags: str = ""
) -> list[str]:
    """The llama engine's command line: ``binary --model M --ctx C [--slots S] --threads T MORE... FLAGS...``
    (``flags``: more options in one string, split as a shell would)."""
    argv = [binary, "--model", model, "--ctx", str(ctx), *(["--slots", str(slots)] if slots else [])]
    return [*argv, "--threads", str(threads), *more, *shlex.split(flags)]


def reference_reps(
    ref_bin: str | Path, model: str | Path, text: str | None, ctx: int, threads: int, reps: int, *more: str
) -> tuple[int, list[float]]:
    """llama.cpp's own decode of ``text`` (``llama-prefill-ref``, last logit only unless ``more`` says
    ``--all-logits``): (tokens, the seconds of each of ``reps`` decodes, in order). ``text`` None:
    ``more`` names the prompt (``--prompt-file F``). Raises ``CalledProcessError`` when it fails."""
    name = None
    if text is not None:
        with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
            f.write(text.encode())
        name = f.name
    try:
        argv = [str(ref_bin), "--model", str(model), *(["--prompt-file", name] if name else [])]
        argv += ["--ctx", str(ctx), "--threads", str(threads), "--reps", str(reps), *more]
        out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    finally:
        if name:
            os.unlink(name)
    rows = [dict(kv.split("=") for kv in line.split()) for line in out.splitlines() if line.startswith("tokens=")]
    return int(rows[0]["tokens"]), [float(r["seconds"]) for r in rows]
