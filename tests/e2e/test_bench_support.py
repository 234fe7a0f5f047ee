"""Shared by the tests of ``bench/``: a benchmark run as its README says, ``python -m bench.<name> ARGS``, from
the checkout's root (the tests import the package's modules as ``bench.<name>``; the quick tier imports none)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

#: The checkout's root: where ``python -m bench.<name>`` runs.
ROOT = Path(__file__).resolve().parents[2]


def bench_argv(name: str, *args: str) -> list[str]:
    """The command line of benchmark ``name`` (``load``, ``gpu.fixed_cost``) with ``args``."""
    return [sys.executable, "-m", f"bench.{name}", *args]


def run_bench(name: str, *args: str, timeout: float, check: bool = False) -> subprocess.CompletedProcess[str]:
    """Runs benchmark ``name`` with ``args`` from the checkout's root, its output captured as text, within
    ``timeout`` seconds (``subprocess.TimeoutExpired`` past it); ``check``: a non-zero exit raises
    ``subprocess.CalledProcessError``."""
    return subprocess.run(
        bench_argv(name, *args), cwd=ROOT, capture_output=True, text=True, check=check, timeout=timeout
    )
