"""The supervisor's typed errors: whose fault, and what the caller can do.

Engine-level errors (:class:`EngineError` and subclasses) mean the engine
process is gone or unusable; every request in it fails with the same one.
:class:`RequestError` means the engine refused or failed one request and keeps
serving the others (an ``ERROR <id> <CODE> <reason>`` frame, spec section 7).
"""

from __future__ import annotations


class EngineError(Exception):
    """Base of every supervisor error about an engine process.

    ``name`` is the engine's name (as given to ``Engine.spawn``), or ``""``.
    """

    def __init__(self, message: str, *, name: str = "") -> None:
        super().__init__(message)
        self.name = name


class EngineLoadError(EngineError):
    """The engine answered the handshake with ``LOAD_FAIL kind=<kind> <detail>``.

    ``kind`` is one of ``nomem``, ``io``, ``format``, ``unsupported`` (spec
    section 3); ``detail`` is the engine's free text (may be empty).
    """

    def __init__(self, kind: str, detail: str, *, name: str = "") -> None:
        super().__init__(f"engine {name!r} could not load its model: kind={kind} {detail}".rstrip(), name=name)
        self.kind = kind
        self.detail = detail


class EngineCrashed(EngineError):
    """The engine process exited or closed its stdout.

    ``returncode``: the exit status (negative: killed by that signal), or
    ``None`` when the process had not been reaped yet. ``stderr_tail``: the
    last lines it wrote on stderr, oldest first: for the server's log (the
    gateway logs them when the engine dies), never in the message, which a
    client may read in a 503 (a start-up warning is not why an engine died).
    """

    def __init__(
        self, message: str, *, name: str = "", returncode: int | None = None, stderr_tail: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message, name=name)
        self.returncode = returncode
        self.stderr_tail = stderr_tail


class EngineProtocolError(EngineError):
    """The engine wrote something the serve protocol does not allow.

    ``code`` is the protocol error code the ``serveproto`` parser gave (e.g.
    ``BAD_FRAME``); the engine is killed, it cannot be trusted to stay in step.
    """

    def __init__(self, message: str, *, name: str = "", code: str = "") -> None:
        super().__init__(message, name=name)
        self.code = code


class EngineTimeout(EngineError):
    """A deadline passed: the handshake, one request, or the engine stopped answering.

    ``what`` says which: ``"handshake"``, ``"request"`` (one request past its own
    deadline: it was cancelled, the engine keeps serving) or ``"stall"`` (the
    engine wrote nothing for ``stall_timeout`` seconds while requests were in
    flight: it was killed and every request in it failed). ``seconds`` is the
    deadline that passed.
    """

    def __init__(self, message: str, *, name: str = "", what: str = "request", seconds: float = 0.0) -> None:
        super().__init__(message, name=name)
        self.what = what
        self.seconds = seconds


class EngineUnavailable(EngineError):
    """No engine process can take the request: the supervisor was closed, or it
    gave up after its restart intensity was exceeded (``last_error`` says why
    the last process ended)."""

    def __init__(self, message: str, *, name: str = "", last_error: BaseException | None = None) -> None:
        super().__init__(message, name=name)
        self.last_error = last_error


class EngineBusy(EngineError):
    """The request was refused without queueing: ``waiting`` callers already
    wait for a slot, the engine's ``max_waiting`` (an HTTP server answers 503
    with ``Retry-After``)."""

    def __init__(self, message: str, *, name: str = "", waiting: int = 0) -> None:
        super().__init__(message, name=name)
        self.waiting = waiting


class RequestError(Exception):
    """The engine ended one request with ``ERROR <id> <code> <reason>``.

    ``code`` is the spec's error code (section 7: ``BAD_REQUEST``,
    ``SLOT_BUSY``, ``DECIDE_INVALID``, ``NOT_SUPPORTED``, ``CANCELLED``, ...),
    ``reason`` the free text (for ``DECIDE_INVALID``, ``<field>: <reason>``),
    ``request_id`` the frame's id. The engine keeps serving.
    """

    def __init__(self, code: str, reason: str = "", *, request_id: int = 0) -> None:
        super().__init__(f"{code}: {reason}" if reason else code)
        self.code = code
        self.reason = reason
        self.request_id = request_id
