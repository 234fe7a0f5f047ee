"""Helpers shared by the protocol tests: loading the conformance vectors
(spec/vectors/) and building the events they describe."""

from __future__ import annotations

import json
import math
import pathlib
import struct
from typing import Any

import attrs

import serveproto as sp
from serveproto import _events

VECTORS = pathlib.Path(__file__).resolve().parents[2] / "spec" / "vectors"
ALL_CAPS = {"x_score": "1", "x_counters": "1", "x_health": "1", "vision": "1", "decide": "1"}

_FLOAT_FIELDS = {"temperature", "top_p", "logprob", "tok_s", "hit_pct", "rss_gb"}
_BYTES_FIELDS = {"prompt", "grammar", "data", "record", "payload", "text", "line"}


def load(name: str) -> list[dict[str, Any]]:
    """The vectors of ``spec/vectors/<name>.json``."""
    return json.loads((VECTORS / f"{name}.json").read_text())["vectors"]


def b(s: str) -> bytes:
    """A vector byte string (one char per byte) as bytes."""
    return s.encode("latin-1")


def expected_event(vec: dict[str, Any]) -> sp.Event:
    """Build the event a vector describes, from its JSON fields alone."""
    kw: dict[str, Any] = {}
    for k, v in vec["fields"].items():
        if v is None:
            kw[k] = None
        elif k in _FLOAT_FIELDS:
            kw[k] = float(v)
        elif k in _BYTES_FIELDS:
            kw[k] = b(v)
        elif k == "top":
            kw[k] = tuple((t, float(lp)) for t, lp in v)
        elif k in ("fields", "logprobs", "values") and isinstance(v, list):
            kw[k] = tuple(float(x) for x in v)
        else:
            kw[k] = v
    return getattr(sp, vec["event"])(**kw)


def _f32(x: float) -> bytes:
    return struct.pack("<f", x)


def same(a: Any, c: Any, f32: bool = False) -> bool:
    """Equality where NaN equals NaN, through tuples, lists and events.

    ``f32``: compare floats after rounding both to float32 (what ``%.9g``
    text preserves exactly, spec section 1).
    """
    if isinstance(a, float) and isinstance(c, float):
        if math.isnan(a) or math.isnan(c):
            return math.isnan(a) and math.isnan(c)
        return _f32(a) == _f32(c) if f32 else a == c
    if isinstance(a, (tuple, list)) and isinstance(c, (tuple, list)):
        return type(a) is type(c) and len(a) == len(c) and all(same(x, y, f32) for x, y in zip(a, c, strict=True))
    if isinstance(a, _events.Event):
        if type(a) is not type(c):
            return False
        return all(same(getattr(a, f.name), getattr(c, f.name), f32) for f in attrs.fields(type(a)))
    return type(a) is type(c) and a == c


class CodecGateway(sp.GatewayConnection):
    """A gateway connection without the state machines: the frame codec alone,
    so reply vectors can be decoded out of any conversation."""

    def _process_event(self, e: sp.Event) -> None:
        pass


def engine(caps: dict[str, str] | None = None, **limits: int) -> sp.EngineConnection:
    """An engine connection past its handshake, having advertised ``caps``."""
    conn = sp.EngineConnection(**limits)
    conn.send_handshake(ALL_CAPS if caps is None else caps)
    return conn


def decode_all(conn: Any, data: bytes) -> list[Any]:
    """Feed ``data`` and return every event up to NEED_DATA."""
    conn.receive_data(data)
    out = []
    while (e := conn.next_event()) is not sp.NEED_DATA:
        out.append(e)
        if isinstance(e, sp.ConnectionClosed):
            break
    return out
