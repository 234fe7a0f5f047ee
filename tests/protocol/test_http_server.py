"""The h11 + anyio HTTP server through real sockets, on both anyio backends."""

from __future__ import annotations

import gzip
import zlib

import anyio
import h11
import orjson
import pytest
import zstandard

from gateway.http import HTTPError, HTTPServer, Limits, Request, Response, Router

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param


def make_router():
    router = Router()

    async def echo(req: Request) -> Response:
        return Response.json(
            {
                "len": len(req.body),
                "body": req.body.decode("utf-8", "replace"),
                "path": req.path,
                "query": req.query,
                "id": req.request_id,
            }
        )

    async def boom(req: Request) -> Response:
        raise RuntimeError("bug")

    async def teapot(req: Request) -> Response:
        raise HTTPError(429, "rate_limit_error", "slow down", headers=[("retry-after", "2")])

    async def stream(req: Request) -> Response:
        async def gen():
            for i in range(3):
                yield f"data: {i}\n\n".encode()

        return Response(200, [("content-type", "text/event-stream")], gen())

    router.route("/echo", "POST", echo)
    router.route("/echo", "GET", echo)
    router.route("/boom", "GET", boom)
    router.route("/busy", "GET", teapot)
    router.route("/stream", "GET", stream)
    return router


async def dispatch(req: Request) -> Response:
    _, handler = ROUTER.resolve(req)
    return await handler(req)


ROUTER = make_router()


async def exchange(port: int, raw: bytes, n_responses: int = 1, *, close_after_send: bool = False):
    """Send raw bytes, read ``n_responses`` responses with an h11 client. Returns [(status, headers, body)]."""
    out = []
    async with await anyio.connect_tcp("127.0.0.1", port) as s:
        await s.send(raw)
        if close_after_send:
            await s.send_eof()
        client = h11.Connection(h11.CLIENT)
        # The client side state machine needs to believe it sent the requests.
        client._cstate.process_event(h11.CLIENT, h11.Request)
        client._cstate.process_event(h11.CLIENT, h11.EndOfMessage)
        status, headers, body = None, None, b""
        with anyio.fail_after(10):
            while len(out) < n_responses:
                ev = client.next_event()
                if ev is h11.NEED_DATA:
                    try:
                        client.receive_data(await s.receive())
                    except anyio.EndOfStream:
                        client.receive_data(b"")
                    continue
                if isinstance(ev, h11.Response):
                    status, headers, body = ev.status_code, {k.decode(): v.decode() for k, v in ev.headers}, b""
                elif isinstance(ev, h11.Data):
                    body += ev.data
                elif isinstance(ev, h11.EndOfMessage):
                    out.append((status, headers, body))
                    if client.our_state is h11.MUST_CLOSE or client.their_state is h11.MUST_CLOSE:
                        break
                    client.start_next_cycle()
                    client._cstate.process_event(h11.CLIENT, h11.Request)
                    client._cstate.process_event(h11.CLIENT, h11.EndOfMessage)
                elif isinstance(ev, h11.ConnectionClosed):
                    break
    return out


async def with_server(fn, limits: Limits | None = None):
    async with anyio.create_task_group() as tg:
        port = await HTTPServer(dispatch, limits).start(tg)
        try:
            return await fn(port)
        finally:
            tg.cancel_scope.cancel()


def post(path: str, body: bytes, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n{extra}\r\n").encode() + body


async def test_keepalive_and_pipelining_answer_in_order():
    raw = post("/echo", b"one") + post("/echo?x=1&x=2", b"two") + b"GET /echo HTTP/1.1\r\nHost: t\r\n\r\n"
    res = await with_server(lambda port: exchange(port, raw, 3))
    assert [r[0] for r in res] == [200, 200, 200]
    bodies = [orjson.loads(r[2]) for r in res]
    assert [b["body"] for b in bodies] == ["one", "two", ""]
    assert bodies[1]["query"] == {"x": ["1", "2"]}
    ids = [r[1]["x-typesafe-request-id"] for r in res]
    assert len(set(ids)) == 3 and all(i.startswith("req_") and len(i) == 28 for i in ids)
    assert [b["id"] for b in bodies] == ids


async def test_header_block_over_bound_is_431():
    raw = b"GET /echo HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 5000 + b"\r\n\r\n"
    res = await with_server(lambda port: exchange(port, raw), Limits(max_header_bytes=4096))
    assert res[0][0] == 431
    assert res[0][1]["connection"] == "close"


async def test_body_over_bound_is_413_from_content_length():
    raw = b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 2000\r\n\r\n" + b"x" * 100
    res = await with_server(lambda port: exchange(port, raw), Limits(max_body_bytes=1000))
    assert res[0][0] == 413
    assert orjson.loads(res[0][2])["detail"]["error_type"] == "request_too_large"


async def test_chunked_body_over_bound_is_413():
    chunk = b"x" * 600
    raw = (
        b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"258\r\n"
        + chunk
        + b"\r\n"
        + b"258\r\n"
        + chunk
        + b"\r\n0\r\n\r\n"
    )
    res = await with_server(lambda port: exchange(port, raw), Limits(max_body_bytes=1000))
    assert res[0][0] == 413


async def test_chunked_body_within_bound_is_read():
    raw = b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    res = await with_server(lambda port: exchange(port, raw))
    assert orjson.loads(res[0][2])["body"] == "abcde"


@pytest.mark.parametrize("coding", ["gzip", "zstd", "deflate"])
async def test_compressed_bodies_are_decoded(coding):
    text = b'{"state": "' + b"z" * 5000 + b'"}'
    packed = {"gzip": gzip.compress, "zstd": zstandard.ZstdCompressor().compress, "deflate": zlib.compress}[coding](
        text
    )
    res = await with_server(lambda port: exchange(port, post("/echo", packed, f"Content-Encoding: {coding}\r\n")))
    assert res[0][0] == 200
    assert orjson.loads(res[0][2])["len"] == len(text)


async def test_compressed_body_decoded_over_bound_is_413():
    packed = zstandard.ZstdCompressor().compress(b"\0" * 200_000)
    assert len(packed) < 1000
    res = await with_server(
        lambda port: exchange(port, post("/echo", packed, "Content-Encoding: zstd\r\n")),
        Limits(max_decoded_bytes=100_000),
    )
    assert res[0][0] == 413


async def test_unknown_and_corrupt_encodings():
    res = await with_server(lambda port: exchange(port, post("/echo", b"abc", "Content-Encoding: br\r\n")))
    assert res[0][0] == 415
    res = await with_server(lambda port: exchange(port, post("/echo", b"not gzip", "Content-Encoding: gzip\r\n")))
    assert res[0][0] == 400
    assert "gzip" in orjson.loads(res[0][2])["detail"]["message"]


async def test_head_timeout_is_408():
    data = await with_server(
        lambda port: raw_until_close(port, b"GET /echo HTTP/1.1\r\nHos"), Limits(header_timeout=0.2)
    )
    assert data.startswith(b"HTTP/1.1 408 Request Timeout\r\n")


async def test_idle_keepalive_connection_is_closed_quietly():
    async def run(port):
        async with await anyio.connect_tcp("127.0.0.1", port) as s:
            with anyio.fail_after(5):
                try:
                    return await s.receive()
                except anyio.EndOfStream:
                    return b""

    assert await with_server(run, Limits(keepalive_timeout=0.1)) == b""


async def test_errors_404_405_500_and_handler_http_errors():
    raw = (
        b"GET /nope HTTP/1.1\r\nHost: t\r\n\r\n"
        + b"DELETE /echo HTTP/1.1\r\nHost: t\r\n\r\n"
        + b"GET /boom HTTP/1.1\r\nHost: t\r\n\r\n"
        + b"GET /busy HTTP/1.1\r\nHost: t\r\n\r\n"
    )
    res = await with_server(lambda port: exchange(port, raw, 4))
    assert [r[0] for r in res] == [404, 405, 500, 429]
    assert orjson.loads(res[0][2]) == {"detail": {"error_type": "not_found_error", "message": "no route GET /nope"}}
    assert res[1][1]["allow"] == "GET, POST"
    assert res[2][1]["x-typesafe-request-id"] in orjson.loads(res[2][2])["detail"]["message"]
    assert res[3][1]["retry-after"] == "2"


async def test_malformed_request_line_is_400():
    res = await with_server(lambda port: exchange(port, b"GARBAGE\r\n\r\n"))
    assert res[0][0] == 400


async def test_streamed_body_is_chunked():
    async def run(port):
        async with await anyio.connect_tcp("127.0.0.1", port) as s:
            await s.send(b"GET /stream HTTP/1.1\r\nHost: t\r\n\r\n")
            data = b""
            with anyio.fail_after(5):
                while not data.endswith(b"0\r\n\r\n"):
                    data += await s.receive()
            return data

    data = await with_server(run)
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head.lower()
    assert body == b"9\r\ndata: 0\n\n\r\n9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n0\r\n\r\n"


async def raw_until_close(port: int, raw: bytes) -> bytes:
    """Send ``raw`` to ``port`` on loopback; every byte received until the server closes (5 s at most)."""
    async with await anyio.connect_tcp("127.0.0.1", port) as s:
        await s.send(raw)
        data = b""
        with anyio.fail_after(5):
            while True:
                try:
                    data += await s.receive()
                except anyio.EndOfStream:
                    return data


async def test_http10_closes_and_head_has_no_body():
    data = await with_server(lambda port: raw_until_close(port, b"GET /echo HTTP/1.0\r\n\r\n"))
    assert data.startswith(b"HTTP/1.1 200 OK\r\n")
    assert data.endswith(b'"query":{},"id":"' + data.split(b"x-typesafe-request-id: ")[1][:28] + b'"}')
    data = await with_server(
        lambda port: raw_until_close(port, b"HEAD /echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    )
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"content-length: " in head and body == b""


async def test_mutated_requests_never_break_the_server():
    """200 requests mutated at random (bytes flipped, cut, CR/LF and spaces inserted): each gets a
    4xx/2xx answer or a closed connection, never a hang or a 5xx, and the server keeps serving."""
    import random

    rng = random.Random(20261130)
    valid = post("/echo", b'{"state": "s"}', "Content-Encoding: identity\r\n")

    def mutate(data: bytes) -> bytes:
        b = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            op = rng.randrange(4)
            i = rng.randrange(len(b))
            if op == 0:
                b[i] = rng.randrange(256)
            elif op == 1:
                del b[i:]
                if not b:
                    b = bytearray(b"X")
            elif op == 2:
                b[i:i] = rng.choice([b"\r\n", b"\n", b" ", b":", b"\x00", b"\r\n\r\n"])
            else:
                b[i:i] = b"9" * rng.randint(1, 30)
        return bytes(b)

    async def run(port):
        statuses = []
        for _ in range(200):
            raw = mutate(valid)
            with anyio.fail_after(5):
                async with await anyio.connect_tcp("127.0.0.1", port) as s:
                    await s.send(raw)
                    await s.send_eof()
                    data = b""
                    while True:
                        try:
                            data += await s.receive()
                        except (anyio.EndOfStream, anyio.BrokenResourceError):
                            break
            if data:
                assert data.startswith(b"HTTP/1.1 "), data[:40]
                statuses.append(int(data[9:12]))
        ok = await exchange(port, valid)
        return statuses, ok

    statuses, ok = await with_server(run, Limits(header_timeout=1, body_timeout=1))
    assert all(s < 500 for s in statuses), sorted(set(statuses))
    assert len(statuses) > 100
    assert ok[0][0] == 200


async def test_connections_over_the_bound_get_503():
    async def run(port):
        async with await anyio.connect_tcp("127.0.0.1", port) as first:
            await first.send(b"GET /echo HTTP/1.1\r\nHost: t\r\n\r\n")  # served, kept alive
            assert (await first.receive()).startswith(b"HTTP/1.1 200 OK")
            second = await raw_until_close(port, b"GET /echo HTTP/1.1\r\nHost: t\r\n\r\n")
        third = await exchange(port, b"GET /echo HTTP/1.1\r\nHost: t\r\n\r\n")  # the first has gone
        return second, third

    second, third = await with_server(run, Limits(max_connections=1))
    assert second.startswith(b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\n")
    assert third[0][0] == 200


class _Gate:
    """A handler that waits on an event, recording whether it finished or was cancelled."""

    def __init__(self) -> None:
        self.release = anyio.Event()
        self.started = anyio.Event()
        self.outcome: list[str] = []

    async def __call__(self, req: Request) -> Response:
        if req.path == "/echo":
            return await dispatch(req)
        self.started.set()
        try:
            await self.release.wait()
        except BaseException:
            self.outcome.append("cancelled")
            raise
        self.outcome.append("finished")
        return Response.json({"gate": req.body.decode()})


async def test_client_that_closes_cancels_the_running_handler(caplog):
    caplog.set_level("INFO", logger="serveproto.access")
    gate = _Gate()
    async with anyio.create_task_group() as tg:
        port = await HTTPServer(gate).start(tg)
        async with await anyio.connect_tcp("127.0.0.1", port) as s:
            await s.send(post("/wait", b"x"))
            with anyio.fail_after(5):
                await gate.started.wait()
        with anyio.fail_after(5):  # the handler still waits on its event: only the close can end it
            while not gate.outcome:
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert gate.outcome == ["cancelled"]
    [record] = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == "serveproto.access"]
    assert (record["status"], record["path"], record["bytes_in"]) == (499, "/wait", 1)
    assert record["error"] == "the client closed the connection; the request was cancelled"


async def test_pipelined_request_read_while_watching_is_answered_after():
    gate = _Gate()

    async def run(port):
        async with await anyio.connect_tcp("127.0.0.1", port) as s:
            await s.send(post("/wait", b"first"))
            with anyio.fail_after(5):
                await gate.started.wait()
            # the next request arrives while the first handler runs: the watcher reads it into h11
            await s.send(post("/echo", b"second"))
            await anyio.sleep(0.2)
            gate.release.set()
            client = h11.Connection(h11.CLIENT)
            client._cstate.process_event(h11.CLIENT, h11.Request)
            client._cstate.process_event(h11.CLIENT, h11.EndOfMessage)
            bodies, body = [], b""
            with anyio.fail_after(5):
                while len(bodies) < 2:
                    ev = client.next_event()
                    if ev is h11.NEED_DATA:
                        client.receive_data(await s.receive())
                    elif isinstance(ev, h11.Data):
                        body += ev.data
                    elif isinstance(ev, h11.EndOfMessage):
                        bodies.append(orjson.loads(body))
                        body = b""
                        client.start_next_cycle()
                        client._cstate.process_event(h11.CLIENT, h11.Request)
                        client._cstate.process_event(h11.CLIENT, h11.EndOfMessage)
            return bodies

    async with anyio.create_task_group() as tg:
        port = await HTTPServer(gate).start(tg)
        bodies = await run(port)
        tg.cancel_scope.cancel()
    assert bodies[0] == {"gate": "first"}
    assert bodies[1]["body"] == "second" and bodies[1]["path"] == "/echo"
    assert gate.outcome == ["finished"]


async def test_body_over_the_read_ahead_is_read_whole_then_the_next_request():
    big = bytes(range(256)) * 4096  # 1 MiB, four times READ_AHEAD: the reader pauses and resumes
    raw = post("/echo", big) + post("/echo", b"after")
    res = await with_server(lambda port: exchange(port, raw, 2))
    assert [r[0] for r in res] == [200, 200]
    assert orjson.loads(res[0][2])["len"] == len(big)
    assert orjson.loads(res[1][2])["body"] == "after"


async def test_large_pipelined_request_waits_behind_a_running_handler():
    from gateway.http.server import READ_AHEAD

    gate = _Gate()
    big = b"y" * (3 * READ_AHEAD)

    async def run(port):
        async with await anyio.connect_tcp("127.0.0.1", port) as s:
            await s.send(post("/wait", b"first"))
            with anyio.fail_after(5):
                await gate.started.wait()
            async with anyio.create_task_group() as tg:
                # more than READ_AHEAD arrives while the handler runs: the reader stops reading at
                # READ_AHEAD and must read on once the request loop needs the rest (no deadlock, no loss)
                tg.start_soon(s.send, post("/echo", big))
                await anyio.sleep(0.2)
                gate.release.set()
            data = b""
            with anyio.fail_after(10):
                while data.count(b"HTTP/1.1 200 OK") < 2 or not data.endswith(b'"}'):
                    data += await s.receive()
            return data

    async with anyio.create_task_group() as tg:
        port = await HTTPServer(gate).start(tg)
        data = await run(port)
        tg.cancel_scope.cancel()
    first, second = data.split(b"HTTP/1.1 200 OK")[1:]
    assert first.endswith(b'{"gate":"first"}')
    assert orjson.loads(second.partition(b"\r\n\r\n")[2])["len"] == len(big)
    assert gate.outcome == ["finished"]


async def test_client_that_closes_mid_stream_ends_the_stream_at_once():
    """The body's iterator waits (a slow engine) after its first chunk: the close must end it without
    another write to fail on."""
    outcome: list[str] = []
    first_sent = anyio.Event()

    async def slow_stream(req: Request) -> Response:
        async def gen():
            try:
                yield b"data: 0\n\n"
                first_sent.set()
                await anyio.sleep_forever()
            except BaseException:
                outcome.append("cancelled")
                raise

        return Response(200, [("content-type", "text/event-stream")], gen())

    async with anyio.create_task_group() as tg:
        port = await HTTPServer(slow_stream).start(tg)
        async with await anyio.connect_tcp("127.0.0.1", port) as s:
            await s.send(b"GET /stream HTTP/1.1\r\nHost: t\r\n\r\n")
            got = b""
            with anyio.fail_after(5):
                while b"data: 0" not in got:
                    got += await s.receive()
        with anyio.fail_after(5):
            while not outcome:
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert got.startswith(b"HTTP/1.1 200 OK\r\n") and outcome == ["cancelled"]
