"""A small HTTP/1.1 server: h11 for the protocol, anyio for the sockets.

One task per connection, one request at a time per connection: keep-alive is
kept, and pipelined requests are answered in order (h11 holds the bytes of the
next request until this one's response is sent). Each connection has one
reader task, which owns the socket's receiving side and feeds h11 for as long
as the connection lives; so the connection is watched while a handler runs: a
client that closes it cancels the handler (and the engine work under it).
Header block and body sizes are bounded (431 / 413), the head and the body
each have a read timeout (408), and ``Content-Encoding`` bodies are decoded
with a bound on their output. A head whose framing RFC 9112 says to distrust
is refused before h11 reads it (:mod:`gateway.http.framing`: 400, closed), and
a handler's ``screen`` sees each head before its body is read (auth first).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from email.utils import formatdate
from http import HTTPStatus
from typing import Any

import anyio
import anyio.abc
import attrs
import h11
import orjson

from gateway.http import framing
from gateway.http.encoding import decode_body
from gateway.http.message import HTTPError, Request, Response

log = logging.getLogger("serveproto.http")
#: The access log, shared with the application's one-line-per-request records.
access_log = logging.getLogger("serveproto.access")

Handler = Callable[[Request], Awaitable[Response]]
#: A handler's optional ``screen`` method: called with the request's head alone (``body`` empty)
#: before the body is read or decoded; a response it returns is sent at once and the connection
#: closed (e.g. a 401, so that no unauthenticated body is ever inflated). None lets the request on.
Screen = Callable[[Request], "Response | None"]

_RECEIVE = 65536
#: Seconds a closing connection keeps reading what the client still sends.
LINGER = 1.0
#: Bytes h11 may hold unread before the reader stops reading ahead (it reads on when the request
#: loop needs more); pipelined requests up to this size are read while a handler runs.
READ_AHEAD = 256 * 1024
_SERVER_NAME = b"serveproto"


@attrs.frozen
class Limits:
    """Bounds and timeouts of the server.

    Sizes in bytes, times in seconds. ``max_header_bytes``: the request line
    plus headers (431 above it). ``max_body_bytes``: the body as sent on the
    wire (413). ``max_decoded_bytes``: the body after ``Content-Encoding``
    decoding (413). ``header_timeout``: from the first byte of a request to
    the end of its head; ``body_timeout``: reading the body; both answer 408.
    ``keepalive_timeout``: an idle keep-alive connection is closed after it.
    ``max_connections``: connections served at once; one more is answered
    503 + ``Retry-After`` and closed.
    """

    max_header_bytes: int = 16 * 1024
    max_body_bytes: int = 16 << 20
    max_decoded_bytes: int = 64 << 20
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    keepalive_timeout: float = 75.0
    max_connections: int = 1024


def new_request_id() -> str:
    """A fresh request id, ``req_`` + 24 hex digits (96 random bits)."""
    return "req_" + os.urandom(12).hex()


def _error_response(status: int, error_type: str, message: str) -> Response:
    return HTTPError(status, error_type, message).response()


class _Closed(Exception):
    """The peer went away; the connection ends without a response."""


class HTTPConnection:
    """Serves the requests of one accepted byte stream with ``handler``.

    Two tasks share the connection: :meth:`_reader` receives bytes into h11
    (``receive_data``) and wakes the request loop; the request loop pulls h11
    events and awaits the handler under a cancel scope that the reader
    cancels when the peer closes. A request that arrives whole costs no new
    task and no timeout scope: timeouts are entered only to wait for bytes.
    """

    def __init__(
        self,
        stream: anyio.abc.ByteStream,
        handler: Handler,
        limits: Limits,
        client: str = "",
        on_release: Callable[[], None] | None = None,
    ) -> None:
        self.stream = stream
        self._on_release = on_release  # called once, when the peer's EOF is seen or serving ends
        self.handler = handler
        self._screen: Screen | None = getattr(handler, "screen", None)
        self.limits = limits
        self.client = client
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.max_header_bytes)
        self._eof = False  # the reader has fed h11 the peer's EOF
        self._arrived: anyio.Event | None = None  # set by the reader when bytes (or EOF) arrive
        self._resume: anyio.Event | None = None  # set to wake a reader paused by READ_AHEAD
        self._draining = False  # closing: read and drop what the client still sends
        self._handler_scope: anyio.CancelScope | None = None
        self._stopping = False  # the server drains: serve no request after this one
        self._idle_scope: anyio.CancelScope | None = None  # around the keep-alive wait for the next request

    def stop(self) -> None:
        """Serve no further request: the one being answered finishes (its response closes the
        connection), an idle keep-alive connection closes at once."""
        self._stopping = True
        if self._idle_scope is not None:
            self._idle_scope.cancel()

    async def _reader(self) -> None:
        """Receive until EOF: into h11, or dropped once the connection is closing."""
        while True:
            if not self._draining and self._arrived is None and len(self.conn.trailing_data[0]) >= READ_AHEAD:
                self._resume = anyio.Event()  # enough read ahead: wait until the request loop needs more
                await self._resume.wait()
                self._resume = None
            try:
                data = await self.stream.receive(_RECEIVE)
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                data = b""
            if not self._draining:
                self.conn.receive_data(data)
            if not data:
                self._eof = True
            arrived, self._arrived = self._arrived, None
            if arrived is not None:
                arrived.set()
            if not data:
                if self._handler_scope is not None:
                    self._handler_scope.cancel()
                self._release()
                return

    def _release(self) -> None:
        # A connection whose peer has closed its side no longer counts toward
        # max_connections: it is only finishing (its handler is cancelled).
        release, self._on_release = self._on_release, None
        if release is not None:
            release()

    async def _receive(self) -> None:
        """Wait until the reader has fed h11 more bytes or the EOF (at once if it already saw the EOF)."""
        if self._eof:
            return
        arrived = self._arrived = anyio.Event()
        if self._resume is not None:
            self._resume.set()
        await arrived.wait()

    async def _send(self, event: h11.Event) -> None:
        data = self.conn.send(event)
        if data:
            try:
                await self.stream.send(data)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
                raise _Closed() from exc

    async def serve(self) -> None:
        """Answer requests until the peer closes, a timeout, or a response that ends the connection."""
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._reader)
                try:
                    while True:
                        if not await self._serve_one():
                            break
                        self.conn.start_next_cycle()
                    await self._linger()
                except _Closed:
                    pass
                finally:
                    tg.cancel_scope.cancel()
        finally:
            self._release()
            with anyio.CancelScope(shield=True):
                await self.stream.aclose()

    async def _linger(self) -> None:
        """Half-close and read what the client still sends (at most ``LINGER`` seconds) before closing.

        Closing a socket over unread bytes (the rest of a refused upload, a
        pipelined request) makes the kernel reset the connection, which can
        destroy the response before the client has read it.
        """
        self._draining = True
        if self._resume is not None:
            self._resume.set()
        with anyio.move_on_after(LINGER):
            try:
                await self.stream.send_eof()
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                return
            while not self._eof:
                await self._receive()

    async def _read_head(self) -> h11.Request | None:
        """Wait (keep-alive idle) for a request and read its head. None when the peer closed."""
        if not self.conn.trailing_data[0]:
            if self._stopping:
                return None
            with anyio.move_on_after(self.limits.keepalive_timeout) as idle:
                self._idle_scope = idle
                try:
                    await self._receive()
                finally:
                    self._idle_scope = None
            if not self.conn.trailing_data[0]:
                return None
        self._check_head()
        event = self.conn.next_event()
        if event is h11.NEED_DATA:
            with anyio.fail_after(self.limits.header_timeout):
                while event is h11.NEED_DATA:
                    await self._receive()
                    self._check_head()
                    event = self.conn.next_event()
        if isinstance(event, h11.ConnectionClosed):
            return None
        assert isinstance(event, h11.Request), event
        return event

    def _check_head(self) -> None:
        """Bound the head's size (431) and, once it has arrived whole, refuse framing that is not to be
        trusted (:func:`gateway.http.framing.check_head`, raises ``FramingError``) before h11 reads it."""
        # h11 bounds only a head that is still incomplete; one that arrives
        # whole in a single read is bounded here.
        limit = self.limits.max_header_bytes
        buf = self.conn.trailing_data[0]
        end = framing.head_end(buf, limit)
        if (end == -1 and len(buf) > limit) or end > limit:
            raise h11.RemoteProtocolError("request header block too large", error_status_hint=431)
        if end != -1:
            framing.check_head(buf[:end])

    def _consume_refused_head(self) -> None:
        # h11 lets a response be sent once it has read the head (or failed to): let it do either
        try:
            self.conn.next_event()
        except h11.RemoteProtocolError:
            pass

    async def _read_body(self, head: h11.Request) -> bytes:
        """The body as sent on the wire; 413 as soon as it is over the bound."""
        limit = self.limits.max_body_bytes
        for name, value in head.headers:
            if name == b"content-length" and int(value) > limit:
                raise HTTPError(413, "request_too_large", f"the request body is over {limit} bytes")
        chunks: list[bytes] = []
        size = 0
        deadline: float | None = None  # the body timeout starts at the first wait
        while True:
            event = self._next_body_event(limit)
            if isinstance(event, h11.Data):
                size += len(event.data)
            if size > limit or size + _chunk_left(self.conn) > limit:
                # a chunk announced past the bound is refused now, not after its bytes (or the timeout)
                raise HTTPError(413, "request_too_large", f"the request body is over {limit} bytes")
            if event is h11.NEED_DATA:
                if self.conn.they_are_waiting_for_100_continue:
                    await self._send(h11.InformationalResponse(status_code=100, headers=[]))
                if deadline is None:
                    deadline = anyio.current_time() + self.limits.body_timeout
                with anyio.fail_after(max(0.0, deadline - anyio.current_time())):
                    await self._receive()
            elif isinstance(event, h11.Data):
                chunks.append(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
            elif isinstance(event, h11.ConnectionClosed):
                raise _Closed()

    def _next_body_event(self, limit: int) -> Any:
        """h11's next event of a body; a chunk size too long for h11's grammar (over 20 hex digits, 2**80
        and up) is over the bound as much as one it reads, and refused the same way: 413, not 400."""
        try:
            return self.conn.next_event()
        except h11.RemoteProtocolError as exc:
            size = _refused_chunk_size(str(exc))
            if size is not None and size > limit:
                raise HTTPError(413, "request_too_large", f"the request body is over {limit} bytes") from None
            raise

    async def _serve_one(self) -> bool:
        """One request cycle. Returns True when the connection may serve another."""
        started = time.perf_counter()
        request_id = new_request_id()
        try:
            head = await self._read_head()
        except h11.RemoteProtocolError as exc:
            await self._send_error_and_close(
                exc.error_status_hint, "invalid_request_error", str(exc) or "malformed request", request_id
            )
            return False
        except TimeoutError:
            await self._send_error_and_close(
                408, "request_timeout", "the request head was not received in time", request_id
            )
            return False
        except framing.FramingError as exc:
            # Close after answering: whatever follows this head cannot be told apart from its body.
            self._consume_refused_head()
            await self._send_error_and_close(400, "invalid_request_error", str(exc), request_id)
            return False
        if head is None:
            return False
        if self._screen is not None:
            refused = self._screen(self._request(head, b"", request_id))
            if refused is not None:
                # The body is left unread (the linger drops it): answer and close.
                await self._send_response(self._finish(refused, request_id, close=True), head.method == b"HEAD")
                return False
        try:
            raw = await self._read_body(head)
            encoding = _header(head.headers, b"content-encoding")
            if encoding and len(raw) > 1 << 18:
                body = await anyio.to_thread.run_sync(decode_body, raw, encoding, self.limits.max_decoded_bytes)
            else:
                body = decode_body(raw, encoding, self.limits.max_decoded_bytes)
        except h11.RemoteProtocolError as exc:
            await self._send_error_and_close(
                exc.error_status_hint, "invalid_request_error", str(exc) or "malformed request", request_id
            )
            return False
        except TimeoutError:
            await self._send_error_and_close(
                408, "request_timeout", "the request body was not received in time", request_id
            )
            return False
        except HTTPError as exc:
            # The rest of the body may still be on the wire: answer and close.
            await self._send_response(self._finish(exc.response(), request_id, close=True), head.method == b"HEAD")
            return False
        request = self._request(head, body, request_id)
        response = await self._call_watching(request)
        if response is None:
            # nginx's 499 "client closed request": no response is sent, the line says why
            access_log.info(
                access_line(
                    request,
                    499,
                    time.perf_counter() - started,
                    {"error": "the client closed the connection; the request was cancelled"},
                )
            )
            raise _Closed()
        await self._send_response(self._finish(response, request_id, close=self._stopping), request.method == "HEAD")
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "%s %s %s %.1fms", request_id, request.method, request.target, (time.perf_counter() - started) * 1e3
            )
        return self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE

    def _request(self, head: h11.Request, body: bytes, request_id: str) -> Request:
        return Request(
            method=head.method.decode("ascii"),
            target=head.target.decode("latin-1"),
            headers=tuple(head.headers),
            body=body,
            request_id=request_id,
            http_version=head.http_version.decode("ascii"),
            client=self.client,
        )

    async def _call_watching(self, request: Request) -> Response | None:
        """Run the handler while the reader watches the connection; None when the client went away meanwhile.

        The reader goes on reading while the handler runs. Bytes it gets (a
        pipelined next request) go to h11, which holds them until this
        response is sent; it stops reading once :data:`READ_AHEAD` bytes wait
        there. An EOF (the client closed, or shut down its sending side)
        cancels the handler, so that the engine work it started is cancelled
        (the supervisor sends CANCEL, or leaves the slot queue) instead of
        running for nobody.
        """
        response: Response | None = None
        with anyio.CancelScope() as scope:
            self._handler_scope = scope
            if self._eof:
                scope.cancel()
            try:
                response = await self.handler(request)
            except HTTPError as exc:
                response = exc.response()
            except Exception:  # the handler's bug: the client gets a 500 with the request id
                log.exception("request %s failed", request.request_id)
                response = _error_response(500, "api_error", f"internal error (request {request.request_id})")
            finally:
                self._handler_scope = None
        return response

    def _finish(self, response: Response, request_id: str, close: bool = False) -> Response:
        names = {name.lower() for name, _ in response.headers}
        headers = list(response.headers)
        if "x-typesafe-request-id" not in names:
            headers.append(("x-typesafe-request-id", request_id))
        if close:
            headers.append(("connection", "close"))
        return Response(response.status, headers, response.body)

    async def _send_error_and_close(self, status: int, error_type: str, message: str, request_id: str) -> None:
        if self.conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        response = self._finish(_error_response(status, error_type, message), request_id, close=True)
        try:
            await self._send_response(response, False)
        except h11.LocalProtocolError:
            pass

    async def _send_response(self, response: Response, head_only: bool) -> None:
        headers = [(b"server", _SERVER_NAME), (b"date", _http_date())]
        headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers]
        body = response.body
        if isinstance(body, (bytes, bytearray)):
            headers.append((b"content-length", str(len(body)).encode("ascii")))
            # one write for the whole response: each stream send is a syscall and a checkpoint
            conn = self.conn
            out = conn.send(h11.Response(status_code=response.status, headers=headers, reason=_reason(response.status)))
            if body and not head_only:
                out += conn.send(h11.Data(data=bytes(body)))
            out += conn.send(h11.EndOfMessage())
            try:
                await self.stream.send(out)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
                raise _Closed() from exc
            return
        # A streamed body: chunked on HTTP/1.1 (h11 frames it), close-delimited on 1.0. A client
        # that closes meanwhile ends the stream at once (the reader cancels the scope), not at the
        # next write that fails: the engine work behind the iterator stops with it.
        await self._send(h11.Response(status_code=response.status, headers=headers, reason=_reason(response.status)))
        try:
            with anyio.CancelScope() as scope:
                self._handler_scope = scope
                if self._eof:
                    scope.cancel()
                try:
                    async for chunk in body:
                        if chunk:
                            await self._send(h11.Data(data=chunk))
                finally:
                    self._handler_scope = None
            if scope.cancelled_caught:
                raise _Closed()
            await self._send(h11.EndOfMessage())
        finally:
            aclose = getattr(body, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()


_date_cache: list[Any] = [0, b""]


def _http_date() -> bytes:
    """The ``Date`` header value, formatted once per second."""
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache[0] = now
        _date_cache[1] = formatdate(now, usegmt=True).encode("ascii")
    date: bytes = _date_cache[1]
    return date


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode("ascii")
    except ValueError:
        return b""


def _header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> str | None:
    for k, v in headers:
        if k == name:
            return v.decode("latin-1")
    return None


class PortInUse(OSError):
    """Listening failed because another socket holds ``host:port`` (``EADDRINUSE``)."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(errno.EADDRINUSE, f"port {port} on {host} is in use")
        self.host = host
        self.port = port


def _is_addr_in_use(exc: BaseException) -> bool:
    # anyio may bind several addresses and wrap their failures together
    if getattr(exc, "errno", None) == errno.EADDRINUSE:
        return True
    return any(_is_addr_in_use(e) for e in getattr(exc, "exceptions", ()))


class HTTPServer:
    """Accepts connections on a listener and serves each with ``handler``.

    Use ``port = await server.start(task_group, host, port)`` to listen (port
    0 picks a free one) and serve in ``task_group``; cancelling the task
    group stops the server and every connection with it. ``await
    server.drain(seconds)`` stops it gracefully first: no new connection or
    request, the requests being answered finish.
    """

    def __init__(self, handler: Handler, limits: Limits | None = None) -> None:
        self.handler = handler
        self.limits = limits or Limits()
        self.connections = 0
        #: True once :meth:`drain` was called: no connection is accepted, no new request served.
        self.draining = False
        self._live: set[HTTPConnection] = set()
        self._accepting: list[anyio.CancelScope] = []
        self._drained: anyio.Event | None = None  # made by drain(), set when the last connection ends

    async def _handle(self, stream: anyio.abc.SocketStream) -> None:
        if self.draining:
            with anyio.CancelScope(shield=True):
                await stream.aclose()
            return
        if self.connections >= self.limits.max_connections:
            body = orjson.dumps({"detail": {"error_type": "overloaded_error", "message": "too many connections"}})
            with anyio.CancelScope(shield=True), anyio.move_on_after(1):
                try:
                    await stream.send(
                        b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\nconnection: close\r\n"
                        b"content-type: application/json\r\ncontent-length: "
                        + str(len(body)).encode()
                        + b"\r\n\r\n"
                        + body
                    )
                    # read what the client sent: closing over unread bytes would reset the
                    # connection and could destroy the answer before the client reads it
                    await stream.send_eof()
                    while await stream.receive():
                        pass
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream):
                    pass
                await stream.aclose()
            return
        try:
            address: Any = stream.extra(anyio.abc.SocketAttribute.remote_address)
            host, port = address[:2]
            client = f"{host}:{port}"
        except Exception:
            client = ""
        self.connections += 1
        conn = HTTPConnection(stream, self.handler, self.limits, client, self._release_one)
        self._live.add(conn)
        try:
            await conn.serve()
        finally:
            self._live.discard(conn)
            if self._drained is not None and not self._live:
                self._drained.set()

    async def drain(self, timeout: float) -> bool:
        """Stop accepting connections and let the requests being answered finish.

        Each response then carries ``Connection: close``; idle keep-alive
        connections are closed at once. Returns True once every connection
        has ended, False when some are still open after ``timeout`` seconds
        (the caller then cancels the server's task group, which ends them).
        """
        self.draining = True
        self._drained = anyio.Event()
        for scope in self._accepting:
            scope.cancel()
        for conn in list(self._live):
            conn.stop()
        if self._live:
            with anyio.move_on_after(timeout):
                await self._drained.wait()
        return not self._live

    async def _accept(self, listener: anyio.abc.Listener[anyio.abc.SocketStream], tg: anyio.abc.TaskGroup) -> None:
        # The connections run in ``tg``, outside this scope: drain() stops accepting, not serving.
        with anyio.CancelScope() as scope:
            self._accepting.append(scope)
            if self.draining:
                scope.cancel()
            await listener.serve(self._handle, task_group=tg)

    def _release_one(self) -> None:
        self.connections -= 1

    @staticmethod
    async def bind(host: str = "127.0.0.1", port: int = 0) -> anyio.abc.Listener[anyio.abc.SocketStream]:
        """A TCP listener on ``host:port`` (port 0 picks a free one), to pass to :meth:`start`.

        Binding apart from serving lets a caller claim the port before slow
        work (loading a model). Raises :class:`PortInUse` when the address is
        taken, ``OSError`` for any other failure to listen.
        """
        try:
            return await anyio.create_tcp_listener(local_host=host, local_port=port, reuse_port=False)
        except OSError as exc:
            if _is_addr_in_use(exc):
                raise PortInUse(host, port) from exc
            raise

    async def start(
        self,
        tg: anyio.abc.TaskGroup,
        host: str = "127.0.0.1",
        port: int = 0,
        listener: anyio.abc.Listener[anyio.abc.SocketStream] | None = None,
    ) -> int:
        """Serve in ``tg`` on ``listener``, or on a new one bound to ``host:port``. Returns the bound port."""
        if listener is None:
            listener = await self.bind(host, port)
        bound = listener.extra(anyio.abc.SocketAttribute.local_port)
        tg.start_soon(self._accept, listener, tg)
        return bound

    async def serve_forever(self, host: str, port: int) -> None:
        """Listen and serve until cancelled."""
        async with anyio.create_task_group() as tg:
            await self.start(tg, host, port)


#: h11's message for a chunk header its grammar refuses (``chunk-size`` is 1 to 20 hex digits there).
_ILLEGAL_CHUNK_HEADER = re.compile(r"illegal chunk header: (?:bytearray\()?b'([0-9A-Fa-f]+)(?:[;\s']|\\r)")


def _refused_chunk_size(message: str) -> int | None:
    """The size of a chunk whose header h11 refused (its ``RemoteProtocolError`` message), when that
    header starts with a hexadecimal size; else None."""
    m = _ILLEGAL_CHUNK_HEADER.match(message)
    return int(m.group(1), 16) if m else None


def _chunk_left(conn: h11.Connection) -> int:
    """Bytes of the chunk h11 is reading that it has not yet returned (0 between chunks and for a body
    framed by Content-Length). h11 keeps the count in its reader's private ``_bytes_in_chunk``; read
    with getattr, so that an h11 without it only loses the early 413, not the bound."""
    left = getattr(getattr(conn, "_reader", None), "_bytes_in_chunk", 0)
    return left if isinstance(left, int) else 0


def access_line(request: Request, status: int, seconds: float, extra: dict[str, Any] | None = None) -> str:
    """The structured log line of one request: one JSON object (orjson) on one line."""
    record = {
        "request_id": request.request_id,
        "method": request.method,
        "path": request.path,
        "status": status,
        "ms": round(seconds * 1e3, 3),
        "client": request.client,
        "bytes_in": len(request.body),
    }
    if extra:
        record.update(extra)
    return orjson.dumps(record).decode()
