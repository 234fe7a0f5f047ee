"""The request and response values the HTTP server hands to and takes from a handler.

A handler is ``async def handler(request: Request) -> Response``. Errors a
handler wants the client to see are raised as :class:`HTTPError`; anything
else becomes a 500 with the request id.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs

import attrs
import orjson

#: Header names travel lower-cased, values as bytes (h11's convention).
Headers = tuple[tuple[bytes, bytes], ...]


@attrs.frozen
class Request:
    """One HTTP request, its body read and decoded.

    ``body`` is the entity after ``Content-Encoding`` decoding (bytes);
    ``target`` the raw request target; ``path`` and ``query`` its two halves
    (``query`` as ``parse_qs`` gives it). ``request_id`` is the id the server
    assigned (``req_`` + 24 hex digits), also sent back in
    ``x-typesafe-request-id``.
    """

    method: str
    target: str
    headers: Headers
    body: bytes
    request_id: str
    http_version: str = "1.1"
    client: str = ""

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    @property
    def query(self) -> dict[str, list[str]]:
        _, _, q = self.target.partition("?")
        return parse_qs(q, keep_blank_values=True)

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (case-insensitive), latin-1 decoded, or None."""
        key = name.lower().encode("ascii")
        for k, v in self.headers:
            if k == key:
                return v.decode("latin-1")
        return None


@attrs.define
class Response:
    """A response: ``status`` (int), ``headers`` as ``(name, value)`` str pairs, and a body.

    ``body`` is bytes (sent with ``Content-Length``) or an async iterator of
    bytes (sent chunked, e.g. server-sent events); the server closes the
    iterator (``aclose``) when the client goes away mid-stream.
    """

    status: int = 200
    headers: list[tuple[str, str]] = attrs.field(factory=list)
    body: bytes | AsyncIterator[bytes] = b""

    @classmethod
    def json(cls, value: Any, status: int = 200, headers: list[tuple[str, str]] | None = None) -> Response:
        """A JSON response serialised with orjson (non-finite floats are an error upstream)."""
        h = [("content-type", "application/json")]
        h.extend(headers or [])
        return cls(status, h, orjson.dumps(value))

    @classmethod
    def text(cls, value: str | bytes, status: int = 200, content_type: str = "text/plain; charset=utf-8") -> Response:
        body = value.encode() if isinstance(value, str) else value
        return cls(status, [("content-type", content_type)], body)


class HTTPError(Exception):
    """An error the client sees as ``status`` with a JSON body.

    By default the body is ``{"detail": {"error_type", "message"}}``, the shape
    TypeSafe's clients parse; ``body`` overrides it (e.g. a 422 ``detail``
    list). ``headers`` are added to the response (e.g. ``Retry-After``).
    """

    def __init__(
        self,
        status: int,
        error_type: str,
        message: str,
        *,
        body: Any = None,
        headers: list[tuple[str, str]] | None = None,
    ) -> None:
        super().__init__(f"{status} {error_type}: {message}")
        self.status = status
        self.error_type = error_type
        self.message = message
        self.body = body if body is not None else {"detail": {"error_type": error_type, "message": message}}
        self.headers = list(headers or [])

    def response(self) -> Response:
        return Response.json(self.body, self.status, self.headers)
