"""``POST /v1/systemone`` (TypeSafe's Jev) and ``POST /v1/decisions`` (OpenAI's Decisions API shape).

Both answer through :func:`decide_questions`: on a language model each
question is a prompt of the seed's table scored option by option (one batched
``SCORE`` when the engine advertises ``x_score``, else the seed's pin + SUBMIT
sequence; the supervisor picks), on a ``decide=1`` engine the whole request is
one ``DECIDE`` record. A question with a single option is answered without
the engine.
"""
from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import anyio
import attrs

from gateway.decision import debias, decision_log, record as decision_record, jev, readings, scoring
from gateway.server import refusals
from gateway.server.body import parse_json
from gateway.server.errors import RETRY_AFTER
from gateway.http import HTTPError, Request, Response
from gateway.decision.jev import JevValidationError, Question, SystemOneRequest
from gateway.decision.prompts import as_text

if TYPE_CHECKING:
    from gateway.server.app import App

log = logging.getLogger("serveproto.systemone")

#: ``x_calibration`` of an answer no calibration map was applied to (gateway.decision.calibration).
IDENTITY = "identity"

#: How many recent states the server remembers to decide ``pin_state`` on its own.
SEEN_STATES = 1024


@attrs.define
class Decided:
    """The outcome of one request's questions.

    ``probs``: reported probabilities by question id (reply order of
    options); ``input_tokens``: the longest prompt; ``output_tokens``: option
    tokens read (0 on a decision engine); ``engine_ms``: the engine's time;
    ``path``: ``"score"``, ``"decide"`` or ``"none"`` (no engine call);
    ``warnings``: text for ``x_warnings``; counters of the scoring calls;
    ``debias``: the :mod:`gateway.decision.debias` methods applied; ``calibration``:
    question id -> the ``x_calibration`` of its answer (absent: identity);
    ``uncalibrated``: question id -> its reported probabilities before the
    calibration (only questions a calibration map was applied to).
    """

    probs: dict[str, list[float]]
    input_tokens: int = 0
    output_tokens: int = 0
    engine_ms: float = 0.0
    path: str = "none"
    warnings: list[str] = attrs.field(factory=list)
    computed: int | None = None
    reused: int | None = None
    snapshot: str | None = None
    debias: tuple[str, ...] = ()
    calibration: dict[str, str] = attrs.field(factory=dict)
    uncalibrated: dict[str, list[float]] = attrs.field(factory=dict)


class ScoringMemory:
    """What the scoring path remembers between requests (one per app): the states seen lately
    (to pin a state that comes back), the fixed prefixes photographed, by slot, and the
    questions' content-free log-probabilities (:mod:`gateway.decision.debias`)."""

    def __init__(self) -> None:
        self.states: OrderedDict[int, None] = OrderedDict()
        self.fixed: dict[tuple[int | None, str], bool] = {}
        self.content_free: OrderedDict[tuple, list[float]] = OrderedDict()
        self.reading: dict[tuple, anyio.Event] = {}  # content-free readings in progress

    def remember_content_free(self, key: tuple, mean_log_probs: list[float]) -> None:
        """Keep a question's content-free log-probabilities (the :data:`SEEN_STATES` latest questions)."""
        self.content_free[key] = mean_log_probs
        self.content_free.move_to_end(key)
        while len(self.content_free) > SEEN_STATES:
            self.content_free.popitem(last=False)

    def seen(self, key: str) -> bool:
        h = hash(key)
        was = h in self.states
        self.states[h] = None
        self.states.move_to_end(h)
        while len(self.states) > SEEN_STATES:
            self.states.popitem(last=False)
        return was


def _check_slot(app: "App", request: SystemOneRequest) -> None:
    """Check ``cache_slot`` against the engine's slots (422 naming the field)."""
    slots = max(1, int(app.caps.slots or 1))
    if request.cache_slot is not None and request.cache_slot >= slots:
        raise JevValidationError([{"loc": ["body", "cache_slot"],
                                   "msg": f"The engine has {slots} KV slot(s): 0..{slots - 1}", "type": "less_than"}])


async def _engine_call(app: "App", fn, *args, **kwargs):
    try:
        with anyio.fail_after(app.request_timeout):
            return await fn(*args, **kwargs)
    except TimeoutError:
        raise HTTPError(503, "overloaded_error", f"the engine did not answer within {app.request_timeout:g} s",
                        headers=[("retry-after", RETRY_AFTER)]) from None


def _raise_refusal(app: "App", exc: BaseException, owners: list[Question | None], request: SystemOneRequest,
                   read_owners: list[tuple[int, ...]] | None = None) -> None:
    """Raise the 422 naming the request's own field when ``exc`` is the engine's ``BAD_REQUEST`` of a
    text it cannot score (:func:`gateway.server.refusals.scoring_refusal`); return otherwise. ``read_owners[g]``
    maps group ``g``'s scored texts to reply options (a canonical read scores them in another order)."""
    if getattr(exc, "code", None) != "BAD_REQUEST":
        return
    reason = getattr(exc, "reason", "") or ""
    m = refusals._OPTION_FIELD.match(reason)
    if m is not None and read_owners is not None:
        g, o = int(m.group(1) or m.group(2)), int(m.group(3) or m.group(4))
        if g < len(read_owners) and o < len(read_owners[g]):
            reason = f"groups[{g}].options[{read_owners[g][o]}]: {m.group(5)}"
    entry = refusals.scoring_refusal(reason, owners, request, _n_ctx(app))
    if entry is not None:
        raise JevValidationError([entry]) from None


def _n_ctx(app: "App") -> int | None:
    n = getattr(app.caps, "n_ctx", None)
    return int(n) if isinstance(n, int) and n > 0 else None


def _methods(app: "App", request: SystemOneRequest) -> tuple[str, ...]:
    """The debias methods of a request: its own ``x_debias``, else the server's default."""
    return request.debias if request.debias is not None else app.debias


async def _score_path(app: "App", mem: ScoringMemory, request: SystemOneRequest, questions: list[Question],
                      out: Decided) -> None:
    prompts = app.prompts
    prefix_text = prompts.prefix(request.state, request.prefix)
    if request.cache_slot is not None:
        _check_slot(app, request)
    methods = _methods(app, request)
    method = readings.Method.from_names(methods)
    calibration = app.calibration  # gateway.decision.calibration.Calibration, set by serve
    # one group per read of a question (gateway.decision.readings.plan); spans[i] = (first group, reads) of question i
    groups: list[tuple[str, list[str]]] = []
    read_owners: list[tuple[int, ...]] = []  # per group, the reply option of each scored text (Read.owner)
    spans: list[tuple[int, int]] = []
    owners: list[Question | None] = []  # the question of each group, to name a refused option's field
    for q in questions:
        try:
            reads = readings.plan(q.type, q.instructions, q.criteria, q.n_options, method)
        except ValueError as exc:
            raise JevValidationError([{"loc": ["body", "questions", q.id, "criteria"], "msg": str(exc),
                                       "type": "value_error"}]) from None
        spans.append((len(groups), len(reads)))
        for rd in reads:
            groups.append((prompts.stem(rd.text), list(rd.scored)))
            read_owners.append(rd.owner)
            owners.append(q)
    seen = mem.seen(prefix_text)
    pin = request.pin_state if request.pin_state is not None else (len(questions) >= 2 or seen)
    engine = app.engine
    slot = request.cache_slot
    # With no cache_slot the supervisor routes a request to the slot that last
    # served its prefix; a fixed prefix routes by itself, so the frames that
    # share it meet its snapshot.
    route = {}
    t0 = time.perf_counter()
    if request.prefix:
        fixed = prompts.fixed_prefix(request.prefix)
        route = {"route": fixed}
        key = (slot, fixed)
        if key not in mem.fixed:
            try:
                await _engine_call(app, engine.read_out, fixed, logprobs=1, pin=True, slot=slot, **route)
            except Exception as exc:
                if getattr(exc, "code", None) == "BAD_REQUEST" and refusals.too_long(getattr(exc, "reason", "") or ""):
                    n = _n_ctx(app)
                    raise JevValidationError([{"loc": ["body", "prefix"], "type": "too_long", "msg":
                                               f"The prefix is longer than the engine's context"
                                               f"{f' of {n} tokens' if n else ''}"}]) from None
                raise
            mem.fixed[key] = True
    content_free = None
    if "content_free" in methods:
        content_free = await _content_free(app, mem, request, questions, groups, read_owners, spans, slot, route, out)
    try:
        result = await _engine_call(app, engine.score, prefix_text, groups, pin=pin, slot=slot, **route)
    except Exception as exc:
        _raise_refusal(app, exc, owners, request, read_owners)
        raise
    out.engine_ms = (time.perf_counter() - t0) * 1e3
    out.path = "score"
    if methods:
        out.debias = methods
    done = getattr(result, "done", None)
    out.computed = _add(out.computed, getattr(result, "computed", None))
    out.reused = _add(out.reused, getattr(result, "reused", None))
    out.snapshot = getattr(done, "snapshot", None) if done is not None else None
    if request.prefix and out.snapshot not in (None, "hit"):
        mem.fixed.pop((slot, prompts.fixed_prefix(request.prefix)), None)  # evicted: retake it next time
    for i, (q, (start, k)) in enumerate(zip(questions, spans)):
        rows = [[tuple(o.logprobs) for o in result.groups[g]] for g in range(start, start + k)]
        counts = {len(x) for x in rows[0]}
        if request.normalize == "mean" and len(counts) > 1:
            log.warning("question %r: normalize=mean over options of %d to %d tokens", q.id, min(counts), max(counts))
            out.warnings.append(f"question {q.id!r}: normalize=mean over options of different token counts "
                                f"({min(counts)} to {max(counts)}): a per-token average favours the longer options")
        try:
            if methods:
                per_read = [readings.log_probs(read_owners[start + j], lps, request.normalize)
                            for j, lps in enumerate(rows)]
                cf = content_free[i] if content_free is not None else None
                p = scoring.softmax(readings.combine(per_read, cf))
            else:
                p = scoring.softmax(scoring.option_scores(rows[0], request.normalize))
            if calibration is not None:
                before = p
                p, out.calibration[q.id] = calibration.apply(q.type, p, methods)
                if out.calibration[q.id] != IDENTITY:
                    out.uncalibrated[q.id] = scoring.report(before)
            out.probs[q.id] = scoring.report(p)
        except ValueError as exc:
            raise HTTPError(502, "api_error", f"the engine's scores for {q.id!r} are unusable: {exc}") from None
    longest = 0
    for group in result.groups:
        for o in group:
            longest = max(longest, int(o.context_tokens) + len(o.logprobs))
            out.output_tokens += len(o.logprobs)
    out.input_tokens = longest


def _add(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else a + b


async def _content_free(app: "App", mem: ScoringMemory, request: SystemOneRequest, questions: list[Question],
                        groups: list[tuple[str, list[str]]], read_owners: list[tuple[int, ...]],
                        spans: list[tuple[int, int]], slot: int | None,
                        route: dict[str, str], out: Decided) -> list[list[float]]:
    """Each question's mean option log-probabilities on the content-free states (:mod:`gateway.decision.debias`).

    Read once per question (its rotations' stems and options, the fixed
    prefix, ``normalize``) and remembered in ``mem``; the questions not seen
    yet are read in one ``SCORE`` whose prefix is the prompt up to where the
    state would start, each content-free state beginning the stems. That
    reading is shielded from the client leaving, and a request that needs a
    question another request is reading waits for it rather than reading it
    again. Returns one list of ``n_options`` floats per question.
    """
    cf_prefix = app.prompts.prefix("", request.prefix)
    keys = [(cf_prefix, request.normalize, tuple((stem, tuple(opts), owner) for (stem, opts), owner
                                                 in zip(groups[start:start + k], read_owners[start:start + k])))
            for start, k in spans]
    owner_of: dict[tuple, Question] = {}
    for key, q in zip(keys, questions):
        owner_of.setdefault(key, q)
    while True:
        missing = [key for key in dict.fromkeys(keys) if key not in mem.content_free]
        waiting = [mem.reading[key] for key in missing if key in mem.reading]
        if not waiting:
            break
        for event in waiting:  # another request is reading them: share its result
            await event.wait()
    if missing:
        event = anyio.Event()
        for key in missing:
            mem.reading[key] = event
        try:
            # Shielded: a client that leaves (the SDK's 10 s timeout) does not waste the reading;
            # its retry finds it remembered. The engine call keeps its own time limit.
            with anyio.CancelScope(shield=True):
                await _read_content_free(app, mem, request, missing, owner_of, cf_prefix, slot, route, out)
        finally:
            for key in missing:
                mem.reading.pop(key, None)
            event.set()
    return [mem.content_free[key] for key in keys]


async def _read_content_free(app: "App", mem: ScoringMemory, request: SystemOneRequest, missing: list[tuple],
                             owner_of: dict[tuple, Question], cf_prefix: str, slot: int | None,
                             route: dict[str, str], out: Decided) -> None:
    cf_groups = [(state + stem, list(opts)) for key in missing for state in debias.CONTENT_FREE_STATES
                 for stem, opts, _ in key[2]]
    owners: list[Question | None] = [owner_of[key] for key in missing
                                     for _ in range(len(debias.CONTENT_FREE_STATES) * len(key[2]))]
    read_owners = [owner for key in missing for _ in debias.CONTENT_FREE_STATES for _s, _o, owner in key[2]]
    try:
        result = await _engine_call(app, app.engine.score, cf_prefix, cf_groups, pin=False, slot=slot, **route)
    except Exception as exc:
        _raise_refusal(app, exc, owners, request, read_owners)
        raise
    out.computed = _add(out.computed, getattr(result, "computed", None))
    out.reused = _add(out.reused, getattr(result, "reused", None))
    g = 0
    for key in missing:
        per_read = []
        for _ in debias.CONTENT_FREE_STATES:
            for _stem, _opts, owner in key[2]:
                lps = [tuple(o.logprobs) for o in result.groups[g]]
                out.output_tokens += sum(len(x) for x in lps)
                try:
                    per_read.append(readings.log_probs(owner, lps, request.normalize))
                except ValueError as exc:
                    raise HTTPError(502, "api_error", f"the engine's content-free scores are unusable: {exc}") from None
                g += 1
        mem.remember_content_free(key, readings.mean_log_probs(per_read))


def decide_invalid_error(reason: str, questions: list[Question]) -> dict[str, Any]:
    """A ``DECIDE_INVALID <field>: <reason>`` as a 422 ``detail`` entry naming the request's field.

    The engine names a field of the record (``questions.2.options.1.label``,
    spec/decision-record.md); the client gets the path in what it sent:
    the question by its id, an option by its label (choice) or level index
    (score), ``criteria`` for options, the side (``false`` / ``true``) of a noul.
    """
    field, sep, why = reason.partition(": ")
    if not sep:
        field, why = "record", reason
    parts = [p for p in field.split(".") if p]
    loc: list[Any] = ["body"]
    if parts[:1] == ["questions"] and len(parts) >= 2 and parts[1].isdigit() and int(parts[1]) < len(questions):
        q = questions[int(parts[1])]
        loc += ["questions", q.id]
        rest = parts[2:]
        if rest[:1] == ["options"]:
            loc.append("criteria")
            if len(rest) >= 2 and rest[1].isdigit():
                j = int(rest[1])
                if q.type == "choice" and j < len(q.criteria):
                    loc.append(list(q.criteria)[j])
                elif q.type == "score":
                    loc.append(j)
                elif q.type == "noul" and j < 2:
                    loc.append(("false", "true")[j])
        elif rest:
            loc.append(rest[0])
    elif parts and parts[0] not in ("record",):
        loc += parts
    return {"loc": loc, "msg": why or "refused by the decision engine", "type": "decide_invalid"}


async def _decide_path(app: "App", request: SystemOneRequest, questions: list[Question], out: Decided) -> None:
    if request.prefix is not None:
        raise JevValidationError([{"loc": ["body", "prefix"], "type": "value_error",
                                   "msg": "A decision engine takes no prefix: put that text in state or instructions"}])
    slot = request.cache_slot if request.cache_slot is not None else 0
    _check_slot(app, request)
    raw = (getattr(app.caps, "decide_record", None) or "") == "raw"
    record = decision_record.serialize(decision_record.build(request, tuple(questions), raw=raw))
    t0 = time.perf_counter()
    try:
        decision, done = await _engine_call(app, app.engine.decide, record, slot=slot)
    except Exception as exc:
        if getattr(exc, "code", None) == "DECIDE_INVALID":
            raise JevValidationError([decide_invalid_error(getattr(exc, "reason", ""), questions)]) from None
        raise
    wall_ms = (time.perf_counter() - t0) * 1e3
    try:
        probs = decision_record.probabilities(decision, tuple(questions))
    except decision_record.DecisionError as exc:
        raise HTTPError(500, "api_error", f"the decision engine's answer is unusable: {exc}") from None
    for q in questions:
        out.probs[q.id] = scoring.report(probs[q.id])
    tokens = decision.get("input_tokens")
    if not isinstance(tokens, int) or isinstance(tokens, bool):
        tokens = getattr(done, "prompt_tokens", 0) or 0
    out.input_tokens = int(tokens)
    engine_ms = decision.get("engine_ms")
    out.engine_ms = float(engine_ms) if isinstance(engine_ms, (int, float)) and not isinstance(engine_ms, bool) else wall_ms
    out.path = "decide"


async def decide_questions(app: "App", request: SystemOneRequest, memory: ScoringMemory) -> Decided:
    """Answer every question of ``request``: probabilities by question id, usage and counters.

    Raises :class:`JevValidationError` (422) for a request the served engine
    cannot take (``cache_slot`` out of range, ``prefix`` on a decision
    engine), :class:`HTTPError` for an engine failure, and lets the engine's
    own errors through for :class:`gateway.server.app.App` to map.
    """
    out = Decided(probs={})
    for q in request.questions:
        # accepted (a scale may describe only some of its levels), but said: the model sees "2: " alone
        if q.type == "score":
            empty = [str(i) for i, level in enumerate(q.criteria) if isinstance(level, str) and not level.strip()]
            if empty:
                out.warnings.append(f"question {q.id!r}: level {empty[0]} is empty: the model reads only its number"
                                    if len(empty) == 1 else f"question {q.id!r}: levels {', '.join(empty)} are "
                                    "empty: the model reads only their numbers")
    asked = []
    for q in request.questions:
        if q.n_options == 1:
            out.probs[q.id] = [1.0]
        else:
            asked.append(q)
    if asked:
        if app.caps.decide:
            await _decide_path(app, request, asked, out)
            if request.debias:
                out.warnings.append("x_debias is not applied: the decision engine answers natively")
        else:
            await _score_path(app, memory, request, asked, out)
    metrics = app.metrics
    for q in request.questions:
        metrics.questions.labels(q.type, out.path if q.n_options > 1 else "none").inc()
    metrics.option_tokens.inc(out.output_tokens)
    metrics.observe_counters(out.computed, out.reused, out.snapshot)
    return out


def log_decisions(app: "App", request_id: str, parsed: SystemOneRequest, decided: Decided) -> None:
    """Append the request's answers to the server's decision log, when it keeps one (``--log-decisions``)."""
    if app.decision_log is None:
        return
    config = {"model": app.model.name, "model_sha256": app.model_sha256, "x_debias": list(decided.debias),
              "normalize": parsed.normalize}
    app.decision_log.write(decision_log.lines(request_id, parsed.questions, decided.probs, decided.uncalibrated,
                                              config, decided.calibration))


def _headers(request: Request, decided: Decided) -> list[tuple[str, str]]:
    return [("x-serveproto-engine-ms", f"{decided.engine_ms:.3f}"), ("x-serveproto-path", decided.path)]


async def systemone(app: "App", memory: ScoringMemory, request: Request) -> Response:
    parsed = jev.parse_request(parse_json(request))
    decided = await decide_questions(app, parsed, memory)
    log_decisions(app, request.request_id, parsed, decided)
    answers = {q.id: {**jev.answer(q, decided.probs[q.id]), "x_calibration": decided.calibration.get(q.id, IDENTITY)}
               for q in parsed.questions}
    extra: dict[str, Any] = {"x_request_id": request.request_id, "x_engine_ms": round(decided.engine_ms, 3), "x_path": decided.path}
    if decided.computed is not None:
        extra["x_positions"] = {"computed": decided.computed, "reused": decided.reused, "snapshot": decided.snapshot}
    if decided.debias:
        extra["x_debias"] = list(decided.debias)
    if decided.warnings:
        extra["x_warnings"] = decided.warnings
    body = jev.reply(app.model.name, answers, decided.input_tokens, decided.output_tokens, extra)
    return Response.json(body, headers=_headers(request, decided))


# --- OpenAI's Decisions API shape -------------------------------------------------------------

_OPENAI_TYPES = {"predicate": "noul", "choice": "choice", "score": "score"}


def _openai_error(message: str, param: str) -> HTTPError:
    return HTTPError(400, "invalid_request_error", message,
                     body={"error": {"message": message, "type": "invalid_request_error", "param": param, "code": None},
                           "detail": {"error_type": "invalid_request_error", "message": message}})


def parse_decisions(body: Any) -> tuple[SystemOneRequest, list[dict[str, Any]]]:
    """Read a ``/v1/decisions`` body into the equivalent System One request.

    ``{"model"?, "input", "questions": [{"type": "predicate"|"choice"|"score", "name"?,
    "question"|"instructions"?, "choices": [{"value", "description"?}], "levels":
    [{"label", "description"?}]}]}``. Returns the request (question ids are the
    positions ``"0".."n-1"``) and the questions as sent. Raises
    :class:`HTTPError` 400 in OpenAI's error envelope, naming the parameter.
    """
    if not isinstance(body, dict):
        raise _openai_error("the body must be a JSON object", "")
    if "input" not in body:
        raise _openai_error("'input' is required", "input")
    qs = body.get("questions")
    if not isinstance(qs, list) or not 1 <= len(qs) <= jev.MAX_QUESTIONS:
        raise _openai_error(f"'questions' must be an array of 1 to {jev.MAX_QUESTIONS} questions", "questions")
    converted: dict[str, Any] = {}
    for i, q in enumerate(qs):
        param = f"questions[{i}]"
        if not isinstance(q, dict) or q.get("type") not in _OPENAI_TYPES:
            raise _openai_error(f"{param}.type must be 'predicate', 'choice' or 'score'", f"{param}.type")
        text = q.get("question", q.get("instructions"))
        jq: dict[str, Any] = {"type": _OPENAI_TYPES[q["type"]]}
        if text is not None:
            jq["instructions"] = text
        if q["type"] == "choice":
            choices = q.get("choices")
            if not isinstance(choices, list) or not choices:
                raise _openai_error(f"{param}.choices must be a non-empty array", f"{param}.choices")
            crit = {}
            for j, c in enumerate(choices):
                if not isinstance(c, dict) or not isinstance(c.get("value"), str) or not c["value"]:
                    raise _openai_error(f"{param}.choices[{j}].value must be a non-empty string", f"{param}.choices[{j}].value")
                if c["value"] in crit:
                    raise _openai_error(f"{param}.choices[{j}].value repeats {c['value']!r}", f"{param}.choices[{j}].value")
                crit[c["value"]] = c.get("description")
            jq["criteria"] = crit
        elif q["type"] == "score":
            levels = q.get("levels")
            if not isinstance(levels, list) or not levels:
                raise _openai_error(f"{param}.levels must be a non-empty array", f"{param}.levels")
            crit_l = []
            for j, lv in enumerate(levels):
                if not isinstance(lv, dict) or not isinstance(lv.get("label"), str):
                    raise _openai_error(f"{param}.levels[{j}].label must be a string", f"{param}.levels[{j}].label")
                desc = lv.get("description")
                crit_l.append(f"{lv['label']}: {as_text(desc)}" if desc else lv["label"])
            jq["criteria"] = crit_l
        converted[str(i)] = jq
    try:
        extension = {"x_debias": body["x_debias"]} if "x_debias" in body else {}
        parsed = jev.parse_request({"state": body["input"], "questions": converted, "model": body.get("model"), **extension})
    except JevValidationError as exc:
        e = exc.errors[0]
        loc = e["loc"][1:]
        param = "input" if loc[:1] == ["state"] else ".".join(map(str, loc))
        raise _openai_error(e["msg"], param) from None
    return parsed, qs


def _openai_param(loc: list, sent: list[dict[str, Any]]) -> str:
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
            return f"{param}.choices[{values.index(rest[1])}].value" if len(rest) > 1 and rest[1] in values \
                else f"{param}.choices"
        if q.get("type") == "score":
            return f"{param}.levels[{rest[1]}]" if len(rest) > 1 else f"{param}.levels"
        return param
    return ".".join([param, *map(str, rest)])


async def decisions(app: "App", memory: ScoringMemory, request: Request) -> Response:
    parsed, sent = parse_decisions(parse_json(request))
    try:
        decided = await decide_questions(app, parsed, memory)
    except JevValidationError as exc:  # what the engine refused, in this route's envelope
        e = exc.errors[0]
        raise _openai_error(e["msg"], _openai_param(e["loc"], sent)) from None
    log_decisions(app, request.request_id, parsed, decided)
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
            a.update(choice=labels[best], probabilities=[{"value": v, "probability": p[i]} for i, v in enumerate(labels)],
                     confidence=scoring.r6(scoring.confidence(p)))
        else:
            a.update(score=scoring.r6(scoring.expected_level(p)),
                     probabilities=[{"value": i, "label": lv["label"], "probability": p[i]} for i, lv in enumerate(raw["levels"])],
                     confidence=scoring.r6(scoring.confidence(p)))
        a["x_calibration"] = decided.calibration.get(q.id, IDENTITY)
        answers.append(a)
    body = {"id": request.request_id, "object": "decision", "created": int(time.time()), "model": app.model.name,
            "answers": answers, "usage": {"input_tokens": decided.input_tokens, "output_tokens": decided.output_tokens}}
    return Response.json(body, headers=_headers(request, decided))


def register(app: "App") -> None:
    memory = ScoringMemory()

    async def _systemone(request: Request) -> Response:
        return await systemone(app, memory, request)

    async def _decisions(request: Request) -> Response:
        return await decisions(app, memory, request)

    app.router.route("/v1/systemone", "POST", _systemone)
    app.router.route("/v1/decisions", "POST", _decisions)
