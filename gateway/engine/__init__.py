"""The engine room: engine processes, supervised, behind one API (no HTTP, no questions).

The public names (:class:`Engine`, its results and its typed errors) are read
from :mod:`gateway.engine.api` on first use, so ``gateway.engine.errors`` can be
imported (to catch an error by type) without importing anyio.

Modules: ``api`` (``Engine``: spawn, submit, read_out, score, decide, ping),
``process`` (one engine process and its pipe), ``supervisor`` (restarts,
watchdog), ``slots`` (KV-slot FIFO queues and prefix routing), ``request``
(one request's event stream), ``score`` (which read-out positions an option owns:
option logprobs, no probabilities), ``errors``,
``pool`` (several engines by state affinity), ``precision`` (the F32 transcode),
``build`` (an engine built from the wheel's sources on first use, outside a clone),
``default_model`` (the default GGUF, fetched and verified).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "Engine",
    "ReadOut",
    "ScoreResult",
    "OptionScore",
    "RequestStream",
    "RestartPolicy",
    "EngineError",
    "EngineLoadError",
    "EngineCrashed",
    "EngineProtocolError",
    "EngineBusy",
    "EngineTimeout",
    "EngineUnavailable",
    "RequestError",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from gateway.engine import api

        return getattr(api, name)
    raise AttributeError(f"module 'gateway.engine' has no attribute {name!r}")
