"""API-key check: ``Authorization: Bearer <key>``, compared in constant time.

With no key configured every request passes (the SDKs always send some bearer
token). With a key, a missing, malformed or wrong one is a 401
``authentication_error``.
"""

from __future__ import annotations

import hmac
import os

from gateway.http import HTTPError, Request

#: The environment variable holding the server's key.
API_KEY_ENV = "SERVEPROTO_API_KEY"


def key_from_env() -> str | None:
    """``$SERVEPROTO_API_KEY``, or None when unset or empty."""
    return os.environ.get(API_KEY_ENV) or None


def check(request: Request, api_key: str | None) -> None:
    """Raise :class:`HTTPError` 401 unless ``request`` carries ``api_key`` as its bearer token.

    ``hmac.compare_digest`` compares the UTF-8 bytes in time independent of
    where they first differ.
    """
    if not api_key:
        return
    header = request.header("authorization") or ""
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise HTTPError(
            401,
            "authentication_error",
            "missing API key: send 'Authorization: Bearer <key>'",
            headers=[("www-authenticate", "Bearer")],
        )
    if not hmac.compare_digest(token.strip().encode("utf-8"), api_key.encode("utf-8")):
        raise HTTPError(401, "authentication_error", "invalid API key", headers=[("www-authenticate", "Bearer")])
