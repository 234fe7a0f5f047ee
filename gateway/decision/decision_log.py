"""The opt-in decision log (``serve --log-decisions FILE``); reading it back for ``calibrate`` is the
lab's (:mod:`gateway.lab.logged_answers`).

One JSON line per answered question with two or more options, appended as the
reply is sent::

    {"request_id": "req_...", "question_id": "intent", "type": "choice",
     "options": ["billing", "sales", "technical"],
     "probabilities": [0.2, 0.1, 0.7], "uncalibrated": [0.25, 0.15, 0.6],
     "config": {"model": "...", "model_sha256": "...", "x_debias": ["canonical", "content_free"],
                "normalize": "sum", "x_calibration": "identity"},
     "answer": null}

``options`` are in reply order: a choice's labels as sent, a noul's
``["no", "yes"]``, a score's levels ``[0, 1, ...]`` (their descriptions are not
logged); ``probabilities`` are the reported ones (calibrated when a calibration
applied), ``uncalibrated`` the same before calibration, the numbers
``calibrate`` fits on. Nothing else is written: no state, no question text, no
descriptions, no client address. To fit a calibration on one's own traffic, fill
``answer`` with the truth (a choice's label, ``true``/``false`` for a noul, a
score's level) on the lines one has judged and pass the file to ``serveproto
calibrate --data FILE``; lines left ``null`` are skipped.

A request's lines are written whole or not at all (:meth:`DecisionLog.write`): on a
full disk (``ENOSPC``, a short write) what was written of them is truncated away, so
the file only ever holds whole lines; the request is still answered (the decision is
not the log) unless the server was started with ``--log-decisions-required``, and
the lines lost are counted (``serveproto_decision_log_lines_lost_total``) and
warned about once a minute at most.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from gateway.decision.schema import Question

log = logging.getLogger("serveproto.decisions")

#: Seconds between two warnings about lost decision-log lines (the first loss is warned at once).
WARN_INTERVAL = 60.0

#: The write the log makes (``os.write``); a test replaces it to inject a short write or ``ENOSPC``.
_write = os.write

#: A decision-log line carries these keys; a labelled-request line (gateway.lab.evalset) does not.
KEYS = ("request_id", "question_id", "type", "options", "probabilities", "config")


def options_of(question: Question) -> list[Any]:
    """The logged options of ``question`` in reply order (see the module doc)."""
    if question.type == "noul":
        return ["no", "yes"]
    if question.type == "choice":
        return list(question.criteria)
    return list(range(len(question.criteria)))


def lines(
    request_id: str,
    questions: Sequence[Question],
    probs: Mapping[str, Sequence[float]],
    uncalibrated: Mapping[str, Sequence[float]],
    config: Mapping[str, Any],
    calibration: Mapping[str, str],
) -> bytes:
    """The log lines of one request, as bytes ending in a newline (``b""`` when no question has two options).

    ``probs``: reported probabilities by question id, reply order; ``uncalibrated``: the same
    before calibration (a question absent from it had none applied); ``config``: ``model``,
    ``model_sha256``, ``x_debias``, ``normalize``; ``calibration``: question id -> its
    ``x_calibration`` (absent: ``"identity"``).
    """
    out = []
    for q in questions:
        if q.n_options < 2:
            continue
        p = list(probs[q.id])
        out.append(
            orjson.dumps(
                {
                    "request_id": request_id,
                    "question_id": q.id,
                    "type": q.type,
                    "options": options_of(q),
                    "probabilities": p,
                    "uncalibrated": list(uncalibrated.get(q.id, p)),
                    "config": {**config, "x_calibration": calibration.get(q.id, "identity")},
                    "answer": None,
                },
                option=orjson.OPT_APPEND_NEWLINE,
            )
        )
    return b"".join(out)


class DecisionLog:
    """An append-only decision log file, opened for the server's life.

    ``path``: created when missing, appended to otherwise; raises ``OSError`` when it cannot be
    opened. Each request's lines go out in one ``write`` on an ``O_APPEND`` descriptor, so
    servers sharing one file never interleave a request's lines with another's, and a crash
    loses at most the request being written. ``required``: the server refuses (503) a request
    whose lines could not be written (``serve --log-decisions-required``) instead of answering
    it unlogged; the log itself only records the choice. ``clock``: seconds, monotonic (the
    warnings' pace). ``lost``: lines not written since the file was opened; ``last_error``:
    why the last write failed (``strerror``), or None.
    """

    def __init__(
        self, path: str | Path, *, required: bool = False, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = Path(path)
        self.required = required
        self.lost = 0
        self.last_error: str | None = None
        self._clock = clock
        self._warned_at: float | None = None
        self._unwarned = 0  # lines lost since the last warning
        self._failing = False
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def write(self, data: bytes) -> int:
        """Append ``data`` (whole lines from :func:`lines`) whole or not at all; never raises.

        Returns the number of lines lost: 0 when all were written, else all of ``data``'s
        lines. A short write (the disk filled mid-request) is truncated back to where this
        write began, the last whole line, so that a later line is never glued to half of
        this one; an ``OSError`` (``ENOSPC``, ``EDQUOT``, ``EFBIG``, ``EIO``) loses the lines
        the same way. Losses are counted in :attr:`lost` and logged as one warning a minute at
        most (:data:`WARN_INTERVAL`), and the first whole write after them is logged too.
        """
        if not data:
            return 0
        written = 0
        try:
            written = _write(self._fd, data)
            if written != len(data):
                raise OSError(errno.ENOSPC, f"short write ({written} of {len(data)} bytes)")
        except OSError as exc:
            return self._lose(data, written, exc)
        if self._failing:
            self._failing = False
            log.warning(
                "decision log %s: writing again; %d line(s) lost in all since it was opened", self.path, self.lost
            )
            self._unwarned = 0
        return 0

    def _lose(self, data: bytes, written: int, exc: OSError) -> int:
        """Undo a partial write of ``written`` bytes of ``data``, count and warn; returns the lines lost."""
        reason = exc.strerror or str(exc)
        if written > 0:
            try:
                end = os.lseek(self._fd, 0, os.SEEK_CUR)  # O_APPEND: just past the bytes written
                if os.fstat(self._fd).st_size == end:  # nobody appended after them
                    os.ftruncate(self._fd, end - written)
                else:
                    reason += f"; {written} bytes of a torn line left at offset {end - written}"
            except OSError as again:
                reason += f"; the torn line could not be truncated away ({again.strerror or again})"
        n = data.count(b"\n")
        self.lost += n
        self._unwarned += n
        self.last_error = reason
        self._failing = True
        now = self._clock()
        if self._warned_at is None or now - self._warned_at >= WARN_INTERVAL:
            log.warning(
                "decision log %s: %d line(s) not written (%s); %s (%d lost in all)",
                self.path,
                self._unwarned,
                reason,
                "their requests refused with 503 (--log-decisions-required)"
                if self.required
                else "their requests answered without them",
                self.lost,
            )
            self._warned_at, self._unwarned = now, 0
        return n

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
