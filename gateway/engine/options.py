"""The knobs of one supervised engine, as values built once and passed whole.

:class:`ProcessOptions` says how one engine process is run and watched
(:meth:`gateway.engine.process.EngineProcess.start`), :class:`RestartPolicy`
how the supervisor restarts it, :class:`EngineOptions` both plus the defaults
of its requests (:meth:`gateway.engine.Engine.spawn`, which hands the two
parts to :class:`gateway.engine.supervisor.Supervisor` and the process).
Times are seconds; ``None`` turns a timeout off where it says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ProcessOptions:
    """How one engine process is run and watched; seconds unless said.

    ``handshake_timeout`` (60; ``None``: none): from the start to the end of
    the handshake (READY..STAT). ``stall_timeout`` (60; ``None``: trust the
    engine forever): no output this long while requests are in flight, and the
    engine is declared hung (the watchdog of an engine without ``x_health``).
    ``health_interval`` (``None``: never): an engine with ``x_health`` is
    PINGed this often, busy or idle. ``ping_timeout`` (30): a PING unanswered
    this long and the engine is stalled: failed and killed. ``drain_timeout``
    (5) and ``term_timeout`` (2): the shutdown ladder (EOF, drain, SIGTERM,
    wait, SIGKILL). ``env`` / ``cwd`` (``None``: the gateway's): the
    process's environment and folder. ``stderr_lines_per_s`` (1000): stderr
    lines logged a second, the rest counted (not a stalled engine's stack,
    logged whole). ``max_line`` (4096 bytes) and
    ``max_payload`` (64 MiB): the serve-protocol bounds of what the engine
    writes (``serveproto.GatewayConnection``).
    """

    handshake_timeout: float | None = 60.0
    stall_timeout: float | None = 60.0
    health_interval: float | None = None
    ping_timeout: float = 30.0
    drain_timeout: float = 5.0
    term_timeout: float = 2.0
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    stderr_lines_per_s: int = 1000
    max_line: int = 4096
    max_payload: int = 64 << 20


@dataclass(frozen=True)
class RestartPolicy:
    """Restart intensity and backoff (Erlang/OTP's intensity / period).

    ``max_restarts`` (3) restarts are allowed within any ``period`` (60)
    seconds; 0 means never restart, ``None`` restart without limit. The n-th
    consecutive restart waits ``min(backoff_max, backoff_initial * 2**(n-1))``
    seconds (defaults 0.1 and 5); the count of consecutive restarts resets
    after a process served for ``period`` s. Raises ValueError naming the
    field for a negative value.
    """

    max_restarts: int | None = 3
    period: float = 60.0
    backoff_initial: float = 0.1
    backoff_max: float = 5.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None and value < 0:
                raise ValueError(f"{f.name}: must be >= 0, got {value}")

    def delay(self, consecutive: int) -> float:
        """Seconds to wait before the ``consecutive``-th restart in a row (1-based)."""
        doublings: int = 2 ** max(0, consecutive - 1)
        return min(self.backoff_max, self.backoff_initial * doublings)


#: :meth:`EngineOptions.updated`'s keywords that are not the field's own name: keyword -> (part, field).
_RENAMED = {"restart_period": ("restart", "period")}


@dataclass(frozen=True)
class EngineOptions:
    """Everything :meth:`gateway.engine.Engine.spawn` takes besides the command and its name.

    ``process``: :class:`ProcessOptions`, with ``health_interval`` 5 s by
    default here (a supervised engine is PINGed). ``restart``:
    :class:`RestartPolicy`. ``request_timeout`` (seconds; ``None``, the
    default: none): each request's default deadline. ``max_waiting``
    (``None``, the default: no bound): with that many callers already queued
    for slots, a new request raises ``EngineBusy`` at once.
    """

    process: ProcessOptions = field(default_factory=lambda: ProcessOptions(health_interval=5.0))
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    request_timeout: float | None = None
    max_waiting: int | None = None

    def updated(self, **changes: Any) -> EngineOptions:
        """These options with ``changes`` by their flat names, the keywords ``Engine.spawn`` has
        always taken: a :class:`ProcessOptions` or :class:`RestartPolicy` field's name
        (``restart_period`` for ``restart.period``), ``request_timeout`` or ``max_waiting``.

        Raises TypeError naming a keyword that is none of them; ValueError from
        :class:`RestartPolicy` for a negative restart value.
        """
        if not changes:
            return self
        parts: dict[str, dict[str, Any]] = {"process": {}, "restart": {}, "": {}}
        process = {f.name for f in dataclasses.fields(ProcessOptions)}
        restart = {f.name for f in dataclasses.fields(RestartPolicy)} - {"period"}
        for key, value in changes.items():
            if key in _RENAMED:
                part, name = _RENAMED[key]
            elif key in process:
                part, name = "process", key
            elif key in restart:
                part, name = "restart", key
            elif key in ("request_timeout", "max_waiting"):
                part, name = "", key
            else:
                raise TypeError(f"{key}: not an engine option (gateway.engine.options.EngineOptions)")
            parts[part][name] = value
        return dataclasses.replace(
            self,
            process=dataclasses.replace(self.process, **parts["process"]),
            restart=dataclasses.replace(self.restart, **parts["restart"]),
            **parts[""],
        )
