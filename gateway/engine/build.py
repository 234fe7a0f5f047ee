"""Building an engine on first use, for an installed package (a clone runs ``make engines``).

The wheel carries the engines' sources (the ``engines/`` Makefiles, C files and patches) as
``gateway/engine/engines/``. The first time an engine is needed, :func:`ensure_engine` copies
them into :func:`gateway.paths.engine_build_dir` and runs the clone's own ``make`` there for
that one binary, make's lines going to stderr as in a clone. The llama engine's first build
fetches the llama-cpp-python sdist from PyPI and builds llama.cpp (10 to 15 minutes on two
cores, once, into the same cache the clone uses); the fixture engine takes seconds.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

from gateway.paths import PACKAGED_ENGINES, cache_dir, engine_bin, engine_build_dir, in_clone

#: The engines :func:`ensure_engine` builds (``make bin/<name>`` in ``engines/``).
ENGINES = ("serveproto-llama", "serveproto-fixture", "serveproto-quantize", "serveproto-sparrow")


#: The engines that build in seconds (no llama.cpp).
_QUICK = ("serveproto-fixture", "serveproto-sparrow")


class EngineBuildError(RuntimeError):
    """An engine could not be built; the message says why (make's output is above it on stderr)."""


def ensure_engine(name: str) -> Path:
    """Return the path of engine ``name`` (one of :data:`ENGINES`), building it first when the
    package is installed (not a clone) and the binary is not there yet.

    In a clone it returns ``engines/bin/<name>`` whether built or not (``make engines`` builds it).
    Installed, a missing binary is built with a progress line on stderr; two processes building
    at once build once (a lock file beside the build folder). Raises ``ValueError`` for an
    unknown ``name`` and ``EngineBuildError`` when the sources are missing or make fails.
    """
    if name not in ENGINES:
        raise ValueError(f"engine {name!r}: not one of {', '.join(ENGINES)}")
    binary = engine_bin(name)
    if in_clone() or binary.is_file():
        return binary
    if not (PACKAGED_ENGINES / "Makefile").is_file():
        raise EngineBuildError(
            f"{PACKAGED_ENGINES} has no engine sources: reinstall serveproto from its wheel or sdist"
        )
    out = engine_build_dir()
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not binary.is_file():
            _make(out, name)
    return binary


def _make(out: Path, name: str) -> None:
    """Copy the packaged sources to ``out`` (once) and run ``make bin/<name>`` there."""
    if not (out / "Makefile").is_file():
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(PACKAGED_ENGINES, tmp, ignore=shutil.ignore_patterns("__pycache__"))
        os.replace(tmp, out)
    slow = " (the llama engine's first build fetches and builds llama.cpp: 10 to 15 minutes on 2 cores)"
    print(
        f"serveproto: building {name} into {out} (first use only){'' if name in _QUICK else slow}",
        file=sys.stderr,
        flush=True,
    )
    cmd = ["make", "-C", str(out), f"bin/{name}", f"LLAMA_PIP_PY={sys.executable}", f"SERVEPROTO_CACHE={cache_dir()}"]
    try:
        err = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        err = None  # stderr is not a file (captured): make's output goes to ours
    try:
        rc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err).returncode
    except FileNotFoundError:
        raise EngineBuildError(f"building {name} needs make, a C compiler and cmake on PATH") from None
    if rc != 0:
        raise EngineBuildError(f"make bin/{name} in {out} failed (exit {rc})")
    print(f"serveproto: built {out / 'bin' / name}", file=sys.stderr, flush=True)
