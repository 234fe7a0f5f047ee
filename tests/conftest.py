"""Shared pytest fixtures: the anyio backends, engine binaries, leak counters."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.paths import PERSIST_ENV, default_model_path, engine_bin

# A server the tests start keeps nothing on disk unless a test asks (--cache-dir): what one test
# computed would otherwise answer the next one's "cold" request (tests/test_llama_persist.py).
os.environ.setdefault(PERSIST_ENV, "off")


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    """Every ``@pytest.mark.anyio`` test runs on both anyio backends."""
    return request.param


@pytest.fixture
def fixture_engine() -> Path:
    """``engines/bin/serveproto-fixture`` (built by ``make -C engines all``); skips if missing."""
    path = engine_bin("serveproto-fixture")
    if not os.access(path, os.X_OK):
        pytest.skip(f"{path} is not built yet (make -C engines all)")
    return path


@pytest.fixture(scope="session")
def model_path() -> Path:
    """The default model's GGUF, once the llama engine is built too; skips if either is missing."""
    path = engine_bin("serveproto-llama")
    model = default_model_path()
    if not os.access(path, os.X_OK):
        pytest.skip(f"{path} is not built yet (make -C engines all)")
    if not model.exists():
        pytest.skip(f"{model} is not fetched yet (make model)")
    return model


@pytest.fixture
def llama_engine(model_path) -> list[str]:
    """The llama engine on the default model, as an argv; skips if either is missing."""
    return [str(engine_bin("serveproto-llama")), "--model", str(model_path), "--threads", "2"]


@pytest.fixture(scope="session")
def tiny() -> Path:
    """The tiny F32 fixture GGUF, from the real cache: a test that points $SERVEPROTO_CACHE
    elsewhere takes it first (written there, it would fetch the default model for its tokenizer)."""
    from fixtures import tiny_gguf

    return tiny_gguf.ensure()


def open_fds() -> int:
    """File descriptors this process has open now (``/proc/self/fd``)."""
    return len(os.listdir("/proc/self/fd"))


def child_pids() -> set[int]:
    """Processes whose parent is this one, zombies included (scans ``/proc/*/stat``)."""
    me = os.getpid()
    out = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # Fields after the parenthesised command name: state, ppid, ...
        fields = stat[stat.rfind(b")") + 2 :].split()
        if int(fields[1]) == me:
            out.add(int(entry))
    return out


@pytest.fixture
def probes():
    """Leak probes for tests: ``probes.open_fds()`` and ``probes.child_pids()``."""
    import types

    return types.SimpleNamespace(open_fds=open_fds, child_pids=child_pids)
