"""``serveproto chat --attach`` driven through a pseudo-terminal (pexpect) against a fake server.

The screen is read with the ANSI escapes stripped; the fake server records what
the client sent so the requests are checked exactly, not only the screen.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from pathlib import Path

import pytest

pexpect = pytest.importorskip("pexpect", reason="pexpect is not installed (pip install -e '.[test]')")

from support import free_port  # noqa: E402
from test_chat_client import FakeServer, choice_reply, entropy_oracle  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][0-9A-B]|\x1b[=>]|[\r\x08]")


class Term:
    """The client in a 40x120 pseudo-terminal; ``wait_for`` reads until a text shows."""

    def __init__(self, *args: str):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SERVEPROTO_API_KEY", "NO_COLOR"))}
        env.update(TERM="xterm-256color", PROMPT_TOOLKIT_NO_CPR="1", COLUMNS="120", LINES="40")
        self.child = pexpect.spawn(
            sys.executable,
            ["-m", "gateway.cli", "chat", *args],
            cwd=str(ROOT),
            env=env,
            dimensions=(40, 120),
            encoding="utf-8",
            timeout=20,
        )
        self.screen = ""  # everything shown since the last wait_for matched, escapes stripped
        self.seen = ""  # everything shown, escapes stripped

    def wait_for(self, text: str, timeout: float = 20.0) -> str:
        """Read until ``text`` appears; return what was shown up to and including it."""
        deadline = time.monotonic() + timeout
        while text not in self.screen:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{text!r} never showed; screen so far:\n{self.screen}")
            try:
                chunk = self.child.read_nonblocking(4096, timeout=min(left, 0.5))
            except pexpect.TIMEOUT:
                continue
            except pexpect.EOF:
                raise AssertionError(f"the client exited before {text!r}; screen:\n{self.screen}") from None
            clean = ANSI.sub("", chunk)
            self.screen += clean
            self.seen += clean
        head, _, tail = self.screen.partition(text)
        self.screen = tail
        return head + text

    def line(self, text: str) -> None:
        self.child.send(text + "\r")

    def ask(self, text: str, until: str, timeout: float = 20.0) -> str:
        """Type ``text`` and Enter, then ``wait_for(until)``: what was shown up to and including it."""
        self.line(text)
        return self.wait_for(until, timeout)

    def close(self) -> int:
        if self.child.isalive():
            self.line("/quit")  # typed ahead if the prompt is not up yet
            self.child.expect(pexpect.EOF, timeout=10)
        self.child.close()
        return self.child.exitstatus


@pytest.fixture
def term_factory():
    terms: list[Term] = []

    def make(*args):
        t = Term(*args)
        terms.append(t)
        return t

    yield make
    for t in terms:
        t.child.terminate(force=True)


PROBS = {"merge": 0.064, "request changes": 0.936, "close": 0.0}


def test_chat_then_decide_draws_bars_and_entropy(term_factory):
    with FakeServer(
        decide=lambda body: (200, choice_reply(PROBS)), chat=lambda body: (200, ["The PR ", "has no ", "tests."])
    ) as srv:
        t = term_factory("--attach", srv.url)
        t.wait_for("model fake-model")
        t.wait_for("›")
        t.ask("What about this PR?", "The PR has no tests.")
        # TAB completes the command; the rest is typed once the completion shows.
        t.child.send("/dec\t")
        t.wait_for("/decide")
        t.ask(" merge | request changes | close", "✦ System One · 3 options")
        t.wait_for("◆ ›")
        shown = t.ask("What should we do?", "nothing generated")
        t.ask("/decide", "✦ chat")
        t.ask("/quit", "bye")
        assert t.close() == 0

        [(_, _, _, body)] = srv.posts("/v1/systemone")
        [(_, _, _, chat_body)] = srv.posts("/v1/chat/completions")
    assert chat_body["messages"] == [{"role": "user", "content": "What about this PR?"}]
    assert chat_body["stream"] is True and chat_body["model"] == "fake-model"
    assert body["state"] == "User: What about this PR?\nAssistant: The PR has no tests."
    assert body["questions"] == {
        "decision": {
            "type": "choice",
            "instructions": "What should we do?",
            "criteria": {"merge": None, "request changes": None, "close": None},
        }
    }
    # Bars, most likely first, each label padded to the longest.
    rows = [ln.strip() for ln in shown.splitlines() if "%" in ln]
    assert rows == [
        "request changes  " + "█" * 24 + "░" * 2 + "   93.6%",
        "merge            " + "█" * 2 + "░" * 24 + "    6.4%",
        "close            " + "░" * 26 + "    0.0%",
    ]
    h = entropy_oracle([0.064, 0.936, 0.0])
    assert f"→ request changes  entropy {h:.3f}  (sure)" in shown
    assert "131 prompt tokens · 4 option tokens read · nothing generated" in shown
    assert re.search(r"  (\d+\.\d ms|\d+\.\d\ds) · 131 prompt tokens", shown)


def test_format_seconds():
    from gateway.cli.chat import format_seconds

    assert format_seconds(0.01234) == "12.3 ms"
    assert format_seconds(58.714) == "58.71s"


def test_completion_of_colon_decide_and_an_unsure_answer(term_factory):
    probs = {"yes": 0.5, "no": 0.3, "maybe": 0.2}
    with FakeServer(decide=lambda body: (200, choice_reply(probs, input_tokens=12, output_tokens=3))) as srv:
        t = term_factory("--attach", srv.url)
        t.wait_for("›")
        t.child.send(":d\t")
        t.wait_for(":decide")
        t.ask(" yes | no | maybe", "◆ ›")
        shown = t.ask("Is it raining?", "nothing generated")
        t.close()
        [(_, _, _, body)] = srv.posts("/v1/systemone")
    assert body["state"] == ""
    h = entropy_oracle([0.5, 0.3, 0.2])
    assert 0.8 < h  # 0.937: the seed's "does not know"
    assert f"→ yes  entropy {h:.3f}  (does not know)" in shown


def test_ctrl_c_cancels_a_request_and_the_client_stays(term_factory):
    release = threading.Event()
    calls = []

    def slow_then_fast(body):
        calls.append(body["questions"]["decision"]["instructions"])
        if len(calls) == 1:
            release.wait(30)
        return 200, choice_reply({"a": 0.9, "b": 0.1})

    with FakeServer(decide=slow_then_fast) as srv:
        t = term_factory("--attach", srv.url)
        t.wait_for("›")
        t.ask("/decide a | b", "◆ ›")
        t.ask("slow question", "scoring")
        while not calls:
            time.sleep(0.05)
        t.child.sendintr()
        t.wait_for("✗ cancelled")
        release.set()
        t.wait_for("◆ ›")
        shown = t.ask("fast question", "nothing generated")
        assert "→ a  entropy" in shown
        t.ask("/quit", "bye")
        assert t.close() == 0
        # The cancelled question did not join the conversation.
        bodies = [b for (_, _, _, b) in srv.posts("/v1/systemone")]
    assert calls == ["slow question", "fast question"]
    assert bodies[1]["state"] == ""


def test_ctrl_c_cancels_a_streamed_chat_reply(term_factory):
    with FakeServer(chat=lambda body: (200, ["first part", None, "never shown"])) as srv:
        t = term_factory("--attach", srv.url)
        t.wait_for("›")
        t.ask("tell me a long story", "first part")
        t.child.sendintr()
        t.wait_for("✗ cancelled; this turn is not kept")
        t.wait_for("›")
        srv.hold.set()
        t.ask("/quit", "bye")
        assert t.close() == 0
    assert "never shown" not in t.seen


def test_server_down_is_a_clear_line_not_a_traceback(term_factory):
    url = f"http://127.0.0.1:{free_port()}"
    t = term_factory("--attach", url)
    t.wait_for(f"✗ no server at {url} (connection refused); is `serveproto serve` running there?")
    t.line("/decide a | b")
    t.ask("anything", "✗ no server at")
    t.ask("hello", "✗ no server at")
    t.ask("/quit", "bye")
    assert t.close() == 0
    assert "Traceback" not in t.seen


def test_errors_from_the_server_are_one_line(term_factory):
    body422 = {
        "detail": [
            {"loc": ["body", "questions", "decision", "criteria"], "msg": "too many labels", "type": "value_error"}
        ]
    }
    with FakeServer(decide=lambda body: (422, body422), api_key="sekrit") as srv:
        t = term_factory("--attach", srv.url, "--api-key", "wrong")
        t.wait_for("›")
        t.line("/decide a | b")
        t.ask("q", "✗ HTTP 401: wrong or missing API key (pass --api-key or set SERVEPROTO_API_KEY)")
        t.close()
        t2 = term_factory("--attach", srv.url, "--api-key", "sekrit")
        t2.wait_for("›")
        t2.line("/decide a | b")
        t2.ask("q", "✗ HTTP 422: body.questions.decision.criteria: too many labels")
        t2.ask("/decide a | a", "✗ options: 'a' is given twice")
        t2.ask("/nonsense", "✗ unknown command /nonsense")
        t2.close()
    assert "Traceback" not in t.seen + t2.seen


def test_help_clear_and_ctrl_d(term_factory):
    with FakeServer(chat=lambda body: (200, ["ok"])) as srv:
        t = term_factory("--attach", srv.url.removeprefix("http://"))  # a bare host:port works too
        t.wait_for(f"attached to {srv.url}")
        t.wait_for("›")
        shown = t.ask("/help", "/exit")
        assert "/decide  System One: /decide a | b | c; alone, back to chat" in shown
        t.ask("first", "ok")
        t.ask("/clear", "✦ conversation cleared")
        t.ask("second", "ok")
        t.wait_for("›")
        t.child.sendeof()
        t.wait_for("bye")
        t.child.expect(pexpect.EOF, timeout=10)
        t.child.close()
        assert t.child.exitstatus == 0
        bodies = [b for (_, _, _, b) in srv.posts("/v1/chat/completions")]
    # After /clear the second turn goes alone.
    assert [b["messages"] for b in bodies] == [
        [{"role": "user", "content": "first"}],
        [{"role": "user", "content": "second"}],
    ]


def test_piped_input_runs_without_a_terminal():
    import subprocess

    probs = {"yes": 0.8, "no": 0.2}
    with FakeServer(decide=lambda body: (200, choice_reply(probs, input_tokens=7, output_tokens=2))) as srv:
        out = subprocess.run(
            [sys.executable, "-m", "gateway.cli", "chat", "--attach", srv.url],
            cwd=ROOT,
            input="/decide yes | no\nIs it on?\n",
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "COLUMNS": "100"},
        )
        [(_, _, _, body)] = srv.posts("/v1/systemone")
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    assert body["questions"]["decision"]["instructions"] == "Is it on?"
    lines = out.stdout.splitlines()
    assert "     yes  " + "█" * 21 + "░" * 5 + "   80.0%" in lines
    assert "     no   " + "█" * 5 + "░" * 21 + "   20.0%" in lines
    assert f"     → yes  entropy {entropy_oracle([0.8, 0.2]):.3f}  (unsure)" in lines  # 0.722
