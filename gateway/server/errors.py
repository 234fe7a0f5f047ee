"""What a handler raises, as the HTTP error the client sees: the one place the server maps errors.

:func:`http_error` takes the decision room's typed errors (:mod:`gateway.decision.errors`,
the request's validation), the engine's (:mod:`gateway.engine.errors`) and the routes'
own :class:`HTTPError`; every 422 body has Jev's shape (:func:`gateway.server.jev.protocol.validation_body`).
"""

from __future__ import annotations

from gateway.decision.errors import DecisionTimeout, UnusableDecision, UnusableScores
from gateway.decision.schema import JevValidationError
from gateway.engine.errors import EngineError, RequestError
from gateway.http import HTTPError
from gateway.server.jev.protocol import error_body, validation_body
from gateway.server.rerank.protocol import RerankInvalid

#: Seconds a client is told to wait when the engine is down or busy.
RETRY_AFTER = "1"


def http_error(exc: BaseException) -> HTTPError | None:
    """The HTTP error for what a handler raised, or None for anything else (a bug: the app answers
    500 with the request id and logs it).

    :class:`HTTPError` as it is; :class:`JevValidationError` (and the pipeline's
    :class:`gateway.decision.errors.Refused`) 422 with its ``detail`` list;
    :class:`DecisionTimeout` 503 ``overloaded_error`` + ``Retry-After``;
    :class:`UnusableScores` 502 and :class:`UnusableDecision` 500 ``api_error``; the
    engine's errors by :func:`engine_http_error`.
    """
    if isinstance(exc, HTTPError):
        return exc
    if isinstance(exc, RerankInvalid):  # /v1/rerank's 422 adds the ``message`` its clients print
        return HTTPError(422, "invalid_request_error", str(exc), body=exc.body())
    if isinstance(exc, JevValidationError):
        return HTTPError(422, "invalid_request_error", str(exc), body=error_body(exc))
    if isinstance(exc, DecisionTimeout):
        return HTTPError(503, "overloaded_error", str(exc), headers=[("retry-after", RETRY_AFTER)])
    if isinstance(exc, UnusableScores):
        return HTTPError(502, "api_error", str(exc))
    if isinstance(exc, UnusableDecision):
        return HTTPError(500, "api_error", str(exc))
    if isinstance(exc, (EngineError, RequestError)):
        return engine_http_error(exc)
    return None


def log_note(exc: BaseException, err: HTTPError) -> str:
    """The access log's ``error`` for ``exc`` answered as ``err``: ``"validation"`` for a 422 of
    :class:`JevValidationError`, ``"engine: ..."`` for an engine error, else its ``error_type``."""
    if isinstance(exc, JevValidationError):
        return "validation"
    if isinstance(exc, (EngineError, RequestError)):
        return f"engine: {exc}"[:300]
    return err.error_type


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
            return HTTPError(
                422,
                "invalid_request_error",
                reason,
                body=validation_body(detail, reason or "refused by the decision engine", ".".join(loc[1:])),
            )
        if code == "DECIDE_FAILED":
            return HTTPError(500, "api_error", f"the decision engine failed: {reason}")
        if code in ("SLOT_BUSY", "CANCELLED"):
            return HTTPError(503, "overloaded_error", f"engine: {code} {reason}".strip(), headers=retry)
        if code in ("BAD_REQUEST", "EMPTY_PROMPT", "NOT_SUPPORTED"):
            return HTTPError(400, "invalid_request_error", f"the engine refused the request: {code} {reason}".strip())
        return HTTPError(502, "api_error", f"engine error {code} {reason}".strip())
    return HTTPError(503, "overloaded_error", f"the engine is unavailable: {exc}", headers=retry)


def openai_error(message: str, param: str | None = None) -> HTTPError:
    """A 400 in OpenAI's error envelope, with Jev's ``detail`` beside it (each client reads its own): the
    OpenAI routes' refusals and ``/v1/decisions``'; ``param`` names the request's field (None: the body)."""
    return HTTPError(
        400,
        "invalid_request_error",
        message,
        body={
            "error": {"message": message, "type": "invalid_request_error", "param": param, "code": None},
            "detail": {"error_type": "invalid_request_error", "message": message},
        },
    )
