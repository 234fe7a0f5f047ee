"""Shared pytest fixtures: the anyio backends, engine binaries, leak counters."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gateway.paths import DEFAULT_MODEL_NAME, PERSIST_ENV, default_model_path, engine_bin

# A server the tests start keeps nothing on disk unless a test asks (--cache-dir): what one test
# computed would otherwise answer the next one's "cold" request (tests/engines/test_llama_persist.py).
os.environ.setdefault(PERSIST_ENV, "off")


TESTS = Path(__file__).resolve().parent
# The quick tier (make test-quick): the tests of these folders start no engine process.
QUICK_TIERS = (TESTS / "protocol", TESTS / "gateway")


def is_engine_argv(args: object) -> bool:
    """True if a ``subprocess.Popen`` argv starts an engine: a program named ``serveproto*`` (the engines of
    ``engines/bin`` and the ``serveproto`` command, whose ``serve`` starts one) or any argument naming a
    file of ``engines/bin``."""
    argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)  # type: ignore[call-overload]
    words = [os.fsdecode(a) for a in argv]
    if words and Path(words[0].split()[0] if words[0] else "").name.startswith("serveproto"):
        return True
    return any("engines/bin/" in w for w in words)


@pytest.fixture(autouse=True)
def quick_tier_spawns_no_engine(request, monkeypatch):
    """A test of the quick tier (``tests/protocol``, ``tests/gateway``) that starts an engine fails here,
    whichever backend starts it (asyncio, trio and ``subprocess`` all go through ``subprocess.Popen``):
    such a test belongs in ``tests/engines`` or ``tests/e2e``."""
    path = Path(str(request.node.path)).resolve()
    if not any(tier in path.parents for tier in QUICK_TIERS):
        return
    real_init = subprocess.Popen.__init__

    def guarded(self, args, *rest, **kwargs):
        if is_engine_argv(args):
            raise AssertionError(f"{path.name} is in the quick tier but starts an engine ({args!r})")
        real_init(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded)


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    """Every ``@pytest.mark.anyio`` test runs on both anyio backends."""
    return request.param


def built(name: str) -> Path:
    """``engines/bin/<name>``, built by ``make -C engines all``; skips the test if it is not there."""
    path = engine_bin(name)
    if not os.access(path, os.X_OK):
        pytest.skip(f"{path} is not built yet (make -C engines all)")
    return path


@pytest.fixture
def fixture_engine() -> Path:
    """``engines/bin/serveproto-fixture``; skips if missing."""
    return built("serveproto-fixture")


@pytest.fixture(scope="session")
def llama_bin() -> Path:
    """``engines/bin/serveproto-llama``; skips if missing."""
    return built("serveproto-llama")


@pytest.fixture(scope="session")
def model_path(llama_bin) -> Path:
    """The default model's GGUF, once the llama engine is built too; skips if either is missing."""
    model = default_model_path()
    if not model.exists():
        pytest.skip(f"{model} is not fetched yet (make model)")
    return model


@pytest.fixture
def model_cache(model_path, tmp_path, monkeypatch) -> Path:
    """A fresh ``$SERVEPROTO_CACHE`` (``tmp_path / "cache"``) whose ``models/`` holds only the default model (a
    link to ``model_path``): what the test writes under the model's sha256 (a calibration, heads) stays there.
    Skips as ``model_path`` does."""
    cache = tmp_path / "cache"
    (cache / "models").mkdir(parents=True)
    (cache / "models" / DEFAULT_MODEL_NAME).symlink_to(model_path)
    monkeypatch.setenv("SERVEPROTO_CACHE", str(cache))
    return cache


@pytest.fixture
def llama_engine(llama_bin, model_path) -> list[str]:
    """The llama engine on the default model, as an argv; skips if either is missing."""
    return [str(llama_bin), "--model", str(model_path), "--threads", "2"]


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
