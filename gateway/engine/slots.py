"""KV slots of one engine process: who runs on which slot, and who waits.

An engine runs one request per slot at a time (``SLOT_BUSY`` otherwise, spec
section 6), and runs the requests of different slots in the same decodes
(spec/llama-engine.md, "Many requests at once"). A caller holds a slot through
a :class:`SlotLease` for one *window* of requests (one request, or a scoring
group); waiters form one queue, served first come first served among those
that can use the slot that frees.

Which slot a request may use, when it names none, follows from its routing
key (its state's text):

* a slot whose last key shares at least ``AFFINE_SHARE`` of the request's key
  and half of its own (and at least ``MIN_SHARED_BYTES``) holds the request's
  state: an *affine* slot. Two support tickets that share the chat template's
  head and little else are not affine: waiting for one slot to reuse that head
  would serialise them;
* while the state has no snapshot on the engine, the request waits for an
  affine slot, where its rows are (another slot would compute the state
  again);
* once a request that pins the state has ended well, the engine holds a
  snapshot of it, which any slot restores by sharing its cells (a copy in the
  unified KV cache, nothing recomputed): the state is *ready*, and its
  requests take any free slot, affine ones first, those already waiting for
  its slot too. So one popular document is served from every slot at once
  instead of queueing on one;
* a request with no affine slot takes any free slot.

Among the free slots a request may use it takes the one that keeps the most
and drops the least of what the slots hold (shared prefix minus the rest of
the slot's key, in bytes), then the least recently used: a short prompt that
is a prefix of a long document's (the content-free reading's) goes to an
empty slot rather than truncating the document's.
"""

from __future__ import annotations

from collections import OrderedDict, deque

import anyio

#: A routing key shares a slot's state only when at least this many leading bytes match.
MIN_SHARED_BYTES = 64

#: The share of a request's routing key a slot's key must hold for the slot to hold its state.
AFFINE_SHARE = 0.9

#: Routing keys remembered as ready (their snapshot taken), least recently used forgotten first.
READY_KEYS = 64

#: The router routes by the first this many bytes of a key (1 MiB): a prompt that fits a context
#: is far shorter (4,096 tokens are about 16 KB of text), and a longer one, which the engine will
#: refuse, must not be kept whole by a slot, the ready keys or the shared-prefix cache.
MAX_KEY_BYTES = 1 << 20

#: What the ready keys may hold, in bytes of key (16 MiB), besides :data:`READY_KEYS`.
READY_BYTES = 16 << 20

#: What the shared-prefix cache may hold, in bytes of the key pairs it keeps alive (32 MiB).
PREFIX_CACHE_BYTES = 32 << 20


def _shared_prefix(a: bytes, b: bytes) -> int:
    """Length in bytes of the longest common prefix of ``a`` and ``b``.

    A binary search over slice comparisons (each a memcmp): keys are whole
    documents, and a byte-by-byte loop in Python would cost a millisecond each.
    """
    n = min(len(a), len(b))
    va, vb = memoryview(a), memoryview(b)
    if va[:n] == vb[:n]:
        return n
    lo, hi = 0, n  # va[:lo] == vb[:lo] and va[:hi] != vb[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if va[:mid] == vb[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class _PrefixCache:
    """:func:`_shared_prefix` remembered per key pair, least recently used forgotten first, within
    ``max_bytes`` bytes of the keys the pairs keep alive (``len(a) + len(b)`` per pair: an upper
    bound, since pairs share key objects).

    A release asks for every waiter and slot, mostly of the same key objects again (a bytes object
    keeps its hash, so a lookup is cheap). Bounded by bytes, not pairs: 2,048 pairs of refused
    15 MB states once kept 1.5 GB alive (issue 30, item 0).
    """

    def __init__(self, max_bytes: int = PREFIX_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.held = 0  # bytes of keys kept alive by the pairs, counted per pair
        self._pairs: OrderedDict[tuple[bytes, bytes], int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._pairs)

    def shared(self, a: bytes, b: bytes) -> int:
        """:func:`_shared_prefix` of ``a`` and ``b``, remembered."""
        pair = (a, b)
        n = self._pairs.get(pair)
        if n is not None:
            self._pairs.move_to_end(pair)
            return n
        n = _shared_prefix(a, b)
        size = len(a) + len(b)
        if size <= self.max_bytes:
            self._pairs[pair] = n
            self.held += size
            while self.held > self.max_bytes:
                (x, y), _ = self._pairs.popitem(last=False)
                self.held -= len(x) + len(y)
        return n


class _Slot:
    """One slot's state: busy or not, its last key, when it was last granted."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.busy = False
        self.key = b""
        self.last_used = 0


class _Waiter:
    """A caller waiting for a slot: its key, its explicit slot, the slot granted."""

    __slots__ = ("key", "slot", "event", "granted")

    def __init__(self, key: bytes, slot: int | None) -> None:
        self.key = key
        self.slot = slot
        self.event = anyio.Event()
        self.granted: int | None = None


class SlotLease:
    """The right to run requests on one slot, held for one window.

    The slot returns to the router when the lease is closed AND every request
    begun under it has ended on the engine's side (its DONE or ERROR arrived):
    a request cancelled by its caller keeps the slot until the engine confirms,
    so the next request never meets ``SLOT_BUSY``.
    """

    def __init__(self, router: SlotRouter, slot: int, key: bytes = b"", pin: bool = False) -> None:
        self._router = router
        self.slot = slot
        self.key = key
        self.pin = pin
        self._pending = 0
        self._closed = False
        self._returned = False

    def begin(self) -> None:
        """A request was sent on this slot (call once per request)."""
        self._pending += 1

    def end(self, ok: bool = False) -> None:
        """A request begun under this lease ended (its terminal frame, or the engine died).

        ``ok``: it ended with DONE; a pinning lease's key is then ready (its snapshot exists).
        """
        self._pending -= 1
        if ok and self.pin and self.key:
            self._router.mark_ready(self.key)
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
    """One queue of waiters and state-affinity routing for ``n_slots`` KV slots.

    Raises :class:`ValueError` for an explicit slot outside ``0 .. n_slots-1``.
    After :meth:`close` every waiter and every later :meth:`acquire` raises the
    exception given to ``close``.
    """

    def __init__(self, n_slots: int) -> None:
        if n_slots < 1:
            raise ValueError(f"slots must be at least 1, got {n_slots}")
        self._slots = [_Slot(i) for i in range(n_slots)]
        self._waiters: deque[_Waiter] = deque()
        self._ready: OrderedDict[bytes, None] = OrderedDict()
        self._ready_bytes = 0
        self._prefix = _PrefixCache()
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
        return len(self._waiters)

    def kept_bytes(self) -> int:
        """Bytes of routing keys this router keeps alive, at most: the slots' last keys, the ready
        keys and the shared-prefix cache's pairs, each counted where it is kept (an upper bound).
        At most ``n_slots * MAX_KEY_BYTES + READY_BYTES + PREFIX_CACHE_BYTES``."""
        return sum(len(s.key) for s in self._slots) + self._ready_bytes + self._prefix.held

    def mark_ready(self, key: bytes) -> None:
        """The engine holds a snapshot of ``key``'s state: its requests may take any slot.

        The :data:`READY_KEYS` latest keys are remembered, within :data:`READY_BYTES` bytes."""
        key = key[:MAX_KEY_BYTES]
        new = key not in self._ready
        if new:
            self._ready_bytes += len(key)
        self._ready[key] = None
        self._ready.move_to_end(key)
        while len(self._ready) > READY_KEYS or self._ready_bytes > READY_BYTES:
            old, _ = self._ready.popitem(last=False)
            self._ready_bytes -= len(old)
        if new:
            self._dispatch()

    def _dispatch(self) -> None:
        """Grants the free slots to the waiters that may take them now, first come first served, each the
        best of those it may take: once a state is ready, the requests queued for its slot take every free
        slot at once instead of that slot one at a time."""
        if not self._waiters or all(s.busy for s in self._slots):
            return
        for w in list(self._waiters):
            usable = self._usable(w)
            if usable:
                self._hand(w, usable[0])

    def is_ready(self, key: bytes) -> bool:
        return key[:MAX_KEY_BYTES] in self._ready

    def _affine(self, key: bytes, s: _Slot) -> bool:
        n = self._prefix.shared(key, s.key)
        return n >= MIN_SHARED_BYTES and n >= AFFINE_SHARE * len(key) and 2 * n >= len(s.key)

    def _gain(self, key: bytes, s: _Slot) -> int:
        n = self._prefix.shared(key, s.key)
        return n - (len(s.key) - n)

    def _any_slot(self, w: _Waiter) -> bool:
        """Whether routed waiter ``w`` may take any free slot: no key, a ready key, or no affine slot."""
        return not w.key or self.is_ready(w.key) or not any(self._affine(w.key, t) for t in self._slots)

    def _may_take(self, w: _Waiter, s: _Slot) -> bool:
        """Whether ``w`` may take slot ``s`` now (module docstring)."""
        if s.busy:
            return False
        if w.slot is not None:
            return w.slot == s.index
        return self._affine(w.key, s) or self._any_slot(w)

    def _usable(self, w: _Waiter) -> list[_Slot]:
        """The free slots ``w`` may take now, best first."""
        if w.slot is not None:
            return [s for s in self._slots[w.slot : w.slot + 1] if not s.busy]
        free = [s for s in self._slots if not s.busy]
        if free and not self._any_slot(w):  # affinity decided once, not once per free slot
            free = [s for s in free if self._affine(w.key, s)]
        return sorted(free, key=lambda s: (-self._gain(w.key, s), s.last_used, s.index))

    def route(self, key: bytes) -> int | None:
        """The free slot a request with routing ``key`` would take now, or ``None`` (it would wait)."""
        usable = self._usable(_Waiter(key[:MAX_KEY_BYTES], None))
        return usable[0].index if usable else None

    def _grant(self, w: _Waiter, s: _Slot) -> None:
        s.busy = True
        self._clock += 1
        s.last_used = self._clock
        if w.key:
            s.key = w.key
        w.granted = s.index

    def _hand(self, w: _Waiter, s: _Slot) -> None:
        """Gives free slot ``s`` to queued waiter ``w`` and wakes it."""
        self._waiters.remove(w)
        self._grant(w, s)
        w.event.set()

    async def acquire(self, slot: int | None = None, key: bytes = b"", pin: bool = False) -> SlotLease:
        """Wait for a slot and return its lease.

        ``slot``: an explicit slot (overrides routing), or ``None`` to route by
        ``key`` (module docstring). ``pin``: the requests of this window pin
        ``key``'s state; one that ends with DONE makes the key ready.
        Only the first :data:`MAX_KEY_BYTES` bytes of ``key`` are routed by and kept.
        Cancellation while waiting leaves the queue cleanly.
        """
        key = key[:MAX_KEY_BYTES]  # the same object when shorter
        if self._closed is not None:
            raise self._closed
        if slot is not None and not 0 <= slot < len(self._slots):
            raise ValueError(f"slot: {slot} is out of range 0..{len(self._slots) - 1}")
        w = _Waiter(key, slot)
        usable = self._usable(w)
        if usable:
            self._grant(w, usable[0])
        else:
            self._waiters.append(w)
            try:
                await w.event.wait()
            except BaseException:
                if w.granted is None:
                    if w in self._waiters:
                        self._waiters.remove(w)
                elif self._closed is None:
                    # The slot was handed to us as we were cancelled: pass it on.
                    self._release(w.granted)
                raise
            if self._closed is not None:
                raise self._closed
        assert w.granted is not None
        return SlotLease(self, w.granted, key, pin)

    def _release(self, slot: int) -> None:
        s = self._slots[slot]
        s.busy = False
        # first come first served among the waiters that may take this slot
        for w in self._waiters:
            if self._may_take(w, s):
                self._hand(w, s)
                break
        # the grant moved this slot's key: a waiter whose state it held may now take any other free slot
        self._dispatch()

    def close(self, exc: BaseException) -> None:
        """Fail every waiter and every later acquire with ``exc``."""
        if self._closed is not None:
            return
        self._closed = exc
        while self._waiters:
            self._waiters.popleft().event.set()
