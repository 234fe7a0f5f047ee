"""Keep one engine command running: restart it with backoff, give up OTP-style.

A :class:`Supervisor` runs a task that starts an :class:`EngineProcess`, waits
for it to fail, and starts the next one after a backoff delay. Like an
Erlang/OTP supervisor it has a restart intensity: more than ``max_restarts``
restarts within ``restart_period`` seconds and it gives up, reporting failed
health (:attr:`Supervisor.healthy` False, requests raise
:class:`EngineUnavailable`) and ending :meth:`Supervisor.run`, so that its
owner can fail upward in turn (``serveproto serve`` exits non-zero).
``max_restarts=None`` never gives up: it restarts with the capped backoff for
as long as it runs. A failure of the very first start is not retried: it is
raised to the caller, who asked for an engine that cannot start. The
supervisor's lifetime is one cancel scope: :meth:`Supervisor.close` cancels
it, which ends a serving process gracefully (its shutdown is shielded), a
start in progress or a backoff at once.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence

import anyio
from anyio.abc import TaskStatus

from gateway.engine.errors import EngineError, EngineUnavailable
from gateway.engine.options import EngineOptions, RestartPolicy
from gateway.engine.process import EngineProcess

__all__ = ["RestartPolicy", "Supervisor"]

log = logging.getLogger("gateway.engine")


class Supervisor:
    """Owns the current :class:`EngineProcess` of one engine command and restarts it.

    ``options``: :class:`gateway.engine.options.EngineOptions`; its ``restart``
    is the policy, its ``process`` goes to :meth:`EngineProcess.start` whole
    (timeouts, env, cwd, ...). Use through :meth:`gateway.engine.Engine.spawn`, which runs :meth:`run` in
    a task group and calls :meth:`close` on exit.
    """

    def __init__(self, argv: Sequence[str], *, name: str, options: EngineOptions) -> None:
        self.argv = list(argv)
        self.name = name
        self.options = options
        self.policy: RestartPolicy = options.restart
        self._current: EngineProcess | None = None
        self._ready = anyio.Event()  # set while a process serves (and once stopped): instance() waits on it
        #: The supervisor's lifetime: :meth:`run` runs inside it, :meth:`close` cancels it (whatever
        #: run is doing then: serving, starting a process, or waiting out a backoff).
        self._scope = anyio.CancelScope()
        self._gave_up: EngineUnavailable | None = None
        self._restart_times: deque[float] = deque()
        self._done = anyio.Event()
        #: Restarts so far (not counting the first start).
        self.restarts = 0
        #: Why the last process ended, or ``None``.
        self.last_error: BaseException | None = None
        #: Exit status of each process that served, in order (negative: killed by that signal).
        self.exit_statuses: list[int | None] = []

    @property
    def healthy(self) -> bool:
        """True while a process is serving and answers its PINGs in time; False while it is
        unresponsive, while restarting, after giving up or closing."""
        cur = self._current
        return cur is not None and cur.healthy and cur.responsive

    @property
    def state(self) -> str:
        """One word: ``"serving"``, ``"unresponsive"`` (a PING unanswered for longer than the
        PING interval: slow or stalled), ``"restarting"``, ``"gave_up"`` or ``"closed"``."""
        if self._gave_up is not None:
            return "gave_up"
        if self._scope.cancel_called:
            return "closed"
        cur = self._current
        if cur is None or not cur.healthy:
            return "restarting"
        return "serving" if cur.responsive else "unresponsive"

    @property
    def gave_up(self) -> bool:
        """True once the restart intensity was exceeded (health failed for good)."""
        return self._gave_up is not None

    @property
    def current(self) -> EngineProcess | None:
        """The process serving now, or ``None`` while restarting or closed."""
        return self._current

    async def instance(self) -> EngineProcess:
        """The serving process, waiting through a restart in progress.

        Raises :class:`EngineUnavailable` once the supervisor gave up or closed.
        A wait is bounded by the backoff plus one start's handshake timeout.
        """
        while True:
            if self._gave_up is not None:
                raise self._gave_up
            if self._scope.cancel_called:
                raise EngineUnavailable(f"engine {self.name!r} is closed", name=self.name)
            cur = self._current
            if cur is not None and cur.healthy:
                return cur
            if cur is not None:
                # Going down (its stdout closed, the exit status on its way).
                await cur.wait_failed()
            else:
                await self._ready.wait()

    def _on_process_exit(self) -> None:
        # Called synchronously when the serving process fails: from now on
        # instance() waits for the next one.
        self._current = None
        if self._ready.is_set() and not self._scope.cancel_called:
            self._ready = anyio.Event()

    def _will_restart(self) -> bool:
        """Whether a process that dies now is restarted: not closed, and within the intensity."""
        return not self._scope.cancel_called and self._allow_restart()

    def _allow_restart(self) -> bool:
        if self.policy.max_restarts is None:
            return True
        now = anyio.current_time()
        while self._restart_times and now - self._restart_times[0] > self.policy.period:
            self._restart_times.popleft()
        return len(self._restart_times) < self.policy.max_restarts

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Start the engine, then keep it running until :meth:`close` (or until it gives up).

        ``task_status.started()`` is called after the first handshake; an error
        of the first start propagates (EngineLoadError, EngineTimeout, ...).
        """
        first = True
        consecutive = 0
        try:
            with self._scope:
                while True:
                    started_at = anyio.current_time()
                    served: EngineProcess | None = None
                    try:
                        async with EngineProcess.start(
                            self.argv,
                            name=self.name,
                            options=self.options.process,
                            on_exit=self._on_process_exit,
                            will_restart=self._will_restart,
                        ) as proc:
                            served = proc
                            self._current = proc
                            self._ready.set()
                            if first:
                                first = False
                                task_status.started()
                            await proc.wait_failed()
                    except EngineError as exc:
                        served = None  # a start that failed, or a shutdown that did: this error is why
                        if first:
                            raise
                        self.last_error = exc
                        log.error("engine %s: restart failed: %s", self.name, exc)
                    finally:  # also when closed: the process has shut down by now
                        self._current = None
                        if served is not None:
                            self.last_error = served.failure
                            self.exit_statuses.append(served.returncode)
                    if anyio.current_time() - started_at >= self.policy.period:
                        consecutive = 0
                    if not self._allow_restart():
                        self._gave_up = EngineUnavailable(
                            f"engine {self.name!r} gave up: more than {self.policy.max_restarts} "
                            f"restart(s) within {self.policy.period} s; last error: "
                            f"{self.last_error}",
                            name=self.name,
                            last_error=self.last_error,
                        )
                        log.error("%s", self._gave_up)
                        return
                    consecutive += 1
                    delay = self.policy.delay(consecutive)
                    log.warning(
                        "engine %s: restarting in %.2f s (restart %d): %s",
                        self.name,
                        delay,
                        self.restarts + 1,
                        str(self.last_error).removesuffix("; restarting"),  # this line says so
                    )
                    await anyio.sleep(delay)
                    self._restart_times.append(anyio.current_time())
                    self.restarts += 1
        finally:
            self._current = None
            self._ready.set()
            self._done.set()

    def close(self) -> None:
        """Stop restarting; the serving process (if any) shuts down gracefully, a start or a
        backoff in progress is cancelled."""
        self._scope.cancel()
        self._ready.set()  # callers waiting for a process get EngineUnavailable now

    async def wait_closed(self) -> None:
        """Return once :meth:`run` has finished (after :meth:`close` or giving up: see :attr:`gave_up`)."""
        await self._done.wait()
