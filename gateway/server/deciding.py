"""A decision as every route asks it: the counted pipeline call and the Jev answers it gives.

``/v1/systemone``, ``/v1/decisions``, ``/v1/rerank`` and the ``jev`` extension of
``/v1/chat/completions`` each parse their own body into a
:class:`~gateway.decision.schema.SystemOneRequest`; then :func:`decide` (the pre-check, the
pipeline, the metrics), :func:`log_decisions` (``--log-decisions``), and for the routes that
answer in Jev's shape :func:`answers` (each question's answer with its ``x_`` fields) and
:func:`extras` (the reply's ``x_`` fields). One place, so that a question answered on any route
carries the same fields and the same digits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.decision import decision_log, label_mass, pipeline, readers, refusals, scoring
from gateway.decision.calibration import IDENTITY
from gateway.decision.errors import Refused
from gateway.decision.pipeline import Decided
from gateway.decision.schema import SystemOneRequest
from gateway.http import HTTPError
from gateway.server.errors import RETRY_AFTER
from gateway.server.jev.protocol import answer

if TYPE_CHECKING:
    from gateway.server.fleet import Backend


async def decide(app: Backend, parsed: SystemOneRequest) -> Decided:
    """The decision pipeline on one parsed request, counted in the app's metrics; ``app`` is the
    :class:`gateway.server.fleet.Backend` the request was routed to (its engine, settings and memory).

    A request with a part no context can hold is refused (:class:`Refused`, the engine's own 422)
    before the engine reads it (:func:`gateway.decision.refusals.over_any_context`)."""
    over = over_context(app, parsed)
    if over is not None:
        raise Refused([over])
    decider = app.decider
    if decider is None:
        _check_reader(app, parsed)
        decided = await pipeline.decide(parsed, app.engine, app.served.settings, app.memory)
    else:
        decided = await pipeline.decide(
            parsed, app.engine, app.served.settings, app.memory, decider=decider.engine, reader=app.served.reader
        )
    metrics = app.metrics
    for q in parsed.questions:
        metrics.questions.labels(q.type, decided.path if q.n_options > 1 else "none").inc()
    metrics.option_tokens.inc(decided.output_tokens)
    metrics.observe_counters(decided.computed, decided.reused, decided.snapshot, decided.disk)
    return decided


def over_context(app: Backend, parsed: SystemOneRequest) -> dict[str, Any] | None:
    """The 422 ``detail`` entry of a request with a part no context of ``app``'s language model can hold
    (:func:`gateway.decision.refusals.over_any_context`); None when every part might fit, when the engine
    answers natively (a decision engine reads no prompt) or when no question of a served pair goes to its
    language model."""
    caps = app.caps
    # a served pair's language model reads only the questions whose reader needs it
    lm_reads = app.decider is None or any(
        readers.needs(parsed.reader_of(q.id, app.served.reader))[1] for q in parsed.questions
    )
    if not lm_reads or getattr(caps, "decide", False):
        return None
    return refusals.over_any_context(parsed, refusals.max_prompt(caps), getattr(app.model, "max_token_bytes", None))


def _check_reader(app: Backend, parsed: SystemOneRequest) -> None:
    """Refuse an ``x_reader`` a model of one engine cannot give (:class:`Refused` naming the field): only
    a served pair holds two readers; a language model is ``"lm"``, a decision engine ``"decider"``."""
    own = "decider" if getattr(app.caps, "decide", False) else "lm"
    asked: list[tuple[list[str], str]] = [([], parsed.reader)] if parsed.reader is not None else []
    asked += [(["questions", qid], r) for qid, r in parsed.readers.items()]
    for loc, reader in asked:
        if reader != own:
            raise Refused(
                [
                    {
                        "loc": ["body", *loc, "x_reader"],
                        "msg": f"The model {app.model.name!r} holds one reader ({own!r}); {reader!r} needs a served "
                        "pair of a language model and a decision engine (serve --pair)",
                        "type": "literal_error",
                    }
                ]
            )


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
        "model_sha256": app.served.model_sha256,
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


def headers(decided: Decided) -> list[tuple[str, str]]:
    """The response headers of a decision: ``x-serveproto-engine-ms`` and ``x-serveproto-path``."""
    return [("x-serveproto-engine-ms", f"{decided.engine_ms:.3f}"), ("x-serveproto-path", decided.path)]


def head_fields(decided: Decided, qid: str) -> dict[str, Any]:
    """The ``x_`` fields of an answer a trained head gave: ``x_head`` (its name) and ``x_debias`` (the
    methods its prompt was read under, ``[]`` for none, in place of the reply's ``x_debias``)."""
    return {"x_head": decided.heads[qid], "x_debias": list(decided.head_debias.get(qid, ()))}


def mass_fields(decided: Decided, qid: str) -> dict[str, Any]:
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


def answers(parsed: SystemOneRequest, decided: Decided) -> dict[str, dict[str, Any]]:
    """Question id -> its Jev answer (:func:`gateway.server.jev.protocol.answer`) with ``x_calibration``,
    a head's fields (:func:`head_fields`), the label-mass fields (:func:`mass_fields`) and, on a served
    pair, ``x_reader`` (who read it: :mod:`gateway.decision.readers`), in request order."""
    return {
        q.id: {
            **answer(q, decided.probs[q.id]),
            "x_calibration": decided.calibration.get(q.id, IDENTITY),
            **(head_fields(decided, q.id) if q.id in decided.heads else {}),
            **mass_fields(decided, q.id),
            **({"x_reader": decided.readers[q.id]} if q.id in decided.readers else {}),
        }
        for q in parsed.questions
    }


def extras(parsed: SystemOneRequest, decided: Decided, warnings: list[str] | None = None) -> dict[str, Any]:
    """The reply's ``x_`` fields of a decision: ``x_engine_ms``, ``x_path``, ``x_positions`` (scoring
    counters, when the engine reported them), ``x_debias`` (the corrections applied, when an answer was
    read under them) and ``x_warnings`` (``warnings``, default the request's unknown fields, then the
    pipeline's; absent when none)."""
    out: dict[str, Any] = {"x_engine_ms": round(decided.engine_ms, 3), "x_path": decided.path}
    if decided.computed is not None:
        out["x_positions"] = {"computed": decided.computed, "reused": decided.reused, "snapshot": decided.snapshot}
        if decided.disk is not None:  # an engine that keeps results on disk (CAPS x_persist)
            out["x_positions"]["disk"] = decided.disk
    # absent when no answer was read under them (every question a head answered carries its own x_debias)
    if decided.debias and any(q.id not in decided.heads and q.n_options > 1 for q in parsed.questions):
        out["x_debias"] = list(decided.debias)
    said = (parsed.warnings if warnings is None else warnings) + decided.warnings
    if said:
        out["x_warnings"] = said
    return out
