"""The terminal client's pieces (gateway.cli.chat_client) against a fake server.

The fake server here is also used by test_chat_client_pty.py and test_page.py:
it answers ``/v1/systemone`` and ``/v1/chat/completions`` with replies the test
chooses, records every request, and serves ``gateway/server/static`` at ``/``.
"""

from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from gateway.cli.chat_client import (
    Client,
    Decision,
    ServerError,
    ServerUnreachable,
    choice_request,
    entropy_reading,
    error_message,
    normalised_entropy,
    parse_options,
)
from gateway.decision.conversation import conversation_state
from support import SERVEPROTO, free_port, serve_process

STATIC = Path(__file__).resolve().parents[2] / "gateway" / "server" / "static"


class FakeServer:
    """A threaded HTTP server on 127.0.0.1 with scripted replies.

    ``decide(body) -> (status, reply_dict[, headers])`` answers ``/v1/systemone``;
    ``chat(body) -> (status, list_of_deltas | reply_dict)`` answers
    ``/v1/chat/completions`` (a list is streamed as SSE); ``api_key`` when set
    makes every ``/v1`` route demand it. ``requests`` records
    ``(method, path, headers, body)``; ``hold`` is an event that a scripted
    reply may wait on (set at close so no thread hangs).
    """

    def __init__(self, decide=None, chat=None, api_key=None):
        self.decide = decide or (lambda body: (200, uniform_reply(body)))
        self.chat = chat or (lambda body: (200, ["Hello", ", ", "world."]))
        self.api_key = api_key
        self.requests: list[tuple[str, str, dict, object]] = []
        self.hold = threading.Event()
        self.cancelled = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _send(self, status, body: bytes, ctype="application/json", headers=None):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                server.requests.append(("GET", self.path, dict(self.headers), None))
                if self.path == "/v1/models":
                    return self._send(
                        200,
                        json.dumps(
                            {
                                "object": "list",
                                "data": [{"id": "fake-model"}],
                                "models": [{"name": "fake-model", "description": "", "release_date": "2026-11-30"}],
                            }
                        ).encode(),
                    )
                path = "index.html" if self.path in ("/", "") else self.path.lstrip("/").split("?")[0]
                f = (STATIC / path).resolve()
                if STATIC.resolve() in f.parents and f.is_file():
                    ctype = {
                        ".html": "text/html; charset=utf-8",
                        ".js": "text/javascript",
                        ".css": "text/css",
                        ".svg": "image/svg+xml",
                    }.get(f.suffix, "application/octet-stream")
                    return self._send(200, f.read_bytes(), ctype)
                self._send(404, b'{"detail": "not found"}')

            def do_POST(self):
                n = int(self.headers.get("Content-Length", 0))
                raw = self.rfile.read(n)
                body = json.loads(raw) if raw else None
                server.requests.append(("POST", self.path, dict(self.headers), body))
                if server.api_key and self.headers.get("Authorization") != f"Bearer {server.api_key}":
                    return self._send(
                        401,
                        json.dumps(
                            {"detail": {"error_type": "authentication_error", "message": "wrong or missing API key"}}
                        ).encode(),
                    )
                if self.path == "/v1/systemone":
                    status, reply, *extra = server.decide(body)
                    return self._send(status, json.dumps(reply).encode(), headers=extra[0] if extra else None)
                if self.path == "/v1/chat/completions":
                    status, reply = server.chat(body)
                    if isinstance(reply, list):
                        return self._stream(reply)
                    return self._send(status, json.dumps(reply).encode())
                self._send(404, b'{"detail": "not found"}')

            def _stream(self, deltas):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                try:
                    for d in deltas:
                        if d is None:  # a pause the test releases with `hold`
                            server.hold.wait(30)
                            continue
                        ev = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": d}}]}
                        self.wfile.write(b"data: " + json.dumps(ev).encode() + b"\n\n")
                        self.wfile.flush()
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                except OSError:
                    server.cancelled.set()
                self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.hold.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def posts(self, path):
        return [r for r in self.requests if r[0] == "POST" and r[1] == path]


def choice_reply(probabilities: dict, input_tokens=131, output_tokens=4, qid="decision"):
    """A Jev reply for one choice question with the given label -> probability table."""
    n = len(probabilities)
    peak = max(probabilities.values())
    return {
        "model": "fake-model",
        "answers": {
            qid: {
                "type": "choice",
                "choice": max(probabilities, key=probabilities.get),
                "probabilities": probabilities,
                "confidence": 1.0 if n == 1 else (n * peak - 1) / (n - 1),
            }
        },
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }


def uniform_reply(body):
    """Every question of ``body`` answered with equal probabilities."""
    answers = {}
    for qid, q in body["questions"].items():
        labels = list(q["criteria"])
        answers[qid] = {
            "type": "choice",
            "choice": labels[0],
            "probabilities": {k: 1 / len(labels) for k in labels},
            "confidence": 0.0,
        }
    return {"model": "fake-model", "answers": answers, "usage": {"input_tokens": 10, "output_tokens": len(answers)}}


def entropy_oracle(p):
    """Normalised entropy with numpy, written apart from the code under test."""
    p = np.asarray(p, dtype=np.float64)
    p = p / p.sum()
    nz = p[p > 0]
    return float(-(nz * np.log(nz)).sum() / np.log(len(p)))


# -- pure helpers ------------------------------------------------------------


def test_parse_options_splits_and_strips():
    assert parse_options("merge | request changes |close") == ("merge", "request changes", "close")
    assert parse_options("ja|nein") == ("ja", "nein")


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("", "at least two"),
        ("only", "at least two"),
        ("a | | b", "empty option"),
        ("a | b | a", "'a' is given twice"),
    ],
)
def test_parse_options_refuses(text, fragment):
    with pytest.raises(ValueError, match=fragment):
        parse_options(text)


@pytest.mark.parametrize(
    "p",
    [
        [0.936, 0.064, 0.0],
        [0.5, 0.5, 0.0],
        [0.2, 0.3, 0.5],
        [0.059806, 0.939983, 0.000211],
        [0.25] * 4,
    ],
)
def test_normalised_entropy_matches_numpy_oracle(p):
    assert normalised_entropy(p) == pytest.approx(entropy_oracle(p), abs=1e-12)


def test_normalised_entropy_known_values():
    assert normalised_entropy([1.0, 0.0, 0.0]) == 0.0
    assert normalised_entropy([0.5, 0.5]) == pytest.approx(1.0, abs=1e-15)
    # ln 2 / ln 3: half the mass on each of two of three options.
    assert normalised_entropy([0.5, 0.5, 0.0]) == pytest.approx(math.log(2) / math.log(3), abs=1e-15)
    assert normalised_entropy([1.0]) == 0.0


@pytest.mark.parametrize("bad", [[], [0.5, -0.1], [float("nan"), 1.0], [0.0, 0.0]])
def test_normalised_entropy_refuses(bad):
    with pytest.raises(ValueError, match="probabilities"):
        normalised_entropy(bad)


@pytest.mark.parametrize(
    "h, reading",
    [
        (0.0, "sure"),
        (0.3999, "sure"),
        (0.4, "unsure"),
        (0.63, "unsure"),
        (0.8, "unsure"),
        (0.8001, "does not know"),
        (1.0, "does not know"),
    ],
)
def test_entropy_reading_follows_the_seed_table(h, reading):
    assert entropy_reading(h) == reading


def test_conversation_text_and_choice_request():
    msgs = [{"role": "user", "content": "The PR has no tests."}, {"role": "assistant", "content": "Noted."}]
    state = conversation_state(msgs)
    assert state == "User: The PR has no tests.\nAssistant: Noted."
    assert conversation_state([]) == ""
    assert choice_request(state, "What now?", ("merge", "close"), model="m") == {
        "state": "User: The PR has no tests.\nAssistant: Noted.",
        "questions": {
            "decision": {"type": "choice", "instructions": "What now?", "criteria": {"merge": None, "close": None}}
        },
        "model": "m",
    }


def test_decision_from_reply_keeps_request_order_and_reads_entropy():
    reply = choice_reply({"close": 0.0, "merge": 0.064, "request changes": 0.936})
    d = Decision.from_reply(reply, ("merge", "request changes", "close"), 1.5)
    assert d.probabilities == (0.064, 0.936, 0.0)
    assert d.winner == "request changes"
    assert d.entropy == pytest.approx(entropy_oracle([0.064, 0.936, 0.0]), abs=1e-12)
    assert d.reading == "sure"
    assert (d.input_tokens, d.output_tokens, d.seconds, d.model) == (131, 4, 1.5, "fake-model")


def test_decision_from_reply_refuses_a_reply_without_the_label():
    with pytest.raises(ServerError, match="no usable answer"):
        Decision.from_reply(choice_reply({"merge": 1.0}), ("merge", "close"), 0.1)


def test_error_message_reads_the_known_envelopes():
    jev422 = {
        "detail": [
            {"loc": ["body", "questions", "decision", "criteria"], "msg": "at least one label", "type": "value_error"}
        ]
    }
    assert error_message(422, json.dumps(jev422).encode()) == "body.questions.decision.criteria: at least one label"
    auth = {"detail": {"error_type": "authentication_error", "message": "bad key"}}
    assert error_message(401, json.dumps(auth).encode()) == "bad key"
    assert error_message(400, b'{"error": {"message": "no model", "param": "model"}}') == "no model"
    assert error_message(502, b"upstream fell over\n") == "upstream fell over"
    assert error_message(503, b"") == "Service Unavailable"


def test_client_refuses_a_bad_url():
    with pytest.raises(ValueError, match="url"):
        Client("ftp://example")


# -- against the fake server -------------------------------------------------


def test_decide_sends_one_choice_with_the_key_and_reads_the_reply():
    probs = {"merge": 0.064, "request changes": 0.936, "close": 0.0}
    with FakeServer(decide=lambda body: (200, choice_reply(probs)), api_key="k3y") as srv:
        d = Client(srv.url, api_key="k3y").decide(
            "User: hi", "What should we do?", ("merge", "request changes", "close")
        )
        [(_, _, headers, body)] = srv.posts("/v1/systemone")
    assert headers["Authorization"] == "Bearer k3y"
    assert headers["Content-Type"] == "application/json"
    assert body == {
        "state": "User: hi",
        "questions": {
            "decision": {
                "type": "choice",
                "instructions": "What should we do?",
                "criteria": {"merge": None, "request changes": None, "close": None},
            }
        },
    }
    assert list(body["questions"]["decision"]["criteria"]) == ["merge", "request changes", "close"]
    assert d.winner == "request changes" and d.probabilities == (0.064, 0.936, 0.0)


def test_chat_stream_yields_the_deltas_in_order():
    with FakeServer(chat=lambda body: (200, ["Hel", "lo", " there", "."])) as srv:
        out = list(Client(srv.url).chat_stream([{"role": "user", "content": "hi"}], model="fake-model", max_tokens=8))
        [(_, _, _, body)] = srv.posts("/v1/chat/completions")
    assert out == ["Hel", "lo", " there", "."]
    assert body == {
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "model": "fake-model",
        "max_tokens": 8,
    }


def test_chat_without_streaming_support_reads_the_whole_reply():
    reply = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Whole."}}]}
    with FakeServer(chat=lambda body: (200, reply)) as srv:
        assert list(Client(srv.url).chat_stream([{"role": "user", "content": "hi"}])) == ["Whole."]


def test_wrong_key_is_a_401_server_error():
    with FakeServer(api_key="right") as srv:
        with pytest.raises(ServerError) as err:
            Client(srv.url, api_key="wrong").decide("", "q", ("a", "b"))
    assert err.value.status == 401
    assert err.value.message == "wrong or missing API key"


def test_a_422_names_the_field():
    body422 = {"detail": [{"loc": ["body", "state"], "msg": "field required", "type": "missing"}]}
    with FakeServer(decide=lambda body: (422, body422)) as srv:
        with pytest.raises(ServerError, match=r"HTTP 422: body\.state: field required"):
            Client(srv.url).decide("", "q", ("a", "b"))


def test_no_server_is_unreachable():
    with pytest.raises(ServerUnreachable, match="no server at http://127.0.0.1:"):  # noqa: RUF043  (the dots also match themselves)
        Client(f"http://127.0.0.1:{free_port()}", timeout=5).model_ids()


def test_model_ids_reads_both_lists():
    with FakeServer() as srv:
        assert Client(srv.url).model_ids() == ["fake-model", "fake-model"]


BUSY = {"detail": {"error_type": "overloaded_error", "message": "the engine is restarting"}}


@pytest.mark.parametrize(
    "busy_replies, headers, posts, ok",
    [
        (1, {"Retry-After": "0"}, 2, True),  # busy once, then answered
        (5, {"Retry-After": "0"}, 3, False),  # busy throughout: 1 + MAX_RETRIES tries, then the 503
        (1, {}, 1, False),  # no Retry-After: no retry
        (1, {"Retry-After": "60"}, 1, False),  # too long to wait in a terminal
        (1, {"Retry-After": "Wed, 21 Oct 2026 07:28:00 GMT"}, 1, False),  # date form: not waited for
    ],
)
def test_busy_server_is_retried_after_retry_after(busy_replies, headers, posts, ok):
    calls = []

    def decide(body):
        calls.append(1)
        if len(calls) <= busy_replies:
            return 503, BUSY, headers
        return 200, choice_reply({"a": 0.25, "b": 0.75})

    with FakeServer(decide=decide) as srv:
        client = Client(srv.url)
        if ok:
            assert client.decide("", "q", ("a", "b")).winner == "b"
        else:
            with pytest.raises(ServerError) as err:
                client.decide("", "q", ("a", "b"))
            assert (err.value.status, err.value.message) == (503, "the engine is restarting")
        assert len(srv.posts("/v1/systemone")) == posts


def _chat_piped(url: str, text: str, *key_args: str):
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "SERVEPROTO_API_KEY"}
    return subprocess.run(
        [*SERVEPROTO, "chat", "--attach", url, *key_args],
        cwd=STATIC.parents[2],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_piped_chat_without_the_key_prints_the_401_once_and_fails(fixture_engine):
    import subprocess

    argv = ["--port", "0", "--api-key", "k1", "--log-level", "WARNING", "--engine", str(fixture_engine)]
    with serve_process(*argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as proc:
        line = proc.stdout.readline()
        assert line.startswith("serveproto: serving fixture on "), line
        url = line.split(" on ")[1].strip()
        out = _chat_piped(url, "hello\n/decide a | b\nwhich?\n")
        good = _chat_piped(url, "hello\n", "--api-key", "k1")
    assert out.returncode == 1
    assert out.stdout.splitlines() == [
        f"  attached to {url}",
        "  ✗ HTTP 401: missing API key: send 'Authorization: Bearer <key>' (pass --api-key or set SERVEPROTO_API_KEY)",
    ]
    assert good.returncode == 0, good.stdout + good.stderr
    lines = good.stdout.splitlines()
    assert lines[1] == "  model fixture · chat, or /decide a | b | c · /help" and len(lines) == 3
    assert lines[2].startswith("  ") and lines[2].strip()  # the reply: one indented line of text


def test_piped_session_with_a_failed_request_exits_1_with_no_empty_line():
    # the fake server takes the key on GET /v1/models, so only the chat line fails
    with FakeServer(api_key="k1") as srv:
        out = _chat_piped(srv.url, "hello\n")
    assert out.returncode == 1
    assert out.stdout.splitlines()[2:] == [
        "  ✗ HTTP 401: wrong or missing API key (pass --api-key or set SERVEPROTO_API_KEY)"
    ]
