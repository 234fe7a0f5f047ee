"""The serve protocol, sans-IO.

The line protocol between a gateway and an engine process (spec:
``spec/serve-protocol.md``), as h11 does HTTP: no I/O, no async. Feed bytes
to a connection with ``receive_data``, pull typed events with
``next_event`` (or ``NEED_DATA``), turn events into bytes with ``send``::

    conn = GatewayConnection()
    conn.receive_data(engine_stdout_bytes)      # b"" on EOF
    ev = conn.next_event()                      # Ready(), Caps(...), ..., NEED_DATA
    stdin.write(conn.send(Submit(id=1, slot=0, prompt=b"Hi", max_tokens=0,
                                 temperature=0.0, top_p=1.0, logprobs=1)))

``EngineConnection`` is the engine's end of the same wire.
"""

from ._connection import EngineConnection, GatewayConnection
from ._errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from ._events import (
    Accept,
    Cancel,
    Caps,
    ConnectionClosed,
    Data,
    Decide,
    Decision,
    Done,
    Echo,
    Error,
    Event,
    Hidden,
    Image,
    LoadFail,
    Ping,
    Pong,
    Ready,
    Score,
    Scored,
    Stat,
    Stop,
    Submit,
    Telemetry,
    score_shape,
)
from ._state import CLOSED, ERROR, HANDSHAKE, NEED_DATA, SERVING

#: The distribution's version (PEP 440); setup.cfg reads it from here.
__version__ = "0.1.0"

__all__ = [
    "__version__",
    "GatewayConnection",
    "EngineConnection",
    "NEED_DATA",
    "HANDSHAKE",
    "SERVING",
    "CLOSED",
    "ERROR",
    "ProtocolError",
    "LocalProtocolError",
    "RemoteProtocolError",
    "Event",
    "ConnectionClosed",
    "Ready",
    "Caps",
    "Stat",
    "LoadFail",
    "Telemetry",
    "Submit",
    "Image",
    "Stop",
    "Cancel",
    "Decide",
    "Score",
    "Ping",
    "Accept",
    "Echo",
    "Data",
    "Decision",
    "Done",
    "Error",
    "Scored",
    "Hidden",
    "Pong",
    "score_shape",
]
