"""``serveproto batch``'s files (gateway/cli/batch_io.py) and the server's answers while it loads
(gateway/server/starting.py), without a server: resume after a torn line, another input's output refused,
JSON paths, and the loading handler's three answers."""

from __future__ import annotations

import anyio
import orjson
import pytest

from gateway.cli import batch_io
from gateway.http import Request, Response
from gateway.server.starting import Starting


def test_resume_cuts_a_torn_last_line_and_counts_the_whole_ones(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_bytes(b'{"row":0,"reply":{}}\n{"row":1,"reply":{}}\n{"row":2,"rep')
    assert batch_io.resume(out, "jsonl") == 2
    assert out.read_bytes() == b'{"row":0,"reply":{}}\n{"row":1,"reply":{}}\n'  # the torn line is gone
    o = batch_io.Output(out, "jsonl", ["q"])
    o.write(2, {"answers": {}})
    o.close()
    assert batch_io.resume(out, "jsonl") == 3
    assert [orjson.loads(line)["row"] for line in out.read_bytes().splitlines()] == [0, 1, 2]


def test_resume_of_a_csv_skips_its_header(tmp_path):
    out = tmp_path / "out.csv"
    o = batch_io.Output(out, "csv", ["urgent", "team"])
    o.write(0, {"answers": {"urgent": {"type": "noul", "noul": 0.25}, "team": {"type": "choice", "choice": "it"}}})
    o.write(1, None, {"status": 422, "body": {"detail": []}})
    o.close()
    lines = out.read_text().splitlines()
    assert lines[0] == "row,urgent,team,error,reply"
    assert lines[1].startswith("0,0.25,it,,")
    assert lines[2].startswith('1,,,"{""status"":422')
    assert batch_io.resume(out, "csv") == 2
    batch_io.Output(out, "csv", ["urgent", "team"]).close()  # reopened: no second header
    assert out.read_text().count("row,urgent") == 1


def test_resume_refuses_another_inputs_output(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_bytes(b'{"row":0,"reply":{}}\n{"row":5,"reply":{}}\n')
    with pytest.raises(batch_io.BatchFileError, match="line 2 is row 5, not 1"):
        batch_io.resume(out, "jsonl")
    out.write_bytes(b"hello\n")
    with pytest.raises(batch_io.BatchFileError, match="line 1 is not a line serveproto batch writes"):
        batch_io.resume(out, "jsonl")
    assert batch_io.resume(tmp_path / "absent.jsonl", "jsonl") == 0


def test_json_path_and_the_missing_step():
    row = {"ticket": {"messages": [{"text": "a"}, {"text": "b"}]}}
    assert batch_io.json_path(row, "ticket.messages.1.text", "in.jsonl: row 3") == "b"
    with pytest.raises(batch_io.BatchFileError, match=r"in.jsonl: row 3: no '2' at 'ticket.messages.2.text'"):
        batch_io.json_path(row, "ticket.messages.2.text", "in.jsonl: row 3")
    assert batch_io.state_of({"text": "x"}, "csv", "text", "w") == "x"
    with pytest.raises(batch_io.BatchFileError, match=r"no column 'body' \(columns: text\)"):
        batch_io.state_of({"text": "x"}, "csv", "body", "w")


def test_the_loading_handler_then_the_app():
    async def main() -> list[Response]:
        gate = Starting()
        got = []
        for method, path in (("GET", "/health"), ("GET", "/ready"), ("POST", "/v1/systemone")):
            got.append(await gate(Request(method, path, [], b"", "req_0")))

        async def app(request: Request) -> Response:
            return Response.json({"app": request.path})

        gate.app = app
        got.append(await gate(Request("GET", "/ready", [], b"", "req_1")))
        return got

    health, ready, post, after = anyio.run(main)
    assert (health.status, orjson.loads(health.body)) == (200, {"status": "loading"})
    assert (ready.status, orjson.loads(ready.body), ("retry-after", "1") in ready.headers) == (
        503,
        {"status": "loading"},
        True,
    )
    assert post.status == 503 and orjson.loads(post.body)["detail"]["error_type"] == "overloaded_error"
    assert orjson.loads(after.body) == {"app": "/ready"}
