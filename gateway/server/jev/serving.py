"""Serving ``POST /v1/systemone`` (TypeSafe's Jev) and ``POST /v1/decisions`` (OpenAI's Decisions API shape).

Each request is parse -> decide -> reply: the body is parsed into a
:class:`~gateway.decision.schema.SystemOneRequest` (:func:`gateway.decision.schema.parse_request`,
or :func:`parse_decisions` for the OpenAI shape), answered by the decision pipeline
(:func:`gateway.decision.pipeline.decide`, with the app's engine, settings and memory),
and written in the route's reply shape (:mod:`gateway.server.jev.protocol` for Jev's). What
the pipeline raises is mapped to HTTP by :mod:`gateway.server.errors` (``/v1/decisions`` gives
a refusal OpenAI's envelope).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from gateway.decision import batch, decision_log, label_mass, pipeline, refusals, schema, scoring
from gateway.decision.calibration import IDENTITY
from gateway.decision.errors import Refused
from gateway.decision.pipeline import Decided
from gateway.decision.prompts import as_text
from gateway.decision.schema import JevValidationError, SystemOneRequest
from gateway.http import HTTPError, Request, Response
from gateway.server.body import parse_json
from gateway.server.errors import RETRY_AFTER, openai_error
from gateway.server.jev import protocol
from gateway.server.routing import HEADER as ROUTE_HEADER
from gateway.server.routing import routing_key

if TYPE_CHECKING:
    from gateway.server.app import App
    from gateway.server.fleet import Backend


async def decide(app: Backend, parsed: SystemOneRequest) -> Decided:
    """The decision pipeline on one parsed request, counted in the app's metrics; ``app`` is the
    :class:`gateway.server.fleet.Backend` the request was routed to (its engine, settings and memory).

    A request with a part no context can hold is refused (:class:`Refused`, the engine's own 422)
    before the engine reads it (:func:`gateway.decision.refusals.over_any_context`)."""
    over = over_context(app, parsed)
    if over is not None:
        raise Refused([over])
    decided = await pipeline.decide(parsed, app.engine, app.settings, app.memory)
    metrics = app.metrics
    for q in parsed.questions:
        metrics.questions.labels(q.type, decided.path if q.n_options > 1 else "none").inc()
    metrics.option_tokens.inc(decided.output_tokens)
    metrics.observe_counters(decided.computed, decided.reused, decided.snapshot, decided.disk)
    return decided


def over_context(app: Backend, parsed: SystemOneRequest) -> dict[str, Any] | None:
    """The 422 ``detail`` entry of a request with a part no context of ``app``'s engine can hold
    (:func:`gateway.decision.refusals.over_any_context`), None when every part might fit or the engine
    answers natively (a decision engine reads no prompt)."""
    caps = app.caps
    if getattr(caps, "decide", False):
        return None
    return refusals.over_any_context(parsed, refusals.max_prompt(caps), getattr(app.model, "max_token_bytes", None))


def log_decisions(app: Backend, request_id: str, parsed: SystemOneRequest, decided: Decided) -> None:
    """Append the request's answers to the server's decision log, when it keeps one (``--log-decisions``).

    Lines that cannot be written are counted in ``serveproto_decision_log_lines_lost_total`` and the
    request is answered all the same (the decision is not the log), unless the log is ``required``
    (``--log-decisions-required``): then :class:`HTTPError` 503 naming the log.
    """
    if app.decision_log is None:
        return
    config = {
        "model": app.model.name,
        "model_sha256": app.model_sha256,
        "x_debias": list(decided.debias),
        "normalize": parsed.normalize,
    }
    lost = app.decision_log.write(
        decision_log.lines(
            request_id, parsed.questions, decided.probs, decided.uncalibrated, config, decided.calibration
        )
    )
    if lost:
        app.metrics.log_lines_lost.inc(lost)
        if app.decision_log.required:
            raise HTTPError(
                503,
                "overloaded_error",
                f"the decision log {app.decision_log.path.name} cannot be written ({app.decision_log.last_error}); "
                "this server answers only what it logs (--log-decisions-required)",
                headers=[("retry-after", RETRY_AFTER)],
            )


def _headers(request: Request, decided: Decided) -> list[tuple[str, str]]:
    return [("x-serveproto-engine-ms", f"{decided.engine_ms:.3f}"), ("x-serveproto-path", decided.path)]


def _head_fields(decided: Decided, qid: str) -> dict[str, Any]:
    """The ``x_`` fields of an answer a trained head gave: ``x_head`` (its name) and ``x_debias`` (the
    methods its prompt was read under, ``[]`` for none, in place of the reply's ``x_debias``)."""
    return {"x_head": decided.heads[qid], "x_debias": list(decided.head_debias.get(qid, ()))}


def _refuse_multipart(request: Request) -> None:
    """A multipart body is the official SDK's way of sending image assets (its JSON in the part named
    ``request``, each picture a part of its own): refused as ``assets`` are, naming the field
    (422, :data:`gateway.decision.schema.NOT_IMPLEMENTED`), before anything of it is read."""
    if (request.header("content-type") or "").lower().startswith("multipart/"):
        raise JevValidationError(
            [
                {
                    "loc": ["body", "assets"],
                    "msg": f"{schema.NOT_IMPLEMENTED}image assets need a vision model, and this server reads no "
                    "images: a multipart body (the SDK's Image assets) is not read; send the request as JSON "
                    "without assets",
                    "type": "not_implemented",
                }
            ]
        )


def _mass_fields(decided: Decided, qid: str) -> dict[str, Any]:
    """An answer's ``x_margin`` (its two best probabilities' difference) and, where the options were scored
    at one position, ``x_label_mass`` and ``x_argmax_is_label`` (:mod:`gateway.decision.label_mass`); none
    for a question of one option."""
    p = decided.probs[qid]
    if len(p) < 2:
        return {}
    out: dict[str, Any] = {"x_margin": scoring.r6(label_mass.margin(p))}
    mass = decided.label_mass.get(qid)
    if mass is not None:
        out["x_label_mass"] = scoring.r6(mass.mass)
        out["x_argmax_is_label"] = mass.argmax_is_label
    return out


async def systemone(app: App, request: Request) -> Response:
    _refuse_multipart(request)
    parsed = schema.parse_request(parse_json(request), strict=app.config.strict)
    key = routing_key(parsed.state, parsed.prefix)
    here = app.backend(parsed.model, key)  # the model named (else the default), by state affinity then load
    body, decided = await answer_one(here, parsed, request.request_id)
    return Response.json(body, headers=_headers(request, decided) + [(ROUTE_HEADER, key)])


async def answer_one(here: Backend, parsed: SystemOneRequest, request_id: str) -> tuple[dict[str, Any], Decided]:
    """One parsed ``/v1/systemone`` request answered on ``here`` and logged: its 200 body (the reply's
    ``id`` and ``x_request_id`` are ``request_id``) and the pipeline's :class:`Decided`. The single route
    and each item of the batch route (:func:`systemone_batch`) are answered here. Raises what
    :func:`decide` raises."""
    decided = await decide(here, parsed)
    log_decisions(here, request_id, parsed, decided)
    answers = {
        q.id: {
            **protocol.answer(q, decided.probs[q.id]),
            "x_calibration": decided.calibration.get(q.id, IDENTITY),
            **(_head_fields(decided, q.id) if q.id in decided.heads else {}),
            **_mass_fields(decided, q.id),
        }
        for q in parsed.questions
    }
    extra: dict[str, Any] = {
        "x_request_id": request_id,
        "x_engine_ms": round(decided.engine_ms, 3),
        "x_path": decided.path,
    }
    if decided.computed is not None:
        extra["x_positions"] = {"computed": decided.computed, "reused": decided.reused, "snapshot": decided.snapshot}
        if decided.disk is not None:  # an engine that keeps results on disk (CAPS x_persist)
            extra["x_positions"]["disk"] = decided.disk
    # the corrections applied: absent when no answer was read under them (every question a head answered
    # carries its own x_debias)
    if decided.debias and any(q.id not in decided.heads and q.n_options > 1 for q in parsed.questions):
        extra["x_debias"] = list(decided.debias)
    warnings = parsed.warnings + decided.warnings
    if warnings:
        extra["x_warnings"] = warnings
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
        over = over_context(here, parsed)
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


def parse_decisions(body: Any) -> tuple[SystemOneRequest, list[dict[str, Any]]]:
    """Read a ``/v1/decisions`` body into the equivalent System One request.

    ``{"model"?, "input", "questions": [{"type": "predicate"|"choice"|"score", "name"?,
    "question"|"instructions"?, "choices": [{"value", "description"?}], "levels":
    [{"label", "description"?}]}]}``. Returns the request (question ids are the
    positions ``"0".."n-1"``) and the questions as sent. Raises
    :class:`HTTPError` 400 in OpenAI's error envelope, naming the parameter.
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
        extension = {k: body[k] for k in ("x_debias", "x_head") if k in body}
        parsed = schema.parse_request(
            {"state": body["input"], "questions": converted, "model": body.get("model"), **extension}
        )
    except JevValidationError as exc:
        e = exc.errors[0]
        raise openai_error(e["msg"], _openai_param(e["loc"], qs)) from None
    return parsed, qs


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
    parsed, sent = parse_decisions(parse_json(request))
    key = routing_key(parsed.state, parsed.prefix)
    here = app.backend(parsed.model, key)
    try:
        decided = await decide(here, parsed)
    except Refused as exc:  # what the engine refused, in this route's envelope
        e = exc.errors[0]
        raise openai_error(e["msg"], _openai_param(e["loc"], sent)) from None
    log_decisions(here, request.request_id, parsed, decided)
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
        answers.append(a)
    body = {
        "id": request.request_id,
        "object": "decision",
        "created": int(time.time()),
        "model": here.model.name,
        "answers": answers,
        "usage": {"input_tokens": decided.input_tokens, "output_tokens": decided.output_tokens},
    }
    return Response.json(body, headers=_headers(request, decided) + [(ROUTE_HEADER, key)])
