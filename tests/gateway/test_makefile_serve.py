"""``make serve``'s variables reach ``serveproto serve`` as its flags (``make -n``: printed, nothing run)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VARIABLES = (
    "HOST",
    "PORT",
    "MODEL",
    "THREADS",
    "DEBIAS",
    "PRECISION",
    "LOG_DECISIONS",
    "PIN_SLOTS",
    "STRICT",
    "MMPROJ",
)


def serve_line(**variables: str) -> str:
    """The command ``make serve`` runs with ``variables``, its prerequisites taken as made."""
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES and not k.startswith("MAKE")}
    argv = ["make", "-s", "-n", "-C", str(ROOT), "serve", "-o", ".venv/.installed", "-o", "engines", "-o", "model"]
    out = subprocess.run(
        [*argv, *(f"{k}={v}" for k, v in variables.items())], env=env, capture_output=True, text=True, check=True
    ).stdout
    return " ".join(out.split())


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_serve_passes_log_decisions_as_its_flag():
    assert serve_line() == ".venv/bin/serveproto serve --host 127.0.0.1 --port 8000"
    assert serve_line(LOG_DECISIONS="decisions.jsonl") == (
        ".venv/bin/serveproto serve --host 127.0.0.1 --port 8000 --log-decisions decisions.jsonl"
    )
    assert serve_line(DEBIAS="none", LOG_DECISIONS="/tmp/d.jsonl", PORT="8123") == (
        ".venv/bin/serveproto serve --host 127.0.0.1 --port 8123 --debias none --log-decisions /tmp/d.jsonl"
    )


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_serve_passes_pin_slots_and_strict_as_their_flags():
    """Issue 48: the kept snapshots (``--pin-slots``) and ``--strict`` are ``make serve`` variables too."""
    assert serve_line(PIN_SLOTS="8") == ".venv/bin/serveproto serve --host 127.0.0.1 --port 8000 --pin-slots 8"
    assert serve_line(STRICT="1", PIN_SLOTS="2") == (
        ".venv/bin/serveproto serve --host 127.0.0.1 --port 8000 --pin-slots 2 --strict"
    )


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_serve_passes_mmproj_as_its_flag():
    """Issue 48, item 2: a vision projector for the served model (``--mmproj``)."""
    assert serve_line(MMPROJ="/m/p.gguf", STRICT="1") == (
        ".venv/bin/serveproto serve --host 127.0.0.1 --port 8000 --strict --mmproj /m/p.gguf"
    )
