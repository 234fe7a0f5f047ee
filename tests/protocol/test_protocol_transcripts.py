"""The conversations of spec/vectors/transcripts.json: the handshake and
per-request state machines of both roles, fed whole, byte by byte, and split
at every byte."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import serveproto as sp
from test_protocol_support import CodecGateway, b, engine, load, same

TRANSCRIPTS = load("transcripts")
IDS = [t["name"] for t in TRANSCRIPTS]

Chunker = Callable[[int, bytes], list[bytes]]


def whole(step: int, data: bytes) -> list[bytes]:
    return [data]


def bytewise(step: int, data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


def _decode_sent(role: str, frame: bytes) -> sp.Event:
    """The event a sent frame stands for, decoded by the peer's codec."""
    peer = engine() if role == "gateway" else CodecGateway()
    peer.receive_data(frame)
    e = peer.next_event()
    assert peer.next_event() is sp.NEED_DATA
    return e


def _pull(conn, out: list) -> None:
    """Pull events into ``out`` until NEED_DATA or ConnectionClosed."""
    while True:
        e = conn.next_event()
        if e is sp.NEED_DATA:
            return
        out.append(e)
        if isinstance(e, sp.ConnectionClosed):
            return


def run(t: dict, chunker: Chunker = whole) -> list:
    """Run transcript ``t``; return every event received. Asserts each step."""
    role = t["role"]
    conn = sp.GatewayConnection() if role == "gateway" else sp.EngineConnection()
    received: list = []
    for n, step in enumerate(t["steps"]):
        if "send" in step:
            frame = b(step["send"])
            event = _decode_sent(role, frame)
            if "error" in step:
                with pytest.raises(sp.LocalProtocolError) as info:
                    conn.send(event)
                assert (info.value.code, info.value.request_id) == (step["error"], step["request_id"])
            else:
                assert conn.send(event) == frame
            continue
        got: list = []
        if step.get("recv_eof"):
            feeds = [b""]
        else:
            data = b(step["recv"])
            feeds = chunker(n, data) if data else []
        fed = 0
        try:
            if not feeds:
                _pull(conn, got)
            for chunk in feeds:
                conn.receive_data(chunk)
                fed += 1
                _pull(conn, got)
        except sp.RemoteProtocolError as exc:
            for chunk in feeds[fed:]:  # the rest of the step's bytes still arrive
                conn.receive_data(chunk)
            assert "error" in step, exc
            assert (exc.code, exc.request_id) == (step["error"], step["request_id"]), exc
        else:
            assert "error" not in step, f"step {n}: no error raised"
        assert [type(e).__name__ for e in got] == step["events"], f"step {n}"
        if "unfinished" in step:
            assert got[-1].unfinished == tuple(step["unfinished"])
        received += got
        if "error" in step and role == "gateway":
            assert conn.state is sp.ERROR
    return received


@pytest.mark.parametrize("t", TRANSCRIPTS, ids=IDS)
def test_transcript(t):
    run(t)


@pytest.mark.parametrize("t", TRANSCRIPTS, ids=IDS)
def test_transcript_byte_by_byte(t):
    assert same(run(t, bytewise), run(t))


def test_transcripts_split_at_every_byte():
    """Each received chunk cut in two at every position gives the same events."""
    runs = 0
    for t in TRANSCRIPTS:
        reference = run(t)
        for n, step in enumerate(t["steps"]):
            data = b(step.get("recv", ""))
            for i in range(1, len(data)):

                def split(k: int, d: bytes, n=n, i=i) -> list[bytes]:
                    return [d[:i], d[i:]] if k == n else [d]

                assert same(run(t, split), reference), (t["name"], n, i)
                runs += 1
    assert runs > 4000  # every recv byte of every transcript was a split point
