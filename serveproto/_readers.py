"""Readers: one frame's bytes -> one event (spec sections 1, 3, 4, 5, 9).

Each reader takes the line split on single spaces (``parts``, kind first, no
``\\n``) and the frame's payloads, checks every field against the grammar
(``_grammar``) and returns the event. A frame that does not parse raises
``BadFrame`` with a reason; the connection turns it into a
``RemoteProtocolError`` tied to the right request id.

Hot path: ECHO, DATA and SCORED are parsed with ``bytes.isdigit`` / ``int`` /
one precompiled float pattern and built with trusted constructors.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import TypeVar

from . import _events as ev
from . import _grammar as g
from ._errors import LocalProtocolError

_U64 = g.UINT_LIMIT
_float_match = g.FLOAT_RE.fullmatch
_key_match = g.KEY_RE.fullmatch
_echo_k1 = g.ECHO_K1_FAST.fullmatch
_echo_kn = g.ECHO_KN_FAST.fullmatch
_isfinite = math.isfinite
E = TypeVar("E", bound=ev.Event)


class BadFrame(Exception):
    """A frame that does not parse; ``args[0]`` is the reason."""


def uint(b: bytes) -> int:
    """Parse a ``uint`` (section 1): ``0|[1-9][0-9]*``, at most 20 digits, below 2**64."""
    if b.isdigit() and (b[0] != 48 or len(b) == 1) and len(b) <= 20:
        v = int(b)
        if v < _U64:
            return v
    raise BadFrame(f"bad uint {b[:40]!r}")


def rid(b: bytes) -> int:
    """Parse an ``id``: a uint from 1 to 2**64-1."""
    if b.isdigit() and b[0] != 48 and len(b) <= 20:
        v = int(b)
        if v < _U64:
            return v
    raise BadFrame(f"bad id {b[:40]!r}")


def flt(b: bytes) -> float:
    """Parse a ``float`` as read (section 1); ``-nan`` reads as nan."""
    if _float_match(b) is None:
        raise BadFrame(f"bad float {b[:40]!r}")
    return float(b)


def pairs(fields: list[bytes]) -> dict[str, str]:
    """Parse ``key=value`` fields into a dict; refuse a bad key, an empty
    value, a duplicate key or a value that is not UTF-8."""
    out: dict[str, str] = {}
    for f in fields:
        k, eq, v = f.partition(b"=")
        if not eq or _key_match(k) is None or not v:
            raise BadFrame(f"bad key=value field {f[:40]!r}")
        key = k.decode()
        if key in out:
            raise BadFrame(f"duplicate key {key}")
        try:
            out[key] = v.decode()
        except UnicodeDecodeError:
            raise BadFrame(f"value of {key} is not UTF-8") from None
    return out


def _text(fields: list[bytes]) -> str:
    return b" ".join(fields).decode("utf-8", "replace")


def _build(cls: Callable[..., E], *args: object, **kw: object) -> E:
    """Build an event with validation, turning a bad field into BadFrame."""
    try:
        return cls(*args, **kw)
    except LocalProtocolError as e:
        raise BadFrame(e.reason) from None


def _nfields(parts: list[bytes], n: int) -> None:
    if len(parts) != n:
        raise BadFrame(f"{parts[0].decode('latin-1')} takes {n - 1} fields, got {len(parts) - 1}")


def _top(parts: list[bytes], start: int) -> tuple[tuple[int, float], ...]:
    out = []
    for j in range(start, len(parts), 2):
        lp = flt(parts[j + 1])
        if not _isfinite(lp):
            raise BadFrame(f"alternative logprob must be finite, got {lp!r}")
        out.append((uint(parts[j]), lp))
    return tuple(out)


# --- engine to gateway ------------------------------------------------------------------

_make_echo = ev.trusted_constructor(ev.Echo)
_make_data = ev.trusted_constructor(ev.Data)
_make_scored = ev.trusted_constructor(ev.Scored)
_make_hidden = ev.trusted_constructor(ev.Hidden)
_make_accept = ev.trusted_constructor(ev.Accept)
_make_decision = ev.trusted_constructor(ev.Decision)
_make_telemetry = ev.trusted_constructor(ev.Telemetry)


def read_echo(parts: list[bytes], payload: bytes) -> ev.Echo:
    """``ECHO <id> <nbytes> <position> <logprob> <k>[ <tid> <tlp>]*k`` + text."""
    n = len(parts)
    if n < 6:
        raise BadFrame(f"ECHO takes at least 5 fields, got {n - 1}")
    k = uint(parts[5])
    if n != 6 + 2 * k:
        raise BadFrame(f"ECHO announces k={k} alternatives but has {(n - 6) / 2:g}")
    pos = uint(parts[3])
    lp = flt(parts[4])
    if k == 1:
        tlp = flt(parts[7])
        if not _isfinite(tlp):
            raise BadFrame(f"alternative logprob must be finite, got {tlp!r}")
        top: tuple[tuple[int, float], ...] = ((uint(parts[6]), tlp),)
    elif k:
        top = _top(parts, 6)
    else:
        top = ()
    if not _isfinite(lp) and not (lp != lp and pos == 0 and k == 0):
        raise BadFrame(f"ECHO logprob must be finite (nan only at position 0 with k=0), got {lp!r}")
    return _make_echo(rid(parts[1]), pos, lp, top, payload)


def read_plain_echo(data: bytes, pos: int, nl: int, max_payload: int) -> ev.Echo | None:
    """The hot path of a read-out: the ECHO frame whose line is ``data[pos:nl]``, when that
    line is in its plainest spelling (``_grammar.ECHO_K1_FAST`` or ``ECHO_KN_FAST``) and its payload (at most
    ``max_payload`` bytes) is complete in ``data``.

    Returns the event (the frame ends ``len(event.text) + 1`` bytes after ``nl``), or None
    for anything else, whatever the reason: the general path (``read_echo``) then decides.
    An event it returns is the one ``read_echo`` builds from the same bytes.
    """
    top: tuple[tuple[int, float], ...]
    m = _echo_k1(data, pos, nl)
    if m is not None:
        i, nb, p, lp, tid, tlp = m.groups()
        top = ((int(tid), float(tlp)),)
    else:
        m = _echo_kn(data, pos, nl)
        if m is None:
            return None
        i, nb, p, lp, k, tail = m.groups()
        t = tail.split(b" ")  # t[0] is empty: the group starts with a space
        if len(t) != 2 * int(k) + 1:
            return None
        top = tuple(zip(map(int, t[1::2]), map(float, t[2::2]), strict=True))
    n = int(nb)
    end = nl + 1 + n
    if n > max_payload or len(data) <= end or data[end] != 10:
        return None
    return _make_echo(int(i), int(p), float(lp), top, data[nl + 1 : end])


def read_data(parts: list[bytes], payload: bytes) -> ev.Data:
    """``DATA <id> <n>[ <lp> <k>[ <tid> <tlp>]*k]`` + text."""
    n = len(parts)
    if n == 3:
        return _make_data(rid(parts[1]), payload, None, ())
    if n < 5:
        raise BadFrame(f"DATA takes 2 fields or at least 4, got {n - 1}")
    k = uint(parts[4])
    if n != 5 + 2 * k:
        raise BadFrame(f"DATA announces k={k} alternatives but has {(n - 5) / 2:g}")
    lp = flt(parts[3])
    if not _isfinite(lp):
        raise BadFrame(f"DATA logprob must be finite, got {lp!r}")
    return _make_data(rid(parts[1]), payload, lp, _top(parts, 5))


def read_decision(parts: list[bytes], payload: bytes) -> ev.Decision:
    """``DECISION <id> <n>`` + JSON."""
    _nfields(parts, 3)
    return _make_decision(rid(parts[1]), payload)


def read_scored(parts: list[bytes]) -> ev.Scored:
    """``SCORED <id> <group> <option> <context_tokens> <n> <lp_1> ... <lp_n>``."""
    if len(parts) < 7:
        raise BadFrame(f"SCORED takes at least 6 fields, got {len(parts) - 1}")
    n = uint(parts[5])
    if len(parts) != 6 + n or n > g.MAX_SCORED_TOKENS:
        raise BadFrame(f"SCORED announces n={n} logprobs (1..{g.MAX_SCORED_TOKENS}) but has {len(parts) - 6}")
    lps = tuple(map(flt, parts[6:]))
    if not all(map(_isfinite, lps)):
        raise BadFrame(f"SCORED logprobs must be finite, got {lps!r}")
    return _make_scored(rid(parts[1]), uint(parts[2]), uint(parts[3]), uint(parts[4]), lps)


def read_hidden(parts: list[bytes], payload: bytes) -> ev.Hidden:
    """``HIDDEN <id> <bytes> <group> <layer>`` + that many bytes: float32 values, little-endian."""
    _nfields(parts, 5)
    n, rest = divmod(len(payload), 4)
    if rest or not 1 <= n <= g.MAX_HIDDEN_VALUES:
        raise BadFrame(f"HIDDEN payload of {len(payload)} bytes is not 1 to {g.MAX_HIDDEN_VALUES} float32 values")
    vals = struct.unpack(f"<{n}f", payload)
    if not all(map(_isfinite, vals)):
        raise BadFrame("HIDDEN values must be finite")
    return _make_hidden(rid(parts[1]), uint(parts[3]), uint(parts[4]), vals)


def read_accept(parts: list[bytes]) -> ev.Accept:
    """``ACCEPT <id> <prompt_tokens>``."""
    _nfields(parts, 3)
    return _make_accept(rid(parts[1]), uint(parts[2]))


def read_done(parts: list[bytes]) -> ev.Done:
    """``DONE <id> STAT <emitted> <tok_s> <hit_pct> <rss_gb> <prompt_tokens> <length_limited>[ key=value ...]``."""
    if len(parts) < g.DONE_FIXED_FIELDS or parts[2] != b"STAT":
        raise BadFrame("DONE takes <id> STAT and six fields")
    if parts[8] not in (b"0", b"1"):
        raise BadFrame(f"DONE length_limited must be 0 or 1, got {parts[8][:40]!r}")
    counters: dict[str, object] = {}
    if len(parts) > g.DONE_FIXED_FIELDS:
        kv = pairs(parts[g.DONE_FIXED_FIELDS :])
        if set(kv) - {"disk"} != {"computed", "reused", "snapshot"}:
            raise BadFrame(f"DONE keys must be computed, reused and snapshot (and disk), got {sorted(kv)}")
        counters = {
            "computed": uint(kv["computed"].encode()),
            "reused": uint(kv["reused"].encode()),
            "snapshot": kv["snapshot"],
        }
        if "disk" in kv:
            counters["disk"] = uint(kv["disk"].encode())
    return _build(
        ev.Done,
        rid(parts[1]),
        uint(parts[3]),
        flt(parts[4]),
        flt(parts[5]),
        flt(parts[6]),
        uint(parts[7]),
        parts[8] == b"1",
        **counters,
    )


def read_error(parts: list[bytes]) -> ev.Error:
    """``ERROR <id> <CODE>[ <reason>]``; the reason is free text (UTF-8, bad bytes replaced)."""
    if len(parts) < 3 or not parts[2]:
        raise BadFrame("ERROR takes <id> <CODE>")
    return _build(ev.Error, uint(parts[1]), parts[2].decode("utf-8", "replace"), _text(parts[3:]))


def read_caps(parts: list[bytes]) -> ev.Caps:
    """``CAPS key=value ...`` (zero or more pairs)."""
    return _build(ev.Caps, pairs(parts[1:]))


def read_stat(parts: list[bytes]) -> ev.Stat:
    """``STAT <float> <float> <float> <rss_gb>``."""
    _nfields(parts, 1 + g.STAT_FIELDS)
    return _build(ev.Stat, tuple(map(flt, parts[1:])))


def read_load_fail(parts: list[bytes]) -> ev.LoadFail:
    """``LOAD_FAIL kind=<kind> <detail>``; the detail is free text, maybe empty."""
    if len(parts) < 2 or not parts[1].startswith(b"kind="):
        raise BadFrame("LOAD_FAIL takes kind=<kind> first")
    return _build(ev.LoadFail, parts[1][5:].decode("utf-8", "replace"), _text(parts[2:]))


def read_pong(parts: list[bytes]) -> ev.Pong:
    """``PONG <id>[ key=value ...]`` (``active=`` required)."""
    if len(parts) < 2:
        raise BadFrame("PONG takes <id>")
    return _build(ev.Pong, rid(parts[1]), pairs(parts[2:]))


def read_telemetry(kind: bytes, line: bytes) -> ev.Telemetry:
    """A line of a kind the gateway does not know; the kind was checked by the caller."""
    return _make_telemetry(kind.decode("ascii"), line)


# --- gateway to engine -------------------------------------------------------------------


def read_submit(parts: list[bytes], payloads: tuple[bytes, ...], counters_ok: bool) -> ev.Submit:
    """``SUBMIT <id> <slot> <bytes> <max_tokens> <temp> <top_p>[ <gbytes>][ key=value ...]``.

    ``payloads``: the prompt, and the grammar when ``gbytes`` was given.
    ``counters_ok``: whether the ``counters`` key is known (the engine
    advertised ``x_counters=1``).
    """
    n = len(parts)
    if n < g.SUBMIT_FIXED_FIELDS:
        raise BadFrame(f"SUBMIT takes at least 6 fields, got {n - 1}")
    keys = parts[g.SUBMIT_FIXED_FIELDS :]
    grammar = None
    if keys and b"=" not in keys[0]:
        if len(payloads) != 2:  # payload_sizes() could not read it as a uint
            raise BadFrame(f"bad gbytes {keys[0][:40]!r}")
        grammar = payloads[1]
        keys = keys[1:]
    opts: dict[str, object] = {}
    for f in keys:
        k, eq, v = f.partition(b"=")
        rng = g.SUBMIT_KEYS.get(k) if eq else None
        if rng is None or (k == b"counters" and not counters_ok):
            raise BadFrame(f"unknown key or field {f[:40]!r}")
        key = k.decode()
        if key in opts:
            raise BadFrame(f"duplicate key {key}")
        val = uint(v)
        if not rng[0] <= val <= rng[1]:
            raise BadFrame(f"{key}={val} out of range {rng[0]}..{rng[1]}")
        opts[key] = val if key == "logprobs" else bool(val)
    return _build(
        ev.Submit,
        rid(parts[1]),
        uint(parts[2]),
        payloads[0],
        uint(parts[4]),
        flt(parts[5]),
        flt(parts[6]),
        grammar,
        **opts,
    )


def read_image(parts: list[bytes], payloads: tuple[bytes, ...]) -> ev.Image:
    """``IMAGE <id> <bytes> <grid_h> <grid_w>`` + data."""
    _nfields(parts, 5)
    return _build(ev.Image, rid(parts[1]), payloads[0], uint(parts[3]), uint(parts[4]))


def read_decide(parts: list[bytes], payloads: tuple[bytes, ...]) -> ev.Decide:
    """``DECIDE <id> <slot> <bytes>`` + JSON record."""
    _nfields(parts, 4)
    return _build(ev.Decide, rid(parts[1]), uint(parts[2]), payloads[0])


def read_score(parts: list[bytes], payloads: tuple[bytes, ...]) -> ev.Score:
    """``SCORE <id> <slot> <bytes>`` + JSON."""
    _nfields(parts, 4)
    return _build(ev.Score, rid(parts[1]), uint(parts[2]), payloads[0])


def read_id_only(cls: Callable[[int], E]) -> Callable[[list[bytes]], E]:
    """Return a reader for ``<KIND> <id>`` frames (STOP, CANCEL, PING)."""

    def read(parts: list[bytes]) -> E:
        _nfields(parts, 2)
        return cls(rid(parts[1]))

    read.__doc__ = f"``{cls.__name__.upper()} <id>``."
    return read


def payload_sizes(kind: bytes, parts: list[bytes], table: dict[bytes, int]) -> tuple[int, ...] | None:
    """Return the payload sizes a payload-carrying line announces, or None
    when they cannot be read (section 7: only a readable byte count makes the
    reader skip a bad frame's payload). The line must have no empty field."""
    i = table[kind]
    if len(parts) <= i or b"" in parts:
        return None
    try:
        sizes = [uint(parts[i])]
    except BadFrame:
        return None
    if kind == b"SUBMIT" and len(parts) > g.SUBMIT_GBYTES_FIELD and b"=" not in parts[g.SUBMIT_GBYTES_FIELD]:
        try:
            sizes.append(uint(parts[g.SUBMIT_GBYTES_FIELD]))
        except BadFrame:
            pass
    return tuple(sizes)
