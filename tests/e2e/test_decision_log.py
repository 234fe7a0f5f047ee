"""The decision log (``serve --log-decisions``) and ``calibrate`` fitting on it once judged.

The lines are compared with the reply they log, field by field; the fit on a
judged log is compared with :func:`gateway.lab.calibration_fit.fit` on the same
answers (the oracle), and every refusal names the line and the field.
"""

from __future__ import annotations

import subprocess
import sys

import httpx2
import orjson
import pytest

from gateway.decision import calibration as cal
from gateway.decision.decision_log import DecisionLog
from gateway.lab import calibration_fit as calfit
from gateway.lab.logged_answers import DecisionLogError, read_answers
from support import SERVEPROTO
from test_calibration import _answers
from test_routes_support import TICKET, FakeEngine, make_app, running, serving

SHA = "ab" * 32


def _lines(path):
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


@pytest.mark.anyio
async def test_every_answer_is_logged_with_its_numbers_and_nothing_else(tmp_path):
    c = cal.load_document(calfit.document(calfit.fit(_answers(), k=5), "m", SHA, (), "x"))
    app = make_app(FakeEngine())
    log = tmp_path / "decisions.jsonl"
    app.decision_log, app.model_sha256 = DecisionLog(log), SHA
    async with running(app) as base:
        async with httpx2.AsyncClient(base_url=base) as client:
            plain = (await client.post("/v1/systemone", json=TICKET)).json()
            app.calibration = c
            calibrated = (await client.post("/v1/systemone", json=TICKET)).json()
            openai = (
                await client.post("/v1/decisions", json={"input": "x", "questions": [{"type": "predicate"}]})
            ).json()
    app.decision_log.close()
    lines = _lines(log)
    assert len(lines) == 3 + 3 + 1
    config = {"model": app.model.name, "model_sha256": SHA, "x_debias": [], "normalize": "sum"}
    for reply, block, ident in ((plain, lines[:3], None), (calibrated, lines[3:6], c.id)):
        for line, (qid, answer) in zip(block, reply["answers"].items()):
            q = TICKET["questions"][qid]
            served = (
                [1 - answer["noul"], answer["noul"]] if q["type"] == "noul" else list(answer["probabilities"].values())
            )
            options = (
                ["no", "yes"]
                if q["type"] == "noul"
                else list(q["criteria"])
                if q["type"] == "choice"
                else list(range(len(q["criteria"])))
            )
            assert line == {
                "request_id": reply["x_request_id"],
                "question_id": qid,
                "type": q["type"],
                "options": options,
                "probabilities": line["probabilities"],
                "uncalibrated": line["uncalibrated"],
                "config": {**config, "x_calibration": answer.get("x_calibration", "identity")},
                "answer": None,
            }
            assert line["probabilities"] == pytest.approx(served, abs=1e-6)  # a noul's reply is rounded to 1e-6
            if ident is None:
                assert line["uncalibrated"] == line["probabilities"]
    # the calibrated request logs the plain request's numbers as its uncalibrated ones
    assert [x["uncalibrated"] for x in lines[3:6]] == [x["probabilities"] for x in lines[:3]]
    assert [x["probabilities"] for x in lines[3:6]] != [x["probabilities"] for x in lines[:3]]
    assert lines[6]["request_id"] == openai["id"] and lines[6]["type"] == "noul"
    text = log.read_text()
    assert TICKET["state"][:20] not in text and "description" not in text


def _judged_log(path, answers, config):
    """A decision log of ``answers`` ((type, p, gold, request id)), judged: every line's answer filled."""
    with open(path, "wb") as f:
        for k, (qtype, p, gold, rid) in enumerate(answers):
            options = (
                ["no", "yes"]
                if qtype == "noul"
                else [f"l{i}" for i in range(len(p))]
                if qtype == "choice"
                else list(range(len(p)))
            )
            truth = [False, True][gold] if qtype == "noul" else options[gold]
            f.write(
                orjson.dumps(
                    {
                        "request_id": rid,
                        "question_id": f"q{k}",
                        "type": qtype,
                        "options": options,
                        "probabilities": p,
                        "uncalibrated": p,
                        "config": {**config, "x_calibration": "identity"},
                        "answer": truth,
                    }
                )
                + b"\n"
            )
            f.write(
                orjson.dumps(
                    {
                        "request_id": rid,
                        "question_id": f"u{k}",
                        "type": qtype,
                        "options": options,
                        "probabilities": p,
                        "config": config,
                        "answer": None,
                    }
                )
                + b"\n"
            )  # not judged


def test_read_answers_gives_fit_its_answers_back(tmp_path):
    answers = _answers(20)
    config = {"model": "m", "model_sha256": SHA, "x_debias": ["canonical"], "normalize": "sum"}
    _judged_log(tmp_path / "log", answers, config)
    got, conf = read_answers(tmp_path / "log")
    assert got == [(t, list(p), g, r) for t, p, g, r in answers]
    assert conf == config


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda e: {**e, "answer": "maybe"}, r"log:1: answer: a noul's answer is true or false"),
        (lambda e: {**e, "type": "box"}, r"log:1: type: expected one of noul, choice, score"),
        (lambda e: {k: v for k, v in e.items() if k != "options"}, r"log:1: not a decision-log line"),
        (lambda e: {**e, "uncalibrated": [0.5]}, r"log:1: uncalibrated: expected 2 probabilities"),
    ],
)
def test_read_answers_names_the_line_and_the_field(tmp_path, edit, message):
    entry = {
        "request_id": "r",
        "question_id": "q",
        "type": "noul",
        "options": ["no", "yes"],
        "probabilities": [0.4, 0.6],
        "uncalibrated": [0.4, 0.6],
        "config": {"model_sha256": SHA},
        "answer": True,
    }
    (tmp_path / "log").write_bytes(orjson.dumps(edit(entry)) + b"\n")
    with pytest.raises(DecisionLogError, match=message):
        read_answers(tmp_path / "log")


def test_read_answers_refuses_mixed_configs_and_an_unjudged_log(tmp_path):
    a = {"model_sha256": SHA, "x_debias": []}
    _judged_log(tmp_path / "log", _answers(2)[:1], a)
    _judged_log(tmp_path / "other", _answers(2)[:1], {**a, "x_debias": ["cyclic"]})
    (tmp_path / "mixed").write_bytes((tmp_path / "log").read_bytes() + (tmp_path / "other").read_bytes())
    with pytest.raises(DecisionLogError, match=r"mixed:3: config: .* one calibration fits one model and one x_debias"):
        read_answers(tmp_path / "mixed")
    (tmp_path / "none").write_bytes((tmp_path / "log").read_bytes().splitlines(keepends=True)[1])
    with pytest.raises(DecisionLogError, match="no line has an answer"):
        read_answers(tmp_path / "none")


def test_calibrate_fits_a_judged_log_without_a_model(tmp_path):
    answers = _answers(100)
    config = {"model": "m", "model_sha256": SHA, "x_debias": ["canonical", "content_free"], "normalize": "sum"}
    _judged_log(tmp_path / "log", answers, config)
    out = tmp_path / "cal.json"
    r = subprocess.run(
        [*SERVEPROTO, "calibrate", "--data", str(tmp_path / "log"), "--out", str(out), "--png", "none"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "300 judged answers from the decision log" in r.stdout
    doc = orjson.loads(out.read_bytes())
    want = calfit.document(
        calfit.fit(answers, k=5, seed=0), "m", SHA, config["x_debias"], f"decision log {tmp_path / 'log'}"
    )
    assert doc == orjson.loads(orjson.dumps(want))
    loaded = cal.load(out)
    assert loaded.model_sha256 == SHA and loaded.debias == ("canonical", "content_free")


def test_serve_refuses_a_log_it_cannot_open(tmp_path, fixture_engine):
    r = subprocess.run(
        [*SERVEPROTO, "serve", "--port", "0", "--log-decisions", str(tmp_path / "no" / "such" / "dir.jsonl")]
        + ["--engine", str(fixture_engine)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert r.stderr.strip().endswith(
        f"serveproto serve: --log-decisions: cannot open {tmp_path}/no/such/dir.jsonl: No such file or directory"
    )


@pytest.mark.anyio
async def test_serve_logs_to_the_file_it_is_given(tmp_path, fixture_engine):
    log = tmp_path / "d.jsonl"
    log.write_bytes(b'{"earlier": 1}\n')  # appended to, not truncated: an earlier line stays
    async with serving("--log-decisions", str(log), "--engine", str(fixture_engine)) as base:
        async with httpx2.AsyncClient(base_url=base) as client:
            reply = (await client.post("/v1/systemone", json=TICKET)).json()
    lines = log.read_bytes().splitlines()
    assert lines[0] == b'{"earlier": 1}'
    logged = [orjson.loads(x) for x in lines[1:]]
    assert [(x["request_id"], x["question_id"]) for x in logged] == [
        (reply["x_request_id"], q) for q in reply["answers"]
    ]
    assert logged[1]["probabilities"] == list(reply["answers"]["department"]["probabilities"].values())
    assert logged[0]["config"] == {
        "model": reply["model"],
        "model_sha256": None,
        "x_debias": [],
        "normalize": "sum",
        "x_calibration": "identity",
    }


# --- a full disk: a request's lines whole or not at all, answered all the same (issue 30, item 2) ---------


def _short_writes(monkeypatch, keep):
    """Make the log's writes write only ``keep(data)`` bytes (a full disk), or raise ``ENOSPC`` when it is 0."""
    import errno
    import os

    from gateway.decision import decision_log

    def write(fd, data):
        n = keep(data)
        if n == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.write(fd, data[:n])

    monkeypatch.setattr(decision_log, "_write", write)


def test_a_short_write_is_truncated_back_to_the_last_whole_line(tmp_path, monkeypatch, caplog):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"earlier": 1}\n')
    clock = [100.0]
    log = DecisionLog(path, clock=lambda: clock[0])
    three = b'{"a": 1}\n{"b": 2}\n{"c": 3}\n'
    _short_writes(monkeypatch, lambda data: len(data) // 2)  # a line and a half reach the disk
    with caplog.at_level("WARNING", logger="serveproto.decisions"):
        assert log.write(three) == 3
        assert path.read_bytes() == b'{"earlier": 1}\n'  # the half line is gone, and the whole one beside it
        clock[0] += 59.0
        _short_writes(monkeypatch, lambda data: 0)  # ENOSPC: nothing written
        assert log.write(b'{"d": 4}\n') == 1
        clock[0] += 1.0
        assert log.write(b'{"e": 5}\n{"f": 6}\n') == 2
        monkeypatch.undo()
        assert log.write(b'{"g": 7}\n') == 0
    log.close()
    assert path.read_bytes() == b'{"earlier": 1}\n{"g": 7}\n'  # never glued to a torn line
    assert (log.lost, log.last_error) == (6, "No space left on device")
    # one warning at once, none 59 s later, one at 60 s with the lines since, one when writing again
    assert [r.getMessage() for r in caplog.records] == [
        f"decision log {path}: 3 line(s) not written (short write (13 of 27 bytes)); "
        "their requests answered without them (3 lost in all)",
        f"decision log {path}: 3 line(s) not written (No space left on device); "
        "their requests answered without them (6 lost in all)",
        f"decision log {path}: writing again; 6 line(s) lost in all since it was opened",
    ]


def test_a_real_short_write_leaves_only_whole_lines(tmp_path):
    """The kernel's own short write (a file size limit, RLIMIT_FSIZE, as a full disk makes one), in a child."""
    script = f"""
import resource, signal
from gateway.decision.decision_log import DecisionLog
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of the signal
resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))
log = DecisionLog({str(tmp_path / "d.jsonl")!r})
print([log.write(b'{{"request": %d, "pad": "%s"}}\\n' % (i, b"x" * 10)) for i in range(4)], log.lost, log.last_error)
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    # each line is 36 bytes: two fit in 100; the third's first 28 are written (short) and truncated away,
    # so the fourth finds the file at 72 bytes again and goes the same way
    assert r.stdout.strip() == "[0, 0, 1, 1] 2 short write (28 of 36 bytes)"
    assert (tmp_path / "d.jsonl").read_bytes() == b"".join(
        b'{"request": %d, "pad": "xxxxxxxxxx"}\n' % i for i in range(2)
    )


@pytest.mark.anyio
async def test_a_full_disk_answers_all_the_same_and_counts_the_lines_lost(tmp_path, monkeypatch):
    app = make_app(FakeEngine())
    log = tmp_path / "decisions.jsonl"
    app.decision_log = DecisionLog(log)
    async with running(app) as base:
        async with httpx2.AsyncClient(base_url=base) as client:
            before = await client.post("/v1/systemone", json=TICKET)
            _short_writes(monkeypatch, lambda data: len(data) - 1)  # all but the last newline
            full = [await client.post("/v1/systemone", json=TICKET) for _ in range(2)]
            monkeypatch.undo()
            after = await client.post("/v1/systemone", json=TICKET)
            metrics = (await client.get("/metrics")).text
    app.decision_log.close()
    assert [r.status_code for r in (before, *full, after)] == [200, 200, 200, 200]
    for r in (*full, after):
        assert r.json()["answers"] == before.json()["answers"]
    assert "serveproto_decision_log_lines_lost_total 6.0" in metrics.splitlines()
    assert [x["request_id"] for x in _lines(log)] == [before.json()["x_request_id"]] * 3 + [
        after.json()["x_request_id"]
    ] * 3


@pytest.mark.anyio
async def test_a_required_log_refuses_with_503_naming_it(tmp_path, monkeypatch):
    app = make_app(FakeEngine())
    app.decision_log = DecisionLog(tmp_path / "decisions.jsonl", required=True)
    _short_writes(monkeypatch, lambda data: 0)
    async with running(app) as base:
        async with httpx2.AsyncClient(base_url=base) as client:
            r = await client.post("/v1/systemone", json=TICKET)
            d = await client.post("/v1/decisions", json={"input": "x", "questions": [{"type": "predicate"}]})
    app.decision_log.close()
    message = (
        "the decision log decisions.jsonl cannot be written (No space left on device); "
        "this server answers only what it logs (--log-decisions-required)"
    )
    assert (r.status_code, r.headers["retry-after"]) == (503, "1")
    assert r.json() == {"detail": {"error_type": "overloaded_error", "message": message}}
    assert d.status_code == 503 and d.json() == r.json()
    assert (tmp_path / "decisions.jsonl").read_bytes() == b""
    assert app.decision_log.lost == 4


def test_serve_refuses_a_required_log_it_does_not_have(fixture_engine):
    r = subprocess.run(
        [*SERVEPROTO, "serve", "--port", "0", "--log-decisions-required"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert r.stderr.strip() == "serveproto serve: --log-decisions-required: needs --log-decisions FILE"
