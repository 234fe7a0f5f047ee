"""``serveproto batch IN OUT --url URL``: a pile of states (JSONL or CSV) answered by a running server's
``POST /v1/systemone/batch``, written to OUT (JSONL or CSV) in the input's order, resumable.

Rows go in chunks (``--chunk``, one batch request each), ``--concurrency`` requests in flight; a 503 or
429 is retried after its ``Retry-After`` (at most :data:`MAX_RETRY_AFTER` s, ``--retries`` times), as is a
connection that fails; a chunk the server refuses (422: a bad row) is sent again row by row to
``/v1/systemone``, so each row gets its reply or its own error line. Killed at any point (SIGKILL
included) and started again with the same arguments, it skips the rows OUT holds and writes each row
once, whole (:mod:`gateway.cli.batch_io`). A progress line on stderr gives rows done, rows a second
and the time left.
"""

from __future__ import annotations

import argparse
import http.client
import math
import os
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import orjson

from gateway.cli import batch_io
from gateway.server.auth import API_KEY_ENV

#: The longest ``Retry-After`` honoured, in seconds (a longer one is waited this long).
MAX_RETRY_AFTER = 60.0
#: Statuses retried after ``Retry-After``: the server busy, loading or restarting its engine.
RETRY_STATUSES = (429, 503)
#: Seconds between progress lines at most.
PROGRESS_EVERY = 0.5


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "batch",
        help="answer a JSONL or CSV file of states with a running server, resumable",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("input", type=Path, metavar="IN", help="rows: JSONL (one object a line) or CSV (a header)")
    p.add_argument("output", type=Path, metavar="OUT", help="answers: JSONL or CSV; rows it holds are skipped")
    p.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument(
        "--questions",
        type=Path,
        default=None,
        help="a JSON file of the questions every row is asked (Jev's questions object); without it each JSONL "
        "row's own 'questions'",
    )
    p.add_argument(
        "--state",
        default="state",
        help="the state: a CSV column, or a JSONL row's JSON path (dotted: ticket.body, messages.0.text); "
        "default 'state'",
    )
    p.add_argument("--model", default=None, help="the served model to ask (default: the server's)")
    p.add_argument("--in-format", choices=("jsonl", "csv"), default=None, help="default: by IN's suffix")
    p.add_argument("--out-format", choices=("jsonl", "csv"), default=None, help="default: by OUT's suffix")
    p.add_argument("--concurrency", type=int, default=4, help="requests in flight (default 4)")
    p.add_argument("--chunk", type=int, default=32, help="rows a request (default 32; the server takes 1,000)")
    p.add_argument("--retries", type=int, default=8, help="tries again on 503/429 or a failed connection (default 8)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one request may take (default 600)")
    p.set_defaults(func=run)


class Server:
    """One HTTP/1.1 connection to the server (``http.client``, blocking: used from a worker thread),
    opened again after a failure."""

    def __init__(self, url: str, api_key: str | None, timeout: float) -> None:
        parts = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
        self.https = parts.scheme == "https"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.https else 80)
        self.prefix = parts.path.rstrip("/")
        self.headers = {"content-type": "application/json"}
        if api_key:
            self.headers["authorization"] = f"Bearer {api_key}"
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None

    def post(self, path: str, body: bytes) -> tuple[int, str | None, bytes]:
        """POST ``body``; ``(status, Retry-After header or None, body)``. Raises ``OSError`` /
        ``http.client.HTTPException`` when the connection fails (closed first)."""
        if self._conn is None:
            cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            self._conn = cls(self.host, self.port, timeout=self.timeout)
        try:
            self._conn.request("POST", self.prefix + path, body=body, headers=self.headers)
            resp = self._conn.getresponse()
            return resp.status, resp.getheader("retry-after"), resp.read()
        except (OSError, http.client.HTTPException):
            self._conn.close()
            self._conn = None
            raise


def retry_after(value: str | None) -> float:
    """Seconds to wait for a ``Retry-After`` value (delta-seconds; 1 when absent or not a number), at most
    :data:`MAX_RETRY_AFTER`."""
    try:
        seconds = float(value) if value is not None else 1.0
    except ValueError:
        seconds = 1.0
    return min(max(seconds, 0.0), MAX_RETRY_AFTER) if math.isfinite(seconds) else 1.0


class GaveUp(Exception):
    """The server stayed busy or unreachable past ``--retries``: the command stops, OUT keeps what it has."""


async def post(server: Server, path: str, payload: dict[str, Any], retries: int) -> tuple[int, Any]:
    """POST ``payload`` as JSON, trying again after a 503/429's ``Retry-After`` or a failed connection
    (1 s, doubling to :data:`MAX_RETRY_AFTER`), ``retries`` times; ``(status, decoded body)``. Raises
    :class:`GaveUp` past them."""
    body = orjson.dumps(payload)
    backoff = 1.0
    for attempt in range(retries + 1):
        try:
            status, after, raw = await anyio.to_thread.run_sync(server.post, path, body)
        except (OSError, http.client.HTTPException) as exc:  # TimeoutError is an OSError
            why = f"cannot reach {server.host}:{server.port} ({exc})"
            wait, backoff = backoff, min(backoff * 2, MAX_RETRY_AFTER)
        else:
            if status not in RETRY_STATUSES:
                try:
                    return status, orjson.loads(raw)
                except orjson.JSONDecodeError:
                    return status, {"raw": raw.decode("utf-8", "replace")[:500]}
            why, wait = f"HTTP {status}", retry_after(after)
        if attempt == retries:
            raise GaveUp(f"{path}: {why}, {retries} retries spent")
        await anyio.sleep(wait)
    raise AssertionError("unreachable")


class Progress:
    """The stderr line ``done/total rows, rate rows/s, ETA``, redrawn at most every :data:`PROGRESS_EVERY` s."""

    def __init__(self, done: int, total: int) -> None:
        self.start_done, self.done, self.total = done, done, total
        self.t0 = self.shown = time.monotonic()
        self.tty = sys.stderr.isatty()

    def add(self, n: int, *, final: bool = False) -> None:
        self.done += n
        now = time.monotonic()
        if not final and now - self.shown < PROGRESS_EVERY:
            return
        self.shown = now
        rate = (self.done - self.start_done) / max(now - self.t0, 1e-9)
        left = (self.total - self.done) / rate if rate > 0 else float("inf")
        eta = time.strftime("%H:%M:%S", time.gmtime(left)) if math.isfinite(left) and left < 86400 * 365 else "?"
        line = f"serveproto batch: {self.done}/{self.total} rows, {rate:.1f} rows/s, ETA {eta}"
        sys.stderr.write(("\r" + line + ("\n" if final else "")) if self.tty else line + "\n")
        sys.stderr.flush()


async def answer_all(args: argparse.Namespace, rows: list[dict[str, Any]], shared: dict[str, Any] | None) -> int:
    """Answer ``rows`` (each a ``/v1/systemone`` item) from OUT's resume point on; the rows written."""
    out_fmt = batch_io.file_format(args.output, args.out_format)
    done = batch_io.resume(args.output, out_fmt)
    if done > len(rows):
        raise batch_io.BatchFileError(f"{args.output} holds {done} rows, {args.input} has {len(rows)}")
    qids = list(shared["questions"]) if shared else list(rows[0]["questions"]) if rows else []
    output = batch_io.Output(args.output, out_fmt, qids)
    chunks = [(i, rows[i : i + args.chunk]) for i in range(done, len(rows), args.chunk)]
    results: dict[int, list[tuple[dict[str, Any] | None, dict[str, Any] | None]]] = {}
    progress = Progress(done, len(rows))
    window = anyio.Semaphore(2 * args.concurrency)  # chunks answered but not yet written, at most
    state = {"next": 0, "write": 0}
    api_key = os.environ.get(API_KEY_ENV)

    def write_ready() -> None:
        while state["write"] in results:
            k = state["write"]
            start, _ = chunks[k]
            for j, (reply, error) in enumerate(results.pop(k)):
                output.write(start + j, reply, error)
            progress.add(len(chunks[k][1]))
            state["write"] += 1
            window.release()

    async def answer_chunk(server: Server, items: list[dict[str, Any]]) -> list[tuple[Any, Any]]:
        body: dict[str, Any] = {**(shared or {}), "items": items}
        status, reply = await post(server, "/v1/systemone/batch", body, args.retries)
        if status == 200 and isinstance(reply, dict) and len(reply.get("items", ())) == len(items):
            return [(r, None) for r in reply["items"]]
        out = []  # a refused chunk (a bad row): each row on its own, its own reply or error
        for item in items:
            status, one = await post(server, "/v1/systemone", {**(shared or {}), **item}, args.retries)
            out.append((one, None) if status == 200 else (None, {"status": status, "body": one}))
        return out

    gave_up: list[GaveUp] = []

    async def worker(tg: anyio.abc.TaskGroup) -> None:
        server = Server(args.url, api_key, args.timeout)
        while True:
            await window.acquire()
            k = state["next"]
            if k >= len(chunks):
                window.release()
                return
            state["next"] += 1
            try:
                results[k] = await answer_chunk(server, chunks[k][1])
            except GaveUp as exc:  # the others stop too; what is written stays
                gave_up.append(exc)
                tg.cancel_scope.cancel()
                return
            write_ready()

    try:
        async with anyio.create_task_group() as tg:
            for _ in range(max(1, args.concurrency)):
                tg.start_soon(worker, tg)
    finally:
        output.close()
        progress.add(0, final=True)
    if gave_up:
        raise gave_up[0]
    return progress.done - done


def load(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The rows as batch items (``{"state"}``, or ``{"state", "questions"}`` without ``--questions``) and the
    fields every item shares (``questions``, ``model``), or None. Raises :class:`batch_io.BatchFileError`."""
    in_fmt = batch_io.file_format(args.input, args.in_format)
    shared: dict[str, Any] = {}
    if args.questions is not None:
        try:
            questions = orjson.loads(args.questions.read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            raise batch_io.BatchFileError(f"--questions {args.questions}: {exc}") from None
        if not isinstance(questions, dict):
            raise batch_io.BatchFileError(f"--questions {args.questions}: a JSON object of questions by id")
        shared["questions"] = questions
    if args.model:
        shared["model"] = args.model
    items = []
    for n, row in enumerate(batch_io.read_rows(args.input, in_fmt)):
        where = f"{args.input}: row {n}"
        item = {"state": batch_io.state_of(row, in_fmt, args.state, where)}
        if "questions" not in shared:
            if in_fmt == "csv" or not isinstance(row.get("questions"), dict):
                raise batch_io.BatchFileError(f"{where}: no questions: pass --questions FILE")
            item["questions"] = row["questions"]
        items.append(item)
    return items, shared or None


def run(args: argparse.Namespace) -> int:
    if args.concurrency < 1 or not 1 <= args.chunk <= 1000 or args.retries < 0:
        print("serveproto batch: --concurrency >= 1, --chunk 1 to 1000, --retries >= 0", file=sys.stderr)
        return 2
    try:
        rows, shared = load(args)
        written = anyio.run(answer_all, args, rows, shared)
    except batch_io.BatchFileError as exc:
        print(f"serveproto batch: {exc}", file=sys.stderr)
        return 2
    except GaveUp as exc:
        print(f"serveproto batch: giving up: {exc}; run it again to go on from {args.output}", file=sys.stderr)
        return 1
    print(f"serveproto batch: {written} rows written to {args.output}", file=sys.stderr)
    return 0
