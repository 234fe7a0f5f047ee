"""The HTTP/1.1 server (h11 + anyio): messages, body decoding, router, server."""

from gateway.http.message import HTTPError, Request, Response
from gateway.http.router import Router
from gateway.http.server import HTTPServer, Limits, PortInUse, access_line, new_request_id

__all__ = [
    "HTTPError",
    "HTTPServer",
    "Limits",
    "PortInUse",
    "Request",
    "Response",
    "Router",
    "access_line",
    "new_request_id",
]
