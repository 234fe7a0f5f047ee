"""Property tests: every event survives send -> bytes -> next_event unchanged,
and random or mutated bytes only ever raise ProtocolError subclasses."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import serveproto as sp
from serveproto._writers import write as frame_bytes  # the bare writer, no state machine
from test_protocol_support import ALL_CAPS, CodecGateway, b, engine, load, same

U64 = 2**64 - 1
ids = st.integers(1, U64)
uints = st.integers(0, U64)
small = st.integers(0, 10**6)
# Writers print %.9g, which round-trips float32 values exactly (spec section 1).
f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
logprobs32 = st.floats(-1e4, 0, width=32)
blobs = st.binary(max_size=300)
words = st.text(
    st.characters(min_codepoint=33, max_codepoint=0x10FFFF, blacklist_categories=("Cs",)), min_size=1, max_size=12
).filter(lambda s: " " not in s and "\n" not in s)
free_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"), max_size=40)
keys = st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True)
tops = st.lists(st.tuples(uints, logprobs32), max_size=32).map(tuple)
token_ids = st.lists(st.integers(0, 10**9), min_size=1, max_size=20).map(lambda v: " ".join(map(str, v)).encode())


@st.composite
def submits(draw):
    ids_mode = draw(st.booleans())
    logprobs = draw(st.integers(0, 32))
    max_tokens = draw(st.integers(1 if logprobs == 0 else 0, 10**6))
    return sp.Submit(
        id=draw(ids),
        slot=draw(uints),
        prompt=draw(token_ids if ids_mode else blobs),
        max_tokens=max_tokens,
        temperature=draw(st.floats(0, 100, width=32)),
        top_p=draw(st.floats(0, 1, exclude_min=True, width=32)),
        grammar=draw(st.none() | blobs),
        logprobs=logprobs,
        pin=draw(st.booleans()),
        ids=ids_mode,
        counters=draw(st.booleans()),
    )


@st.composite
def echoes(draw):
    if draw(st.booleans()):
        return sp.Echo(draw(ids), 0, math.nan, (), draw(blobs))
    return sp.Echo(draw(ids), draw(uints), draw(logprobs32), draw(tops), draw(blobs))


@st.composite
def datas(draw):
    if draw(st.booleans()):
        return sp.Data(draw(ids), draw(blobs))
    return sp.Data(draw(ids), draw(blobs), draw(logprobs32), draw(tops))


@st.composite
def dones(draw):
    counters = {}
    if draw(st.booleans()):
        counters = dict(
            computed=draw(small), reused=draw(small), snapshot=draw(st.sampled_from(["none", "hit", "stale"]))
        )
    return sp.Done(
        draw(ids), draw(small), draw(f32), draw(f32), draw(f32), draw(small), draw(st.booleans()), **counters
    )


requests = st.one_of(
    submits(),
    st.builds(sp.Image, ids, blobs, uints, uints),
    st.builds(sp.Stop, ids),
    st.builds(sp.Cancel, ids),
    st.builds(sp.Ping, ids),
    st.builds(sp.Decide, ids, uints, blobs),
    st.builds(sp.Score, ids, uints, blobs),
)
replies = st.one_of(
    st.just(sp.Ready()),
    st.builds(
        sp.Caps,
        st.dictionaries(
            keys.filter(
                lambda k: (
                    k
                    not in (
                        "chat",
                        "decide",
                        "vision",
                        "x_score",
                        "x_counters",
                        "x_health",
                        "slots",
                        "n_ctx",
                        "n_vocab",
                        "pin_slots",
                        "max_logprobs",
                    )
                )
            ),
            words,
            max_size=6,
        ),
    ),
    st.builds(sp.Stat, st.tuples(f32, f32, f32, f32)),
    st.builds(sp.LoadFail, st.sampled_from(["nomem", "io", "format", "unsupported"]), free_text),
    st.builds(sp.Accept, ids, uints),
    echoes(),
    datas(),
    st.builds(sp.Decision, ids, blobs),
    dones(),
    st.builds(sp.Error, st.integers(0, U64), words, free_text),
    st.builds(sp.Scored, ids, uints, uints, uints, st.lists(logprobs32, min_size=1, max_size=200).map(tuple)),
    st.builds(sp.Pong, ids, st.dictionaries(keys, words, max_size=4).map(lambda d: {"active": "3", **d})),
    st.sampled_from(["HWINFO", "TIERS", "PERF", "X_NEW_1"]).map(lambda k: sp.Telemetry(k, k.encode() + b" 1  2\x01")),
)


def decodes_back(conn, event) -> None:
    """``event``'s frame, fed to ``conn``, decodes to one event equal to it (f32 fields compared as f32)."""
    conn.receive_data(frame_bytes(event))
    assert same(conn.next_event(), event, f32=True)
    assert conn.next_event() is sp.NEED_DATA


@settings(max_examples=400, deadline=None)
@given(requests)
def test_request_round_trip(event):
    decodes_back(engine(), event)


@settings(max_examples=600, deadline=None)
@given(replies)
def test_reply_round_trip(event):
    decodes_back(CodecGateway(), event)


@settings(max_examples=100, deadline=None)
@given(st.lists(replies, min_size=1, max_size=20), st.data())
def test_reply_stream_any_chunking(events, data):
    """A stream of frames cut into random chunks decodes to the same events."""
    stream = b"".join(map(frame_bytes, events))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    conn = CodecGateway()
    got = []
    for a, z in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        conn.receive_data(stream[a:z]) if z > a else None
        while (e := conn.next_event()) is not sp.NEED_DATA:
            got.append(e)
    assert same(got, events, f32=True)


def _drain_engine(conn: sp.EngineConnection) -> None:
    """Pull until NEED_DATA or EOF; refused frames raise RemoteProtocolError and the
    connection goes on. Every refusal consumes bytes, so this ends."""
    for _ in range(100_000):
        try:
            e = conn.next_event()
        except sp.RemoteProtocolError as exc:
            assert exc.code in ("BAD_FRAME", "DUPLICATE_ID")
            continue
        if e is sp.NEED_DATA or isinstance(e, sp.ConnectionClosed):
            return
    raise AssertionError("the engine connection made no progress")


def _drain_gateway(conn: sp.GatewayConnection) -> None:
    try:
        for _ in range(100_000):
            e = conn.next_event()
            if e is sp.NEED_DATA or isinstance(e, sp.ConnectionClosed):
                return
    except sp.RemoteProtocolError as exc:
        assert exc.code in ("BAD_FRAME", "BAD_SEQUENCE")
        assert conn.state is sp.ERROR


_SEEDS = [b(v["frame"]) for name in ("requests", "replies", "invalid") for v in load(name)]


@st.composite
def mutated(draw):
    """A few vector frames glued together, then bytes inserted, deleted or flipped."""
    frames = bytearray(b"".join(draw(st.lists(st.sampled_from(_SEEDS), min_size=1, max_size=4))))
    for _ in range(draw(st.integers(0, 6))):
        i = draw(st.integers(0, len(frames)))
        op = draw(st.sampled_from(["ins", "del", "set"]))
        byte = draw(st.sampled_from([0x20, 0x0A, 0x30, 0x31, 0x2D, 0x3D, 0x01, 0x41, 0xFF]))
        if op == "ins":
            frames.insert(i, byte)
        elif i < len(frames):
            if op == "del":
                del frames[i]
            else:
                frames[i] = byte
    return bytes(frames)


@settings(
    max_examples=int(__import__("os").environ.get("SP_FUZZ", 500)),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.one_of(st.binary(max_size=600), mutated()), st.booleans(), st.integers(1, 64))
def test_garbage_only_raises_protocol_errors(data, eof, chunk):
    """Whatever the bytes, both roles raise nothing but ProtocolError subclasses."""
    gw = sp.GatewayConnection(max_line=256, max_payload=1024)
    gw_serving = sp.GatewayConnection(max_line=256, max_payload=1024)
    gw_serving.receive_data(
        b"\x01\x01READY\x01\x01\nCAPS "
        + " ".join(f"{k}={v}" for k, v in ALL_CAPS.items()).encode()
        + b"\nSTAT 0 0 0 0\n"
    )
    while gw_serving.next_event() is not sp.NEED_DATA:
        pass
    for i in range(1, 9):
        gw_serving.send(sp.Submit(i, 0, b"x", i % 3, 0.0, 1.0, logprobs=i % 2 + (i % 3 == 0)))
    en = engine(max_line=256, max_payload=1024)
    for a in range(0, len(data), chunk):
        for conn in (gw, gw_serving, en):
            conn.receive_data(data[a : a + chunk])
        _drain_gateway(gw)
        _drain_gateway(gw_serving)
        _drain_engine(en)
    if eof:
        for conn in (gw, gw_serving, en):
            conn.receive_data(b"")
        _drain_gateway(gw)
        _drain_gateway(gw_serving)
        _drain_engine(en)
