"""Request frames typed by hand in ``serveproto drive``, parsed by serveproto itself.

The typed bytes go through an engine-side ``serveproto.EngineConnection`` (the
same strict parser an engine uses), so a frame is accepted exactly when an
engine would accept it, and the supervisor then sends the resulting event.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import serveproto
from serveproto import Caps, EngineConnection, Ready, Stat

#: CAPS the parser pretends to have sent, so that every extension key parses;
#: the real engine still answers NOT_SUPPORTED for what it lacks.
_ALL_CAPS = {"decide": "1", "vision": "1", "x_score": "1", "x_counters": "1", "x_health": "1"}


def request_parser() -> EngineConnection:
    """An EngineConnection past its handshake, ready to parse request frames."""
    conn = EngineConnection()
    conn.send(Ready())
    conn.send(Caps(values=dict(_ALL_CAPS)))
    conn.send(Stat(fields=(0.0, 0.0, 0.0, 0.0)))
    return conn


async def read_frame(first_line: str, more: Callable[[], Awaitable[str]]) -> Any:
    """Parse one typed request frame: ``first_line``, then its payload from ``more()``.

    ``more`` returns the next typed line (with its ``\\n``), ``""`` at end of
    input. Returns the request event. Raises ``serveproto.RemoteProtocolError``
    for a frame an engine would refuse (its ``code``, e.g. ``BAD_FRAME``), and
    EOFError when the input ends inside the payload.
    """
    conn = request_parser()
    conn.receive_data(first_line.rstrip("\n").encode("utf-8") + b"\n")
    while True:
        ev = conn.next_event()
        if ev is not serveproto.NEED_DATA:
            return ev
        line = await more()
        if not line:
            raise EOFError("the input ended inside the frame's payload")
        conn.receive_data(line.encode("utf-8"))
