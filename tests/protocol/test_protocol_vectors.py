"""Every conformance vector of spec/vectors/, both ways, through serveproto."""

from __future__ import annotations

import pytest

import serveproto as sp
from serveproto import _writers
from serveproto._writers import write as frame_bytes  # the bare writer, no state machine
from test_protocol_support import CodecGateway, b, decode_all, engine, expected_event, load, same

REQUESTS = load("requests")
REPLIES = load("replies")
INVALID = load("invalid")


def _ids(vecs):
    return [v["name"] for v in vecs]


def test_vector_names_unique_and_directions_right():
    for vecs, direction in ((REQUESTS, "gateway->engine"), (REPLIES, "engine->gateway")):
        assert len(set(_ids(vecs))) == len(vecs)
        assert {v["direction"] for v in vecs} == {direction}
    assert len(set(_ids(INVALID))) == len(INVALID)


def test_every_event_kind_has_a_vector():
    kinds = {v["event"] for v in REQUESTS + REPLIES}
    frames = {c.__name__ for c in _writers.WRITERS}
    assert kinds == frames


@pytest.mark.parametrize("vec", REQUESTS, ids=_ids(REQUESTS))
def test_request_decodes(vec):
    conn = engine(vec.get("caps"))
    events = decode_all(conn, b(vec["frame"]))
    assert len(events) == 1
    assert same(events[0], expected_event(vec)), (events[0], vec["fields"])
    assert conn.trailing_data == (b"", False)


@pytest.mark.parametrize("vec", REPLIES, ids=_ids(REPLIES))
def test_reply_decodes(vec):
    conn = CodecGateway()
    events = decode_all(conn, b(vec["frame"]))
    assert len(events) == 1
    assert same(events[0], expected_event(vec)), (events[0], vec["fields"])
    assert conn.trailing_data == (b"", False)


@pytest.mark.parametrize("vec", REQUESTS + REPLIES, ids=_ids(REQUESTS + REPLIES))
def test_vector_writes(vec):
    written = b(vec.get("written", vec["frame"]))
    assert frame_bytes(expected_event(vec)) == written


@pytest.mark.parametrize(
    "vec",
    [v for v in REQUESTS + REPLIES if "written" in v],
    ids=_ids([v for v in REQUESTS + REPLIES if "written" in v]),
)
def test_canonical_form_decodes_to_same_fields(vec):
    conn = engine(vec.get("caps")) if vec["direction"] == "gateway->engine" else CodecGateway()
    (event,) = decode_all(conn, b(vec["written"]))
    assert same(event, expected_event(vec))


@pytest.mark.parametrize("vec", INVALID, ids=_ids(INVALID))
def test_invalid_frame_refused(vec):
    frame = b(vec["frame"])
    if vec["direction"] == "gateway->engine":
        conn = engine(vec.get("caps"), **vec.get("limits", {}))
    else:
        conn = CodecGateway(**vec.get("limits", {}))
    conn.receive_data(frame)
    with pytest.raises(sp.RemoteProtocolError) as info:
        while conn.next_event() is not sp.NEED_DATA:
            pass
    assert (info.value.code, info.value.request_id) == (vec["code"], vec["request_id"]), info.value
    if vec["direction"] == "engine->gateway":
        assert conn.state is sp.ERROR
        with pytest.raises(sp.RemoteProtocolError):
            conn.next_event()
        return
    left, _ = conn.trailing_data
    assert len(frame) - len(left) == vec["consumed"]
    if vec["consumed"] == len(frame):
        # the engine's connection stays usable: the next frame decodes
        assert decode_all(conn, b"STOP 99\n") == [sp.Stop(99)]
