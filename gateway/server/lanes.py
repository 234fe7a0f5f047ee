"""Fair scheduling of batch items beside single requests, per engine.

A batch of 1,000 states submitted at once would queue 1,000 requests for an engine's slots, and a
single request arriving behind them would wait for all of them. Instead the items of every batch an
engine answers take a *lane* first: at most ``slots - 1`` lanes (one with a single slot), so at least
one slot stays for single requests, which queue for the engine's slots as before and never behind a
batch's remaining items. Items take lanes in arrival order (anyio's limiter is FIFO).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio


class Lanes:
    """The batch lanes of one engine. ``waiting``: batch items waiting for a lane now (the queue gauge
    counts them, :mod:`gateway.server.metrics`)."""

    def __init__(self) -> None:
        self.waiting = 0
        self._limiter: anyio.CapacityLimiter | None = None

    @staticmethod
    def capacity(slots: int) -> int:
        """Batch items an engine of ``slots`` slots answers at once: ``slots - 1``, at least 1."""
        return max(1, slots - 1)

    @asynccontextmanager
    async def lane(self, slots: int) -> AsyncIterator[None]:
        """Hold one lane of an engine with ``slots`` slots (CAPS ``slots``, read each time: a restarted
        engine may have another count) while the body runs; waits, in order, for one to be free."""
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.capacity(slots))
        elif self._limiter.total_tokens != self.capacity(slots):
            self._limiter.total_tokens = self.capacity(slots)
        limiter = self._limiter
        token = object()
        self.waiting += 1
        try:
            await limiter.acquire_on_behalf_of(token)
        finally:
            self.waiting -= 1
        try:
            yield
        finally:
            limiter.release_on_behalf_of(token)
