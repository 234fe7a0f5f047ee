"""The terminal client and the System One page against the real ``serveproto serve`` on the fixture engine.

The server runs as a subprocess (``serveproto serve --port 0 --engine
engines/bin/serveproto-fixture --mode chat|decide``). The page is loaded from
the server's ``/`` when it serves it; until then a small static server of the
test's own serves ``gateway/server/static`` and forwards ``/v1/*`` to the real server.
Every number on the screen is checked against the same request sent straight
to the server (the fixture engine is deterministic).

Set ``SERVEPROTO_PAGE_SCREENSHOT=path.png`` to keep a screenshot of the page.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gateway.cli.chat_client import Client
from gateway.paths import engine_bin
from support import SERVEPROTO
from test_chat_client import STATIC, entropy_oracle

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = engine_bin("serveproto-fixture")


def serve_is_implemented() -> bool:
    out = subprocess.run([*SERVEPROTO, "serve", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    return out.returncode == 0 and "--engine" in out.stdout


if not os.access(FIXTURE, os.X_OK):
    pytest.skip(f"{FIXTURE} is not built (make -C engines all)", allow_module_level=True)
if not serve_is_implemented():
    pytest.skip("`serveproto serve --engine` is not implemented yet", allow_module_level=True)


class LiveServer:
    """``serveproto serve`` on a free port with ``engine`` as its argv; ``url`` once listening."""

    def __init__(self, *engine: str):
        self.proc = subprocess.Popen(
            [*SERVEPROTO, "serve", "--port", "0", "--log-level", "WARNING", "--engine", *engine],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={k: v for k, v in os.environ.items() if k != "SERVEPROTO_API_KEY"},
        )
        self.lines: list[str] = []
        deadline = time.monotonic() + 120
        self.url = None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            m = re.search(r"serving .* on (http://\S+)", line)
            if m:
                self.url = m.group(1)
                break
        if self.url is None:
            self.close()
            raise AssertionError("serveproto serve did not come up:\n" + "".join(self.lines))
        # Keep draining its output so the pipe never fills.
        threading.Thread(target=lambda: [self.lines.append(x) for x in self.proc.stdout], daemon=True).start()

    def post(self, path: str, body: dict) -> tuple[int, dict]:
        u = urllib.parse.urlsplit(self.url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
        try:
            conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read())
        finally:
            conn.close()

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class PageFront:
    """Serves gateway/server/static at ``/`` and forwards every other path to ``upstream`` (streamed)."""

    def __init__(self, upstream: str):
        up = urllib.parse.urlsplit(upstream)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                name = "index.html" if self.path == "/" else self.path.lstrip("/")
                f = STATIC / name
                if "/" not in name and f.is_file():
                    body = f.read_bytes()
                    self.send_response(200)
                    self.send_header(
                        "Content-Type",
                        {".html": "text/html", ".css": "text/css", ".js": "text/javascript"}[f.suffix]
                        + "; charset=utf-8",
                    )
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self.forward("GET", None)

            def do_POST(self):
                self.forward("POST", self.rfile.read(int(self.headers.get("Content-Length", 0))))

            def forward(self, method, body):
                conn = http.client.HTTPConnection(up.hostname, up.port, timeout=120)
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "authorization")}
                conn.request(method, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() in ("content-type", "cache-control", "retry-after"):
                        self.send_header(k, v)
                self.send_header("Connection", "close")
                self.end_headers()
                while chunk := resp.read1(65536):
                    self.wfile.write(chunk)
                    self.wfile.flush()
                conn.close()
                self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def page_url(server: LiveServer):
    """The server's own ``/`` when it serves the page, else a :class:`PageFront` before it."""
    u = urllib.parse.urlsplit(server.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    try:
        conn.request("GET", "/")
        resp = conn.getresponse()
        body = resp.read()
    finally:
        conn.close()
    if resp.status == 200 and b'id="questions"' in body:
        return server.url, None
    front = PageFront(server.url)
    return front.url, front


@pytest.fixture(scope="module")
def chat_server():
    s = LiveServer(str(FIXTURE), "--mode", "chat")
    yield s
    s.close()


@pytest.fixture(scope="module")
def decide_server():
    s = LiveServer(str(FIXTURE), "--mode", "decide")
    yield s
    s.close()


def direct_choice(server: LiveServer, state: str, question: str, options, qid: str) -> dict:
    status, reply = server.post(
        "/v1/systemone",
        {
            "state": state,
            "questions": {qid: {"type": "choice", "instructions": question, "criteria": {o: None for o in options}}},
        },
    )
    assert status == 200, reply
    return reply["answers"][qid]


# -- the terminal --------------------------------------------------------------


def test_terminal_decide_matches_the_server(chat_server):
    from test_chat_client_pty import Term

    t = Term("--attach", chat_server.url)
    try:
        t.wait_for("model fixture")
        t.wait_for("›")
        t.line("/decide merge | request changes | close")
        t.wait_for("◆ ›")
        t.line("The PR touches the engine and carries no tests. What should we do?")
        shown = t.wait_for("nothing generated")
        t.line("/quit")
        t.wait_for("bye")
    finally:
        t.child.terminate(force=True)
    options = ("merge", "request changes", "close")
    answer = direct_choice(
        chat_server, "", "The PR touches the engine and carries no tests. What should we do?", options, "decision"
    )
    probs = [answer["probabilities"][o] for o in options]
    order = sorted(range(3), key=lambda i: -probs[i])
    rows = [ln.strip() for ln in shown.splitlines() if ln.strip().endswith("%")]
    assert [r.split("  ")[0] for r in rows] == [options[i] for i in order]
    assert [r.rsplit(" ", 1)[-1] for r in rows] == [f"{100 * probs[i]:.1f}%" for i in order]
    assert f"→ {answer['choice']}  entropy {entropy_oracle(probs):.3f}" in shown


# -- the page ------------------------------------------------------------------


def test_page_on_a_language_model(chat_server):
    from selenium.webdriver.common.by import By

    import test_page as tp

    url, front = page_url(chat_server)
    driver, profile = tp.start_browser()  # noqa: RUF059  (kept as written)
    try:
        tp.fresh(driver, url)
        driver.find_element(By.ID, "doc").send_keys(tp.TICKET)
        tp.ask(driver, "Which team should handle this?", "billing | technical | sales")
        tp.ask(driver, "How urgent is it?", "low | medium | high")
        first = tp.wait(driver, lambda d: tp.answered(d, 1), timeout=60)
        second = tp.wait(driver, lambda d: tp.answered(d, 2), timeout=60)
        driver.find_element(By.ID, "chat-input").send_keys("Summarise the ticket.\n")
        tp.wait(
            driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#chat-log .msg.assistant:not(.streaming)"), timeout=60
        )
        reply = driver.find_element(By.CSS_SELECTOR, "#chat-log .msg.assistant")
        assert "error" not in reply.get_attribute("class") and reply.text.strip()
        shot = os.environ.get("SERVEPROTO_PAGE_SCREENSHOT")
        if shot:
            time.sleep(0.6)
            driver.save_screenshot(shot)
        for el, question, options in (
            (first, "Which team should handle this?", ("billing", "technical", "sales")),
            (second, "How urgent is it?", ("low", "medium", "high")),
        ):
            answer = direct_choice(chat_server, tp.TICKET, question, options, "q")
            probs = [answer["probabilities"][o] for o in options]
            assert [b[0] for b in tp.bars(el)] == list(options)
            assert [b[2] for b in tp.bars(el)] == probs
            assert [b[1] for b in tp.bars(el)] == [f"{100 * p:.1f}%" for p in probs]
            assert el.get_attribute("data-winner") == answer["choice"]
            assert float(el.get_attribute("data-entropy")) == pytest.approx(entropy_oracle(probs), abs=1e-6)
    finally:
        driver.quit()
        if front:
            front.close()


def test_page_on_a_decision_engine(decide_server):
    from selenium.webdriver.common.by import By

    import test_page as tp

    url, front = page_url(decide_server)
    driver, profile = tp.start_browser()  # noqa: RUF059  (kept as written)
    try:
        tp.fresh(driver, url)
        driver.find_element(By.ID, "doc").send_keys("The invoice was paid twice.")
        tp.ask(driver, "Which queue?", "billing | bugs | sales")
        el = tp.wait(driver, lambda d: tp.answered(d, 1), timeout=60)
        answer = direct_choice(
            decide_server, "The invoice was paid twice.", "Which queue?", ("billing", "bugs", "sales"), "q"
        )
        assert [b[2] for b in tp.bars(el)] == [answer["probabilities"][o] for o in ("billing", "bugs", "sales")]
        assert el.get_attribute("data-winner") == answer["choice"]
        # A decision engine generates nothing: the chat says so in one line.
        driver.find_element(By.ID, "chat-input").send_keys("hello\n")
        msg = tp.wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#chat-log .msg.assistant.error"), timeout=60)[
            0
        ]
        assert msg.text.startswith("HTTP 400: ") and "/v1/systemone" in msg.text
    finally:
        driver.quit()
        if front:
            front.close()


def test_client_against_the_decision_engine(decide_server):
    d = Client(decide_server.url).decide("The invoice was paid twice.", "Which queue?", ("billing", "bugs", "sales"))
    answer = direct_choice(
        decide_server, "The invoice was paid twice.", "Which queue?", ("billing", "bugs", "sales"), "decision"
    )
    assert d.probabilities == tuple(answer["probabilities"][o] for o in ("billing", "bugs", "sales"))
    assert d.winner == answer["choice"]
