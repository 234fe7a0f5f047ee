"""Serving ``POST /v1/systemone`` (TypeSafe's Jev) and ``POST /v1/decisions`` (OpenAI's Decisions API shape).

Each request is parse -> decide -> reply: the body is parsed into a
:class:`~gateway.decision.schema.SystemOneRequest` (:func:`gateway.decision.schema.parse_request`,
or :func:`parse_decisions` for the OpenAI shape), answered by the decision pipeline
(:func:`gateway.server.deciding.decide`, with the app's engine, settings and memory),
and written in the route's reply shape (:mod:`gateway.server.jev.protocol` for Jev's). What
the pipeline raises is mapped to HTTP by :mod:`gateway.server.errors` (``/v1/decisions`` gives
a refusal OpenAI's envelope).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import attrs

from gateway.decision import batch, pictures, schema, scoring
from gateway.decision.calibration import IDENTITY
from gateway.decision.errors import Refused
from gateway.decision.pipeline import Decided
from gateway.decision.prompts import as_text
from gateway.decision.schema import JevValidationError, SystemOneRequest
from gateway.http import Request, Response
from gateway.server import deciding
from gateway.server.body import parse_json, parse_json_bytes
from gateway.server.errors import openai_error
from gateway.server.jev import protocol
from gateway.server.routing import HEADER as ROUTE_HEADER
from gateway.server.routing import routing_key

if TYPE_CHECKING:
    from gateway.server.app import App
    from gateway.server.fleet import Backend


def _refuse_multipart(request: Request) -> None:
    """A multipart body is the official SDK's way of sending image assets (its JSON in the part named
    ``request``, each picture a part of its own): refused as ``assets`` are, naming the field
    (422, :data:`gateway.decision.schema.NOT_IMPLEMENTED`), before anything of it is read."""
    if (request.header("content-type") or "").lower().startswith("multipart/"):
        raise JevValidationError(
            [
                {
                    "loc": ["body", "assets"],
                    "msg": f"{schema.NOT_IMPLEMENTED}image assets need a vision model (serve --mmproj), and this "
                    "server reads no images: a multipart body (the SDK's Image assets) is not read; send the request "
                    "as JSON without assets",
                    "type": "not_implemented",
                }
            ]
        )


def _body_and_parts(app: App, request: Request) -> tuple[Any, dict[str, bytes], bool]:
    """A ``/v1/systemone`` body, the parts of a multipart one by name, and whether its model reads
    pictures (:meth:`App.reads_pictures`). A multipart body (the SDK's ``Image`` assets) is read only
    where a served model reads pictures, else refused as before (:func:`_refuse_multipart`), as is one
    whose model does not."""
    ctype = request.header("content-type") or ""
    if not ctype.lower().startswith("multipart/"):
        body = parse_json(request)
        return body, {}, app.reads_pictures(body.get("model") if isinstance(body, dict) else None)
    if not any(app.reads_pictures(name) for name in app.served):
        _refuse_multipart(request)
    split = pictures.multipart_body(ctype, request.body)
    if split is None:
        raise JevValidationError(
            [
                {
                    "loc": ["body"],
                    "msg": "A multipart body needs a part named 'request' holding the JSON request",
                    "type": "value_error",
                }
            ]
        )
    body = parse_json_bytes(split[0])
    if not app.reads_pictures(body.get("model") if isinstance(body, dict) else None):
        _refuse_multipart(request)
    return body, split[1], True


async def systemone(app: App, request: Request) -> Response:
    body, parts, vision = _body_and_parts(app, request)
    parsed = schema.parse_request(body, strict=app.config.strict, vision=vision, parts=parts)
    key = routing_key(parsed.state, parsed.prefix)
    here = app.backend(parsed.model, key)  # the model named (else the default), by state affinity then load
    body, decided = await answer_one(here, parsed, request.request_id)
    return Response.json(body, headers=deciding.headers(decided) + [(ROUTE_HEADER, key)])


async def answer_one(here: Backend, parsed: SystemOneRequest, request_id: str) -> tuple[dict[str, Any], Decided]:
    """One parsed ``/v1/systemone`` request answered on ``here`` and logged: its 200 body (the reply's
    ``id`` and ``x_request_id`` are ``request_id``) and the pipeline's :class:`Decided`. The single route
    and each item of the batch route (:func:`systemone_batch`) are answered here. Raises what
    :func:`gateway.server.deciding.decide` raises."""
    decided = await deciding.decide(here, parsed)
    deciding.log_decisions(here, request_id, parsed, decided)
    extra = {"x_request_id": request_id, **deciding.extras(parsed, decided)}
    answers = deciding.answers(parsed, decided)
    body = protocol.reply(
        here.model.name, answers, decided.input_tokens, decided.output_tokens, extra, request_id=request_id
    )
    return body, decided


async def systemone_batch(app: App, request: Request) -> Response:
    """``POST /v1/systemone/batch``: many states in one request (:func:`gateway.decision.batch.parse_batch`),
    ``{"items": [<the single route's reply of each item>, ...]}`` in the items' order.

    Every item is validated, and checked against its engine's context, before any is answered (one 422
    naming ``items[i]...`` for each problem). Each item is routed as a single request on its state
    (its own engine, by state affinity) and answered by :func:`answer_one`, its ``id`` the batch's
    request id + ``-<i>``. The items of all batches an engine answers hold at most
    :meth:`gateway.server.lanes.Lanes.capacity` of its slots at once, so single requests keep one.
    An engine failure fails the whole batch (its error, e.g. 503 + ``Retry-After``): no partial reply.
    """
    _refuse_multipart(request)
    items = batch.parse_batch(parse_json(request), strict=app.config.strict)
    routed = [(parsed, app.backend(parsed.model, routing_key(parsed.state, parsed.prefix))) for parsed in items]
    refused = []
    for i, (parsed, here) in enumerate(routed):
        over = deciding.over_context(here, parsed)
        if over is not None:
            refused.append(batch.item_error(i, over))
    if refused:
        raise batch.BatchInvalid(refused)
    replies: list[dict[str, Any] | None] = [None] * len(routed)
    failed: list[tuple[int, Exception]] = []

    async def one(i: int, parsed: SystemOneRequest, here: Backend, tg: anyio.abc.TaskGroup) -> None:
        try:
            async with here.lanes.lane(here.caps.slots):
                replies[i], _ = await answer_one(here, parsed, f"{request.request_id}-{i}")
        except Exception as exc:
            failed.append((i, exc))
            tg.cancel_scope.cancel()

    async with anyio.create_task_group() as tg:
        for i, (parsed, here) in enumerate(routed):
            tg.start_soon(one, i, parsed, here, tg)
    if failed:
        i, exc = min(failed, key=lambda f: f[0])
        if isinstance(exc, JevValidationError):  # the engine's refusal of one item, named as that item
            raise batch.BatchInvalid([batch.item_error(i, e) for e in exc.errors]) from None
        raise exc
    return Response.json({"items": replies})


# --- OpenAI's Decisions API shape -------------------------------------------------------------

_OPENAI_TYPES = {"predicate": "noul", "choice": "choice", "score": "score"}
#: The fields a ``/v1/decisions`` body reads, at each level; any other is an unknown field (``x_warnings``, or
#: under ``serve --strict`` a 400 naming it), as on ``/v1/systemone`` (:data:`gateway.decision.schema.TOP_FIELDS`).
DECISIONS_FIELDS = ("model", "input", "questions", "x_debias", "x_head", "x_reader")
DECISIONS_QUESTION_FIELDS = ("type", "name", "question", "instructions", "choices", "levels")
DECISIONS_CHOICE_FIELDS = ("value", "description")
DECISIONS_LEVEL_FIELDS = ("label", "description")


def _decisions_unknown(body: dict[str, Any]) -> list[str]:
    """The parameter of each field of a ``/v1/decisions`` body that it does not read
    (``questions[1].choices[0].valeu``): the body's own first, then each question's (its own fields
    before its choices' or levels'), in key order."""
    out = [k for k in body if k not in DECISIONS_FIELDS]
    for i, q in enumerate(body["questions"]):
        out += [f"questions[{i}].{k}" for k in q if k not in DECISIONS_QUESTION_FIELDS]
        for name, known in (("choices", DECISIONS_CHOICE_FIELDS), ("levels", DECISIONS_LEVEL_FIELDS)):
            items = q.get(name) if q.get("type") == ("choice" if name == "choices" else "score") else None
            for j, item in enumerate(items or ()):
                out += [f"questions[{i}].{name}[{j}].{k}" for k in item if k not in known]
    return out


def parse_decisions(body: Any, *, strict: bool = False) -> tuple[SystemOneRequest, list[dict[str, Any]]]:
    """Read a ``/v1/decisions`` body into the equivalent System One request.

    ``{"model"?, "input", "questions": [{"type": "predicate"|"choice"|"score", "name"?,
    "question"|"instructions"?, "choices": [{"value", "description"?}], "levels":
    [{"label", "description"?}]}]}``. Returns the request (question ids are the
    positions ``"0".."n-1"``; its ``unknown`` the parameter of each field the body sent that
    this route does not read, :func:`_decisions_unknown`, so its ``warnings`` read
    ``"questions[0].choices[1].valeu: unknown field"``) and the questions as sent. Raises
    :class:`HTTPError` 400 in OpenAI's error envelope, naming the parameter; ``strict``
    (``serve --strict``) refuses the first unknown field so, after the other checks.
    """
    if not isinstance(body, dict):
        raise openai_error("the body must be a JSON object", "")
    if "input" not in body:
        raise openai_error("'input' is required", "input")
    qs = body.get("questions")
    if not isinstance(qs, list) or not 1 <= len(qs) <= schema.MAX_QUESTIONS:
        raise openai_error(f"'questions' must be an array of 1 to {schema.MAX_QUESTIONS} questions", "questions")
    converted: dict[str, Any] = {}
    for i, q in enumerate(qs):
        param = f"questions[{i}]"
        if not isinstance(q, dict) or q.get("type") not in _OPENAI_TYPES:
            raise openai_error(f"{param}.type must be 'predicate', 'choice' or 'score'", f"{param}.type")
        text = q.get("question", q.get("instructions"))
        jq: dict[str, Any] = {"type": _OPENAI_TYPES[q["type"]]}
        if text is not None:
            jq["instructions"] = text
        if q["type"] == "choice":
            choices = q.get("choices")
            if not isinstance(choices, list) or not choices:
                raise openai_error(f"{param}.choices must be a non-empty array", f"{param}.choices")
            crit = {}
            for j, c in enumerate(choices):
                if not isinstance(c, dict) or not isinstance(c.get("value"), str) or not c["value"]:
                    raise openai_error(
                        f"{param}.choices[{j}].value must be a non-empty string", f"{param}.choices[{j}].value"
                    )
                if c["value"] in crit:
                    raise openai_error(
                        f"{param}.choices[{j}].value repeats {c['value']!r}", f"{param}.choices[{j}].value"
                    )
                crit[c["value"]] = c.get("description")
            jq["criteria"] = crit
        elif q["type"] == "score":
            levels = q.get("levels")
            if not isinstance(levels, list) or not levels:
                raise openai_error(f"{param}.levels must be a non-empty array", f"{param}.levels")
            crit_l = []
            for j, lv in enumerate(levels):
                if not isinstance(lv, dict) or not isinstance(lv.get("label"), str):
                    raise openai_error(f"{param}.levels[{j}].label must be a string", f"{param}.levels[{j}].label")
                desc = lv.get("description")
                crit_l.append(f"{lv['label']}: {as_text(desc)}" if desc else lv["label"])
            jq["criteria"] = crit_l
        converted[str(i)] = jq
    try:
        extension = {k: body[k] for k in ("x_debias", "x_head", "x_reader") if k in body}
        parsed = schema.parse_request(
            {"state": body["input"], "questions": converted, "model": body.get("model"), **extension}
        )
    except JevValidationError as exc:
        e = exc.errors[0]
        raise openai_error(e["msg"], _openai_param(e["loc"], qs)) from None
    unknown = _decisions_unknown(body)
    if strict and unknown:
        raise openai_error(f"'{unknown[0]}': unknown field (this server refuses them: serve --strict)", unknown[0])
    return attrs.evolve(parsed, unknown=tuple((u,) for u in unknown)), qs


def _openai_param(loc: list[Any], sent: list[dict[str, Any]]) -> str:
    """The ``/v1/decisions`` parameter of a System One field path (``["body", "questions", "1",
    "criteria", "sales"]`` is ``questions[1].choices[2].value``; ``state`` is ``input``)."""
    path = list(loc[1:])
    if path[:1] == ["state"]:
        return "input"
    if path[:1] != ["questions"] or len(path) < 2 or not str(path[1]).isdigit() or int(path[1]) >= len(sent):
        return ".".join(map(str, path))
    i = int(path[1])
    param, rest, q = f"questions[{i}]", path[2:], sent[int(path[1])]
    if rest[:1] == ["criteria"]:
        if q.get("type") == "choice":
            values = [c.get("value") for c in q.get("choices", [])]
            return (
                f"{param}.choices[{values.index(rest[1])}].value"
                if len(rest) > 1 and rest[1] in values
                else f"{param}.choices"
            )
        if q.get("type") == "score":
            return f"{param}.levels[{rest[1]}]" if len(rest) > 1 else f"{param}.levels"
        return param
    return ".".join([param, *map(str, rest)])


async def decisions(app: App, request: Request) -> Response:
    parsed, sent = parse_decisions(parse_json(request), strict=app.config.strict)
    key = routing_key(parsed.state, parsed.prefix)
    here = app.backend(parsed.model, key)
    try:
        decided = await deciding.decide(here, parsed)
    except Refused as exc:  # what the engine refused, in this route's envelope
        e = exc.errors[0]
        raise openai_error(e["msg"], _openai_param(e["loc"], sent)) from None
    deciding.log_decisions(here, request.request_id, parsed, decided)
    answers = []
    for q, raw in zip(parsed.questions, sent):
        p = decided.probs[q.id]
        a: dict[str, Any] = {"type": raw["type"]}
        if raw.get("name") is not None:
            a["name"] = raw["name"]
        if q.type == "noul":
            a["probability"] = scoring.r6(p[1])
        elif q.type == "choice":
            labels = list(q.criteria)
            best = max(range(len(p)), key=lambda i: (p[i], -i))
            a.update(
                choice=labels[best],
                probabilities=[{"value": v, "probability": p[i]} for i, v in enumerate(labels)],
                confidence=scoring.r6(scoring.confidence(p)),
            )
        else:
            a.update(
                score=scoring.r6(scoring.expected_level(p)),
                probabilities=[
                    {"value": i, "label": lv["label"], "probability": p[i]} for i, lv in enumerate(raw["levels"])
                ],
                confidence=scoring.r6(scoring.confidence(p)),
            )
        a["x_calibration"] = decided.calibration.get(q.id, IDENTITY)
        if q.id in decided.heads:
            a["x_head"] = decided.heads[q.id]
        if q.id in decided.readers:
            a["x_reader"] = decided.readers[q.id]
        answers.append(a | deciding.mass_fields(decided, q.id))
    body = {
        "id": request.request_id,
        "object": "decision",
        "created": int(time.time()),
        "model": here.model.name,
        "answers": answers,
        "usage": {"input_tokens": decided.input_tokens, "output_tokens": decided.output_tokens},
    }
    warnings = parsed.warnings + decided.warnings
    if warnings:
        body["x_warnings"] = warnings
    return Response.json(body, headers=deciding.headers(decided) + [(ROUTE_HEADER, key)])
