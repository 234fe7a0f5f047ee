"""A bounded set of keys remembered by their hash: what a memory of requests may keep of their texts.

A key that is a prompt (a fixed prefix, a state) can be as long as the engine's context; a set of
the latest ``limit`` of their hashes answers "seen lately?" while keeping no text alive (issue 30,
item 0: what a cache keeps must be bounded by bytes, not only by entries).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

__all__ = ["KeySet", "KeyCounts"]


class KeySet:
    """The ``limit`` keys added last, least recently added or tested forgotten first, each kept as
    its ``hash`` (8 bytes, plus the table's own): ``key in s``, ``s[key] = True`` (as a dict of
    flags), ``s.pop(key, None)``, ``len(s)``. Two keys with one hash count as one (a 64-bit hash
    of a str: about one pair in 2**64); a memory that uses it must be a hint, never an answer."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit: must be at least 1, got {limit}")
        self.limit = limit
        self._hashes: OrderedDict[int, None] = OrderedDict()

    def __contains__(self, key: Hashable) -> bool:
        h = hash(key)
        if h in self._hashes:
            self._hashes.move_to_end(h)
            return True
        return False

    def __setitem__(self, key: Hashable, value: bool) -> None:
        if not value:
            self.pop(key, None)
            return
        h = hash(key)
        self._hashes[h] = None
        self._hashes.move_to_end(h)
        while len(self._hashes) > self.limit:
            self._hashes.popitem(last=False)

    def pop(self, key: Hashable, default: object = None) -> object:
        """Forget ``key``; True if it was kept, else ``default``."""
        return True if self._hashes.pop(hash(key), 0) is None else default

    def __len__(self) -> int:
        return len(self._hashes)


class KeyCounts:
    """The ``limit`` keys set last, each with a count (a non-negative int), least recently set or read
    forgotten first, each kept as its ``hash``: ``key in s``, ``s.get(key)`` (None when not kept),
    ``s[key] = n``, ``s.pop(key, None)``, ``len(s)``. A hint, never an answer, as :class:`KeySet`."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit: must be at least 1, got {limit}")
        self.limit = limit
        self._counts: OrderedDict[int, int] = OrderedDict()

    def __contains__(self, key: Hashable) -> bool:
        return self.get(key) is not None

    def get(self, key: Hashable) -> int | None:
        h = hash(key)
        n = self._counts.get(h)
        if n is not None:
            self._counts.move_to_end(h)
        return n

    def __setitem__(self, key: Hashable, count: int) -> None:
        if count < 0:
            raise ValueError(f"count: must be at least 0, got {count}")
        h = hash(key)
        self._counts[h] = int(count)
        self._counts.move_to_end(h)
        while len(self._counts) > self.limit:
            self._counts.popitem(last=False)

    def pop(self, key: Hashable, default: int | None = None) -> int | None:
        """Forget ``key``; its count if it was kept, else ``default``."""
        return self._counts.pop(hash(key), default)

    def __len__(self) -> int:
        return len(self._counts)
