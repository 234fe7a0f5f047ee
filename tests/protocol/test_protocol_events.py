"""Events refuse bad fields where they are built; typed CAPS; connection edges
the vectors do not reach (limits across chunks, EOF, misuse)."""

from __future__ import annotations

import json
import math

import pytest

import serveproto as sp
from serveproto import _connection
from serveproto._writers import write as frame_bytes  # the bare writer, no state machine
from test_protocol_support import CodecGateway, engine


def _refused(fn, *args, field: str, request_id: int = 0, **kw) -> None:
    with pytest.raises(sp.LocalProtocolError) as info:
        fn(*args, **kw)
    assert info.value.reason.startswith(field + ":"), info.value.reason
    assert (info.value.code, info.value.request_id) == ("BAD_FRAME", request_id)


SUB = dict(id=7, slot=0, prompt=b"x", max_tokens=1, temperature=0.0, top_p=1.0)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"id": 0}, "Submit.id"),
        ({"id": 2**64}, "Submit.id"),
        ({"id": True}, "Submit.id"),
        ({"slot": -1}, "Submit.slot"),
        ({"prompt": "x"}, "Submit.prompt"),
        ({"max_tokens": 0}, "Submit.max_tokens"),
        ({"temperature": -0.1}, "Submit.temperature"),
        ({"temperature": math.inf}, "Submit.temperature"),
        ({"top_p": 0.0}, "Submit.top_p"),
        ({"top_p": 1.5}, "Submit.top_p"),
        ({"top_p": math.nan}, "Submit.top_p"),
        ({"logprobs": 33}, "Submit.logprobs"),
        ({"pin": 1}, "Submit.pin"),
        ({"ids": True}, "Submit.prompt"),
        ({"grammar": "g"}, "Submit.grammar"),
    ],
)
def test_submit_refuses(change, field):
    rid = 0 if field == "Submit.id" else 7
    _refused(sp.Submit, **{**SUB, **change}, field=field, request_id=rid)


def test_submit_accepts_ints_for_floats_and_bytes_like():
    s = sp.Submit(3, 1, bytearray(b"12 7"), 0, 1, 1, logprobs=2, ids=True)
    assert (s.temperature, s.top_p, s.prompt) == (1.0, 1.0, b"12 7")
    assert type(s.temperature) is float and type(s.prompt) is bytes


@pytest.mark.parametrize(
    "args, field",
    [
        ((1, 1, math.nan, (), b""), "Echo.logprob"),  # nan only at position 0
        ((1, 0, math.nan, ((5, -1.0),), b""), "Echo.logprob"),  # ... and only with k=0
        ((1, 2, -math.inf, (), b""), "Echo.logprob"),
        ((1, 2, -1.0, ((5, math.nan),), b""), "Echo.top"),
        ((1, 2, -1.0, ((-5, -1.0),), b""), "Echo.top"),
        ((1, 2, -1.0, (5, -1.0), b""), "Echo.top"),
        ((1, 2, -1.0, (), "x"), "Echo.text"),
    ],
)
def test_echo_refuses(args, field):
    _refused(sp.Echo, *args, field=field, request_id=1)


def test_data_refuses_top_without_logprob_and_nonfinite():
    _refused(sp.Data, 4, b"a", None, ((1, -1.0),), field="Data.top", request_id=4)
    _refused(sp.Data, 4, b"a", math.inf, (), field="Data.logprob", request_id=4)


def test_done_counters_all_or_none():
    _refused(sp.Done, 2, 0, 0, 0, 0, 3, False, computed=3, field="Done.computed", request_id=2)
    _refused(
        sp.Done, 2, 0, 0, 0, 0, 3, False, computed=3, reused=0, snapshot="warm", field="Done.snapshot", request_id=2
    )
    _refused(sp.Done, 2, 0, 0, 0, 0, 3, 0, field="Done.length_limited", request_id=2)
    assert sp.Done(2, 0, 0, 0, 0, 3, False, 1, 2, "hit").has_counters
    assert not sp.Done(2, 0, 0, 0, 0, 3, False).has_counters


def test_other_events_refuse():
    _refused(sp.Scored, 1, 0, 0, 0, (), field="Scored.logprobs", request_id=1)
    _refused(sp.Scored, 1, 0, 0, 0, (-1.0,) * 201, field="Scored.logprobs", request_id=1)
    _refused(sp.Scored, 1, 0, 0, 0, (math.nan,), field="Scored.logprobs", request_id=1)
    _refused(sp.Pong, 1, {"busy": "1"}, field="Pong.values", request_id=1)
    _refused(sp.Pong, 1, {"active": "x"}, field="Pong.values", request_id=1)
    _refused(sp.Error, 1, "BAD FRAME", field="Error.code", request_id=1)
    _refused(sp.Error, 1, "BAD_FRAME", "two\nlines", field="Error.reason", request_id=1)
    _refused(sp.LoadFail, "disk", "x", field="LoadFail.kind")
    _refused(sp.Stat, (0.0, 0.0, 0.0), field="Stat.fields")
    _refused(sp.Telemetry, "DONE", b"DONE 1", field="Telemetry.kind")
    _refused(sp.Telemetry, "PERF", b"PERFX 1", field="Telemetry.line")
    _refused(sp.Caps, {"slots": "two"}, field="Caps.values['slots']")
    _refused(sp.Caps, {"chat": "yes"}, field="Caps.values['chat']")
    _refused(sp.Caps, {"Model": "x"}, field="Caps.values")
    _refused(sp.Caps, {"model": "a b"}, field="Caps.values['model']")


def properties(caps: sp.Caps, names: str) -> tuple:
    """The values of ``caps``' properties named in ``names`` (separated by spaces), in that order."""
    return tuple(getattr(caps, name) for name in names.split())


def test_caps_typed_properties_and_defaults():
    c = sp.Caps({})
    names = (
        "chat decide vision slots n_ctx n_vocab model pin_slots max_logprobs x_score x_counters x_health decide_record"
    )
    assert properties(c, names) == (True, False, False, 1, None, None, None, None, 32, False, False, False, None)
    c = sp.Caps(
        {
            "chat": "0",
            "decide": "1",
            "decide_record": "raw",
            "slots": "4",
            "n_ctx": "512",
            "n_vocab": "49152",
            "model": "smol",
            "pin_slots": "8",
            "max_logprobs": "5",
            "x_score": "1",
            "x_counters": "1",
            "x_health": "1",
            "future": "a=b",
        }
    )
    names = "chat decide decide_record slots n_ctx n_vocab model pin_slots max_logprobs x_score x_counters x_health"
    assert properties(c, names) == (False, True, "raw", 4, 512, 49152, "smol", 8, 5, True, True, True)
    assert c.values["future"] == "a=b"


def test_score_build_and_shape():
    s = sp.Score.build(9, 1, "Q: ", [("A", [" yes", " no"]), ("B", ["é"])], pin=True)
    assert json.loads(s.payload) == {
        "prefix": "Q: ",
        "pin": True,
        "groups": [{"stem": "A", "options": [" yes", " no"]}, {"stem": "B", "options": ["é"]}],
    }
    assert sp.score_shape(s.payload) == (2, 1)
    with pytest.raises(sp.LocalProtocolError):
        sp.Score.build(9, 1, "Q", [("A", [])])
    for bad in (
        b"{",
        b"[]",
        b'{"prefix": 1, "groups": [{"stem": "", "options": ["a"]}]}',
        b'{"prefix": "", "groups": []}',
        b'{"prefix": "", "groups": [{"options": ["a"]}]}',
        b'{"prefix": "", "groups": [{"stem": "", "options": [1]}]}',
        b'{"prefix": "", "pin": 1, "groups": [{"stem": "", "options": ["a"]}]}',
        b"\xff",
    ):
        assert sp.score_shape(bad) is None, bad


def test_errors_carry_code_and_request_id():
    e = sp.RemoteProtocolError("bad", "SLOT_BUSY", 4)
    assert (str(e), e.code, e.request_id, isinstance(e, sp.ProtocolError)) == ("bad", "SLOT_BUSY", 4, True)
    with pytest.raises(TypeError):
        sp.ProtocolError("x")


def test_frame_bytes_refuses_non_frames():
    with pytest.raises(TypeError):
        frame_bytes(sp.ConnectionClosed())


def test_engine_handshake_writer():
    conn = sp.EngineConnection()
    assert conn.state is sp.HANDSHAKE
    out = conn.send_handshake({"slots": "2", "x_health": "1"}, rss_gb=0.25)
    assert out == b"\x01\x01READY\x01\x01\nCAPS slots=2 x_health=1\nSTAT 0 0 0 0.25\n"
    assert conn.state is sp.SERVING
    assert sp.EngineConnection().send_handshake() == b"\x01\x01READY\x01\x01\nSTAT 0 0 0 0\n"


def test_gateway_caps_none_before_handshake_and_default_after():
    conn = sp.GatewayConnection()
    assert conn.caps is None and conn.state is sp.HANDSHAKE
    conn.receive_data(b"\x01\x01READY\x01\x01\n")
    assert conn.next_event() == sp.Ready() and conn.caps is None
    conn.receive_data(b"STAT 0 0 0 1\n")
    assert conn.next_event() == sp.Stat((0, 0, 0, 1))
    assert conn.caps == sp.Caps({}) and conn.state is sp.SERVING


def test_gateway_sends_only_requests_and_tracks_in_flight():
    conn = sp.GatewayConnection()
    conn.receive_data(sp.EngineConnection().send_handshake())
    while conn.next_event() is not sp.NEED_DATA:
        pass
    with pytest.raises(sp.LocalProtocolError) as info:
        conn.send(sp.Accept(1, 2))
    assert info.value.code == "BAD_SEQUENCE"
    conn.send(sp.Submit(**SUB))
    conn.send(sp.Submit(**{**SUB, "id": 8}))
    assert conn.in_flight == (7, 8)


def test_receive_after_eof_is_refused():
    conn = sp.GatewayConnection()
    conn.receive_data(b"")
    assert conn.next_event() == sp.ConnectionClosed(())
    assert conn.next_event() == sp.ConnectionClosed(())
    with pytest.raises(sp.LocalProtocolError):
        conn.receive_data(b"x")


def test_limits_are_checked():
    with pytest.raises(ValueError):
        sp.GatewayConnection(max_line=8)
    with pytest.raises(ValueError):
        sp.EngineConnection(max_payload=-1)


def refusal(conn, data: bytes) -> tuple[str, int]:
    """Feed ``data`` to ``conn``: ``(code, request_id)`` of the RemoteProtocolError its next event raises."""
    conn.receive_data(data)
    with pytest.raises(sp.RemoteProtocolError) as info:
        conn.next_event()
    return info.value.code, info.value.request_id


def test_engine_discards_an_oversized_payload_across_chunks():
    conn = engine(max_payload=10)
    assert refusal(conn, b"SUBMIT 3 0 100 1 0 1\n" + b"a" * 30) == ("BAD_FRAME", 3)
    for _ in range(7):
        conn.receive_data(b"a" * 10)
        assert conn.next_event() is sp.NEED_DATA
    conn.receive_data(b"\nSTOP 3\n")  # the payload's last byte was the 100th 'a'; then its "\n"
    assert conn.next_event() == sp.Stop(3)


def test_engine_discards_an_overlong_line_across_chunks():
    conn = engine(max_line=32)
    assert refusal(conn, b"SUBMIT " + b"9" * 40) == ("BAD_FRAME", 0)
    conn.receive_data(b"9" * 100)
    assert conn.next_event() is sp.NEED_DATA
    conn.receive_data(b"99\nCANCEL 5\n")
    assert conn.next_event() == sp.Cancel(5)


def test_gateway_payload_limit_and_large_payload_in_small_chunks():
    conn = CodecGateway(max_payload=1000)
    conn.receive_data(b"DECISION 1 1001\n")
    with pytest.raises(sp.RemoteProtocolError):
        conn.next_event()
    conn = CodecGateway()
    record = bytes(range(256)) * 4096  # 1 MiB, every byte value, newlines included
    frame = frame_bytes(sp.Decision(1, record))
    for i in range(0, len(frame), 4096):
        conn.receive_data(frame[i : i + 4096])
        e = conn.next_event()
        if i + 4096 < len(frame):
            assert e is sp.NEED_DATA
    assert e == sp.Decision(1, record)


def test_engine_eof_lists_unfinished_and_allows_replies():
    conn = engine()
    conn.receive_data(frame_bytes(sp.Submit(**SUB)) + b"")
    assert conn.next_event() == sp.Submit(**SUB)
    conn.receive_data(b"")
    assert conn.next_event() == sp.ConnectionClosed((7,))
    assert conn.state is sp.CLOSED
    assert conn.send(sp.Data(7, b"z")) == b"DATA 7 1\nz\n"
    assert conn.send(sp.Done(7, 1, 5.5, 0, 0.5, 1, True)) == b"DONE 7 STAT 1 5.5 0 0.5 1 1\n"
    assert conn.in_flight == ()


def test_engine_without_extensions_refuses_their_frames():
    conn = engine({})
    conn.receive_data(b"SCORE 1 0 2\n{}\nPING 2\nSUBMIT 3 0 1 0 0 1 logprobs=1 counters=1\nx\nSTOP 4\n")
    codes = []
    for _ in range(3):
        with pytest.raises(sp.RemoteProtocolError) as info:
            conn.next_event()
        codes.append((info.value.code, info.value.request_id, info.value.reason.split(" (")[0]))
    # SCORE's line is refused alone (an unknown kind has no known payload): its
    # payload line "{}" is refused next, as an unknown kind too.
    assert codes[0] == ("BAD_FRAME", 0, "unknown kind SCORE")
    assert codes[1][:2] == ("BAD_FRAME", 0)
    assert codes[2] == ("BAD_FRAME", 0, "unknown kind PING")
    with pytest.raises(sp.RemoteProtocolError) as info:
        conn.next_event()
    assert (info.value.code, info.value.request_id) == ("BAD_FRAME", 3)
    assert conn.next_event() == sp.Stop(4)


def general_reader_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on, connections frame every ECHO with the general reader (``read_echo``)."""
    monkeypatch.setattr(_connection, "_read_plain_echo", lambda *args: None)


def counting_fast_path(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the ECHO frames the fast path reads (the returned list's length)."""
    taken: list[int] = []
    real = _connection._read_plain_echo

    def spy(*args: object) -> object:
        e = real(*args)
        if e is not None:
            taken.append(1)
        return e

    monkeypatch.setattr(_connection, "_read_plain_echo", spy)
    return taken


def reading_out(logprobs: int) -> sp.GatewayConnection:
    """A gateway past the handshake that has sent ``SUBMIT 1`` (slot 0, prompt ``x``): a read-out with
    ``logprobs`` alternatives, waiting for its ECHO frames."""
    gw = sp.GatewayConnection()
    gw.receive_data(sp.EngineConnection().send_handshake())
    while gw.next_event() is not sp.NEED_DATA:
        pass
    gw.send(sp.Submit(1, 0, b"x", 0, 0.0, 1.0, logprobs=logprobs))
    return gw


def test_echo_fast_path_agrees_with_the_general_reader(monkeypatch):
    """ECHO frames of a read-out under way take the fast path; every spelling
    must decode as the general reader (used with no request state) decodes it."""
    spellings = [
        b"-1.25",
        b"-1.250",
        b"-1.5e-05",
        b"-1.5E-05",
        b"-1e-5",
        b"-7",
        b"-0",
        b"0",
        b"-007.5",
        b"-7.",
        b"-3.40282347e+38",
        b"-1e+99",
        b"-12345678901234567890.5",
    ]
    frames = [b"ECHO 1 1 0 nan 0\na\n"]
    for pos, lp in enumerate(spellings, start=1):
        frames.append(b"ECHO 1 1 %d %s 1 %d %s\nb\n" % (pos, lp, 10**18 + pos, spellings[-pos]))
    frames.append(b"DONE 1 STAT 0 0 0 0.5 %d 0\n" % (len(spellings) + 1))
    stream = b"".join(frames)
    gw = reading_out(logprobs=1)
    codec = CodecGateway()
    fast, general = [], []
    taken = counting_fast_path(monkeypatch)
    for conn, out in ((gw, fast), (codec, general)):
        if conn is codec:
            general_reader_only(monkeypatch)
        conn.receive_data(stream)
        while (e := conn.next_event()) is not sp.NEED_DATA:
            out.append(e)
    # the fast path reads the frames whose two floats are both as %.9g spells them (not
    # "E", not a one-digit exponent: 4 frames), and not the cold position 0 ("nan 0")
    assert len(taken) == len(spellings) - 4
    assert len(fast) == len(spellings) + 2
    assert repr(fast) == repr(general)  # repr: NaN compares unequal to itself
    assert [e.logprob for e in fast[1:-1]] == [float(x) for x in spellings]


def test_echo_fast_path_with_several_alternatives_agrees_with_the_general_reader(monkeypatch):
    tails = [
        b"3 5 -0.5 6 -1.5e-05 7 -2",
        b"3 0 -0 18446744073709551615 -1 9 -7.",
        b"3 1 -1 2 -2 3 -3",
        b"3 01 -1 2 -2 3 -3",
    ]  # the last has a leading zero: refused
    stream = b"ECHO 1 1 0 nan 0\na\n" + b"".join(
        b"ECHO 1 1 %d -0.25 %s\nb\n" % (pos, tail) for pos, tail in enumerate(tails, start=1)
    )
    gw = reading_out(logprobs=3)
    codec = CodecGateway()
    results = []
    taken = counting_fast_path(monkeypatch)
    for conn in (gw, codec):
        if conn is codec:
            assert len(taken) == 2  # the first and third (2**64-1 has 20 digits: general path)
            general_reader_only(monkeypatch)
        conn.receive_data(stream)
        out = []
        with pytest.raises(sp.RemoteProtocolError) as info:
            while (e := conn.next_event()) is not sp.NEED_DATA:
                out.append(e)
        assert (info.value.code, info.value.request_id) == ("BAD_FRAME", 1)
        results.append(out)
    assert repr(results[0]) == repr(results[1])
    assert [e.top for e in results[0][1:]] == [
        ((5, -0.5), (6, -1.5e-05), (7, -2.0)),
        ((0, -0.0), (2**64 - 1, -1.0), (9, -7.0)),
        ((1, -1.0), (2, -2.0), (3, -3.0)),
    ]


def test_connection_repr_shows_state_in_flight_and_buffered_bytes():
    conn = engine()
    conn.receive_data(b"STOP 1\nSTO")
    assert repr(conn) == "<EngineConnection state=SERVING in_flight=0 buffered=10>"
    assert conn.next_event() == sp.Stop(1)
    assert repr(sp.GatewayConnection()) == "<GatewayConnection state=HANDSHAKE in_flight=0 buffered=0>"
