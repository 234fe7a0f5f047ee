"""The System One page (gateway/server/static) in real headless Chromium, against a fake server.

The fake server (tests/e2e/test_chat_client.py) serves the static files at ``/``
and answers ``/v1/systemone`` and ``/v1/chat/completions`` with replies chosen
here; the page is driven with selenium and Debian's chromium + chromedriver.
Set ``SERVEPROTO_PAGE_SCREENSHOT=path.png`` to keep a screenshot of the first test.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time

import pytest

from test_chat_client import FakeServer, choice_reply, entropy_oracle

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
CHROME_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--window-size=1280,1000",
)

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')")
if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
    pytest.skip(
        "chromium and chromedriver are not installed (apt-get install -y chromium chromium-driver)",
        allow_module_level=True,
    )

from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


def start_browser():
    """A headless Chromium with a fresh profile; returns ``(driver, profile_dir)``."""
    profile = tempfile.mkdtemp(prefix="serveproto-chromium-")
    opts = webdriver.ChromeOptions()
    for flag in CHROME_FLAGS:
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={profile}")
    opts.binary_location = CHROMIUM
    return webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER)), profile


@pytest.fixture(scope="module")
def browser():
    driver, profile = start_browser()
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def wait(driver, cond, timeout=20):
    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(lambda d: cond(d))


def ask(driver, question, options):
    driver.find_element(By.ID, "q-text").send_keys(question)
    driver.find_element(By.ID, "q-options").send_keys(options + "\n")


def card(driver, n):
    """The n-th question card (1-based)."""
    return driver.find_element(By.CSS_SELECTOR, f"#questions > li.question:nth-child({n})")


def answered(driver, n):
    els = driver.find_elements(By.CSS_SELECTOR, f"#questions > li.question:nth-child({n})[data-winner]")
    return els[0] if els and "running" not in els[0].get_attribute("class") else None


def bars(el):
    """``[(label, pct_text, data_p, fill_width_style)]`` of a card, in the options' order."""
    labels = [e.text for e in el.find_elements(By.CSS_SELECTOR, ".bar-label")]
    pcts = [e.text for e in el.find_elements(By.CSS_SELECTOR, ".bar-pct")]
    ps = [float(e.get_attribute("data-p")) for e in el.find_elements(By.CSS_SELECTOR, ".bar-pct")]
    widths = [e.get_attribute("style") for e in el.find_elements(By.CSS_SELECTOR, ".bar-fill")]
    return list(zip(labels, pcts, ps, widths))


TICKET = (
    "Hi, I have been trying to connect my Stripe account for 3 days and the integration keeps failing. "
    "I am losing sales. Please help ASAP."
)


def fresh(driver, url):
    driver.get("about:blank")
    driver.get(url + "/")
    driver.execute_script("localStorage.clear()")
    driver.get(url + "/")
    wait(driver, lambda d: d.find_element(By.ID, "questions"))


def test_a_question_gets_bars_winner_and_entropy(browser):
    probs = {"billing": 0.059806, "technical": 0.939983, "sales": 0.000211}
    with FakeServer(decide=lambda body: (200, choice_reply(probs, input_tokens=86, output_tokens=3, qid="q"))) as srv:
        fresh(browser, srv.url)
        browser.find_element(By.ID, "doc").send_keys(TICKET)
        ask(browser, "Which team should handle this?", "billing | technical | sales")
        el = wait(browser, lambda d: answered(d, 1))
        shot = os.environ.get("SERVEPROTO_PAGE_SCREENSHOT")
        if shot:
            time.sleep(0.6)  # let the bars' 0.35 s width transition finish before the picture
            browser.save_screenshot(shot)
        [(_, _, headers, body)] = srv.posts("/v1/systemone")
    assert body == {
        "state": TICKET,
        "questions": {
            "q": {
                "type": "choice",
                "instructions": "Which team should handle this?",
                "criteria": {"billing": None, "technical": None, "sales": None},
            }
        },
    }
    assert "Authorization" not in headers
    assert bars(el) == [
        ("billing", "6.0%", 0.059806, "display: block; width: 5.98%;"),
        ("technical", "94.0%", 0.939983, "display: block; width: 94%;"),
        ("sales", "0.0%", 0.000211, "display: block; width: 0.02%;"),
    ]
    h = entropy_oracle(list(probs.values()))
    assert el.find_element(By.CSS_SELECTOR, ".winner").text == f"→ technical entropy {h:.3f} sure"
    assert float(el.get_attribute("data-entropy")) == pytest.approx(h, abs=1e-6)
    assert [e.text for e in el.find_elements(By.CSS_SELECTOR, ".bar-row.win.bar-label")] == ["technical"]
    assert el.find_element(By.CSS_SELECTOR, ".meta").text.endswith("s · 86 prompt tokens · 3 option tokens read")
    assert browser.find_element(By.ID, "doc-info").text == f"{len(TICKET)} characters"


def test_an_edited_document_marks_answers_stale_until_asked_again(browser):
    with FakeServer(decide=lambda body: (200, choice_reply({"yes": 0.7, "no": 0.3}, qid="q"))) as srv:
        fresh(browser, srv.url)
        browser.find_element(By.ID, "doc").send_keys("Version one.")
        ask(browser, "Ship it?", "yes | no")
        el = wait(browser, lambda d: answered(d, 1))
        assert "stale" not in el.get_attribute("class")
        browser.find_element(By.ID, "doc").send_keys(" Version two.")
        assert "stale" in el.get_attribute("class")
        browser.find_element(By.ID, "ask-all").click()
        wait(browser, lambda d: len(srv.posts("/v1/systemone")) == 2 and answered(d, 1))
        assert "stale" not in el.get_attribute("class")
        states = [b["state"] for (_, _, _, b) in srv.posts("/v1/systemone")]
    assert states == ["Version one.", "Version one. Version two."]


def test_questions_accumulate_and_keep_running_while_chatting(browser):
    release = threading.Event()

    def decide(body):
        q = body["questions"]["q"]
        labels = list(q["criteria"])
        if q["instructions"] == "How risky is this?":
            release.wait(30)  # a slow run: the page must stay usable meanwhile
            return 200, choice_reply(dict(zip(labels, [0.2, 0.3, 0.5])), qid="q")
        return 200, choice_reply(dict(zip(labels, [0.45, 0.55])), qid="q")

    with FakeServer(decide=decide, chat=lambda body: (200, ["It is ", "a payment ", "ticket."])) as srv:
        fresh(browser, srv.url)
        browser.find_element(By.ID, "doc").send_keys("Refund request for order 1234.")
        ask(browser, "How risky is this?", "low | medium | high")
        ask(browser, "Do we sign?", "yes | no")
        # The second question is answered while the first still runs.
        second = wait(browser, lambda d: answered(d, 2))
        assert "running" in card(browser, 1).get_attribute("class")
        assert card(browser, 1).find_element(By.CSS_SELECTOR, ".q-status").text == "scoring…"
        # Chat meanwhile.
        browser.find_element(By.ID, "chat-input").send_keys("What is this about?\n")
        wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#chat-log .msg.assistant:not(.streaming)"))
        chat_texts = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#chat-log .msg")]
        release.set()
        first = wait(browser, lambda d: answered(d, 1))
        [(_, _, _, chat_body)] = srv.posts("/v1/chat/completions")
    assert chat_texts == ["What is this about?", "It is a payment ticket."]
    assert chat_body["stream"] is True and chat_body["max_tokens"] == 256
    assert chat_body["messages"] == [
        {"role": "system", "content": "The user is looking at this document:\n\nRefund request for order 1234."},
        {"role": "user", "content": "What is this about?"},
    ]
    assert [b[:2] for b in bars(first)] == [("low", "20.0%"), ("medium", "30.0%"), ("high", "50.0%")]
    assert [b[:2] for b in bars(second)] == [("yes", "45.0%"), ("no", "55.0%")]
    h1, h2 = entropy_oracle([0.2, 0.3, 0.5]), entropy_oracle([0.45, 0.55])
    assert first.find_element(By.CSS_SELECTOR, ".winner").text == f"→ high entropy {h1:.3f} does not know"
    assert second.find_element(By.CSS_SELECTOR, ".winner").text == f"→ no entropy {h2:.3f} does not know"
    assert browser.find_element(By.ID, "q-count").text == "(2)"


def test_ask_errors_and_the_api_key(browser):
    with FakeServer(decide=lambda body: (200, choice_reply({"yes": 0.9, "no": 0.1}, qid="q")), api_key="s3cret") as srv:
        fresh(browser, srv.url)
        ask(browser, "Is it urgent?", "yes")
        err = browser.find_element(By.ID, "ask-error")
        assert err.text == "options: give at least two, separated by '|' (e.g. yes | no)"
        browser.find_element(By.ID, "q-options").clear()
        browser.find_element(By.ID, "q-options").send_keys("yes | no\n")
        el = wait(browser, lambda d: "failed" in card(d, 1).get_attribute("class") and card(d, 1))
        assert el.find_element(By.CSS_SELECTOR, ".q-error").text == (
            "HTTP 401: wrong or missing API key (set the API key at the top right)"
        )
        key = browser.find_element(By.ID, "api-key")
        key.send_keys("s3cret")
        el.find_element(By.CSS_SELECTOR, ".q-again").click()
        el = wait(browser, lambda d: answered(d, 1))
        assert [b[:2] for b in bars(el)] == [("yes", "90.0%"), ("no", "10.0%")]
        headers = srv.posts("/v1/systemone")[-1][2]
    assert headers["Authorization"] == "Bearer s3cret"


def test_a_422_shows_the_field(browser):
    body422 = {"detail": [{"loc": ["body", "questions", "q", "criteria"], "msg": "too many labels", "type": "x"}]}
    with FakeServer(decide=lambda body: (422, body422)) as srv:
        fresh(browser, srv.url)
        ask(browser, "q?", "a | b")
        el = wait(browser, lambda d: "failed" in card(d, 1).get_attribute("class") and card(d, 1))
        assert (
            el.find_element(By.CSS_SELECTOR, ".q-error").text == "HTTP 422: body.questions.q.criteria: too many labels"
        )


def test_plain_text_files_load_and_pdf_or_word_are_refused(browser, tmp_path):
    notes = tmp_path / "notes.md"
    text = "# Notes\n\nThe build is red since Monday. Ünïcode kept.\n"
    notes.write_text(text, encoding="utf-8")
    fake_pdf = tmp_path / "report.pdf"
    fake_pdf.write_bytes(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj\n")
    disguised = tmp_path / "letter.txt"
    disguised.write_bytes(b"PK\x03\x04\x14\x00\x06\x00word/document.xml")
    docx = tmp_path / "letter.docx"
    docx.write_bytes(b"PK\x03\x04")
    binary = tmp_path / "blob.csv"
    binary.write_bytes(b"a,b\n\xff\xfe\x00\x01")
    with FakeServer() as srv:
        fresh(browser, srv.url)
        upload = browser.find_element(By.ID, "doc-file")
        doc = browser.find_element(By.ID, "doc")
        error = browser.find_element(By.ID, "doc-error")

        upload.send_keys(str(notes))
        wait(browser, lambda d: doc.get_attribute("value"))
        assert doc.get_attribute("value") == "# Notes\n\nThe build is red since Monday. Ünïcode kept.\n"
        assert browser.find_element(By.ID, "doc-info").text == f"{len(text)} characters · notes.md"
        assert not error.is_displayed()

        refusals = {}
        for f in (fake_pdf, docx, disguised, binary):
            upload.send_keys(str(f))
            wait(browser, lambda d: error.is_displayed() and f.name in error.text)  # noqa: B023  (called within the same iteration)
            refusals[f.name] = error.text
            # The document is left as it was.
            assert doc.get_attribute("value") == "# Notes\n\nThe build is red since Monday. Ünïcode kept.\n"
    assert refusals == {
        "report.pdf": "report.pdf: PDF files are not supported; paste the text or save it as plain text (.txt, .md).",
        "letter.docx": "letter.docx: Word files are not supported; paste the text or save it as plain text (.txt, .md).",
        "letter.txt": "letter.txt: this is an office document (Word or similar), not plain text; it is not supported.",
        "blob.csv": "blob.csv: not UTF-8 text; only plain-text files can be loaded.",
    }


def test_a_busy_server_is_retried_after_retry_after(browser):
    calls = []
    busy = {"detail": {"error_type": "overloaded_error", "message": "the engine is restarting"}}

    def decide(body):
        calls.append(1)
        if len(calls) == 1:
            return 503, busy, {"Retry-After": "1"}
        return 200, choice_reply({"yes": 0.6, "no": 0.4}, qid="q")

    with FakeServer(decide=decide) as srv:
        fresh(browser, srv.url)
        ask(browser, "Ready?", "yes | no")
        status = card(browser, 1).find_element(By.CSS_SELECTOR, ".q-status")
        wait(browser, lambda d: status.text == "server busy, retrying in 1 s…")
        el = wait(browser, lambda d: answered(d, 1))
        assert [b[:2] for b in bars(el)] == [("yes", "60.0%"), ("no", "40.0%")]
        assert len(srv.posts("/v1/systemone")) == 2


def test_stop_cancels_a_chat_reply_and_drops_the_turn(browser):
    replies = iter([["half a reply", None, " never shown"], ["second answer"]])
    with FakeServer(chat=lambda body: (200, next(replies))) as srv:
        fresh(browser, srv.url)
        browser.find_element(By.ID, "chat-input").send_keys("first question\n")
        wait(browser, lambda d: "half a reply" in d.find_element(By.CSS_SELECTOR, "#chat-log .msg.assistant").text)
        browser.find_element(By.ID, "chat-stop").click()
        msg = wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#chat-log .msg.assistant.error"))[0]
        assert msg.text == "half a reply\nstopped; this turn is not kept"
        assert not browser.find_element(By.ID, "chat-stop").is_displayed()
        srv.hold.set()
        browser.find_element(By.ID, "chat-input").send_keys("second question\n")
        wait(browser, lambda d: "second answer" in d.find_element(By.CSS_SELECTOR, "#chat-log li:last-child").text)
        bodies = [b for (_, _, _, b) in srv.posts("/v1/chat/completions")]
    # The stopped turn is not part of the conversation sent next.
    assert [m["content"] for m in bodies[1]["messages"]] == ["second question"]
