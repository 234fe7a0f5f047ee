"""A small router: exact paths, one handler per method; 404 and 405 as JSON."""

from __future__ import annotations

from gateway.http.message import HTTPError, Request
from gateway.http.server import Handler


class Router:
    """Maps ``(method, path)`` to a handler.

    ``route(path, method, handler)`` registers one; ``resolve(request)``
    returns ``(route_name, handler)`` and raises :class:`HTTPError` 404
    ``not_found_error`` for an unknown path or 405 ``method_not_allowed``
    (with ``Allow``) for a known path and another method. ``HEAD`` is served
    by the ``GET`` handler (the server drops the body).
    """

    def __init__(self) -> None:
        self._routes: dict[str, dict[str, Handler]] = {}

    def route(self, path: str, method: str, handler: Handler) -> None:
        methods = self._routes.setdefault(path, {})
        if method in methods:
            raise ValueError(f"{method} {path} is already routed")
        methods[method] = handler

    @property
    def paths(self) -> list[str]:
        return list(self._routes)

    def resolve(self, request: Request) -> tuple[str, Handler]:
        path = request.path
        if len(path) > 1 and path.endswith("/"):
            path = path.rstrip("/")
        methods = self._routes.get(path)
        if methods is None:
            raise HTTPError(404, "not_found_error", f"no route {request.method} {request.path}")
        method = "GET" if request.method == "HEAD" else request.method
        handler = methods.get(method)
        if handler is None:
            raise HTTPError(
                405,
                "method_not_allowed",
                f"{request.method} is not allowed on {path} (allowed: {', '.join(sorted(methods))})",
                headers=[("allow", ", ".join(sorted(methods)))],
            )
        return path, handler


__all__ = ["Router"]
