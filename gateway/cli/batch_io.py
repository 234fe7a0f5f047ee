"""The files of ``serveproto batch``: rows read from JSONL or CSV, their states found by a column or a JSON
path, answers written as JSONL or CSV lines, and what an output already holds (resume).

An output line is one row's, written whole by one ``write`` on a file opened for appending, in the rows'
order: a run killed at any point leaves whole lines (at worst a torn last one, which :func:`resume` cuts
off), and the count of whole lines is the count of rows done. Every line carries its row's number
(``row``, 0-based, header excluded), so a resumed run checks that the output is this input's.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson


class BatchFileError(Exception):
    """An input or output the command cannot use; the message names the file, the row and the field."""


def file_format(path: Path, given: str | None) -> str:
    """``jsonl`` or ``csv``: ``given`` when set, else by the file's suffix (``.csv``; ``.jsonl``, ``.ndjson``,
    ``.json``). Raises :class:`BatchFileError` for another suffix."""
    if given:
        return given
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "csv"
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    raise BatchFileError(f"{path}: cannot tell JSONL from CSV by its name: say --in-format / --out-format")


def json_path(value: Any, path: str, where: str) -> Any:
    """The value at dotted ``path`` in ``value`` (``ticket.body``; a number indexes a list: ``messages.0``).
    Raises :class:`BatchFileError` naming ``where`` and the first step that is missing."""
    node = value
    for step in path.split("."):
        if isinstance(node, dict) and step in node:
            node = node[step]
        elif isinstance(node, list) and step.isdigit() and int(step) < len(node):
            node = node[int(step)]
        else:
            raise BatchFileError(f"{where}: no {step!r} at {path!r}")
    return node


def read_rows(path: Path, fmt: str) -> Iterator[dict[str, Any]]:
    """The rows of ``path``: each JSONL line's object, or each CSV record by its header's names. Blank
    JSONL lines are skipped. Raises :class:`BatchFileError` for a line that is not a JSON object."""
    if fmt == "csv":
        with path.open(newline="", encoding="utf-8") as f:
            yield from csv.DictReader(f)
        return
    with path.open("rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise BatchFileError(f"{path}:{n}: not JSON ({exc})") from None
            if not isinstance(row, dict):
                raise BatchFileError(f"{path}:{n}: a line should be a JSON object")
            yield row


def state_of(row: dict[str, Any], fmt: str, field: str, where: str) -> Any:
    """A row's state: CSV, the column ``field``; JSONL, the JSON path ``field``. Raises
    :class:`BatchFileError` when it is missing."""
    if fmt == "csv":
        if field not in row:
            raise BatchFileError(f"{where}: no column {field!r} (columns: {', '.join(row)})")
        return row[field]
    return json_path(row, field, where)


def answer_value(answer: dict[str, Any]) -> Any:
    """An answer's one value for a CSV cell: noul its probability of yes, choice its label, score its level."""
    return answer.get(answer.get("type", ""), "")


class Output:
    """The output file, appended to one whole line at a time (:meth:`write`). ``fmt``: ``jsonl`` lines
    ``{"row", "reply"}`` or ``{"row", "error"}``; ``csv`` records ``row``, one column per question (its
    :func:`answer_value`), ``error`` and ``reply`` (the whole reply as JSON), under a header. No line
    holds a newline of its own (JSON is written compact), so lines are records."""

    def __init__(self, path: Path, fmt: str, question_ids: list[str]) -> None:
        self.path = path
        self.fmt = fmt
        self.columns = ["row", *question_ids, "error", "reply"]
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if fmt == "csv" and os.fstat(self._fd).st_size == 0:
            self._put(self._csv_line(self.columns))

    def _csv_line(self, cells: list[Any]) -> bytes:
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerow(cells)
        return buf.getvalue().encode()

    def _put(self, data: bytes) -> None:
        view = memoryview(data)
        while view:  # one write for a line, in practice; a short write goes on where it stopped
            view = view[os.write(self._fd, view) :]

    def write(self, row: int, reply: dict[str, Any] | None, error: dict[str, Any] | None = None) -> None:
        """Append row ``row``'s line: its reply, or the server's ``error`` (status and body) for it."""
        if self.fmt == "jsonl":
            record = {"row": row, "reply": reply} if reply is not None else {"row": row, "error": error}
            self._put(orjson.dumps(record) + b"\n")
            return
        answers = (reply or {}).get("answers", {})
        cells = [row, *(answer_value(answers.get(q, {})) for q in self.columns[1:-2])]
        cells += [
            orjson.dumps(error).decode() if error is not None else "",
            orjson.dumps(reply).decode() if reply else "",
        ]
        self._put(self._csv_line(cells))

    def close(self) -> None:
        os.close(self._fd)


def resume(path: Path, fmt: str) -> int:
    """Rows an earlier run wrote to ``path`` (0 when it does not exist): its whole lines (less a CSV
    header), after cutting off a torn last line. Raises :class:`BatchFileError` when a line is not one this
    command writes or the rows are not 0, 1, 2... in order (another input's output)."""
    if not path.exists():
        return 0
    data = path.read_bytes()
    whole = data.rfind(b"\n") + 1
    if whole < len(data):
        with path.open("r+b") as f:  # a line cut by a kill: written again
            f.truncate(whole)
    lines = data[:whole].splitlines()
    if fmt == "csv":
        lines = lines[1:]
    for n, line in enumerate(lines):
        try:
            row = orjson.loads(line)["row"] if fmt == "jsonl" else int(next(csv.reader([line.decode()]))[0])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, StopIteration, IndexError):
            raise BatchFileError(f"{path}: line {n + 1} is not a line serveproto batch writes") from None
        if row != n:
            raise BatchFileError(f"{path}: line {n + 1} is row {row}, not {n}: is it this input's output?")
    return len(lines)
