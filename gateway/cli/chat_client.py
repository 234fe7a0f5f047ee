"""The client side of ``serveproto chat --attach``: HTTP calls and the decision's reading.

Nothing here touches the terminal: :class:`Client` speaks to a running server
(``POST /v1/chat/completions`` streamed, ``POST /v1/systemone``), and the pure
helpers turn an answer into what the terminal shows (normalised entropy and its
reading, the seed's table in "Reading the answer"). :mod:`gateway.cli.chat`
draws it.
"""

from __future__ import annotations

import http.client
import json
import math
import socket
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

#: The question id used for the one ``choice`` a terminal question becomes.
QUESTION_ID = "decision"

#: Normalised-entropy thresholds of the seed's table: below 0.4 the model is
#: sure, 0.4 to 0.8 unsure, above 0.8 it does not know.
SURE_BELOW = 0.4
UNSURE_UP_TO = 0.8

#: A busy server (429, or 503 while the engine restarts) says when to come back
#: with ``Retry-After``; the client waits that long (at most MAX_RETRY_AFTER
#: seconds) and tries again, at most MAX_RETRIES times, as the Jev SDK does.
RETRY_STATUSES = (429, 503)
MAX_RETRIES = 2
MAX_RETRY_AFTER = 10.0


class ServerError(Exception):
    """The server answered, but not with a usable reply.

    ``status`` is the HTTP status (0 when the reply could not be read at all),
    ``message`` a one-line explanation taken from the error body when it has one.
    """

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status
        self.message = message


class ServerUnreachable(ServerError):
    """No server answered at the address (refused, unknown host, timed out)."""

    def __init__(self, message: str):
        super().__init__(0, message)


def parse_options(text: str) -> tuple[str, ...]:
    """Split ``"a | b | c"`` into the option labels ``("a", "b", "c")``.

    Labels are stripped of surrounding blanks and kept otherwise byte for byte.
    Raises ``ValueError`` naming the problem when fewer than two labels remain,
    a label is empty, or a label is given twice.
    """
    parts = [p.strip() for p in text.split("|")]
    if any(not p for p in parts) and len(parts) > 1:
        raise ValueError("options: an empty option between '|' separators")
    labels = tuple(p for p in parts if p)
    if len(labels) < 2:
        raise ValueError("options: give at least two, separated by '|' (e.g. /decide yes | no)")
    seen: set[str] = set()
    for label in labels:
        if label in seen:
            raise ValueError(f"options: {label!r} is given twice")
        seen.add(label)
    return labels


def normalised_entropy(probabilities: Sequence[float]) -> float:
    """Shannon entropy of ``probabilities`` divided by ``ln(n)``, in ``[0, 1]``.

    ``probabilities``: shape ``(n,)``, non-negative, summing to about 1 (a
    server rounds them to a few digits; they are renormalised here). ``n == 1``
    gives 0. Source: the seed's "Reading the answer" (entropy normalised to
    0..1 over the number of options). Raises ``ValueError`` for an empty
    sequence, a negative or non-finite value, or an all-zero sequence.
    """
    n = len(probabilities)
    if n == 0:
        raise ValueError("probabilities: empty")
    if any(not math.isfinite(p) or p < 0 for p in probabilities):
        raise ValueError("probabilities: every value must be finite and >= 0")
    total = math.fsum(probabilities)
    if total <= 0:
        raise ValueError("probabilities: all zero")
    if n == 1:
        return 0.0
    h = -math.fsum((p / total) * math.log(p / total) for p in probabilities if p > 0)
    return min(1.0, max(0.0, h / math.log(n)))


def entropy_reading(h: float) -> str:
    """The seed's reading of a normalised entropy ``h``: ``"sure"`` below 0.4,
    ``"unsure"`` from 0.4 to 0.8 (both included), ``"does not know"`` above 0.8."""
    if h < SURE_BELOW:
        return "sure"
    if h <= UNSURE_UP_TO:
        return "unsure"
    return "does not know"


def choice_request(state: str, question: str, options: Sequence[str], model: str | None = None) -> dict[str, Any]:
    """The ``POST /v1/systemone`` body asking ``question`` as one ``choice``.

    The labels are the ``criteria`` keys (descriptions null), in the given
    order; the options are never written into the state (seed: "Do not put the
    options in the state").
    """
    body: dict[str, Any] = {
        "state": state,
        "questions": {
            QUESTION_ID: {
                "type": "choice",
                "instructions": question,
                "criteria": {label: None for label in options},
            }
        },
    }
    if model:
        body["model"] = model
    return body


@dataclass(frozen=True)
class Decision:
    """One answered ``choice``, as the terminal shows it.

    ``options`` and ``probabilities`` have shape ``(n,)`` in the request's
    order; ``winner`` is the server's ``choice``; ``entropy`` is
    :func:`normalised_entropy` of the probabilities and ``reading`` its
    :func:`entropy_reading`; ``seconds`` is the wall time of the HTTP call;
    ``input_tokens`` / ``output_tokens`` are the reply's ``usage`` (prompt
    tokens, option tokens read).
    """

    options: tuple[str, ...]
    probabilities: tuple[float, ...]
    winner: str
    confidence: float | None
    entropy: float
    reading: str
    seconds: float
    input_tokens: int
    output_tokens: int
    model: str

    @classmethod
    def from_reply(cls, reply: dict[str, Any], options: Sequence[str], seconds: float) -> Decision:
        """Read a ``/v1/systemone`` reply body for the question :data:`QUESTION_ID`.

        Raises :class:`ServerError` (status 200) when the body lacks the
        answer, its ``probabilities`` miss a label, or ``choice`` is not a label.
        """
        try:
            answer = reply["answers"][QUESTION_ID]
            table = answer["probabilities"]
            probs = tuple(float(table[label]) for label in options)
            winner = answer["choice"]
            usage = reply.get("usage") or {}
        except (KeyError, TypeError, ValueError) as exc:
            raise ServerError(200, f"the reply has no usable answer ({exc!r})") from None
        if winner not in options:
            raise ServerError(200, f"the reply's choice {winner!r} is not one of the options")
        h = normalised_entropy(probs)
        conf = answer.get("confidence")
        return cls(
            options=tuple(options),
            probabilities=probs,
            winner=winner,
            confidence=float(conf) if isinstance(conf, (int, float)) else None,
            entropy=h,
            reading=entropy_reading(h),
            seconds=seconds,
            input_tokens=int(usage.get("input_tokens", 0)),
            output_tokens=int(usage.get("output_tokens", 0)),
            model=str(reply.get("model", "")),
        )


def error_message(status: int, raw: bytes) -> str:
    """One line out of an error body: Jev's ``detail`` (list of ``{loc, msg}`` or
    ``{error_type, message}``), an OpenAI ``error.message``, or the raw text."""
    try:
        body = json.loads(raw)
    except ValueError:
        text = raw.decode("utf-8", "replace").strip()
        return text[:200] or http.client.responses.get(status, "error")
    if isinstance(body, dict):
        detail = body.get("detail")
        if isinstance(detail, list) and detail and isinstance(detail[0], dict):
            parts = []
            for item in detail[:3]:
                loc = ".".join(str(x) for x in item.get("loc", []))
                parts.append(f"{loc}: {item.get('msg', '')}" if loc else str(item.get("msg", "")))
            return "; ".join(parts)
        if isinstance(detail, dict) and "message" in detail:
            return str(detail["message"])
        if isinstance(detail, str):
            return detail
        err = body.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if isinstance(err, str):
            return err
    return raw.decode("utf-8", "replace").strip()[:200]


class _Busy(Exception):
    """A 429/503 with a usable ``Retry-After``: ``error`` to raise if retries run out, ``delay`` in seconds."""

    def __init__(self, error: ServerError, delay: float):
        self.error = error
        self.delay = delay


def _retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header in its delta-seconds form; None when absent,
    an HTTP date, negative or above :data:`MAX_RETRY_AFTER`."""
    try:
        delay = float(value) if value is not None else None
    except ValueError:
        return None
    if delay is None or not 0 <= delay <= MAX_RETRY_AFTER:
        return None
    return delay


def _why(exc: BaseException) -> str:
    """A few words on why a connection failed."""
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, socket.gaierror):
        return "unknown host"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "timed out"
    return exc.strerror or exc.__class__.__name__ if isinstance(exc, OSError) else repr(exc)


class Client:
    """A blocking HTTP client of one running serveproto (or Jev-compatible) server.

    ``base_url`` like ``http://127.0.0.1:8000`` (a path prefix is kept);
    ``api_key`` is sent as ``Authorization: Bearer`` when given; ``timeout`` is
    the socket timeout in seconds for connecting and for each read. A call
    interrupted by ``KeyboardInterrupt`` closes its connection, which cancels
    the request on the server side.
    """

    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 600.0):
        url = urllib.parse.urlsplit(base_url if "://" in base_url else "http://" + base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"url: expected http://HOST[:PORT], got {base_url!r}")
        self.scheme = url.scheme
        self.host = url.hostname
        self.port = url.port
        self.prefix = url.path.rstrip("/")
        self.base_url = f"{url.scheme}://{url.netloc}{self.prefix}"
        self.api_key = api_key
        self.timeout = timeout

    # -- plumbing ---------------------------------------------------------
    def _connection(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.timeout)

    def _open(
        self, method: str, path: str, body: dict[str, Any] | None
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Send one request; return ``(connection, response)`` for a 2xx, else raise.

        A 429/503 carrying ``Retry-After`` (seconds, at most
        :data:`MAX_RETRY_AFTER`) is retried after that delay, :data:`MAX_RETRIES` times.
        """
        for attempt in range(MAX_RETRIES + 1):
            try:
                return self._open_once(method, path, body)
            except _Busy as busy:
                if attempt == MAX_RETRIES:
                    raise busy.error from None
                time.sleep(busy.delay)
        raise AssertionError("unreachable")

    def _open_once(
        self, method: str, path: str, body: dict[str, Any] | None
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        headers = {"Accept": "application/json, text/event-stream"}
        data = None
        if body is not None:
            data = json.dumps(body, ensure_ascii=False).encode("utf-8")
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        conn = self._connection()
        try:
            conn.request(method, self.prefix + path, body=data, headers=headers)
            resp = conn.getresponse()
        except OSError as exc:  # refused, unknown host, timed out, reset
            conn.close()
            raise ServerUnreachable(f"no server at {self.base_url} ({_why(exc)})") from None
        except http.client.HTTPException as exc:
            conn.close()
            raise ServerError(0, f"{self.base_url} broke the HTTP exchange ({exc!r})") from None
        except BaseException:
            conn.close()
            raise
        if not 200 <= resp.status < 300:
            try:
                raw = resp.read()
            finally:
                conn.close()
            error = ServerError(resp.status, error_message(resp.status, raw))
            delay = _retry_after(resp.getheader("Retry-After")) if resp.status in RETRY_STATUSES else None
            if delay is not None:
                raise _Busy(error, delay)
            raise error
        return conn, resp

    def _json(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        conn, resp = self._open(method, path, body)
        try:
            raw = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            raise ServerError(resp.status, f"the reply was cut ({exc!r})") from None
        finally:
            conn.close()
        try:
            reply: dict[str, Any] = json.loads(raw)
            return reply
        except ValueError:
            raise ServerError(resp.status, "the reply is not JSON") from None

    # -- routes -----------------------------------------------------------
    def model_ids(self) -> list[str]:
        """``GET /v1/models``: the served model ids (OpenAI ``data[].id``, else Jev ``models[].name``)."""
        body = self._json("GET", "/v1/models")
        ids = [m.get("id") for m in body.get("data", []) if isinstance(m, dict)]
        ids += [m.get("name") for m in body.get("models", []) if isinstance(m, dict)]
        return [i for i in ids if isinstance(i, str)]

    def chat_stream(
        self, messages: Sequence[dict[str, Any]], model: str | None = None, max_tokens: int | None = None
    ) -> Iterator[str]:
        """``POST /v1/chat/completions`` with ``stream: true``; yields text deltas as they arrive.

        Reads the SSE ``data: {...}`` lines up to ``data: [DONE]``. Raises
        :class:`ServerError` for a non-2xx reply, an ``error`` event or a cut stream.
        """
        body: dict[str, Any] = {"messages": list(messages), "stream": True}
        if model:
            body["model"] = model
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        conn, resp = self._open("POST", "/v1/chat/completions", body)
        try:
            ctype = resp.getheader("Content-Type", "")
            if "text/event-stream" not in ctype:
                # A server that ignored stream=true: one JSON body.
                reply = json.loads(resp.read())
                yield reply["choices"][0]["message"]["content"]
                return
            while True:
                line = resp.readline()
                if not line:
                    raise ServerError(resp.status, "the stream ended before [DONE]")
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    return
                event = json.loads(data)
                if "error" in event:
                    raise ServerError(resp.status, error_message(resp.status, data))
                for choice in event.get("choices", []):
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        yield text
        except (OSError, http.client.HTTPException) as exc:
            raise ServerError(resp.status, f"the stream was cut ({exc.__class__.__name__})") from None
        except (ValueError, KeyError, IndexError, TypeError):
            raise ServerError(resp.status, "the stream carried a malformed event") from None
        finally:
            conn.close()

    def decide(self, state: str, question: str, options: Sequence[str], model: str | None = None) -> Decision:
        """Ask ``question`` about ``state`` as one ``choice`` among ``options``.

        Returns a :class:`Decision` (``seconds`` measured around the HTTP call).
        Raises :class:`ServerUnreachable` or :class:`ServerError`.
        """
        t0 = time.monotonic()
        reply = self._json("POST", "/v1/systemone", choice_request(state, question, options, model))
        return Decision.from_reply(reply, options, time.monotonic() - t0)
