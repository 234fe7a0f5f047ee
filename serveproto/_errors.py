"""The error hierarchy: one base class, split by whose fault the error is.

Modelled on h11: ``LocalProtocolError`` means *we* were about to break the
protocol (a bad event, or an event at the wrong time); ``RemoteProtocolError``
means the *peer* did (a frame that does not parse, or a broken invariant).
"""

from __future__ import annotations

__all__ = ["ProtocolError", "LocalProtocolError", "RemoteProtocolError"]


class ProtocolError(Exception):
    """A breach of the serve protocol (``spec/serve-protocol.md``).

    Attributes:
        code: the protocol's error code (spec section 7), e.g. ``"BAD_FRAME"``.
            Besides the codes of section 7 the implementation uses
            ``"BAD_SEQUENCE"`` (a well-formed frame or event at the wrong time:
            out of the handshake order, or breaking a per-request invariant of
            section 5) and ``"NOT_SUPPORTED"`` (an extension the engine did not
            advertise).
        request_id: the request id the error is tied to (``0`` when it cannot
            be tied to one, as in ``ERROR 0 BAD_FRAME``).
        reason: human-readable text; also ``str(error)``.

    Not raised directly: see the two subclasses.
    """

    def __init__(self, reason: str, code: str = "BAD_FRAME", request_id: int = 0) -> None:
        if type(self) is ProtocolError:
            raise TypeError("raise LocalProtocolError or RemoteProtocolError, not ProtocolError")
        super().__init__(reason)
        self.reason = reason
        self.code = code
        self.request_id = request_id

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.reason!r}, code={self.code!r}, request_id={self.request_id})"


class LocalProtocolError(ProtocolError):
    """We tried to break the protocol: an event with a bad field (raised where
    it is built), or ``send()`` of an event the connection's state forbids.
    Nothing was written; the connection is unchanged."""


class RemoteProtocolError(ProtocolError):
    """The peer broke the protocol: a frame that does not parse, or a frame
    at the wrong time. On the gateway side the connection is then in state
    ``ERROR`` for good; on the engine side the offending frame was skipped
    and the connection stays usable, so the engine can answer
    ``ERROR <request_id> <code> <reason>`` and go on."""
