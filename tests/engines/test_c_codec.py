"""The C frame codec (engines/common) against the conformance vectors in spec/vectors/.

Every vector goes through ``engines/bin/codec-check`` (built by ``make -C engines
all``): request frames are decoded by the C reader and compared field by field
with the vector, refused frames must give the vector's code, request id and
consumed byte count, and reply events are written by the C writer and compared
byte for byte with the vector's frame (or its ``written`` form).
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "spec" / "vectors"
CODEC_CHECK = ROOT / "engines" / "bin" / "codec-check"

pytestmark = pytest.mark.skipif(
    not CODEC_CHECK.exists(), reason="engines/bin/codec-check not built (make -C engines all)"
)


def _load(name: str) -> list[dict]:
    return json.loads((VECTORS / f"{name}.json").read_text())["vectors"]


def _b(s: str) -> bytes:
    """The vectors' byte rule: one character per byte (latin-1)."""
    return s.encode("latin-1")


def _ext_args(vector: dict) -> list[str]:
    caps = vector.get("caps")
    if caps is None:
        return ["--ext", "all"]
    names = [k[2:] for k in ("x_score", "x_counters", "x_health") if caps.get(k) == "1"]
    return ["--ext", ",".join(names) if names else "none"]


def _read(frame: bytes, *args: str) -> list[dict]:
    out = subprocess.run([str(CODEC_CHECK), "read", *args], input=frame, capture_output=True, check=True, timeout=10)
    return [json.loads(line) for line in out.stdout.decode().splitlines()]


def _float_eq(a: str, b: str) -> bool:
    x, y = float(a), float(b)
    return (math.isnan(x) and math.isnan(y)) or x == y


BYTE_FIELDS = {"prompt", "grammar", "record", "payload", "data", "text"}


def _check_request(got: dict, vector: dict) -> None:
    assert got["event"] == vector["event"]
    for key, want in vector["fields"].items():
        have = got[key]
        if key in BYTE_FIELDS and want is not None:
            assert bytes.fromhex(have) == _b(want), key
        elif key in ("temperature", "top_p"):
            assert _float_eq(have, want), key
        else:
            assert have == want, key


@pytest.mark.parametrize("vector", _load("requests"), ids=lambda v: v["name"])
def test_request_vector_decodes(vector):
    frame = _b(vector["frame"])
    events = _read(frame, *_ext_args(vector))
    assert [e["event"] for e in events] == [vector["event"], "EOF"]
    _check_request(events[0], vector)
    assert events[0]["consumed"] == len(frame)
    if "written" in vector:  # the canonical spelling decodes to the same fields
        (again, _eof) = _read(_b(vector["written"]), *_ext_args(vector))
        _check_request(again, vector)


def test_request_vectors_decode_as_one_stream():
    """All valid request frames back to back: the reader keeps them apart."""
    vectors = [v for v in _load("requests") if "caps" not in v]
    stream = b"".join(_b(v["frame"]) for v in vectors)
    events = _read(stream)
    assert [e["event"] for e in events] == [v["event"] for v in vectors] + ["EOF"]
    for got, vector in zip(events, vectors):
        _check_request(got, vector)


ENGINE_SIDE_INVALID = [v for v in _load("invalid") if v["direction"] == "gateway->engine"]


def _limit_args(vector: dict) -> list[str]:
    limits = vector.get("limits", {})
    args = []
    if "max_line" in limits:
        args += ["--max-line", str(limits["max_line"])]
    if "max_payload" in limits:
        args += ["--max-payload", str(limits["max_payload"])]
    return args


@pytest.mark.parametrize("vector", ENGINE_SIDE_INVALID, ids=lambda v: v["name"])
def test_invalid_request_refused(vector):
    frame = _b(vector["frame"])
    events = _read(frame, *_ext_args(vector), *_limit_args(vector))
    first = events[0]
    assert first["event"] == "Error"
    assert first["code"] == vector["code"]
    assert first["id"] == vector["request_id"]
    assert first["consumed"] == vector["consumed"]
    assert "\n" not in first["reason"] and first["reason"]


def test_reader_goes_on_after_each_refused_frame():
    """A refused frame followed by a good one: the good one still decodes."""
    for vector in ENGINE_SIDE_INVALID:
        frame = _b(vector["frame"])[: vector["consumed"]]
        events = _read(frame + b"STOP 99\n", *_ext_args(vector), *_limit_args(vector))
        assert events[0]["event"] == "Error", vector["name"]
        assert events[-2] == {"consumed": len(frame) + 8, "event": "Stop", "id": 99}, vector["name"]


@pytest.mark.parametrize("chunk", [1, 2, 7])
def test_reader_is_incremental(chunk):
    """Every vector, valid and invalid, back to back, handed over a few bytes
    at a time: the same events at the same consumed counts as all at once."""
    vectors = [v for v in _load("requests") + ENGINE_SIDE_INVALID if "caps" not in v and "limits" not in v]
    stream = b"".join(_b(v["frame"]) for v in vectors)
    assert _read(stream, "--chunk", str(chunk)) == _read(stream)
    assert len(_read(stream)) > len(vectors)


def _hexify(fields: dict, event: str) -> dict:
    out = {"event": event}
    for key, value in fields.items():
        if key in BYTE_FIELDS and isinstance(value, str):
            value = _b(value).hex()
        out[key] = value
    return out


REPLIES = [v for v in _load("replies") if v["event"] != "Telemetry"]


@pytest.mark.parametrize("vector", REPLIES, ids=lambda v: v["name"])
def test_reply_vector_written_byte_exact(vector):
    line = json.dumps(_hexify(vector["fields"], vector["event"])) + "\n"
    out = subprocess.run([str(CODEC_CHECK), "write"], input=line.encode(), capture_output=True, check=True, timeout=10)
    assert out.stdout == _b(vector.get("written", vector["frame"]))


@pytest.mark.parametrize(
    "value, printed",
    [
        (float("nan"), b"nan"),
        (-float("nan"), b"nan"),
        (float("inf"), b"inf"),
        (-float("inf"), b"-inf"),
        (-0.6931471805599453, b"-0.693147181"),
        (1e-05, b"1e-05"),
        (-1234567890.0, b"-1.23456789e+09"),
    ],
)
def test_float_printing_matches_python_format(value, printed):
    """%.9g with nan never signed; the same text as Python's format(x, '.9g')."""
    assert printed == (b"nan" if math.isnan(value) else format(value, ".9g").encode())
    line = (
        json.dumps(
            {"event": "Scored", "id": 1, "group": 0, "option": 0, "context_tokens": 1, "logprobs": [repr(value)]}
        )
        + "\n"
    )
    out = subprocess.run([str(CODEC_CHECK), "write"], input=line.encode(), capture_output=True, check=True, timeout=10)
    assert out.stdout == b"SCORED 1 0 0 1 1 " + printed + b"\n"


def test_error_reason_newline_flattened():
    line = json.dumps({"event": "Error", "id": 3, "code": "DECIDE_FAILED", "reason": "a\nb"}) + "\n"
    out = subprocess.run([str(CODEC_CHECK), "write"], input=line.encode(), capture_output=True, check=True, timeout=10)
    assert out.stdout == b"ERROR 3 DECIDE_FAILED a b\n"


@pytest.mark.parametrize(
    "text, tree",
    [
        (b'{"a": [1, 2.5, -3e2, true, false, null]}', '{"61":[1,2.5,-300,true,false,null]}'),
        ('"\\u00e9\\ud83d\\ude00\\n\u00e9"'.encode(), '"' + "é😀\né".encode().hex() + '"'),
        (b"  []  ", "[]"),
    ],
)
def test_json_reader_accepts(text, tree):
    out = subprocess.run([str(CODEC_CHECK), "json"], input=text, capture_output=True, timeout=10)
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode().strip() == tree


@pytest.mark.parametrize(
    "text",
    [
        b'{"a": 1, "a": 2}',  # duplicate key
        b'"\\ud83d"',  # lone high surrogate
        b'"\\ude00"',  # lone low surrogate
        b'"\xff"',  # invalid UTF-8
        b'"\xc0\xaf"',  # overlong UTF-8
        b'"\xed\xa0\x80"',  # UTF-8-encoded surrogate
        b'"a\nb"',  # raw control byte
        b"[1,]",
        b"01",
        b"1.",
        b"-",
        b"nul",
        b"[1] x",
        b"[" * 65 + b"]" * 65,  # deeper than SPJ_MAX_DEPTH
        b"",
    ],
)
def test_json_reader_refuses(text):
    out = subprocess.run([str(CODEC_CHECK), "json"], input=text, capture_output=True, timeout=10)
    assert out.returncode == 1
    assert out.stderr.startswith(b"byte ")


def test_json_depth_limit_is_exact():
    deep = b"[" * 64 + b"]" * 64
    out = subprocess.run([str(CODEC_CHECK), "json"], input=deep, capture_output=True, timeout=10)
    assert out.returncode == 0


# ---- differential fuzzing: the C reader and serveproto's EngineConnection agree ----

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies
serveproto = pytest.importorskip("serveproto")


@st.composite
def _request_stream(draw) -> bytes:
    """A few request frames with unique ids, each maybe mutated by a byte edit."""
    frames = []
    for rid in range(1, draw(st.integers(1, 4)) + 1):
        kind = draw(st.sampled_from(["SUBMIT", "SUBMIT_KEYS", "SUBMIT_G", "DECIDE", "SCORE", "PING", "IMAGE"]))
        payload = draw(st.binary(max_size=6))
        if kind.startswith("SUBMIT"):
            line = (
                f"SUBMIT {rid} {draw(st.integers(0, 3))} {len(payload)} {draw(st.sampled_from(['0', '1', '16']))} "
                f"{draw(st.sampled_from(['0', '0.7', '1e-3']))} {draw(st.sampled_from(['1', '0.95']))}"
            )
            extra = b""
            if kind == "SUBMIT_G":
                grammar = draw(st.binary(max_size=4))
                line += f" {len(grammar)}"
                extra = grammar + b"\n"
            if kind == "SUBMIT_KEYS":
                keys = draw(
                    st.lists(
                        st.sampled_from(["logprobs=1", "logprobs=5", "pin=1", "counters=1", "pin=0"]),
                        max_size=3,
                        unique=True,
                    )
                )
                line += "".join(" " + k for k in keys)
            frame = line.encode() + b"\n" + payload + b"\n" + extra
        elif kind in ("DECIDE", "SCORE"):
            frame = f"{kind} {rid} {draw(st.integers(0, 2))} {len(payload)}\n".encode() + payload + b"\n"
        elif kind == "IMAGE":
            frame = f"IMAGE {rid} {len(payload)} 1 2\n".encode() + payload + b"\n"
        else:
            frame = f"PING {rid}\n".encode()
        if draw(st.booleans()):
            at = draw(st.integers(0, len(frame) - 1))
            edit = draw(st.sampled_from(["replace", "delete", "insert"]))
            byte = draw(st.sampled_from(list(b" \n0=x-9.")))
            if edit == "replace":
                frame = frame[:at] + bytes([byte]) + frame[at + 1 :]
            elif edit == "delete":
                frame = frame[:at] + frame[at + 1 :]
            else:
                frame = frame[:at] + bytes([byte]) + frame[at:]
        frames.append(frame)
    return b"".join(frames)


def _python_outcomes(data: bytes) -> list[tuple]:
    conn = serveproto.EngineConnection()
    conn.send_handshake({"x_score": "1", "x_counters": "1", "x_health": "1", "vision": "1", "decide": "1"})
    out = []
    for chunk in (data, b""):
        conn.receive_data(chunk)
        while True:
            try:
                ev = conn.next_event()
            except serveproto.RemoteProtocolError as e:
                out.append(("Error", e.code, e.request_id))
                continue
            if ev is serveproto.NEED_DATA or isinstance(ev, serveproto.ConnectionClosed):
                break
            out.append((type(ev).__name__, ev.id))
    return out


def _c_outcomes(data: bytes) -> list[tuple]:
    out = []
    for e in _read(data):
        if e["event"] == "EOF":
            break
        out.append(("Error", e["code"], e["id"]) if e["event"] == "Error" else (e["event"], e["id"]))
    return out


@hypothesis.settings(max_examples=200, deadline=None, derandomize=True)
@hypothesis.given(_request_stream())
def test_c_reader_agrees_with_python_engine_connection(data):
    assert _c_outcomes(data) == _python_outcomes(data)
    assert _read(data, "--chunk", "1") == _read(data)
