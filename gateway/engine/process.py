"""One engine process: spawn, handshake, multiplexed requests, shutdown ladder.

:class:`EngineProcess` owns the child process, its ``serveproto``
GatewayConnection, a reader task that routes each frame to its request by id,
a stderr pump that logs the engine's lines under ``gateway.engine.<name>``, and
two watchdogs. An engine with ``x_health`` is sent a PING every
``health_interval`` seconds, busy or idle; one not answered within
``ping_timeout`` seconds means the engine is stalled (hung, stopped by a
signal, stuck in one computation), and it is failed and shut down, whatever
the requests' own deadlines; one that advertises ``x_stack`` is first sent
that signal, so its stderr (the log) holds the stack it was stuck in. Without ``x_health``, an engine that writes
nothing for ``stall_timeout`` seconds while requests are in flight is declared
hung the same way. It never restarts anything: that is
:mod:`gateway.engine.supervisor`'s job.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

import serveproto
from gateway.engine.errors import (
    EngineCrashed,
    EngineError,
    EngineLoadError,
    EngineProtocolError,
    EngineTimeout,
    EngineUnavailable,
)
from gateway.engine.options import ProcessOptions
from gateway.engine.slots import SlotLease, SlotRouter
from serveproto import (
    Cancel,
    Caps,
    ConnectionClosed,
    Done,
    Error,
    GatewayConnection,
    LoadFail,
    LocalProtocolError,
    Ping,
    Pong,
    RemoteProtocolError,
    Stat,
    Telemetry,
)

log = logging.getLogger("gateway.engine")

#: Bytes read from the engine's stdout / stderr per receive.
READ_CHUNK = 65536
#: A stderr line longer than this is cut (bytes); the rest starts a new line.
MAX_STDERR_LINE = 8192
#: Lines of stderr kept for error messages.
STDERR_TAIL = 20
#: Seconds to wait for the exit status after the engine closed its stdout.
REAP_GRACE = 1.0
#: Seconds a CANCEL may take to be written before we give up on it.
CANCEL_WRITE_TIMEOUT = 1.0
#: Seconds a stalled engine with ``x_stack`` has to write its stack (spec 9.3) before it is killed.
STACK_WAIT_S = 1.0
#: The framing lines of that stack (engines/common/stack.h), after the engine's name and ": ".
STACK_OPEN = b"stack at a stall ("
STACK_CLOSE = b"end of stack"
#: Lines of one stack logged past the ``stderr_lines_per_s`` limit, at most (glibc's frames, the
#: engine's STACK_MAX_FRAMES, and the two framing lines).
STACK_MAX_LINES = 130

#: The reply frames that end a request.
_TERMINAL = (Done, Error, Pong)


def unwrap_group(exc: BaseException) -> BaseException:
    """The single leaf of nested one-member exception groups, else ``exc`` itself.

    Task groups wrap every error in an ExceptionGroup; the supervisor's public
    surface raises the typed error itself.
    """
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


@contextmanager
def unwrapped() -> Iterator[None]:
    """Around a task group: what it raises as a group, raised as :func:`unwrap_group` leaves it (the typed
    error itself when it is the only one)."""
    try:
        yield
    except BaseExceptionGroup as group:
        raise unwrap_group(group) from None


class Inflight:
    """One request in flight: its id, its slot lease, the stream of its frames.

    The reader puts reply events (and, when the engine fails, the engine's
    exception) into ``send``; the caller reads ``recv``. ``detached`` is set once
    the caller has gone (cancelled): later frames of this id are dropped.
    """

    __slots__ = ("id", "lease", "send", "recv", "detached")

    def __init__(self, rid: int, lease: SlotLease | None) -> None:
        self.id = rid
        self.lease = lease
        self.send: MemoryObjectSendStream[object]
        self.recv: MemoryObjectReceiveStream[object]
        self.send, self.recv = anyio.create_memory_object_stream(math.inf)
        self.detached = False


def exit_words(returncode: int | None, what: str = "exited") -> str:
    """How a process ended, in words: ``"exited (exit status 3)"``, ``"was killed by signal 9
    (SIGKILL)"``, ``"exited (still running)"`` (its stdout closed, not reaped yet). ``what``: the
    verb phrase of a normal exit, e.g. ``"exited before its handshake"``, whose tail (``"before its
    handshake"``) follows a signal's words too."""
    if returncode is None or returncode >= 0:
        status = f"exit status {returncode}" if returncode is not None else "still running"
        return f"{what} ({status})"
    try:
        name = f" ({signal.Signals(-returncode).name})"
    except ValueError:
        name = ""
    rest = what.removeprefix("exited")
    return f"was killed by signal {-returncode}{name}{rest}"


class EngineProcess:
    """A running engine process and its serve-protocol connection.

    Build with :meth:`start` (an async context manager). ``argv`` is the
    command as a list (no shell). Timeouts are in seconds; ``None`` disables
    one. ``on_exit`` is called (synchronously, once) when the process fails or
    is closed. Errors: :class:`EngineLoadError` (LOAD_FAIL, or the command
    cannot be executed), :class:`EngineTimeout` (no handshake in time),
    :class:`EngineCrashed` (exited before the handshake),
    :class:`EngineProtocolError` (garbage instead of a handshake).
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        name: str,
        options: ProcessOptions,
        on_exit: Callable[[], None] | None,
        will_restart: Callable[[], bool] | None = None,
    ) -> None:
        self.argv = [os.fspath(a) for a in argv]
        self.name = name
        #: How the process is run and watched (timeouts in seconds, env, cwd, bounds).
        self.options = options
        self._ping_sent: float | None = None  # when the watchdog's PING now unanswered was sent
        self._on_exit = on_exit
        self._will_restart = will_restart
        self._conn = GatewayConnection(max_line=options.max_line, max_payload=options.max_payload)
        self._proc: anyio.abc.Process | None = None
        self._stderr_log = logging.getLogger(f"gateway.engine.{name}")
        self._stderr_tail: deque[str] = deque(maxlen=STDERR_TAIL)
        self._stderr_done = anyio.Event()
        self._window_start = 0.0
        self._window_lines = 0
        self._dropped_lines = 0
        self._stack_lines = -1  # lines of a stack block logged so far; -1: not inside one
        self._stack_done = anyio.Event()  # the closing line of a stack was read
        self._inflight: dict[int, Inflight] = {}
        self._next_id = 1
        self._write_lock = anyio.Lock()
        self._read_scope: anyio.CancelScope | None = None
        self._failure: BaseException | None = None
        self._failed = anyio.Event()
        self._exited = anyio.Event()
        self._shutdown_started = False
        self._closing = False
        self._eof = False
        self.caps: Caps | None = None
        self.stat: Stat | None = None
        self.router: SlotRouter | None = None

    # ------------------------------------------------------------ properties

    @property
    def pid(self) -> int | None:
        """The process id, or ``None`` before it started."""
        return self._running.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        """The exit status once reaped (negative: the signal that killed it)."""
        return self._running.returncode if self._proc is not None else None

    @property
    def healthy(self) -> bool:
        """True while the handshake is done and the process has neither failed nor been closed."""
        return self.caps is not None and self._failure is None and not self._closing and not self._eof

    @property
    def responsive(self) -> bool:
        """False while the watchdog's PING has gone unanswered for more than ``health_interval`` s
        (a beat missed: the engine is slow or stalled; at ``ping_timeout`` it is failed)."""
        sent = self._ping_sent
        return sent is None or anyio.current_time() - sent <= (self.options.health_interval or 0.0)

    @property
    def failure(self) -> BaseException | None:
        """Why the process stopped serving (an :class:`EngineError`), or ``None``."""
        return self._failure

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet ended by the engine (cancelled ones included)."""
        return len(self._inflight)

    @property
    def stderr_tail(self) -> tuple[str, ...]:
        """The last stderr lines (up to ``STDERR_TAIL``), oldest first."""
        return tuple(self._stderr_tail)

    async def wait_failed(self) -> None:
        """Return once the process failed or was closed."""
        await self._failed.wait()

    # ------------------------------------------------------------ lifetime

    @classmethod
    @asynccontextmanager
    async def start(
        cls,
        argv: Sequence[str],
        *,
        name: str | None = None,
        options: ProcessOptions | None = None,
        on_exit: Callable[[], None] | None = None,
        will_restart: Callable[[], bool] | None = None,
    ) -> AsyncIterator[EngineProcess]:
        """Start ``argv``, complete the handshake, yield the process; shut it down on exit.

        ``options``: :class:`gateway.engine.options.ProcessOptions` (default: its defaults; one field
        changed: ``dataclasses.replace(ProcessOptions(), handshake_timeout=10)``).
        ``will_restart``: asked when the process dies on its own, whether its owner will start
        another (the error then says ``"; restarting"``).

        On exit: close stdin (EOF, the spec's graceful shutdown), wait up to
        ``drain_timeout`` for the engine to finish its requests and exit, then
        SIGTERM, wait ``term_timeout``, then SIGKILL; the process is always reaped.
        """
        if not argv:
            raise ValueError("argv: the engine command is empty")
        options = options or ProcessOptions()
        self = cls(
            argv,
            name=name or os.path.basename(os.fspath(argv[0])),
            options=options,
            on_exit=on_exit,
            will_restart=will_restart,
        )
        try:
            # A session of its own: a terminal's Ctrl-C (SIGINT to the foreground
            # process group) reaches the gateway, which decides; never the engine.
            # Shielded: a spawn cancelled half-way (the supervisor closed during a
            # restart) would leave a child nobody reaps; once it returns, the
            # handshake below is cancellable and its failure path reaps the child.
            with anyio.CancelScope(shield=True):
                self._proc = await anyio.open_process(
                    self.argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=options.env,
                    cwd=options.cwd,
                    start_new_session=True,
                )
        except OSError as exc:
            self._mark_failed(
                EngineLoadError("io", f"cannot execute {self.argv[0]!r}: {exc.strerror or exc}", name=self.name)
            )
            assert self._failure is not None  # set by _mark_failed
            raise self._failure from exc
        log.info("engine %s: started pid %d: %s", self.name, self._running.pid, " ".join(self.argv))
        try:
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._pump_stderr)
                    try:
                        await self._handshake()
                    except BaseException as exc:
                        with anyio.CancelScope(shield=True):
                            self._mark_failed(
                                exc
                                if isinstance(exc, EngineError)
                                else EngineUnavailable("start was cancelled", name=self.name)
                            )
                            await self._shutdown(graceful=False)
                        tg.cancel_scope.cancel()
                        raise
                    tg.start_soon(self._read_loop)
                    if options.health_interval is not None and self.caps is not None and self.caps.x_health:
                        tg.start_soon(self._watchdog)
                    try:
                        yield self
                    finally:
                        with anyio.CancelScope(shield=True):
                            await self._shutdown(graceful=True)
                        tg.cancel_scope.cancel()
            except BaseExceptionGroup as group:
                raise unwrap_group(group) from None
        finally:
            with anyio.CancelScope(shield=True):
                await self._running.aclose()
            log.info("engine %s: pid %d ended with status %s", self.name, self._running.pid, self._running.returncode)

    async def _handshake(self) -> None:
        seconds = self.options.handshake_timeout
        with anyio.CancelScope(deadline=anyio.current_time() + seconds if seconds is not None else math.inf) as scope:
            while self.stat is None:
                data = await self._receive()
                self._conn.receive_data(data)
                while True:
                    try:
                        ev = self._conn.next_event()
                    except RemoteProtocolError as exc:
                        raise EngineProtocolError(
                            f"engine {self.name!r} broke the handshake: {exc}",
                            name=self.name,
                            code=getattr(exc, "code", ""),
                        ) from None
                    if ev is serveproto.NEED_DATA:
                        break
                    if isinstance(ev, LoadFail):
                        raise EngineLoadError(ev.kind, ev.detail, name=self.name)
                    if isinstance(ev, ConnectionClosed):
                        raise await self._crash_error("exited before its handshake")
                    if isinstance(ev, Caps):
                        self.caps = ev
                    elif isinstance(ev, Stat):
                        self.stat = ev
                        break
                    elif isinstance(ev, Telemetry):
                        log.debug("engine %s telemetry: %r", self.name, ev.line)
        if scope.cancelled_caught:
            raise EngineTimeout(
                f"engine {self.name!r} sent no handshake within {seconds} s",
                name=self.name,
                what="handshake",
                seconds=seconds or 0.0,
            )
        if self.caps is None:
            self.caps = self._conn.caps or Caps(values={})
        self.router = SlotRouter(max(1, self.caps.slots or 1))
        log.info("engine %s: ready, caps %s", self.name, self.caps.values)

    async def _receive(self) -> bytes:
        try:
            return await self._stdout.receive(READ_CHUNK)
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            return b""

    async def _crash_error(self, what: str, serving: bool = False) -> EngineCrashed:
        """An EngineCrashed for a closed stdout, with the exit status when it comes soon. ``serving``:
        it died after its handshake (its requests get this error; ``"; restarting"`` when its owner
        starts another); its last stderr lines go to the log, not the message."""
        with anyio.move_on_after(REAP_GRACE):
            await self._running.wait()
            await self._stderr_done.wait()
        rc = self._running.returncode
        message = f"engine {self.name!r} {exit_words(rc, what)}"
        if serving and self._will_restart is not None and self._will_restart():
            message += "; restarting"
        tail = self.stderr_tail
        if tail:  # the server's log keeps them; the client's 503 does not (issue 30, item 4)
            log.warning("%s; its last stderr lines: %s", message, " | ".join(tail[-3:]))
        return EngineCrashed(message, name=self.name, returncode=rc, stderr_tail=tail)

    async def _shutdown(self, *, graceful: bool) -> None:
        """The ladder: EOF on stdin, drain, SIGTERM, SIGKILL; always reaps. Call shielded."""
        if self._shutdown_started:
            await self._exited.wait()
            return
        self._shutdown_started = True
        self._closing = True
        proc = self._proc
        try:
            assert proc is not None  # started before anything shuts it down
            if graceful and self._failure is None:
                with anyio.move_on_after(self.options.drain_timeout):
                    async with self._write_lock:
                        await self._stdin.aclose()
                    await proc.wait()
                if proc.returncode is None:
                    log.warning(
                        "engine %s: did not exit within %.1f s of EOF; terminating",
                        self.name,
                        self.options.drain_timeout,
                    )
            if proc.returncode is None:
                _signal(proc, signal.SIGTERM)
                _signal(proc, signal.SIGCONT)  # a stopped engine (SIGSTOP) acts on the TERM only once resumed
                with anyio.move_on_after(self.options.term_timeout):
                    await proc.wait()
            if proc.returncode is None:
                log.warning("engine %s: did not exit on SIGTERM; killing", self.name)
                _signal(proc, signal.SIGKILL)
                await proc.wait()
        finally:
            self._mark_failed(EngineUnavailable(f"engine {self.name!r} was closed", name=self.name))
            self._exited.set()

    def _mark_failed(self, exc: BaseException) -> None:
        """Fail every request in flight and every waiter with ``exc``; idempotent."""
        if self._failure is not None:
            return
        self._failure = exc
        if self.router is not None:
            self.router.close(exc)
        for req in self._inflight.values():
            if not req.detached:
                req.send.send_nowait(exc)
            req.send.close()
        self._inflight.clear()
        self._failed.set()
        if self._on_exit is not None:
            self._on_exit()

    async def _fail(self, exc: EngineError) -> None:
        log.error("engine %s: %s", self.name, exc)
        self._mark_failed(exc)
        with anyio.CancelScope(shield=True):
            await self._shutdown(graceful=False)

    # ------------------------------------------------------------ reading

    def _stall_deadline(self) -> float:
        if self._inflight and self.options.stall_timeout is not None:
            return anyio.current_time() + self.options.stall_timeout
        return math.inf

    async def _read_loop(self) -> None:
        while True:
            with anyio.CancelScope(deadline=self._stall_deadline()) as scope:
                self._read_scope = scope
                data = await self._receive()
            self._read_scope = None
            if scope.cancelled_caught:
                if not self._inflight:
                    continue
                await self._fail(
                    EngineTimeout(
                        f"engine {self.name!r} wrote nothing for {self.options.stall_timeout} s with "
                        f"{len(self._inflight)} request(s) in flight; killed",
                        name=self.name,
                        what="stall",
                        seconds=self.options.stall_timeout or 0.0,
                    )
                )
                return
            self._conn.receive_data(data)
            while True:
                try:
                    ev = self._conn.next_event()
                except RemoteProtocolError as exc:
                    await self._fail(
                        EngineProtocolError(
                            f"engine {self.name!r} broke the protocol: {exc}",
                            name=self.name,
                            code=getattr(exc, "code", ""),
                        )
                    )
                    return
                if ev is serveproto.NEED_DATA:
                    break
                if isinstance(ev, ConnectionClosed):
                    self._eof = True
                    if self._closing:
                        self._mark_failed(EngineUnavailable(f"engine {self.name!r} was closed", name=self.name))
                    else:
                        await self._fail(await self._crash_error("exited", serving=True))
                    return
                self._dispatch(ev)

    def _dispatch(self, ev: object) -> None:
        rid = getattr(ev, "id", None)
        if rid is None:
            if isinstance(ev, Telemetry):
                log.debug("engine %s telemetry: %r", self.name, ev.line)
            else:
                log.debug("engine %s: %r", self.name, ev)
            return
        req = self._inflight.get(rid)
        if req is None:
            if isinstance(ev, Error):
                # ERROR 0 (untied), or NOT_FOUND for a CANCEL that crossed its DONE.
                log.warning("engine %s: ERROR %d %s %s", self.name, rid, ev.code, ev.reason)
            else:
                log.warning("engine %s: frame for an id not in flight: %r", self.name, ev)
            return
        terminal = isinstance(ev, _TERMINAL)
        if not req.detached:
            req.send.send_nowait(ev)
        if terminal:
            del self._inflight[rid]
            req.send.close()
            if req.lease is not None:
                req.lease.end(isinstance(ev, Done))

    async def _watchdog(self) -> None:
        """PING the engine every ``health_interval`` s, busy or idle (it answers between its own
        frames, spec 9.3). A PONG that has not come within ``ping_timeout`` s fails the engine
        with :class:`EngineTimeout` (``what="stall"``) and shuts it down: every request in it gets
        that error at once, whatever its own deadline."""
        interval = self.options.health_interval
        assert interval is not None  # the watchdog runs only with one
        while True:
            await anyio.sleep(interval)
            req: Inflight | None = None
            self._ping_sent = anyio.current_time()
            with anyio.move_on_after(self.options.ping_timeout) as scope:
                try:
                    # not shielded: a PING line is written whole or not at all, and one that cannot
                    # even be written in time (a full pipe) is a stall too
                    req = await self.begin(lambda rid, _slot: Ping(id=rid), None, shield=False)
                except (EngineError, LocalProtocolError):
                    self._ping_sent = None
                    return
                try:
                    await req.recv.receive()  # the PONG, or the engine's failure
                except (anyio.EndOfStream, anyio.ClosedResourceError):
                    pass
            if req is not None:
                req.detached = True
                req.recv.close()
            if scope.cancelled_caught and self._failure is None and not self._closing:
                await self._log_stack()  # the PING stays unanswered meanwhile: /health says "unresponsive"
            self._ping_sent = None
            if self._failure is not None or self._closing:
                return
            if scope.cancelled_caught:
                await self._fail(
                    EngineTimeout(
                        f"engine {self.name!r} did not answer PING within {self.options.ping_timeout:g} s; killed",
                        name=self.name,
                        what="stall",
                        seconds=self.options.ping_timeout,
                    )
                )
                return

    async def _log_stack(self) -> None:
        """Ask a stalled engine that advertises ``x_stack`` (spec 9.3) for its main thread's stack:
        send the signal, then wait up to ``STACK_WAIT_S`` s for the closing line on stderr, which the
        stderr pump logs (the block bypasses ``stderr_lines_per_s``). Without the key: nothing."""
        sig_name = self.caps.values.get("x_stack") if self.caps is not None else None
        sig = getattr(signal, sig_name, None) if sig_name in ("SIGUSR1", "SIGUSR2") else None
        if sig is None:
            return
        log.warning(
            "engine %s: no PONG within %g s; asking for its stack (%s)", self.name, self.options.ping_timeout, sig_name
        )
        self._stack_done = anyio.Event()
        _signal(self._running, sig)
        with anyio.move_on_after(STACK_WAIT_S):
            await self._stack_done.wait()

    # ------------------------------------------------------------ stderr

    async def _pump_stderr(self) -> None:
        buf = b""
        try:
            async for chunk in self._stderr:
                buf += chunk
                *lines, buf = buf.split(b"\n")
                while len(buf) > MAX_STDERR_LINE:
                    lines.append(buf[:MAX_STDERR_LINE])
                    buf = buf[MAX_STDERR_LINE:]
                for line in lines:
                    self._log_stderr(line)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass
        finally:
            if buf:
                self._log_stderr(buf)
            if self._dropped_lines:
                self._stderr_log.warning(
                    "(%d stderr lines not logged: over %d lines/s)",
                    self._dropped_lines,
                    self.options.stderr_lines_per_s,
                )
            self._stderr_done.set()

    def _log_stderr(self, line: bytes) -> None:
        if len(line) > MAX_STDERR_LINE:
            line = line[:MAX_STDERR_LINE]
        text = line.decode("utf-8", "replace").rstrip("\r")
        self._stderr_tail.append(text)
        if self._stack_line(line, text):
            return
        if not self._stderr_log.isEnabledFor(logging.INFO):
            return
        now = anyio.current_time()
        if now - self._window_start >= 1.0:
            if self._dropped_lines:
                self._stderr_log.warning(
                    "(%d stderr lines not logged: over %d lines/s)",
                    self._dropped_lines,
                    self.options.stderr_lines_per_s,
                )
            self._window_start, self._window_lines, self._dropped_lines = now, 0, 0
        if self._window_lines < self.options.stderr_lines_per_s:
            self._window_lines += 1
            self._stderr_log.info("%s", text)
        else:
            self._dropped_lines += 1

    def _stack_line(self, line: bytes, text: str) -> bool:
        """Log a line of a stack block (spec 9.3) at WARNING, outside the rate limit; False for any
        other line. The block runs from the engine's opening line to its closing line, at most
        ``STACK_MAX_LINES`` lines."""
        _, sep, rest = line.partition(b": ")
        if self._stack_lines < 0:
            if not (sep and rest.startswith(STACK_OPEN)):
                return False
            self._stack_lines = 0
        self._stack_lines += 1
        self._stderr_log.warning("%s", text)
        if (sep and rest == STACK_CLOSE) or self._stack_lines >= STACK_MAX_LINES:
            self._stack_lines = -1
            self._stack_done.set()
        return True

    # ------------------------------------------------------------ requests

    @property
    def _running(self) -> anyio.abc.Process:
        """The OS process: :meth:`start` opens it before anything else reads it."""
        assert self._proc is not None
        return self._proc

    @property
    def _stdin(self) -> anyio.abc.ByteSendStream:
        stream = self._running.stdin
        assert stream is not None  # opened with stdin=PIPE
        return stream

    @property
    def _stdout(self) -> anyio.abc.ByteReceiveStream:
        stream = self._running.stdout
        assert stream is not None  # opened with stdout=PIPE
        return stream

    @property
    def _stderr(self) -> anyio.abc.ByteReceiveStream:
        stream = self._running.stderr
        assert stream is not None  # opened with stderr=PIPE
        return stream

    def _check_open(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._closing:
            raise EngineUnavailable(f"engine {self.name!r} is shutting down", name=self.name)

    async def acquire(self, slot: int | None = None, key: bytes = b"", pin: bool = False) -> SlotLease:
        """Wait for a slot (FIFO) and return its lease; see :class:`SlotRouter`."""
        self._check_open()
        assert self.router is not None  # set at the handshake, before any request
        return await self.router.acquire(slot, key, pin)

    async def begin(
        self,
        make: Callable[[int, int], serveproto.Event | tuple[serveproto.Event, ...]],
        lease: SlotLease | None,
        *,
        shield: bool = True,
    ) -> Inflight:
        """Send one request and return its :class:`Inflight`.

        ``make(id, slot)`` builds the request event (``Submit``, ``Score``, ...)
        with a fresh id, or a tuple of events written at once, nothing between them
        (``Image`` frames, then their ``Submit`` or ``Score``: one request);
        ``lease`` is the slot it runs on (``None`` for PING).
        The write is shielded from cancellation (a frame is never cut) unless
        ``shield`` is False. Raises the engine's failure if it is gone,
        ``LocalProtocolError`` if the connection refuses the event (nothing was
        sent then).
        """
        self._check_open()
        rid = self._next_id
        self._next_id += 1
        made = make(rid, lease.slot if lease is not None else 0)
        events = made if isinstance(made, tuple) else (made,)
        req = Inflight(rid, lease)
        self._inflight[rid] = req
        if lease is not None:
            lease.begin()
        if self._read_scope is not None and self.options.stall_timeout is not None:
            self._read_scope.deadline = min(
                self._read_scope.deadline, anyio.current_time() + self.options.stall_timeout
            )
        try:
            with anyio.CancelScope(shield=shield):
                await self._write(*events)
        except LocalProtocolError:
            if self._inflight.pop(rid, None) is not None:
                req.send.close()
                req.recv.close()
                if lease is not None:
                    lease.end()
            raise
        return req

    async def cancel(self, req: Inflight) -> None:
        """The caller gave up on ``req``: drop its later frames and send CANCEL.

        The slot stays taken until the engine ends the request (its ERROR
        CANCELLED or DONE). Bounded: gives up writing after CANCEL_WRITE_TIMEOUT s.
        """
        req.detached = True
        req.recv.close()
        if req.id not in self._inflight or self._failure is not None:
            return
        with anyio.CancelScope(shield=True) as scope:
            scope.deadline = anyio.current_time() + CANCEL_WRITE_TIMEOUT
            try:
                await self._write(Cancel(id=req.id))
            except LocalProtocolError as exc:
                log.warning("engine %s: could not cancel %d: %s", self.name, req.id, exc)

    async def _write(self, *events: serveproto.Event) -> None:
        async with self._write_lock:
            if self._failure is not None or self._closing or self._eof:
                # Not sent: the request is failed with the engine's error shortly.
                return
            data = b"".join(self._conn.send(event) for event in events)
            try:
                await self._stdin.send(data)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
                # The reader sees the EOF and fails everything with the exit status.
                log.debug("engine %s: write failed: %r", self.name, exc)


def _signal(proc: anyio.abc.Process, sig: int) -> None:
    """Send ``sig`` unless the process was reaped.

    ``os.kill`` rather than ``Popen.send_signal``: the latter polls first, and
    that ``waitpid`` would reap the child behind asyncio's child watcher.
    """
    if proc.returncode is None:
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError:
            pass
