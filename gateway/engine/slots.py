"""KV slots of one engine process: who runs on which slot, and who waits.

An engine runs one request per slot at a time (``SLOT_BUSY`` otherwise, spec
section 6). Each slot has a FIFO queue, so waiting clients are served in
arrival order; a caller holds a slot through a :class:`SlotLease` for one
*window* of requests (one request, or a scoring group) and the next waiter gets
the slot between windows. Requests without an explicit slot are routed to the
slot whose last routing key shares the longest prefix with theirs, so requests
over the same state or prefix meet their snapshot again.
"""
from __future__ import annotations

import os
from collections import deque

import anyio

#: A routing key shares a slot's state when at least this many leading bytes
#: match, and at least half of the key (shorter shared prefixes, such as a chat
#: template's fixed system turn, do not pin unrelated states to one slot).
MIN_SHARED_BYTES = 64


def _shared_prefix(a: bytes, b: bytes) -> int:
    """Length in bytes of the longest common prefix of ``a`` and ``b``."""
    return len(os.path.commonprefix([a, b]))


class _Slot:
    """One slot's state: busy or not, its FIFO of waiters, its last key."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.busy = False
        self.waiters: deque[anyio.Event] = deque()
        self.key = b""
        self.last_used = 0

    @property
    def load(self) -> int:
        return int(self.busy) + len(self.waiters)


class SlotLease:
    """The right to run requests on one slot, held for one window.

    The slot returns to the router when the lease is closed AND every request
    begun under it has ended on the engine's side (its DONE or ERROR arrived):
    a request cancelled by its caller keeps the slot until the engine confirms,
    so the next request never meets ``SLOT_BUSY``.
    """

    def __init__(self, router: SlotRouter, slot: int) -> None:
        self._router = router
        self.slot = slot
        self._pending = 0
        self._closed = False
        self._returned = False

    def begin(self) -> None:
        """A request was sent on this slot (call once per request)."""
        self._pending += 1

    def end(self) -> None:
        """A request begun under this lease ended (its terminal frame, or the engine died)."""
        self._pending -= 1
        self._maybe_return()

    def close(self) -> None:
        """The holder starts no more requests; idempotent."""
        self._closed = True
        self._maybe_return()

    def _maybe_return(self) -> None:
        if self._closed and self._pending <= 0 and not self._returned:
            self._returned = True
            self._router._release(self.slot)


class SlotRouter:
    """FIFO slot queues and prefix-affinity routing for ``n_slots`` KV slots.

    Raises :class:`ValueError` for an explicit slot outside ``0 .. n_slots-1``.
    After :meth:`close` every waiter and every later :meth:`acquire` raises the
    exception given to ``close``.
    """

    def __init__(self, n_slots: int) -> None:
        if n_slots < 1:
            raise ValueError(f"slots must be at least 1, got {n_slots}")
        self._slots = [_Slot(i) for i in range(n_slots)]
        self._closed: BaseException | None = None
        self._clock = 0

    @property
    def n_slots(self) -> int:
        return len(self._slots)

    def busy(self) -> int:
        """How many slots are running a window now."""
        return sum(s.busy for s in self._slots)

    def waiting(self) -> int:
        """How many callers wait for a slot."""
        return sum(len(s.waiters) for s in self._slots)

    def route(self, key: bytes) -> int:
        """The slot a request with routing ``key`` should queue on.

        The slot whose last key shares the longest prefix with ``key`` wins when
        that prefix is at least ``MIN_SHARED_BYTES`` and half of ``key``;
        otherwise the least loaded slot (busy + waiting), least recently used first.
        """
        best, best_len = None, 0
        for s in self._slots:
            n = _shared_prefix(key, s.key)
            if n > best_len:
                best, best_len = s, n
        if best is not None and best_len >= MIN_SHARED_BYTES and 2 * best_len >= len(key):
            return best.index
        return min(self._slots, key=lambda s: (s.load, s.last_used)).index

    async def acquire(self, slot: int | None = None, key: bytes = b"") -> SlotLease:
        """Wait (FIFO) for a slot and return its lease.

        ``slot``: an explicit slot (overrides routing), or ``None`` to route by
        ``key``. Cancellation while waiting leaves the queue cleanly.
        """
        if self._closed is not None:
            raise self._closed
        if slot is None:
            slot = self.route(key)
        elif not 0 <= slot < len(self._slots):
            raise ValueError(f"slot: {slot} is out of range 0..{len(self._slots) - 1}")
        s = self._slots[slot]
        if not s.busy and not s.waiters:
            s.busy = True
        else:
            ev = anyio.Event()
            s.waiters.append(ev)
            try:
                await ev.wait()
            except BaseException:
                if ev in s.waiters:
                    s.waiters.remove(ev)
                elif self._closed is None:
                    # The slot was handed to us as we were cancelled: pass it on.
                    self._release(slot)
                raise
            if self._closed is not None:
                raise self._closed
        self._clock += 1
        s.last_used = self._clock
        if key:
            s.key = key
        return SlotLease(self, slot)

    def _release(self, slot: int) -> None:
        s = self._slots[slot]
        if s.waiters:
            s.waiters.popleft().set()   # ownership passes; the slot stays busy
        else:
            s.busy = False

    def close(self, exc: BaseException) -> None:
        """Fail every waiter and every later acquire with ``exc``."""
        if self._closed is not None:
            return
        self._closed = exc
        for s in self._slots:
            while s.waiters:
                s.waiters.popleft().set()
