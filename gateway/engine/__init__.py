"""The engine room: engine processes, supervised, behind one API (no HTTP, no questions).

The public names (:class:`Engine`, its results and its typed errors) are read
from the module that defines each on first use (:data:`HOME`), so an error can be
imported (to catch it by type) without importing anyio.

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

import importlib
from typing import Any

#: The public names, by the module that defines each: read on first use, so that ``gateway.engine.errors``
#: (an error to catch by type) and the options are imported without anyio.
HOME = {
    "Engine": "api",
    "ReadOut": "api",
    "ScoreResult": "api",
    "OptionScore": "score",
    "RequestStream": "request",
    "RestartPolicy": "options",
    **{
        name: "errors"
        for name in (
            "EngineError",
            "EngineLoadError",
            "EngineCrashed",
            "EngineProtocolError",
            "EngineBusy",
            "EngineTimeout",
            "EngineUnavailable",
            "RequestError",
        )
    },
}
__all__ = list(HOME)


def __getattr__(name: str) -> Any:
    if name in HOME:
        return getattr(importlib.import_module(f"gateway.engine.{HOME[name]}"), name)
    raise AttributeError(f"module 'gateway.engine' has no attribute {name!r}")
