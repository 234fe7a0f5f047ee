"""What an attacker or a careless client tries (issue 16), kept as tests.

Request smuggling through framing h11 accepts but RFC 9112 says to distrust
(raw sockets), unauthenticated bodies that would be inflated, limits named by
the request's own field, an engine that stalls or keeps dying, and the
ambiguous requests of item 6 (duplicate keys, look-alike labels, ``n > 1``).
"""

from __future__ import annotations

import anyio
import orjson
import pytest

from gateway.engine.options import EngineOptions
from gateway.http import HTTPServer, Request, Response
from test_routes_support import TICKET, FakeEngine, make_app, serving

pytestmark = pytest.mark.anyio


# --- raw sockets ---------------------------------------------------------------------------------


async def raw_exchange(port: int, raw: bytes, seconds: float = 5.0) -> bytes:
    """Send ``raw``, half-close, and read everything until the server closes."""
    async with await anyio.connect_tcp("127.0.0.1", port) as s:
        await s.send(raw)
        await s.send_eof()
        data = b""
        with anyio.fail_after(seconds):
            while True:
                try:
                    data += await s.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return data


def responses(data: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Split what the server sent into ``(status, headers, body)`` (bodies by Content-Length)."""
    out = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        assert sep, data
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {k.lower(): v for k, _, v in (line.partition(": ") for line in lines[1:])}
        n = int(headers["content-length"])
        out.append((status, headers, rest[:n]))
        data = rest[n:]
    return out


async def served(handler, fn):
    """Run ``fn(port)`` against an HTTPServer over ``handler``."""
    async with anyio.create_task_group() as tg:
        port = await HTTPServer(handler).start(tg)
        try:
            return await fn(port)
        finally:
            tg.cancel_scope.cancel()


async def echo(request: Request) -> Response:
    return Response.json({"path": request.path, "body": request.body.decode("latin-1")})


SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"

#: Heads h11 accepts (or reads its own way) that RFC 9112 says not to trust; each is followed by a
#: request that a parser framing the body differently would run: the server must answer 400 and close.
DISTRUSTED = {
    "te_and_cl": (
        b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n",
        "Transfer-Encoding and Content-Length together: the body's length is ambiguous; send one of them "
        "(RFC 9112 section 6.1)",
    ),
    "cl_and_te": (
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
        "Transfer-Encoding and Content-Length together: the body's length is ambiguous; send one of them "
        "(RFC 9112 section 6.1)",
    ),
    "te_on_http10": (
        b"POST /echo HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "Transfer-Encoding on an HTTP/1.0 request: its framing cannot be trusted; send Content-Length "
        "(RFC 9112 section 6.1)",
    ),
    "te_not_chunked_last": (
        b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n",
        "Transfer-Encoding 'chunked, gzip' does not end in chunked: the body's length cannot be "
        "determined (RFC 9112 section 6.3)",
    ),
    "te_identity": (
        b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\n\r\n",
        "Transfer-Encoding 'identity' does not end in chunked: the body's length cannot be determined "
        "(RFC 9112 section 6.3)",
    ),
    "cl_twice_same": (
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nContent-Length: 4\r\n\r\nabcd",
        "Content-Length sent 2 times: send it once (RFC 9112 section 6.3)",
    ),
    "cl_list": (
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4, 4\r\n\r\nabcd",
        "Content-Length '4, 4' is not one decimal number (RFC 9112 section 6.3)",
    ),
    "obs_fold": (
        b"POST /echo HTTP/1.1\r\nHost: x\r\n Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\nabcd",
        "a header line starts with whitespace (obs-fold): send each field on one line (RFC 9112 section 5.2)",
    ),
    "obs_fold_tab": (
        b"POST /echo HTTP/1.1\r\nHost: x\r\nX-Note: a\r\n\tb\r\nContent-Length: 4\r\n\r\nabcd",
        "a header line starts with whitespace (obs-fold): send each field on one line (RFC 9112 section 5.2)",
    ),
    "bare_lf": (
        b"POST /echo HTTP/1.1\nHost: x\nContent-Length: 4\n\nabcd",
        "a line of the request head ends in a bare LF: end every line with CRLF (RFC 9112 section 2.2)",
    ),
    "bare_lf_blank_line": (
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\nabcd",
        "a line of the request head ends in a bare LF: end every line with CRLF (RFC 9112 section 2.2)",
    ),
}


@pytest.mark.parametrize("case", sorted(DISTRUSTED))
async def test_distrusted_framing_is_400_and_the_connection_closes(case):
    head, message = DISTRUSTED[case]
    data = await served(echo, lambda port: raw_exchange(port, head + SMUGGLED))
    ((status, headers, body),) = responses(data)  # one answer: the smuggled request never runs
    assert status == 400
    assert headers["connection"] == "close"
    assert orjson.loads(body) == {"detail": {"error_type": "invalid_request_error", "message": message}}


async def test_the_issue_smuggling_example_gets_one_answer():
    # issue 16, item 1: a 422 then a 200 for /v1/models before the fix
    app = make_app(FakeEngine())
    raw = (
        b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n"
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    data = await served(app, lambda port: raw_exchange(port, raw))
    ((status, headers, body),) = responses(data)
    assert (status, headers["connection"]) == (400, "close")
    assert orjson.loads(body)["detail"]["message"].startswith("Transfer-Encoding and Content-Length together")


async def test_trusted_framing_still_keeps_the_connection():
    raw = (
        b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n\r\n"
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"
        b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n"
    )
    got = responses(await served(echo, lambda port: raw_exchange(port, raw)))
    assert [(s, orjson.loads(b)) for s, _, b in got[:2]] == [
        (200, {"path": "/echo", "body": "abcd"}),
        (200, {"path": "/echo", "body": "hi"}),
    ]
    # a coding we do not decode before chunked is h11's 501, and the connection closes after it
    assert [s for s, _, _ in got[2:]] == [501] and got[2][1]["connection"] == "close"


# --- auth before the body ------------------------------------------------------------------------


def zstd_bomb(decoded: int) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor(level=19).compress(b"\0" * decoded)


def post_raw(path: str, body: bytes, *headers: str) -> bytes:
    extra = "".join(f"{h}\r\n" for h in headers)
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


async def test_a_bad_key_is_401_before_the_body_is_decoded(monkeypatch):
    from gateway.http import Limits
    from gateway.http import server as http_server

    decoded = []
    real = http_server.decode_body
    monkeypatch.setattr(http_server, "decode_body", lambda *a: decoded.append(len(a[0])) or real(*a))
    app = make_app(FakeEngine(), api_key="sk-right")
    bomb = zstd_bomb(2 << 20)
    assert len(bomb) < 1024  # inflates 2000-fold and more

    async def run(port):
        async def one(*headers):
            return responses(
                await raw_exchange(port, post_raw("/v1/systemone", bomb, "Content-Encoding: zstd", *headers))
            )

        return (
            await one("Authorization: Bearer sk-wrong"),
            await one(),
            decoded[:],
            await one("Authorization: Bearer sk-right"),
        )

    async with anyio.create_task_group() as tg:
        port = await HTTPServer(app, Limits(max_decoded_bytes=1 << 20)).start(tg)
        wrong, missing, decoded_before, right = await run(port)
        tg.cancel_scope.cancel()
    ((status, headers, body),) = wrong
    assert (status, headers["connection"], headers["www-authenticate"]) == (401, "close", "Bearer")
    assert orjson.loads(body) == {"detail": {"error_type": "authentication_error", "message": "invalid API key"}}
    ((status, _, body),) = missing
    assert status == 401
    assert orjson.loads(body)["detail"]["message"] == "missing API key: send 'Authorization: Bearer <key>'"
    assert decoded_before == []  # neither body was decoded
    ((status, _, body),) = right  # with the key, the bomb is decoded and refused as before
    assert status == 413
    assert orjson.loads(body) == {
        "detail": {"error_type": "request_too_large", "message": "the decoded request body is over 1048576 bytes"}
    }
    assert decoded == [len(bomb)]


async def test_a_bad_key_is_401_not_413_for_a_body_over_the_bound():
    from gateway.http import Limits

    app = make_app(FakeEngine(), api_key="sk-right")
    head = b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nope\r\nContent-Length: 99999999\r\n\r\n"
    async with anyio.create_task_group() as tg:
        port = await HTTPServer(app, Limits(max_body_bytes=1000)).start(tg)
        ((status, headers, body),) = responses(await raw_exchange(port, head + b"x" * 5000))
        public = responses(await raw_exchange(port, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
        tg.cancel_scope.cancel()
    assert (status, headers["connection"]) == (401, "close")
    assert orjson.loads(body)["detail"]["message"] == "invalid API key"
    assert [s for s, _, _ in public] == [200]  # public routes need no key, as before


@pytest.mark.parametrize(
    "method, path",
    [("POST", "/v1/nope"), ("PUT", "/v1/systemone"), ("POST", "/health"), ("DELETE", "/v1/models")],
)
async def test_a_request_without_the_key_to_an_unknown_path_or_method_is_401_before_its_body(monkeypatch, method, path):
    # issue 46, item 3: refused only after its body was read and decoded (404, 405): 40 such gzip
    # bodies took the server from 143 MB to 1.1 GB
    from gateway.http import server as http_server

    decoded = []
    real = http_server.decode_body
    monkeypatch.setattr(http_server, "decode_body", lambda *a: decoded.append(len(a[0])) or real(*a))
    app = make_app(FakeEngine(), api_key="sk-right")
    bomb = zstd_bomb(2 << 20)

    def raw(*headers: str) -> bytes:
        extra = "".join(f"{h}\r\n" for h in headers)
        head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(bomb)}\r\nContent-Encoding: zstd\r\n{extra}\r\n"
        return head.encode() + bomb

    async def run(port):
        without = responses(await raw_exchange(port, raw()))
        before = decoded[:]
        right = responses(await raw_exchange(port, raw("Authorization: Bearer sk-right", "Connection: close")))
        return without, before, right

    (((status, headers, body),), decoded_before, ((right_status, _, right_body),)) = await served(app, run)
    assert (status, headers["connection"], headers["www-authenticate"]) == (401, "close", "Bearer")
    assert orjson.loads(body) == {
        "detail": {
            "error_type": "authentication_error",
            "message": "missing API key: send 'Authorization: Bearer <key>'",
        }
    }
    assert decoded_before == []
    # with the key: the 404 or 405 as before
    assert right_status == (404 if path == "/v1/nope" else 405)
    assert orjson.loads(right_body)["detail"]["error_type"] == (
        "not_found_error" if path == "/v1/nope" else "method_not_allowed"
    )


@pytest.mark.parametrize("size", ["3E9", "FFFFFFFFFFFFFFFFFFFF", "100000000000000000000", "0" * 24 + "3E9"])
async def test_a_chunk_announced_past_the_bound_is_413_at_once(size):
    # issue 46, item 7: a chunk size of 2**80 - 1 was waited for until the body timeout (408), and
    # 2**80 itself (21 hex digits, past h11's grammar) was a 400; 1001 bytes announced is past 1000
    from gateway.http import Limits

    head = f"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{size}\r\nabc".encode()
    async with anyio.create_task_group() as tg:
        # a body timeout far past the test's own: only an answer at once passes
        port = await HTTPServer(echo, Limits(max_body_bytes=1000, body_timeout=600)).start(tg)
        ((status, headers, body),) = responses(await raw_exchange(port, head, seconds=20))
        tg.cancel_scope.cancel()
    assert (status, headers["connection"]) == (413, "close"), body
    assert orjson.loads(body) == {
        "detail": {"error_type": "request_too_large", "message": "the request body is over 1000 bytes"}
    }


async def test_a_chunk_within_the_bound_is_still_read():
    from gateway.http import Limits

    raw = (
        b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3E8\r\n" + b"a" * 1000 + b"\r\n0\r\n\r\n"
    )
    async with anyio.create_task_group() as tg:
        port = await HTTPServer(echo, Limits(max_body_bytes=1000)).start(tg)
        ((status, _, body),) = responses(await raw_exchange(port, raw))
        tg.cancel_scope.cancel()
    assert status == 200 and orjson.loads(body) == {"path": "/echo", "body": "a" * 1000}


# --- an engine that stalls, stops or keeps dying -------------------------------------------------

import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import httpx2  # noqa: E402

from gateway.paths import ROOT  # noqa: E402


def first_start_only(fixture, tmp_path, monkeypatch, faults: str) -> list[str]:
    """The ``--engine`` argv of a fixture that has ``faults`` on its first start only (a marker file
    remembers it; ``exec`` keeps the pid, so the supervisor watches the fixture itself)."""
    monkeypatch.setenv("SERVEPROTO_FIXTURE_FAULTS", faults)
    script = '[ -e "$0" ] && unset SERVEPROTO_FIXTURE_FAULTS || : > "$0"; exec "$@"'
    return ["sh", "-c", script, str(tmp_path / "started"), str(fixture)]


def restarts_of(metrics: str) -> float:
    return float(
        next(line.split()[1] for line in metrics.splitlines() if line.startswith("serveproto_engine_restarts "))
    )


CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


async def test_a_hung_engine_is_found_by_its_ping_not_the_request_timeout(fixture_engine, tmp_path, monkeypatch):
    # partial_payload: PINGs are answered until the first DATA frame, written in half, then silence.
    # The request timeout (60 s) would answer after a minute; the PING watchdog ends it in about 1 s.
    engine = first_start_only(fixture_engine, tmp_path, monkeypatch, "partial_payload")
    async with serving(
        "--request-timeout", "60", "--ping-interval", "0.2", "--ping-timeout", "0.8", "--engine", *engine
    ) as base:
        async with httpx2.AsyncClient(base_url=base, timeout=30) as c:
            with anyio.fail_after(10):
                t0 = anyio.current_time()
                stalled = await c.post("/v1/chat/completions", json=CHAT)
                seconds = anyio.current_time() - t0
                while (await c.get("/health")).status_code != 200:
                    await anyio.sleep(0.05)
                after = await c.post("/v1/chat/completions", json=CHAT)
                restarts = restarts_of((await c.get("/metrics")).text)
    assert stalled.status_code == 503 and stalled.headers["retry-after"] == "1"
    assert stalled.json() == {
        "detail": {
            "error_type": "overloaded_error",
            "message": "the engine is unavailable: engine 'sh' did not answer PING within 0.8 s; killed",
        }
    }
    assert seconds < 5
    assert after.status_code == 200 and restarts == 1.0


async def test_health_says_an_idle_hung_engine_is_unresponsive_then_it_is_restarted(
    fixture_engine, tmp_path, monkeypatch
):
    # hang_after=0: alive, silent from its handshake on (issue 16, item 3: /health said 200 throughout)
    engine = first_start_only(fixture_engine, tmp_path, monkeypatch, "hang_after=0")
    seen = []
    async with serving(
        "--request-timeout", "3", "--ping-interval", "0.3", "--ping-timeout", "3", "--engine", *engine
    ) as base:
        async with httpx2.AsyncClient(base_url=base, timeout=30) as c:
            with anyio.fail_after(15):
                while True:
                    r = await c.get("/health")
                    if not seen or seen[-1] != (r.status_code, r.json()):
                        seen.append((r.status_code, r.json()))
                    if r.status_code == 200 and len(seen) > 1:
                        break
                    await anyio.sleep(0.05)
                restarts = restarts_of((await c.get("/metrics")).text)
    assert seen[0] == (200, {"status": "ok", "model": "fixture"})
    assert (503, {"status": "unavailable", "model": "fixture", "engine": "unresponsive"}) in seen
    assert seen[-1] == (200, {"status": "ok", "model": "fixture"}) and restarts == 1.0


async def test_a_stopped_engine_is_unresponsive_killed_and_replaced(fixture_engine, probes):
    async with serving(
        "--request-timeout", "60", "--ping-interval", "0.2", "--ping-timeout", "1.5", "--engine", str(fixture_engine)
    ) as base:
        async with httpx2.AsyncClient(base_url=base, timeout=30) as c:
            assert (await c.get("/health")).status_code == 200
            (pid,) = probes.child_pids()
            os.kill(pid, signal.SIGSTOP)
            with anyio.fail_after(10):
                t0 = anyio.current_time()
                stopped = await c.post("/v1/chat/completions", json=CHAT)
                seconds = anyio.current_time() - t0
                health = await c.get("/health")
                while (await c.get("/health")).status_code != 200:
                    await anyio.sleep(0.05)
            (new_pid,) = probes.child_pids()
            after = await c.post("/v1/chat/completions", json=CHAT)
    assert stopped.status_code == 503
    assert stopped.json()["detail"]["message"] == (
        "the engine is unavailable: engine 'serveproto-fixture' did not answer PING within 1.5 s; killed"
    )
    assert seconds < 5
    assert health.status_code == 503 and health.json()["engine"] in ("unresponsive", "restarting")
    assert new_pid != pid and after.status_code == 200


def test_a_stalled_engine_leaves_its_stack_in_the_server_log_then_is_replaced(fixture_engine, tmp_path, monkeypatch):
    # hang_after=1: the fixture pause()s inside the write of its first frame after the handshake (issue 46,
    # item 8: nothing said where a stalled engine was stuck). It advertises x_stack=SIGUSR2, so the watchdog
    # sends that signal before the kill, and the server's log (its stderr) holds the stuck thread's stack.
    engine = first_start_only(fixture_engine, tmp_path, monkeypatch, "hang_after=1")
    proc, base = serve_process("--ping-interval", "0.5", "--ping-timeout", "1", "--engine", *engine)
    try:
        stalled = httpx2.post(base + "/v1/chat/completions", json=CHAT, timeout=30)
        deadline = time.monotonic() + 15
        while httpx2.get(base + "/health", timeout=5).status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        after = httpx2.post(base + "/v1/chat/completions", json=CHAT, timeout=30)
        restarts = restarts_of(httpx2.get(base + "/metrics", timeout=5).text)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log = proc.stderr.read().splitlines()
    assert stalled.status_code == 503 and stalled.json() == {
        "detail": {
            "error_type": "overloaded_error",
            "message": "the engine is unavailable: engine 'sh' did not answer PING within 1 s; killed",
        }
    }
    assert after.status_code == 200 and restarts == 1.0
    head = log.index("serveproto-fixture: stack at a stall (SIGUSR2), thread main:")
    end = log.index("serveproto-fixture: end of stack", head)
    killed = log.index("engine sh: engine 'sh' did not answer PING within 1 s; killed")
    assert log[head - 1] == "engine sh: no PONG within 1 s; asking for its stack (SIGUSR2)"
    assert head < end < killed, log
    frames = log[head + 1 : end]
    # innermost first: the handler's frames, libc's pause(), then the fault's own function
    at_pause = next(i for i, f in enumerate(frames) if "(pause+0x" in f)
    assert "serveproto-fixture(faults_hang_forever+0x" in frames[at_pause + 1], frames
    # the first frame being written (the request's ACCEPT, or a PONG should a PING come first), from main
    below = " ".join(frames[at_pause + 1 :])
    assert "serveproto-fixture(sp_write_accept+0x" in below or "serveproto-fixture(sp_write_pong+0x" in below, frames
    assert any("serveproto-fixture(main+0x" in f for f in frames) and "(_start+0x" in frames[-1], frames


def serve_process(*argv: str) -> tuple[subprocess.Popen, str]:
    """``serveproto serve --port 0 ...`` as a process; returns it and its base URL once it serves."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--port", "0", "--log-level", "WARNING", *argv],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    assert line.startswith("serveproto: serving "), (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc, line.split(" on ")[1].strip()


def test_restart_intensity_exceeded_answers_in_flight_then_exits_1(fixture_engine):
    # The engine exits after its third frame (ACCEPT, DATA, DATA): the chat request in flight is
    # answered 503, and with no restart allowed the server then exits 1 with one line saying why.
    proc, base = serve_process(
        "--max-restarts",
        "0",
        "--ping-interval",
        "60",
        "--engine",
        str(fixture_engine),
        "--token-delay-ms",
        "20",
        "--fault",
        "exit_after=3",
    )
    try:
        r = httpx2.post(base + "/v1/chat/completions", json=CHAT, timeout=30)
        status = proc.wait(timeout=20)
        stderr = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json() == {
        "detail": {
            "error_type": "overloaded_error",
            "message": "the engine is unavailable: engine 'serveproto-fixture' exited (exit status 3)",
        }
    }
    assert status == 1
    assert stderr.splitlines()[-1] == (
        "serveproto serve: giving up: the engine failed 1 time(s) within 60 s (--max-restarts 0); last error: "
        "engine 'serveproto-fixture' exited (exit status 3); exiting with status 1 (--keep-restarting keeps retrying)"
    )


def test_keep_restarting_goes_on_past_the_restart_intensity(fixture_engine):
    # The engine exits after its first frame, the PONG of the first PING: a crash loop.
    proc, base = serve_process(
        "--max-restarts",
        "0",
        "--keep-restarting",
        "--ping-interval",
        "0.05",
        "--engine",
        str(fixture_engine),
        "--fault",
        "exit_after=1",
    )
    try:
        t0 = time.monotonic()
        restarts = 0.0
        while restarts < 4 and time.monotonic() - t0 < 20:
            restarts = restarts_of(httpx2.get(base + "/metrics", timeout=10).text)
            time.sleep(0.1)
        running = proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert restarts >= 4 and running
    assert status == 0


async def test_a_stopped_llama_engine_is_found_and_replaced(llama_engine):
    # issue 16, item 3: during a 30 s SIGSTOP of the llama engine /health said 200 throughout
    from gateway.engine import Engine, EngineTimeout

    states = []
    with anyio.fail_after(120):
        async with Engine.spawn(
            llama_engine, options=EngineOptions().updated(health_interval=0.2, ping_timeout=3.0, handshake_timeout=100)
        ) as eng:
            first = eng.pid
            states.append(eng.state)
            os.kill(first, signal.SIGSTOP)
            while eng.restarts == 0:
                if eng.state != states[-1]:
                    states.append(eng.state)
                await anyio.sleep(0.02)
            await eng.wait_ready()
            states.append(eng.state)
            assert eng.pid != first and eng.healthy
            assert isinstance(eng.last_error, EngineTimeout) and eng.last_error.what == "stall"
            assert (await eng.ping())["active"] == "0"
    assert states[:2] == ["serving", "unresponsive"] and states[-1] == "serving"
    # SIGTERM, then SIGCONT so that the stopped process acts on it: no SIGKILL needed
    assert eng.exit_statuses[0] == -signal.SIGTERM


# --- limits named by the request's own field -----------------------------------------------------

from gateway.decision.prompts import PromptBuilder  # noqa: E402


def question_set(**questions) -> dict:
    return {"state": TICKET["state"], "questions": questions}


DEPARTMENT = {"type": "choice", "instructions": "Which team?", "criteria": {"billing": None, "technical": None}}


async def test_a_state_over_the_context_is_422_naming_state(fixture_engine):
    body = {"state": "x" * 1000, "questions": TICKET["questions"]}
    async with serving("--engine", str(fixture_engine), "--ctx", "512") as base:
        async with httpx2.AsyncClient(base_url=base, timeout=30) as c:
            r = await c.post("/v1/systemone", json=body)
            long_question = await c.post(
                "/v1/systemone",
                json=question_set(short={"type": "noul"}, long={"type": "noul", "instructions": "y" * 1000}),
            )
            decisions = await c.post(
                "/v1/decisions",
                json={"input": "x" * 1000, "questions": [{"type": "predicate", "question": "Is it urgent?"}]},
            )
    message = (
        "The prompt of question 'urgency' (the state, then the question and its options) is longer than the "
        "engine's context of 512 tokens; this is its longest part"
    )
    assert r.status_code == 422
    assert r.json() == {
        "detail": [{"loc": ["body", "state"], "msg": message, "type": "too_long"}],
        "error": {"type": "invalid_request_error", "message": "body.state: " + message, "param": "state"},
    }
    assert long_question.status_code == 422
    assert long_question.json()["detail"] == [
        {
            "loc": ["body", "questions", "long"],
            "type": "too_long",
            "msg": "The prompt of question 'long' (the state, then the question and its options) is longer than the engine's "
            "context of 512 tokens; this is its longest part",
        }
    ]
    assert decisions.status_code == 400
    assert decisions.json()["error"] == {
        "type": "invalid_request_error",
        "param": "input",
        "code": None,
        "message": "The prompt of question '0' (the state, then the question and its options) is longer than the engine's "
        "context of 512 tokens; this is its longest part",
    }


async def test_a_label_over_200_tokens_is_422_naming_the_label(fixture_engine):
    label = "a" * 201  # the fixture's tokens are bytes
    body = question_set(department={"type": "choice", "criteria": {"billing": None, label: None}})
    async with serving("--engine", str(fixture_engine)) as base:
        async with httpx2.AsyncClient(base_url=base, timeout=30) as c:
            r = await c.post("/v1/systemone", json=body)
            at_200 = await c.post(
                "/v1/systemone",
                json=question_set(department={"type": "choice", "criteria": {"billing": None, "a" * 200: None}}),
            )
            decisions = await c.post(
                "/v1/decisions",
                json={
                    "input": "x",
                    "questions": [{"type": "choice", "choices": [{"value": "billing"}, {"value": label}]}],
                },
            )
    message = "An option may have at most 200 tokens: the engine scores at most 200 tokens per option"
    assert r.status_code == 422
    assert r.json()["detail"] == [
        {"loc": ["body", "questions", "department", "criteria", label], "msg": message, "type": "too_long"}
    ]
    assert r.json()["error"]["param"] == f"questions.department.criteria.{label}"
    assert at_200.status_code == 200
    assert decisions.status_code == 400
    assert decisions.json()["error"]["param"] == "questions[0].choices[1].value"
    assert decisions.json()["error"]["message"] == message


async def test_a_prompt_over_the_context_names_messages_or_prompt(fixture_engine):
    messages = [{"role": "user", "content": "z" * 100}]
    n_chat = len(PromptBuilder().chat(messages).encode())
    async with serving("--engine", str(fixture_engine), "--ctx", "64") as base:
        async with httpx2.AsyncClient(base_url=base, timeout=30) as c:
            chat = await c.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 4})
            streamed = await c.post(
                "/v1/chat/completions", json={"messages": messages, "max_tokens": 4, "stream": True}
            )
            completion = await c.post("/v1/completions", json={"prompt": "q" * 100, "max_tokens": 4})
            read_out = await c.post(
                "/v1/completions", json={"prompt": "q" * 100, "max_tokens": 0, "echo": True, "logprobs": 1}
            )
            default_max = await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    message = (
        f"'messages': the prompt is longer than the engine's context of 64 tokens (the engine said: prompt of "
        f"{n_chat} tokens exceeds n_ctx=64)"
    )
    assert chat.status_code == 400 and streamed.status_code == 400
    assert (
        chat.json()
        == streamed.json()
        == {
            "error": {"message": message, "type": "invalid_request_error", "param": "messages", "code": None},
            "detail": {"error_type": "invalid_request_error", "message": message},
        }
    )
    for r in (completion, read_out):
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
        assert r.json()["error"]["message"] == (
            "'prompt': the prompt is longer than the engine's context of 64 "
            "tokens (the engine said: prompt of 100 tokens exceeds n_ctx=64)"
        )
    # max_tokens left out defaults to the context when that is under 256: not a 400 about a field never sent
    assert default_max.status_code == 200, default_max.text


async def test_the_llama_engine_refusals_name_the_request_field(llama_engine):
    model = llama_engine[llama_engine.index("--model") + 1]
    label = " ".join(["word"] * 250)
    # --ctx-max: the longest prompt is a slot here (by default the model's trained 8192 would hold this state)
    async with serving(
        "--model", model, "--ctx", "1024", "--ctx-max", "1024", "--threads", "1", "--debias", "none"
    ) as base:
        async with httpx2.AsyncClient(base_url=base, timeout=120) as c:
            state = await c.post(
                "/v1/systemone", json={"state": "the cat sat on the mat. " * 200, "questions": {"q": {"type": "noul"}}}
            )
            long_label = await c.post(
                "/v1/systemone",
                json=question_set(department={"type": "choice", "criteria": {"billing": None, label: None}}),
            )
    assert state.status_code == 422
    assert state.json()["detail"] == [
        {
            "loc": ["body", "state"],
            "type": "too_long",
            "msg": "The prompt of question 'q' (the state, then the question and its options) is longer than the engine's "
            "context of 1024 tokens; this is its longest part",
        }
    ]
    assert long_label.status_code == 422
    assert long_label.json()["detail"] == [
        {
            "loc": ["body", "questions", "department", "criteria", label],
            "type": "too_long",
            "msg": "An option may have at most 200 tokens: the engine scores at most 200 tokens per option",
        }
    ]


# --- item 6: ambiguous requests, each decided ----------------------------------------------------

from test_routes_support import running  # noqa: E402


async def post_json(base: str, path: str, body, *, raw: bytes | None = None):
    async with httpx2.AsyncClient(base_url=base, timeout=30) as c:
        return await c.post(
            path, content=raw if raw is not None else orjson.dumps(body), headers={"content-type": "application/json"}
        )


@pytest.mark.parametrize(
    "labels, twin, label",
    [
        (["billing", "Billing"], "billing", "Billing"),
        (["billing", " billing "], "billing", " billing "),
        (["Sales ", "technical", "sALES"], "Sales ", "sALES"),
    ],
)
async def test_labels_that_differ_only_by_case_or_space_are_422(labels, twin, label):
    body = question_set(department={"type": "choice", "criteria": dict.fromkeys(labels)})
    async with running(make_app(FakeEngine())) as base:
        r = await post_json(base, "/v1/systemone", body)
    assert r.status_code == 422
    assert r.json()["detail"] == [
        {
            "loc": ["body", "questions", "department", "criteria", label],
            "type": "value_error",
            "msg": f"The label {label!r} differs from {twin!r} only by case or surrounding "
            "whitespace: the model cannot tell them apart; rename one",
        }
    ]


async def test_a_whitespace_only_label_is_422():
    body = question_set(department={"type": "choice", "criteria": {"billing": None, " \t": None}})
    async with running(make_app(FakeEngine())) as base:
        r = await post_json(base, "/v1/systemone", body)
    assert r.status_code == 422
    assert r.json()["detail"] == [
        {
            "loc": ["body", "questions", "department", "criteria", " \t"],
            "type": "value_error",
            "msg": "A label must not be only whitespace: it is the text the model is scored on",
        }
    ]


_HIDDEN = (
    "invisible characters (Unicode format characters: zero-width spaces and joiners, a BOM) "
    "or Unicode normalization (NFC)"
)


@pytest.mark.parametrize(
    "labels, twin, label, how",
    [
        (["billing", "billing\u200b"], "billing", "billing\u200b", f"only by {_HIDDEN}"),  # a zero-width space
        (["\ufeffbilling", "billing"], "\ufeffbilling", "billing", f"only by {_HIDDEN}"),  # a BOM
        (["caf\u00e9", "cafe\u0301"], "caf\u00e9", "cafe\u0301", f"only by {_HIDDEN}"),  # café composed, decomposed
        (
            ["Billing", " bil\u00adling\u200d"],
            "Billing",
            " bil\u00adling\u200d",
            f"only by case, surrounding whitespace, {_HIDDEN}",
        ),
    ],
)
async def test_labels_that_differ_only_by_invisible_characters_or_normalization_are_422(labels, twin, label, how):
    body = question_set(department={"type": "choice", "criteria": dict.fromkeys(labels)})
    async with running(make_app(FakeEngine())) as base:
        r = await post_json(base, "/v1/systemone", body)
        d = await post_json(
            base,
            "/v1/decisions",
            {"input": "x", "questions": [{"type": "choice", "choices": [{"value": x} for x in labels]}]},
        )
    msg = f"The label {label!r} differs from {twin!r} {how}: the model cannot tell them apart; rename one"
    assert r.status_code == 422
    assert r.json() == {
        "detail": [{"loc": ["body", "questions", "department", "criteria", label], "msg": msg, "type": "value_error"}],
        "error": {
            "type": "invalid_request_error",
            "message": f"body.questions.department.criteria.{label}: {msg}",
            "param": f"questions.department.criteria.{label}",
        },
    }
    assert d.status_code == 400
    assert d.json()["error"] == {
        "message": msg,
        "type": "invalid_request_error",
        "param": "questions[0].choices[1].value",
        "code": None,
    }


@pytest.mark.parametrize("label", ["\u200b", "\ufeff", " \u200c\u200d ", "\u2060\u00ad"])
async def test_a_label_of_invisible_characters_only_is_422(label):
    body = question_set(department={"type": "choice", "criteria": {"billing": None, label: None}})
    async with running(make_app(FakeEngine())) as base:
        r = await post_json(base, "/v1/systemone", body)
    assert r.status_code == 422
    assert r.json()["detail"] == [
        {
            "loc": ["body", "questions", "department", "criteria", label],
            "type": "value_error",
            "msg": "A label must not be only invisible characters (Unicode format characters such as "
            "zero-width spaces) and whitespace: it is the text the model is scored on",
        }
    ]


async def test_question_ids_that_differ_only_by_invisible_characters_are_422():
    noul = {"type": "noul"}
    async with running(make_app(FakeEngine())) as base:
        zwsp = await post_json(base, "/v1/systemone", {"state": "s", "questions": {"q": noul, "q\u200b": noul}})
        nfd = await post_json(
            base, "/v1/systemone", {"state": "s", "questions": {"caf\u00e9": noul, "cafe\u0301": noul}}
        )
        empty = await post_json(base, "/v1/systemone", {"state": "s", "questions": {"q": noul, "\ufeff": noul}})
        cased = await post_json(base, "/v1/systemone", {"state": "s", "questions": {"q": noul, "Q": noul}})
    zw, composed, decomposed = "q\u200b", "caf\u00e9", "cafe\u0301"
    msg = (
        f"The question id {zw!r} differs from 'q' only by {_HIDDEN}: their answers could not be told apart; rename one"
    )
    assert zwsp.status_code == 422
    assert zwsp.json() == {
        "detail": [{"loc": ["body", "questions", "q\u200b"], "msg": msg, "type": "value_error"}],
        "error": {
            "type": "invalid_request_error",
            "message": f"body.questions.q\u200b: {msg}",
            "param": "questions.q\u200b",
        },
    }
    assert nfd.json()["detail"] == [
        {
            "loc": ["body", "questions", "cafe\u0301"],
            "msg": f"The question id {decomposed!r} differs from {composed!r} only by {_HIDDEN}: their answers "
            "could not be told apart; rename one",
            "type": "value_error",
        }
    ]
    assert empty.json()["detail"] == [
        {
            "loc": ["body", "questions", "\ufeff"],
            "msg": "A question id must not be only invisible characters (Unicode format characters such as "
            "zero-width spaces): it keys its answer in the reply",
            "type": "string_too_short",
        }
    ]
    assert cased.status_code == 200 and list(cased.json()["answers"]) == ["q", "Q"]  # ids keep their case


async def test_an_empty_score_level_is_answered_with_a_warning():
    body = question_set(
        severity={"type": "score", "criteria": ["none", "", "  ", "total"]},
        other={"type": "score", "criteria": ["low", "", "high"]},
    )
    async with running(make_app(FakeEngine())) as base:
        r = await post_json(base, "/v1/systemone", body)
    assert r.status_code == 200
    assert r.json()["x_warnings"] == [
        "question 'severity': levels 1, 2 are empty: the model reads only their numbers",
        "question 'other': level 1 is empty: the model reads only its number",
    ]
    assert r.json()["answers"]["severity"]["legend"] == {"0": "none", "1": "", "2": "  ", "3": "total"}


@pytest.mark.parametrize(
    "raw, loc",
    [
        (b'{"state": "s", "questions": {"q": {"type": "noul"}, "q": {"type": "noul"}}}', ["body", "questions", "q"]),
        (b'{"state": "s", "state": "t", "questions": {"q": {"type": "noul"}}}', ["body", "state"]),
        (
            b'{"state": "s", "questions": {"q": {"type": "choice", "criteria": {"a": 1, "b": 2, "a": 3}}}}',
            ["body", "questions", "q", "criteria", "a"],
        ),
        (b'{"state": [{"x": 1}, {"y": 1, "y": 2}], "questions": {"q": {"type": "noul"}}}', ["body", "state", 1, "y"]),
    ],
)
async def test_a_repeated_json_key_is_422_naming_it(raw, loc):
    async with running(make_app(FakeEngine())) as base:
        r = await post_json(base, "/v1/systemone", None, raw=raw)
    msg = f"The key {loc[-1]!r} is sent more than once in this object: send it once"
    param = ".".join(map(str, loc[1:]))
    assert r.status_code == 422
    assert r.json() == {
        "detail": [{"loc": loc, "msg": msg, "type": "duplicate_key"}],
        "error": {"type": "invalid_request_error", "message": f"body.{param}: {msg}", "param": param},
    }


@pytest.mark.parametrize(
    "path, body, name",
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 2}, "n"),
        ("/v1/completions", {"prompt": "hi", "n": 3}, "n"),
        ("/v1/completions", {"prompt": "hi", "best_of": 2}, "best_of"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": True}, "n"),
    ],
)
async def test_more_than_one_choice_is_400_naming_the_field(path, body, name):
    async with running(make_app(FakeEngine())) as base:
        r = await post_json(base, path, body)
        one = await post_json(base, path, {**body, name: 1})
    message = f"'{name}' must be 1: this server returns one choice per request"
    assert r.status_code == 400
    assert r.json() == {
        "error": {"message": message, "type": "invalid_request_error", "param": name, "code": None},
        "detail": {"error_type": "invalid_request_error", "message": message},
    }
    assert one.status_code == 200


async def test_a_sure_answer_has_entropy_0_not_minus_0():
    # "a" scores -0.1 nats, 60 "z"s about -0.5 each: the reported probabilities are [1.0, 0.0]
    body = question_set(department={"type": "choice", "criteria": {"a": None, "z" * 60: None}})
    async with running(make_app(FakeEngine())) as base:
        r = await post_json(base, "/v1/systemone", body)
    answer = r.json()["answers"]["department"]
    assert answer["probabilities"] == {"a": 1.0, "z" * 60: 0.0}
    assert b'"confidence":1.0,"x_entropy":0.0,"x_calibration":"identity","x_margin":1.0' in r.content
    assert b"-0.0" not in r.content
