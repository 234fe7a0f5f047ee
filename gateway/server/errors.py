"""The HTTP errors the server answers for an engine's failure, and the shape of every 422 body."""
from __future__ import annotations

from typing import Any

from gateway.engine.errors import EngineError, RequestError
from gateway.http import HTTPError

#: Seconds a client is told to wait when the engine is down or busy.
RETRY_AFTER = "1"


def engine_http_error(exc: EngineError | RequestError) -> HTTPError:
    """Map an engine failure to the HTTP error the client sees.

    ``RequestError`` by its code (spec section 7): ``DECIDE_INVALID
    <field>: <reason>`` 422 naming the field, ``DECIDE_FAILED`` 500,
    ``SLOT_BUSY`` / ``CANCELLED`` 503 + ``Retry-After``, ``BAD_REQUEST`` /
    ``EMPTY_PROMPT`` / ``NOT_SUPPORTED`` 400. Any ``EngineError`` (crashed,
    timed out, unavailable, failed to load) 503 + ``Retry-After``.
    """
    retry = [("retry-after", RETRY_AFTER)]
    if isinstance(exc, RequestError):
        code, reason = exc.code, exc.reason
        if code == "DECIDE_INVALID":
            field, _, why = reason.partition(": ")
            loc = ["body", *[p for p in field.split(".") if p]] if why else ["body"]
            detail = [{"loc": loc, "msg": why or reason or "refused by the decision engine", "type": "decide_invalid"}]
            return HTTPError(422, "invalid_request_error", reason,
                             body=validation_body(detail, reason or "refused by the decision engine", ".".join(loc[1:])))
        if code == "DECIDE_FAILED":
            return HTTPError(500, "api_error", f"the decision engine failed: {reason}")
        if code in ("SLOT_BUSY", "CANCELLED"):
            return HTTPError(503, "overloaded_error", f"engine: {code} {reason}".strip(), headers=retry)
        if code in ("BAD_REQUEST", "EMPTY_PROMPT", "NOT_SUPPORTED"):
            return HTTPError(400, "invalid_request_error", f"the engine refused the request: {code} {reason}".strip())
        return HTTPError(502, "api_error", f"engine error {code} {reason}".strip())
    return HTTPError(503, "overloaded_error", f"the engine is unavailable: {exc}", headers=retry)


def validation_body(detail: list[dict[str, Any]], message: str, param: str) -> dict[str, Any]:
    """Every 422 body: Jev's ``detail`` list (what the SDK reads) and an ``error`` envelope beside it,
    ``{"type": "invalid_request_error", "message", "param"}`` (``param``: the dotted field, ``""`` for
    the body as a whole), the same shape :meth:`JevValidationError.body` gives."""
    return {"detail": detail, "error": {"type": "invalid_request_error", "message": message, "param": param}}
