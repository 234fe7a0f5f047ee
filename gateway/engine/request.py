"""The caller's end of one request: an async iterator of its reply events.

A :class:`RequestStream` starts its request lazily (first ``__anext__`` or
``__aenter__``), yields ``Accept`` / ``Echo`` / ``Data`` / ``Scored`` /
``Decision`` / ``Pong`` events and finally ``Done``; an ``ERROR`` frame raises
:class:`RequestError`, an engine failure raises the engine's error. A deadline
or a cancellation of the caller sends ``CANCEL`` and detaches, through the
same path.
"""

from __future__ import annotations

import math
from typing import Any, Awaitable, Callable  # noqa: UP035  (Starter below is a runtime alias)

import anyio

from gateway.engine.errors import EngineCrashed, EngineTimeout, RequestError
from gateway.engine.process import EngineProcess, Inflight
from serveproto import Done, Error, Pong

Starter = Callable[[], Awaitable[tuple[EngineProcess, Inflight]]]


class RequestStream:
    """Reply events of one request, in the order the engine wrote them.

    Use as ``async for ev in stream`` (a caller cancelled mid-request sends
    CANCEL), or as ``async with stream: async for ev in stream`` to also send
    CANCEL when the loop is left early with ``break``. ``timeout`` (seconds,
    from the first use, slot queueing included) raises :class:`EngineTimeout`
    with ``what="request"`` after cancelling the request.
    """

    def __init__(self, start: Starter, *, timeout: float | None = None, name: str = "") -> None:
        self._starter = start
        self._timeout = timeout
        self._deadline: float | None = None
        self._proc: EngineProcess | None = None
        self._req: Inflight | None = None
        self._finished = False
        self.name = name

    @property
    def request_id(self) -> int | None:
        """The id the request was sent with, or ``None`` before it was sent."""
        return self._req.id if self._req is not None else None

    @property
    def slot(self) -> int | None:
        """The KV slot the request runs on, or ``None`` before it was sent."""
        if self._req is None or self._req.lease is None:
            return None
        return self._req.lease.slot

    def __aiter__(self) -> RequestStream:
        return self

    async def __aenter__(self) -> RequestStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Give up on the request: CANCEL if it is still running; idempotent."""
        if not self._finished:
            self._finished = True
            if self._req is not None and self._proc is not None:  # set together by the starter
                await self._proc.cancel(self._req)

    async def __anext__(self) -> Any:
        if self._finished:
            raise StopAsyncIteration
        if self._deadline is None:
            self._deadline = anyio.current_time() + self._timeout if self._timeout is not None else math.inf
        item = None
        try:
            with anyio.CancelScope(deadline=self._deadline) as scope:
                if self._req is None:
                    self._proc, self._req = await self._starter()
                item = await self._req.recv.receive()
        except anyio.EndOfStream:
            self._finished = True
            rid = self._req.id if self._req is not None else None
            raise EngineCrashed(f"request {rid} ended without DONE or ERROR", name=self.name) from None
        except anyio.ClosedResourceError:
            # Another task closed this stream (aclose) while we waited for its frames.
            self._finished = True
            rid = self._req.id if self._req is not None else 0
            raise RequestError("CANCELLED", "closed by aclose() in another task", request_id=rid) from None
        except BaseException:
            # Cancelled by the caller (or anything unexpected): CANCEL, then re-raise.
            with anyio.CancelScope(shield=True):
                await self.aclose()
            raise
        if scope.cancelled_caught:
            with anyio.CancelScope(shield=True):
                await self.aclose()
            raise EngineTimeout(
                f"request to engine {self.name!r} did not finish within {self._timeout} s; cancelled",
                name=self.name,
                what="request",
                seconds=self._timeout or 0.0,
            )
        if isinstance(item, BaseException):
            self._finish()
            raise item
        if isinstance(item, Error):
            self._finish()
            raise RequestError(item.code, item.reason, request_id=item.id)
        if isinstance(item, (Done, Pong)):
            self._finish()
        return item

    def _finish(self) -> None:
        self._finished = True
        if self._req is not None:
            self._req.recv.close()
