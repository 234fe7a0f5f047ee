"""What a server answers while its engines load, then the app itself: the handler ``serve`` listens with.

``serve`` binds its port first and answers from then on, so that a fleet's scheduler can tell a
replica that is loading from one that is gone (a Kubernetes readiness probe, a balancer's health
check): :class:`Starting` answers ``GET /health`` 200 ``{"status": "loading"}`` (the process is alive),
``GET /ready`` 503 ``{"status": "loading"}`` + ``Retry-After`` (it serves nothing yet) and every other
request 503 + ``Retry-After``, until :attr:`Starting.app` is set: from then on every request goes to the
app (:class:`gateway.server.app.App`, whose ``/ready`` is 200 while every model has an engine that serves).
"""

from __future__ import annotations

from gateway.http import HTTPError, Request, Response
from gateway.http.server import Handler
from gateway.server.errors import RETRY_AFTER

#: The readiness route: 503 until every engine of every model has loaded, then as ``/health`` is.
READY_PATH = "/ready"


class Starting:
    """The server's handler from its bind on: answers for the engines that load, then delegates to ``app``.

    ``app``: None while loading; ``serve`` sets it once every engine of every model has loaded (its
    handshake read) and the app is built. ``screen`` is the app's once it is set (auth before a body).
    """

    def __init__(self) -> None:
        self.app: Handler | None = None

    def screen(self, request: Request) -> Response | None:
        """The app's look at a request's head once it is set (``gateway.server.app.App.screen``); None before."""
        screen = getattr(self.app, "screen", None)
        return screen(request) if screen is not None else None

    async def __call__(self, request: Request) -> Response:
        if self.app is not None:
            return await self.app(request)
        retry = [("retry-after", RETRY_AFTER)]
        if request.method == "GET" and request.path == "/health":
            return Response.json({"status": "loading"})
        if request.method == "GET" and request.path == READY_PATH:
            return Response.json({"status": "loading"}, 503, retry)
        message = "the server is loading its engines: retry shortly (GET /ready says when)"
        return HTTPError(503, "overloaded_error", message, headers=retry).response()
