"""The receive buffer: bytes fed in chunks, consumed frame by frame.

Chunks are joined lazily: ``pull()`` makes everything unconsumed contiguous
in ``data[pos:]``. A reader waiting for a payload of known size sets
``need`` so that feeding a large payload in many small chunks does not join
(and copy) the growing buffer once per chunk.
"""

from __future__ import annotations

__all__ = ["ReceiveBuffer"]


class ReceiveBuffer:
    """Unconsumed bytes of one direction of a connection.

    Attributes (read by the connection on its hot path):
        data: bytes; the contiguous part, consumed up to ``pos``.
        pos: index in ``data`` of the first unconsumed byte.
        need: the connection cannot make progress before ``len(self)`` reaches this.
        eof: the peer closed its end (``feed(b"")`` was called).
        chunked: bytes fed since the last ``pull()`` (not yet in ``data``).
    """

    __slots__ = ("data", "pos", "need", "eof", "chunked", "_chunks")

    def __init__(self) -> None:
        self.data = b""
        self.pos = 0
        self.need = 0
        self.eof = False
        self._chunks: list[bytes] = []
        self.chunked = 0

    def feed(self, chunk: bytes) -> None:
        """Append ``chunk`` (bytes-like); an empty chunk marks EOF."""
        if not chunk:
            self.eof = True
            return
        self._chunks.append(bytes(chunk))
        self.chunked += len(chunk)

    def __len__(self) -> int:
        """Unconsumed bytes, in bytes."""
        return len(self.data) - self.pos + self.chunked

    def pull(self) -> None:
        """Join the fed chunks onto the unconsumed bytes, so ``data[pos:]`` holds all of them."""
        if self._chunks:
            rest = self.data[self.pos :] if self.pos < len(self.data) else b""
            self._chunks.insert(0, rest)
            self.data = b"".join(self._chunks)
            self.pos = 0
            self._chunks = []
            self.chunked = 0

    def consume(self, n: int) -> int:
        """Drop up to ``n`` unconsumed bytes; return how many were dropped."""
        self.pull()
        n = min(n, len(self.data) - self.pos)
        self.pos += n
        return n
