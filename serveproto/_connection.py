"""The two connection roles: GatewayConnection and EngineConnection.

Sans-IO: feed bytes with ``receive_data``, pull events with ``next_event``,
turn events into bytes with ``send``. No I/O, no threads, no async. The
gateway side reads the engine's stdout and writes its stdin; the engine side
the reverse.

``next_event`` is two steps, as h11 splits it: framing
(``_extract_next_receive_event``: bytes -> one event, the frame's syntax only)
then state (``_process_event``: the handshake and the request's state machine
say whether that event may come now).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping

from . import _events as ev
from . import _grammar as g
from . import _readers as rd
from . import _state as st
from ._buffer import ReceiveBuffer
from ._errors import LocalProtocolError, RemoteProtocolError
from ._util import Sentinel
from ._writers import WRITERS

__all__ = ["GatewayConnection", "EngineConnection"]

_NEED_DATA = st.NEED_DATA
_read_plain_echo = rd.read_plain_echo
_SERVING = st.SERVING
_Echo = ev.Echo
_ConnectionClosed = ev.ConnectionClosed
_kind_match = g.KIND_RE.fullmatch
#: How many ids of STOP / CANCEL the gateway remembers, to accept a late
#: ``ERROR <id> NOT_FOUND`` for a request that had already ended.
_CONTROLLED_MEMORY = 1024


def _request_id(parts: list[bytes]) -> int:
    """The id a bad frame is tied to: its second field when that is a valid id."""
    if len(parts) > 1:
        try:
            return rd.rid(parts[1])
        except rd.BadFrame:
            pass
    return 0


class _Connection:
    """What both roles share: the receive buffer, limits and the handshake step."""

    def __init__(self, max_line: int = g.MAX_LINE, max_payload: int = g.MAX_PAYLOAD) -> None:
        if type(max_line) is not int or max_line < 16:
            raise ValueError(f"max_line must be an int >= 16 bytes, got {max_line!r}")
        if type(max_payload) is not int or max_payload < 0:
            raise ValueError(f"max_payload must be an int >= 0 bytes, got {max_payload!r}")
        self.max_line = max_line
        self.max_payload = max_payload
        self._buf = ReceiveBuffer()
        self._step: type[Sentinel] = st.WAIT_READY
        self._caps: ev.Caps | None = None
        self._requests: dict[int, st.RequestState] = {}
        self._pings: set[int] = set()
        self._closed_event: ev.ConnectionClosed | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} state={self.state!r} in_flight={len(self._requests)} buffered={len(self._buf)}>"

    @property
    def state(self) -> type[Sentinel]:
        """HANDSHAKE, SERVING, CLOSED or ERROR (see each role)."""
        raise NotImplementedError

    def receive_data(self, data: bytes) -> None:
        """Feed bytes read from the peer; ``b""`` means the peer closed its end (EOF).

        Raises LocalProtocolError (code BAD_SEQUENCE) for data after EOF.
        """
        if self._buf.eof:
            raise LocalProtocolError("receive_data() after EOF", "BAD_SEQUENCE")
        self._buf.feed(data)

    @property
    def caps(self) -> ev.Caps | None:
        """The engine's Caps once the handshake is done (``Caps({})`` when it
        sent no CAPS line); None before."""
        return self._caps if self._step is st.SERVING else None

    @property
    def in_flight(self) -> tuple[int, ...]:
        """Ids of the requests in flight (SUBMIT, DECIDE, SCORE), oldest first."""
        return tuple(self._requests)

    @property
    def trailing_data(self) -> tuple[bytes, bool]:
        """(unconsumed bytes, whether EOF was received): for diagnostics."""
        self._buf.pull()
        return self._buf.data[self._buf.pos :], self._buf.eof

    def _ready(self) -> bool:
        """Make the fed bytes contiguous; False when nothing new can complete a frame
        (fewer bytes than ``need``), so the caller waits."""
        buf = self._buf
        if buf.chunked:
            if len(buf) < buf.need:
                return False
            buf.pull()
            buf.need = 0
            return True
        return not buf.need

    def _closed(self) -> ev.ConnectionClosed:
        if self._closed_event is None:
            self._closed_event = ev.ConnectionClosed(tuple(self._requests))
        return self._closed_event

    def _advance_handshake(self, e: ev.Event) -> bool:
        """Move the handshake on for event ``e``; False when ``e`` is not allowed now."""
        nxt = st.HANDSHAKE_TRANSITIONS.get((self._step, type(e)))
        if nxt is None:
            return False
        if isinstance(e, ev.Caps):
            self._caps = e
        elif nxt is st.SERVING and self._caps is None:
            self._caps = ev.Caps({})
        self._step = nxt
        return True


class GatewayConnection(_Connection):
    """The gateway's end: reads the engine's frames, writes requests.

    ``GatewayConnection(max_line=4096, max_payload=64 << 20)``: the longest
    line (bytes, ``\\n`` included) and the largest payload (bytes) accepted
    from the engine.

    ``next_event()`` returns the engine's events in order (``Ready``,
    ``Caps``, ``Stat``, ``LoadFail``, ``Telemetry``, ``Accept``, ``Echo``,
    ``Data``, ``Decision``, ``Scored``, ``Done``, ``Error``, ``Pong``),
    ``NEED_DATA``, or ``ConnectionClosed`` after EOF. A frame that does not
    parse, a frame out of the handshake order, or a reply that breaks a
    per-request invariant (spec section 5) raises ``RemoteProtocolError``
    and leaves the connection in state ``ERROR``: every later call raises
    the same error.

    ``send(event)`` returns the request's bytes. It raises
    ``LocalProtocolError`` (and writes nothing) for a request before the
    handshake ends or after the connection closed (BAD_SEQUENCE), an id
    already in flight (DUPLICATE_ID), an extension the engine did not
    advertise in CAPS (NOT_SUPPORTED: ``Score`` without ``x_score``,
    ``Ping`` without ``x_health``, ``counters=True`` without
    ``x_counters``, ``Decide`` without ``decide``, ``Image`` without
    ``vision``), or anything but another ``Image`` of its id between an
    ``Image`` and its ``Submit`` or ``Score``.
    """

    def __init__(self, max_line: int = g.MAX_LINE, max_payload: int = g.MAX_PAYLOAD) -> None:
        super().__init__(max_line, max_payload)
        self._error: RemoteProtocolError | None = None
        self._controlled: OrderedDict[int, None] = OrderedDict()
        self._image_id: int | None = None
        self._readers: dict[bytes, Callable[..., ev.Event]] = {
            b"ECHO": rd.read_echo,
            b"DATA": rd.read_data,
            b"DECISION": rd.read_decision,
            b"SCORED": rd.read_scored,
            b"HIDDEN": rd.read_hidden,
            b"ACCEPT": rd.read_accept,
            b"DONE": rd.read_done,
            b"ERROR": rd.read_error,
            b"CAPS": rd.read_caps,
            b"STAT": rd.read_stat,
            b"LOAD_FAIL": rd.read_load_fail,
            b"PONG": rd.read_pong,
            g.READY_LINE: _read_ready,
        }

    @property
    def state(self) -> type[Sentinel]:
        """HANDSHAKE, SERVING, CLOSED (EOF or LOAD_FAIL) or ERROR."""
        if self._error is not None:
            return st.ERROR
        if self._closed_event is not None or self._step is st.LOAD_FAILED:
            return st.CLOSED
        return st.SERVING if self._step is st.SERVING else st.HANDSHAKE

    def _fail(self, reason: str, request_id: int = 0, code: str = "BAD_FRAME") -> RemoteProtocolError:
        self._error = RemoteProtocolError(reason, code, request_id)
        return self._error

    def next_event(self) -> ev.Event | type[st.NEED_DATA]:
        """Return the next event, NEED_DATA, or ConnectionClosed (see the class)."""
        if self._error is not None:
            raise self._error
        e = self._extract_next_receive_event()
        if e is None:
            return _NEED_DATA
        if type(e) is not _ConnectionClosed:
            self._process_event(e)
        return e

    def _extract_next_receive_event(self) -> ev.Event | None:
        """Framing: the next frame's event from the buffer, ConnectionClosed after EOF,
        or None when more bytes are needed. Checks the frame's syntax, not its timing."""
        buf = self._buf
        if buf.chunked:
            if len(buf) < buf.need:
                return self._wait()
            buf.pull()
            buf.need = 0
        elif buf.need:
            return self._wait()
        data, pos = buf.data, buf.pos
        nl = data.find(b"\n", pos, pos + self.max_line)
        if nl < 0:
            if len(buf) >= self.max_line:
                raise self._fail(f"line longer than {self.max_line} bytes")
            buf.need = len(buf) + 1
            return self._wait()
        echo = _read_plain_echo(data, pos, nl, self.max_payload)
        if echo is not None:
            buf.pos = nl + 2 + len(echo.text)
            return echo
        parts = data[pos:nl].split(b" ")
        kind = parts[0]
        reader = self._readers.get(kind)
        e: ev.Event
        try:
            if reader is None:
                if _kind_match(kind) is None:
                    raise rd.BadFrame(f"line does not start with a kind: {data[pos:nl][:40]!r}")
                e = rd.read_telemetry(kind, data[pos:nl])
                end = nl + 1
            elif kind in g.REPLY_PAYLOAD_FIELD:
                n = rd.uint(parts[2]) if len(parts) > 2 else -1
                if n < 0 or n > self.max_payload:
                    raise rd.BadFrame(f"payload size missing or over {self.max_payload} bytes")
                end = nl + 1 + n
                if len(data) <= end:
                    buf.need = end + 1 - pos
                    return self._wait()
                if data[end] != 10:
                    raise rd.BadFrame(f"payload of {n} bytes not followed by a newline")
                e = reader(parts, data[nl + 1 : end])
                end += 1
            else:
                e = reader(parts)
                end = nl + 1
        except rd.BadFrame as exc:
            raise self._fail(
                f"{exc.args[0]} (in {kind[:20].decode('latin-1')} line)",
                _request_id(parts) if reader is not None else 0,
            ) from None
        buf.pos = end
        buf.need = 0
        return e

    def _wait(self) -> ev.ConnectionClosed | None:
        buf = self._buf
        if not buf.eof:
            return None
        if len(buf):
            raise self._fail(f"EOF inside a frame ({len(buf)} bytes left)")
        return self._closed()

    def _process_event(self, e: ev.Event) -> None:
        """State: check a received frame event against the connection's handshake and its
        request's state machine (spec sections 3 and 5); raise RemoteProtocolError for a breach."""
        cls = type(e)
        if self._step is _SERVING:
            if type(e) is _Echo:  # the hot path of a read-out: straight to the request's check
                req = self._requests.get(e.id)
                if req is not None:
                    try:
                        req.echo(e)
                    except st.Breach as b:
                        raise self._fail(b.args[0], req.id, "BAD_SEQUENCE") from None
                    return
            if isinstance(e, st.REQUEST_REPLY_CLASSES):
                i = e.id
                req = self._requests.get(i)
                if req is None:
                    raise self._fail(f"{cls.__name__.upper()} for id {i} not in flight", i, "BAD_SEQUENCE")
                try:
                    ended = req.check(e)
                except st.Breach as b:
                    raise self._fail(b.args[0], i, "BAD_SEQUENCE") from None
                if ended:
                    del self._requests[i]
                return
            if isinstance(e, ev.Error):
                self._receive_error(e)
                return
            if isinstance(e, ev.Pong):
                if e.id not in self._pings:
                    raise self._fail(f"PONG {e.id} answers no PING", e.id, "BAD_SEQUENCE")
                self._pings.discard(e.id)
                return
            if cls is ev.Telemetry:
                return
            raise self._fail(f"{cls.__name__.upper()} after the handshake", 0, "BAD_SEQUENCE")
        if cls is ev.Telemetry:
            return
        if self._step is st.LOAD_FAILED or not self._advance_handshake(e):
            raise self._fail(
                f"{cls.__name__.upper()} during the handshake (at {self._step!r})", getattr(e, "id", 0), "BAD_SEQUENCE"
            )

    def _receive_error(self, e: ev.Error) -> None:
        i = e.id
        if i in self._requests:
            del self._requests[i]
        elif i in self._pings:
            self._pings.discard(i)
        elif i in self._controlled:
            del self._controlled[i]
        elif i != 0:
            raise self._fail(f"ERROR for id {i} not in flight", i, "BAD_SEQUENCE")

    def send(self, e: ev.Event) -> bytes:
        """Return the bytes of request ``e`` (see the class for what is refused)."""
        if self._step is not st.SERVING or self._error is not None or self._closed_event is not None:
            raise LocalProtocolError(
                f"cannot send {type(e).__name__} in state {self.state!r}", "BAD_SEQUENCE", getattr(e, "id", 0)
            )
        cls = type(e)
        caps = self._caps
        assert caps is not None
        i = getattr(e, "id", 0)
        if self._image_id is not None and not (cls in (ev.Submit, ev.Score, ev.Image) and i == self._image_id):
            raise LocalProtocolError(
                f"IMAGE {self._image_id} must be followed by its SUBMIT or SCORE (or another IMAGE of it)",
                "BAD_SEQUENCE",
                i,
            )
        if cls in st.KIND_REPLIES or cls is ev.Ping or cls is ev.Image:
            need = _NEEDS.get(cls)
            if isinstance(e, ev.Submit) and e.counters:
                need = "x_counters"
            if need is not None and not getattr(caps, need):
                raise LocalProtocolError(f"the engine did not advertise {need}=1 in CAPS", "NOT_SUPPORTED", i)
            if i in self._requests or i in self._pings or (cls is ev.Decide and i == self._image_id):
                raise LocalProtocolError(f"id {i} is already in flight", "DUPLICATE_ID", i)
        elif cls not in (ev.Stop, ev.Cancel):
            raise LocalProtocolError(f"{cls.__name__} is not a request", "BAD_SEQUENCE", i)
        out = WRITERS[cls](e)
        if cls is ev.Ping:
            self._pings.add(i)
        elif cls is ev.Image:
            self._image_id = i
        elif cls is ev.Stop or cls is ev.Cancel:
            self._controlled[i] = None
            self._controlled.move_to_end(i)
            if len(self._controlled) > _CONTROLLED_MEMORY:
                self._controlled.popitem(last=False)
        else:
            assert isinstance(e, (ev.Submit, ev.Decide, ev.Score))  # cls is in KIND_REPLIES
            shape = ev.score_shape(e.payload) if isinstance(e, ev.Score) else None
            if cls is ev.Score and shape is None:
                raise LocalProtocolError("Score.payload is not the JSON of spec section 9.1", "BAD_FRAME", i)
            self._requests[i] = st.RequestState(e, shape)
            self._image_id = None
        return out


#: The CAPS flag a request kind needs.
_NEEDS = {ev.Score: "x_score", ev.Ping: "x_health", ev.Decide: "decide", ev.Image: "vision"}


def _read_ready(parts: list[bytes]) -> ev.Ready:
    if len(parts) != 1:
        raise rd.BadFrame("READY line with extra bytes")
    return ev.Ready()


class EngineConnection(_Connection):
    """The engine's end: reads requests, writes its handshake and replies.

    ``EngineConnection(max_line=4096, max_payload=64 << 20)``: limits on the
    gateway's lines and payloads, in bytes.

    ``next_event()`` returns ``Submit``, ``Image``, ``Stop``, ``Cancel``,
    ``Decide``, ``Score``, ``Ping``, ``NEED_DATA``, or ``ConnectionClosed``
    after EOF (a graceful shutdown: finish the requests in flight, listed in
    ``ConnectionClosed.unfinished``, then exit). A bad request frame raises
    ``RemoteProtocolError`` whose ``code`` and ``request_id`` are what the
    engine should answer (``ERROR <request_id> <code> <reason>``): BAD_FRAME
    for a frame that does not parse (spec sections 1, 4, 8; unknown kinds,
    including SCORE / PING when not advertised, with id 0), DUPLICATE_ID for
    an id already in flight. The frame and its payload (when its byte count
    could be read) are skipped and the connection stays usable. Whether a
    well-formed request can be served (slot range, an IMAGE followed by its
    SUBMIT, ...: BAD_REQUEST, NOT_SUPPORTED) is the engine's to decide.

    ``send(event)`` returns the bytes of a handshake line, a telemetry line
    or a reply; ``send_handshake()`` writes READY, CAPS and STAT at once. It
    raises ``LocalProtocolError`` (and writes nothing) for the handshake out
    of order (BAD_SEQUENCE), a reply before the handshake ends, a reply for
    a request not in flight, or a reply that breaks a per-request invariant
    (spec section 5). ``ERROR`` may always be sent: for an id in flight it
    ends the request (except DUPLICATE_ID, which answers the duplicate).
    """

    def __init__(self, max_line: int = g.MAX_LINE, max_payload: int = g.MAX_PAYLOAD) -> None:
        super().__init__(max_line, max_payload)
        self._discard = 0
        self._discard_line = False
        self._sent_caps: ev.Caps = ev.Caps({})

    @property
    def state(self) -> type[Sentinel]:
        """HANDSHAKE (until STAT is sent), SERVING, or CLOSED (EOF received, or LOAD_FAIL sent)."""
        if self._closed_event is not None or self._step is st.LOAD_FAILED:
            return st.CLOSED
        return st.SERVING if self._step is st.SERVING else st.HANDSHAKE

    def next_event(self) -> ev.Event | type[st.NEED_DATA]:
        """Return the next request event, NEED_DATA, or ConnectionClosed (see the class)."""
        e = self._extract_next_receive_event()
        if e is None:
            return _NEED_DATA
        if type(e) is not _ConnectionClosed:
            self._process_event(e)
        return e

    def _extract_next_receive_event(self) -> ev.Event | None:
        """Framing: the next request frame's event, ConnectionClosed after EOF, or None when
        more bytes are needed. A frame that does not parse raises RemoteProtocolError once
        it is skipped; whether it comes at the right time is ``_process_event``'s to say."""
        buf = self._buf
        if self._discard or self._discard_line:
            if not self._skip():
                return self._closed() if buf.eof else None
        if not self._ready():
            return self._wait()
        data, pos = buf.data, buf.pos
        nl = data.find(b"\n", pos, pos + self.max_line)
        if nl < 0:
            if len(buf) >= self.max_line:
                self._discard_line = True
                self._skip()
                raise RemoteProtocolError(f"line longer than {self.max_line} bytes", "BAD_FRAME", 0)
            buf.need = len(buf) + 1
            return self._wait()
        parts = data[pos:nl].split(b" ")
        kind = parts[0]
        if kind not in g.REQUEST_KINDS or not self._knows(kind):
            buf.pos = nl + 1
            buf.need = 0
            shown = kind[:20].decode("latin-1") if _kind_match(kind) else repr(data[pos:nl][:20])
            raise RemoteProtocolError(f"unknown kind {shown}", "BAD_FRAME", 0)
        end = nl + 1
        payloads: tuple[bytes, ...] = ()
        bad: str | None = None
        field = g.REQUEST_PAYLOAD_FIELD.get(kind)
        if field is not None:
            sizes = rd.payload_sizes(kind, parts, g.REQUEST_PAYLOAD_FIELD)
            if sizes is None:
                bad = "payload size missing or unreadable"
            elif max(sizes) > self.max_payload:
                buf.pos = end
                buf.need = 0
                self._discard = sum(sizes) + len(sizes)
                self._skip()
                raise RemoteProtocolError(f"payload over {self.max_payload} bytes", "BAD_FRAME", _request_id(parts))
            else:
                total = sum(sizes) + len(sizes)
                if len(data) < end + total:
                    buf.need = end + total - pos
                    return self._wait()
                got_payloads = []
                for n in sizes:
                    if data[end + n] != 10:
                        buf.pos = end + n
                        buf.need = 0
                        raise RemoteProtocolError(
                            f"payload of {n} bytes not followed by a newline", "BAD_FRAME", _request_id(parts)
                        )
                    got_payloads.append(data[end : end + n])
                    end += n + 1
                payloads = tuple(got_payloads)
        buf.pos = end
        buf.need = 0
        try:
            if bad is not None:
                raise rd.BadFrame(bad)
            e = self._read(kind, parts, payloads)
        except rd.BadFrame as exc:
            raise RemoteProtocolError(
                f"{exc.args[0]} (in {kind.decode()} line)", "BAD_FRAME", _request_id(parts)
            ) from None
        except LocalProtocolError as exc:
            raise RemoteProtocolError(exc.reason, "BAD_FRAME", _request_id(parts)) from None
        return e

    def _knows(self, kind: bytes) -> bool:
        need = g.REQUEST_KINDS[kind]
        return need is None or self._sent_caps.values.get(need) == "1"

    def _read(self, kind: bytes, parts: list[bytes], payloads: tuple[bytes, ...]) -> ev.Event:
        if kind == b"SUBMIT":
            return rd.read_submit(parts, payloads, self._sent_caps.x_counters)
        if kind == b"IMAGE":
            return rd.read_image(parts, payloads)
        if kind == b"DECIDE":
            return rd.read_decide(parts, payloads)
        if kind == b"SCORE":
            return rd.read_score(parts, payloads)
        return _ID_READERS[kind](parts)

    def _skip(self) -> bool:
        """Drop the rest of a refused frame; True when nothing is left to drop."""
        buf = self._buf
        if self._discard:
            self._discard -= buf.consume(self._discard)
        if self._discard_line and not self._discard:
            buf.pull()
            nl = buf.data.find(b"\n", buf.pos)
            if nl < 0:
                buf.pos = len(buf.data)
            else:
                buf.pos = nl + 1
                self._discard_line = False
        buf.need = 0
        return not (self._discard or self._discard_line)

    def _wait(self) -> ev.ConnectionClosed | None:
        buf = self._buf
        if not buf.eof:
            return None
        if len(buf):
            n = len(buf)
            buf.consume(n)
            raise RemoteProtocolError(f"EOF inside a frame ({n} bytes dropped)", "BAD_FRAME", 0)
        return self._closed()

    def _process_event(self, e: ev.Event) -> None:
        """State: a request whose id is already in flight raises RemoteProtocolError
        (DUPLICATE_ID); SUBMIT, DECIDE, SCORE and PING are then in flight."""
        if isinstance(e, (ev.Submit, ev.Decide, ev.Score, ev.Ping)):
            i = e.id
            if i in self._requests or i in self._pings:
                raise RemoteProtocolError(f"id {i} is already in flight", "DUPLICATE_ID", i)
            if isinstance(e, ev.Ping):
                self._pings.add(i)
            else:
                shape = ev.score_shape(e.payload) if isinstance(e, ev.Score) else None
                self._requests[i] = st.RequestState(e, shape)

    def send_handshake(self, caps: ev.Caps | Mapping[str, str] | None = None, rss_gb: float = 0.0) -> bytes:
        """Return READY, the CAPS line (when ``caps`` is given) and ``STAT 0 0 0 <rss_gb>``.

        ``caps``: a Caps event or a mapping of CAPS keys to text values;
        ``rss_gb``: resident memory in GB. Raises LocalProtocolError like send().
        """
        out = self.send(ev.Ready())
        if caps is not None:
            out += self.send(caps if isinstance(caps, ev.Caps) else ev.Caps(dict(caps)))
        return out + self.send(ev.Stat((0.0, 0.0, 0.0, float(rss_gb))))

    def send(self, e: ev.Event) -> bytes:
        """Return the bytes of event ``e`` (see the class for what is refused)."""
        cls = type(e)
        if cls in st.HANDSHAKE_EVENTS:
            if not self._advance_handshake(e):
                raise LocalProtocolError(
                    f"{cls.__name__.upper()} out of the handshake order (at {self._step!r})", "BAD_SEQUENCE"
                )
            if isinstance(e, ev.Caps):
                self._sent_caps = e
            return WRITERS[cls](e)
        if cls is ev.Telemetry:
            return WRITERS[cls](e)
        i = getattr(e, "id", 0)
        if self._step is not st.SERVING:
            raise LocalProtocolError(f"{cls.__name__.upper()} before the handshake ended", "BAD_SEQUENCE", i)
        if cls in st.REQUEST_REPLIES:
            req = self._requests.get(i)
            if req is None:
                raise LocalProtocolError(f"{cls.__name__.upper()} for id {i} not in flight", "BAD_SEQUENCE", i)
            try:
                ended = req.check(e)
            except st.Breach as b:
                raise LocalProtocolError(b.args[0], "BAD_SEQUENCE", i) from None
            out = WRITERS[cls](e)
            if ended:
                del self._requests[i]
            return out
        if isinstance(e, ev.Error):
            if i in self._requests and e.code != "DUPLICATE_ID":
                del self._requests[i]
            self._pings.discard(i)
            return WRITERS[cls](e)
        if cls is ev.Pong:
            if i not in self._pings:
                raise LocalProtocolError(f"PONG {i} answers no PING", "BAD_SEQUENCE", i)
            self._pings.discard(i)
            return WRITERS[cls](e)
        raise LocalProtocolError(f"{cls.__name__} is not a reply", "BAD_SEQUENCE", i)


_ID_READERS = {
    b"STOP": rd.read_id_only(ev.Stop),
    b"CANCEL": rd.read_id_only(ev.Cancel),
    b"PING": rd.read_id_only(ev.Ping),
}
