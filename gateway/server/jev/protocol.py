"""TypeSafe's Jev System One API on the wire: the 422 body, the answers and the reply of ``/v1/systemone``.

The request's side (the body validated into a
:class:`~gateway.decision.schema.SystemOneRequest`, or :class:`~gateway.decision.schema.JevValidationError`
listing every problem) is the decision room's question schema (:mod:`gateway.decision.schema`);
this module is what the server writes: :func:`validation_body` (the shape of every 422 the server
sends, Jev's ``detail`` list and an ``error`` envelope), :func:`error_body` (a validation error's
422 body), :func:`answer` and :func:`reply` (the 200 body; every field beyond Jev's is
``x_``-prefixed). See ``../shared/notes/jev-contract.md`` and the seed's "The HTTP endpoint".
"""

from __future__ import annotations

from typing import Any

from gateway.decision import scoring
from gateway.decision.schema import JevValidationError, Question


def validation_body(detail: list[dict[str, Any]], message: str, param: str) -> dict[str, Any]:
    """Every 422 body: Jev's ``detail`` list (what the SDK reads) and an ``error`` envelope beside it,
    ``{"type": "invalid_request_error", "message", "param"}`` (``param``: the dotted field, ``""`` for
    the body as a whole); every 422 the server sends has it, :func:`error_body` included."""
    return {"detail": detail, "error": {"type": "invalid_request_error", "message": message, "param": param}}


def error_body(exc: JevValidationError) -> dict[str, Any]:
    """The 422 body of a request that does not validate: Jev's ``detail`` list (``exc.errors``; the SDK
    reads it) and an ``error`` envelope beside it whose ``param`` is the first error's field (the error's own
    ``param`` where it has one: the batch route's ``items[3].state``)."""
    param = getattr(exc, "param", None)
    return validation_body(
        exc.errors, str(exc), param if isinstance(param, str) else ".".join(map(str, exc.errors[0]["loc"][1:]))
    )


def answer(question: Question, probabilities: list[float], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Jev answer of one question from its reported probabilities (options in reply order).

    ``probabilities``: ``(n_options,)`` as :func:`gateway.decision.scoring.decide` /
    :func:`gateway.decision.scoring.report` return them (noul: ``[p_no, p_yes]``).
    noul gets ``{"type", "noul"}`` only; choice ``choice`` (the argmax, first
    on ties), ``probabilities`` by label, ``confidence``; score ``score`` (the
    expected level), ``legend`` and ``probabilities`` keyed ``"0".."n-1"``,
    ``confidence``. ``extra`` fields (``x_``-prefixed) are added to choice
    and score answers.
    """
    p = probabilities
    if question.type == "noul":
        return {"type": "noul", "noul": scoring.r6(p[1])}
    if question.type == "choice":
        labels = list(question.criteria)
        best = max(range(len(p)), key=lambda i: (p[i], -i))
        out = {
            "type": "choice",
            "choice": labels[best],
            "probabilities": {label: p[i] for i, label in enumerate(labels)},
            "confidence": scoring.r6(scoring.confidence(p)),
        }
    else:
        out = {
            "type": "score",
            "score": scoring.r6(scoring.expected_level(p)),
            "legend": {str(i): level for i, level in enumerate(question.criteria)},
            "probabilities": {str(i): x for i, x in enumerate(p)},
            "confidence": scoring.r6(scoring.confidence(p)),
        }
    out["x_entropy"] = scoring.r6(scoring.entropy(p))
    if extra:
        out.update(extra)
    return out


def reply(
    model: str,
    answers: dict[str, dict[str, Any]],
    input_tokens: int,
    output_tokens: int,
    extra: dict[str, Any] | None = None,
    *,
    request_id: str | None = None,
) -> dict[str, Any]:
    """The 200 body: ``{"id"?, "model", "answers", "usage": {"input_tokens", "output_tokens"}}`` plus ``x_`` extras.

    ``request_id``: the body's ``id``, first as in the seed's reply (the ``x-typesafe-request-id``
    header's value; the SDK ignores the field). Token counts are ints (the SDK rejects floats).
    ``extra`` keys must start with ``x_`` (``ValueError`` otherwise).
    """
    body: dict[str, Any] = {} if request_id is None else {"id": request_id}
    body |= {
        "model": model,
        "answers": answers,
        "usage": {"input_tokens": int(input_tokens), "output_tokens": int(output_tokens)},
    }
    for k, v in (extra or {}).items():
        if not k.startswith("x_"):
            raise ValueError(f"extra reply field {k!r} is not x_-prefixed")
        body[k] = v
    return body
