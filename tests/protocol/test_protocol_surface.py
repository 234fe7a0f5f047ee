"""serveproto's public surface, as h11 keeps its own: a version, the connections, the
events, the states and the errors; every writer behind a connection's state machine."""

from __future__ import annotations

import configparser
import importlib.metadata
import pathlib
import re

import pytest

import serveproto as sp
from serveproto import _connection

ROOT = pathlib.Path(__file__).resolve().parents[2]

PUBLIC = {
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
}


def test_version_is_the_installed_distribution_s():
    assert re.fullmatch(r"\d+\.\d+\.\d+", sp.__version__)
    assert sp.__version__ == importlib.metadata.version("serveproto")
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert cfg["metadata"]["version"] == "attr: serveproto.__version__"  # one constant


def test_public_names_are_exactly_these_and_none_writes_past_the_state_machine():
    assert set(sp.__all__) == PUBLIC
    assert all(hasattr(sp, name) for name in sp.__all__)
    assert not hasattr(sp, "frame_bytes")
    assert sorted(n for n in dir(sp) if not n.startswith("_") and n not in PUBLIC) == []


def test_states_print_their_name_and_live_in_serveproto():
    for s in (sp.NEED_DATA, sp.HANDSHAKE, sp.SERVING, sp.CLOSED, sp.ERROR):
        assert repr(s) == s.__name__ and s.__module__ == "serveproto"
    assert sp.GatewayConnection().state is sp.HANDSHAKE


def test_next_event_is_framing_then_state():
    """The framing half reads an ECHO for a request never sent; the state half refuses it."""
    gw = sp.GatewayConnection()
    gw.receive_data(sp.EngineConnection().send_handshake())
    while gw.next_event() is not sp.NEED_DATA:
        pass
    frame = b"ECHO 5 1 3 -0.5 1 7 -0.25\nx\n"
    gw.receive_data(frame)
    framing_only = sp.GatewayConnection()
    framing_only.receive_data(frame)
    assert framing_only._extract_next_receive_event() == sp.Echo(5, 3, -0.5, ((7, -0.25),), b"x")
    with pytest.raises(sp.RemoteProtocolError, match="ECHO for id 5 not in flight") as info:
        gw.next_event()
    assert (info.value.code, info.value.request_id) == ("BAD_SEQUENCE", 5)
    assert gw.state is sp.ERROR


def test_the_echo_fast_path_keeps_the_payload_limit():
    """A plain ECHO over ``max_payload`` is refused as the general path refuses it."""
    second = b"ECHO 1 5 1 -0.5 1 7 -0.25\nabcde\n"
    assert _connection._read_plain_echo(second, 0, second.index(b"\n"), 4) is None
    gw = sp.GatewayConnection(max_payload=4)
    gw.receive_data(sp.EngineConnection().send_handshake())
    while gw.next_event() is not sp.NEED_DATA:
        pass
    gw.send(sp.Submit(1, 0, b"x", 0, 0.0, 1.0, logprobs=1))
    gw.receive_data(b"ECHO 1 4 0 -0.5 1 7 -0.25\nabcd\n" + second)
    assert gw.next_event() == sp.Echo(1, 0, -0.5, ((7, -0.25),), b"abcd")
    with pytest.raises(sp.RemoteProtocolError, match="payload size missing or over 4 bytes"):
        gw.next_event()
