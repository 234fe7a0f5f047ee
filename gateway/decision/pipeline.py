"""The decision pipeline: a parsed request and an engine in, each question's probabilities out.

:func:`decide` is what ``POST /v1/systemone`` and ``POST /v1/decisions`` do between
parsing the body and writing the reply, and what ``serveproto calibrate`` and the
benchmarks call without HTTP. On a language model each question is a prompt of the
seed's table scored option by option (one batched ``SCORE`` when the engine
advertises ``x_score``, else the seed's pin + SUBMIT sequence; the engine API
picks), read under the request's ``x_debias`` (:mod:`gateway.decision.readings`),
then softmax (:mod:`gateway.decision.arithmetic`), calibration and the reported
millionths (:mod:`gateway.decision.scoring`). On a ``decide=1`` engine the whole
request is one ``DECIDE`` record (:mod:`gateway.decision.record`). A question with
a single option is answered without the engine.

Errors are typed (:mod:`gateway.decision.errors`, no HTTP): :class:`Refused`
naming the request's field, :class:`DecisionTimeout`, :class:`UnusableScores`,
:class:`UnusableDecision`; the engine's own errors pass through as they are.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

import anyio
import attrs

from gateway.decision import debias, pictures, readers, readings, record, refusals, scoring
from gateway.decision.arithmetic import option_scores, softmax
from gateway.decision.calibration import IDENTITY, Calibration
from gateway.decision.errors import DecisionTimeout, Refused, UnusableDecision, UnusableScores
from gateway.decision.heads import HeadSet
from gateway.decision.keyset import KeyCounts
from gateway.decision.label_mass import Mass, question_mass
from gateway.decision.prompts import PromptBuilder
from gateway.decision.schema import Question, SystemOneRequest
from gateway.engine.api import ReadOut, ScoreResult
from gateway.engine.errors import RequestError
from gateway.engine.score import OptionScore
from serveproto import Done

__all__ = ["EngineCaps", "DecisionEngine", "Settings", "Memory", "Decided", "decide", "SEEN_STATES"]

log = logging.getLogger("serveproto.systemone")

#: How many recent states the server remembers to decide ``pin_state`` on its own.
SEEN_STATES = 1024

#: ``score()`` groups as the pipeline sends them: ``[(stem, [option, ...]), ...]``.
Groups = Sequence[tuple[str, Sequence[str]]]


class EngineCaps(Protocol):
    """What the pipeline reads of an engine's CAPS (:class:`serveproto.Caps`): ``decide`` (a decision
    engine: DECIDE, not SCORE), ``slots`` (KV slots), ``x_hidden`` (layers SCORE's ``hidden`` reads;
    0 without), ``decide_record`` (``"raw"``: the record's texts as sent)."""

    @property
    def decide(self) -> bool: ...

    @property
    def slots(self) -> int: ...

    @property
    def x_hidden(self) -> int: ...

    @property
    def decide_record(self) -> str | None: ...


class DecisionEngine(Protocol):
    """What the pipeline needs of an engine: :class:`gateway.engine.Engine`'s ``caps``, ``read_out``,
    ``score`` and ``decide`` (the supervisor's engine, one backend of a fleet, the tests' fakes)."""

    @property
    def caps(self) -> EngineCaps: ...

    async def read_out(
        self, prompt: str, *, logprobs: int = ..., pin: bool = ..., slot: int | None = ..., route: str | None = ...
    ) -> ReadOut: ...

    async def score(
        self,
        prefix: str,
        groups: Groups,
        *,
        pin: bool = ...,
        slot: int | None = ...,
        route: str | None = ...,
        beside: tuple[str, Groups] | None = ...,
        hidden: tuple[int, ...] = ...,
        pictures: Sequence[bytes] = ...,
    ) -> ScoreResult: ...

    async def decide(self, record: bytes, *, slot: int = ...) -> tuple[dict[str, Any], Done]: ...


@attrs.frozen
class Settings:
    """What the server decides for every request of one model, built once (frozen: replaced whole, never changed).

    ``prompts``: the model's :class:`PromptBuilder`; ``debias``: the
    :mod:`gateway.decision.debias` methods of a request that sends no ``x_debias``;
    ``calibration``: a :class:`gateway.decision.calibration.Calibration` or None;
    ``timeout``: seconds one engine call may take (:class:`DecisionTimeout` past it);
    ``hidden``: layers whose output at each question's prompt end goes in
    ``Decided.hidden`` (SCORE's ``hidden``, engines with CAPS ``x_hidden``; what
    ``serveproto heads fit`` reads); ``heads``: a :class:`gateway.decision.heads.HeadSet`
    or None: a question matching one of its heads is answered by it.
    """

    prompts: PromptBuilder
    debias: tuple[str, ...] = ()
    calibration: Calibration | None = None
    timeout: float = 120.0
    hidden: tuple[int, ...] = ()
    heads: HeadSet | None = None


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
    calibration (only questions a calibration map was applied to); ``hidden``:
    question id -> layer -> the hidden state (``Settings.hidden``, engines that
    read it); ``heads``: question id -> the name of the head that answered it;
    ``head_debias``: question id -> the methods a head's question was read under instead
    of ``debias`` (the head's own ``x_debias``, usually none);
    ``prompt_tokens``: question id -> its longest prompt in tokens, option
    included (scoring path only); ``label_mass``: question id -> how much of the
    next-token probability its options' first tokens held
    (:mod:`gateway.decision.label_mass`; scoring path only, where defined);
    ``readers``: question id -> who read it on a served pair (:mod:`gateway.decision.readers`;
    empty on one engine).
    """

    probs: dict[str, list[float]]
    input_tokens: int = 0
    output_tokens: int = 0
    engine_ms: float = 0.0
    path: str = "none"
    warnings: list[str] = attrs.field(factory=list)
    computed: int | None = None
    reused: int | None = None
    disk: int | None = None
    snapshot: str | None = None
    debias: tuple[str, ...] = ()
    calibration: dict[str, str] = attrs.field(factory=dict)
    uncalibrated: dict[str, list[float]] = attrs.field(factory=dict)
    hidden: dict[str, dict[int, tuple[float, ...]]] = attrs.field(factory=dict)
    heads: dict[str, str] = attrs.field(factory=dict)
    head_debias: dict[str, tuple[str, ...]] = attrs.field(factory=dict)
    prompt_tokens: dict[str, int] = attrs.field(factory=dict)
    label_mass: dict[str, Mass] = attrs.field(factory=dict)
    readers: dict[str, str] = attrs.field(factory=dict)


class Memory:
    """What the scoring path remembers between requests (one per server): the states seen lately
    (to pin a state that comes back), the fixed prefixes photographed, by slot, and the
    questions' content-free log-probabilities (:mod:`gateway.decision.debias`)."""

    def __init__(self) -> None:
        self.states: OrderedDict[int, None] = OrderedDict()
        # (slot, fixed prefix) by hash, no prompt text kept -> the tokens its photograph holds
        self.fixed = KeyCounts(SEEN_STATES)
        self.content_free: OrderedDict[tuple[Any, ...], list[float]] = OrderedDict()
        self.reading: dict[tuple[Any, ...], anyio.Event] = {}  # content-free readings in progress

    def remember_content_free(self, key: tuple[Any, ...], mean_log_probs: list[float]) -> None:
        """Keep a question's content-free log-probabilities (the :data:`SEEN_STATES` latest questions)."""
        self.content_free[key] = mean_log_probs
        self.content_free.move_to_end(key)
        while len(self.content_free) > SEEN_STATES:
            self.content_free.popitem(last=False)

    def seen(self, key: str) -> bool:
        """Whether ``key`` (a state's prompt prefix) was seen lately; remembers it either way."""
        h = hash(key)
        was = h in self.states
        self.states[h] = None
        self.states.move_to_end(h)
        while len(self.states) > SEEN_STATES:
            self.states.popitem(last=False)
        return was


async def decide(
    request: SystemOneRequest,
    engine: DecisionEngine,
    settings: Settings,
    memory: Memory,
    *,
    decider: DecisionEngine | None = None,
    reader: str = "decider",
) -> Decided:
    """Answer every question of ``request``: probabilities by question id, usage and counters.

    ``engine``: the engine API (:class:`gateway.engine.Engine` or anything with its
    ``caps``, ``score``, ``read_out``, ``decide``: :class:`DecisionEngine`). With ``decider`` (a
    ``decide=1`` engine beside ``engine``'s language model: a served pair) each question is read
    by its reader (:meth:`SystemOneRequest.reader_of` over the pair's default ``reader``; one of
    :data:`gateway.decision.readers.READERS`): the decision engine (:func:`_decide_path`), the
    language model (:func:`_score_path`, under ``settings``), or both and combined
    (:func:`gateway.decision.readers.combine`); both engines are asked at once. Raises
    :class:`Refused` for a request the served engine cannot take (``cache_slot`` out of range,
    ``prefix`` on a decision engine, a text it refuses), :class:`DecisionTimeout`,
    :class:`UnusableScores` / :class:`UnusableDecision` for an answer it cannot read, and lets
    the engine's own errors (:mod:`gateway.engine.errors`) through.
    """
    out = Decided(probs={})
    for q in request.questions:
        # accepted (a scale may describe only some of its levels), but said: the model sees "2: " alone
        if q.type == "score":
            empty = [str(i) for i, level in enumerate(q.criteria) if isinstance(level, str) and not level.strip()]
            if empty:
                out.warnings.append(
                    f"question {q.id!r}: level {empty[0]} is empty: the model reads only its number"
                    if len(empty) == 1
                    else f"question {q.id!r}: levels {', '.join(empty)} are empty: the model reads only their numbers"
                )
    asked = []
    for q in request.questions:
        if q.n_options == 1:
            out.probs[q.id] = [1.0]
        else:
            asked.append(q)
    if asked and decider is not None:
        await _pair(request, engine, decider, settings, memory, asked, reader, out)
    elif asked:
        if engine.caps.decide:
            await _decide_path(engine, settings, request, asked, out)
            if request.debias:
                out.warnings.append("x_debias is not applied: the decision engine answers natively")
        else:
            await _score_path(engine, settings, memory, request, asked, out)
    return out


async def _pair(
    request: SystemOneRequest,
    lm: DecisionEngine,
    decider: DecisionEngine,
    settings: Settings,
    memory: Memory,
    asked: list[Question],
    default: str,
    out: Decided,
) -> None:
    """A served pair's questions: each reader's questions on its engine (both at once), then each
    combination from the two answers. The language model's counters, corrections and label mass are
    the reply's; the calibration, label mass, head and hidden state of a question are said only where
    the language model alone read it."""
    chosen = {q.id: request.reader_of(q.id, default) for q in asked}
    to_decider = [q for q in asked if readers.needs(chosen[q.id])[0]]
    to_lm = [q for q in asked if readers.needs(chosen[q.id])[1]]
    by_decider, by_lm = Decided(probs={}), Decided(probs={})
    async with anyio.create_task_group() as tg:
        if to_decider:  # the decision engine has its own slots: the language model's cache_slot is not its
            unslotted = attrs.evolve(request, cache_slot=None)
            tg.start_soon(_decide_path, decider, settings, unslotted, to_decider, by_decider)
        if to_lm:
            tg.start_soon(_score_path, lm, settings, memory, request, to_lm, by_lm)
    for q in asked:
        r = chosen[q.id]
        out.readers[q.id] = r
        if r == "decider":
            out.probs[q.id] = by_decider.probs[q.id]
        elif r == "lm":
            out.probs[q.id] = by_lm.probs[q.id]
            for field in ("calibration", "uncalibrated", "label_mass", "heads", "head_debias", "hidden"):
                if q.id in getattr(by_lm, field):
                    getattr(out, field)[q.id] = getattr(by_lm, field)[q.id]
        else:
            out.probs[q.id] = scoring.report(readers.combine(r, by_decider.probs[q.id], by_lm.probs[q.id]))
    out.path = "+".join(p for p, qs in (("decide", to_decider), ("score", to_lm)) if qs)
    out.engine_ms = max(by_decider.engine_ms, by_lm.engine_ms)
    out.input_tokens = max(by_decider.input_tokens, by_lm.input_tokens)
    out.output_tokens = by_lm.output_tokens
    out.prompt_tokens = by_lm.prompt_tokens
    out.warnings += by_lm.warnings + by_decider.warnings
    if to_lm:
        out.debias, out.computed, out.reused, out.disk = by_lm.debias, by_lm.computed, by_lm.reused, by_lm.disk
        out.snapshot = by_lm.snapshot
    elif request.debias:
        out.warnings.append("x_debias is not applied: the decision engine answers natively")


def _check_slot(engine: DecisionEngine, request: SystemOneRequest) -> None:
    """Refuse a ``cache_slot`` past the engine's slots (naming the field)."""
    slots = max(1, int(engine.caps.slots or 1))
    if request.cache_slot is not None and request.cache_slot >= slots:
        raise Refused(
            [
                {
                    "loc": ["body", "cache_slot"],
                    "msg": f"The engine has {slots} KV slot(s): 0..{slots - 1}",
                    "type": "less_than",
                }
            ]
        )


_T = TypeVar("_T")


async def _call(settings: Settings, fn: Callable[..., Awaitable[_T]], *args: Any, **kwargs: Any) -> _T:
    """One engine call under the server's time limit (:class:`DecisionTimeout` past it)."""
    try:
        with anyio.fail_after(settings.timeout):
            return await fn(*args, **kwargs)
    except TimeoutError:
        raise DecisionTimeout(settings.timeout) from None


def _n_ctx(engine: DecisionEngine) -> int | None:
    return refusals.max_prompt(engine.caps)


def _refuse(
    engine: DecisionEngine,
    exc: BaseException,
    owners: list[Question | None],
    request: SystemOneRequest,
    read_owners: list[tuple[int, ...]] | None = None,
) -> None:
    """Raise :class:`Refused` naming the request's own field when ``exc`` is the engine's
    ``BAD_REQUEST`` of a text it cannot score (:func:`gateway.decision.refusals.scoring_refusal`);
    return otherwise (the caller re-raises ``exc``)."""
    if not isinstance(exc, RequestError) or exc.code != "BAD_REQUEST":
        return
    entry = refusals.scoring_refusal(exc.reason or "", owners, request, _n_ctx(engine), read_owners)
    if entry is not None:
        raise Refused([entry]) from None


def _add(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else a + b


async def _score_path(
    engine: DecisionEngine,
    settings: Settings,
    mem: Memory,
    request: SystemOneRequest,
    questions: list[Question],
    out: Decided,
) -> None:
    prompts = settings.prompts
    prefix_text = prompts.prefix(request.state, request.prefix)
    # pictures (gateway.decision.pictures): their markers in the prefix, read in one SCORE with them, which
    # takes no snapshot, reads no hidden state (no head answers) and photographs no fixed prefix
    shown: tuple[bytes, ...] = ()
    keys: tuple[str, ...] = ()
    if request.pictures:
        prefix_text, keys = pictures.place(prefix_text, request.pictures)
        shown = tuple(request.pictures[k] for k in keys)
    if request.cache_slot is not None:
        _check_slot(engine, request)
    methods = request.debias if request.debias is not None else settings.debias
    method = readings.Method.from_names(methods)
    calibration = settings.calibration
    # one group per read of a question (gateway.decision.readings.plan); spans[i] = (first group, reads) of question i
    groups: list[tuple[str, list[str]]] = []
    read_owners: list[tuple[int, ...]] = []  # per group, the reply option of each scored text (Read.owner)
    spans: list[tuple[int, int]] = []
    owners: list[Question | None] = []  # the question of each group, to name a refused option's field
    # the questions a head answers (gateway.decision.heads): read under the head's x_debias (none: one
    # prompt), its layer's hidden state read in the same SCORE; the others as the request says
    matched: dict[str, Any] = {}
    if settings.heads is not None and request.head != "none" and engine.caps.x_hidden and not shown:
        for q in questions:
            h = settings.heads.match(q)
            if h is not None:
                matched[q.id] = h
    unmatched = [q for q in questions if q.id not in matched]
    for q in questions:
        try:
            m = readings.Method.from_names(matched[q.id].methods) if q.id in matched else method
            reads = readings.plan(q.type, q.instructions, q.criteria, q.n_options, m)
        except ValueError as exc:
            raise Refused(
                [{"loc": ["body", "questions", q.id, "criteria"], "msg": str(exc), "type": "value_error"}]
            ) from None
        spans.append((len(groups), len(reads)))
        for rd in reads:
            groups.append((prompts.stem(rd.text), list(rd.scored)))
            read_owners.append(rd.owner)
            owners.append(q)
    layers = () if shown else tuple(sorted({*settings.hidden, *(h.layer for h in matched.values())}))
    seen = mem.seen(prefix_text)
    pin = request.pin_state if request.pin_state is not None else (len(questions) >= 2 or seen)
    pin = pin and not shown
    slot = request.cache_slot
    # With no cache_slot the supervisor routes a request to the slot that last
    # served its prefix; a fixed prefix routes by itself, so the frames that
    # share it meet its snapshot.
    route = {}
    t0 = time.perf_counter()
    fixed_key: tuple[int | None, str] | None = None
    photographed: int | None = None  # the photograph's tokens, when this request took it
    if request.prefix and not shown:
        fixed = prompts.fixed_prefix(request.prefix)
        route = {"route": fixed}
        fixed_key = (slot, fixed)
        if fixed_key not in mem.fixed:
            try:
                taken = await _call(settings, engine.read_out, fixed, logprobs=1, pin=True, slot=slot, **route)
            except RequestError as exc:
                if exc.code == "BAD_REQUEST" and refusals.too_long(exc.reason or ""):
                    n = _n_ctx(engine)
                    raise Refused(
                        [
                            {
                                "loc": ["body", "prefix"],
                                "type": "too_long",
                                "msg": f"The prefix is longer than the engine's context"
                                f"{f' of {n} tokens' if n else ''}",
                            }
                        ]
                    ) from None
                raise
            photographed = int(taken.done.prompt_tokens)
            mem.fixed[fixed_key] = photographed
            out.computed = _add(out.computed, taken.done.computed)
            out.reused = _add(out.reused, taken.done.reused)
    free = _FreeReading.plan(settings, request, unmatched, method) if method.content_free and unmatched else None
    if free is not None:
        await free.wait_for_others(mem)
    beside = free.groups() if free is not None and free.missing else None
    try:
        if free is not None and free.missing:
            free.claim(mem)
        try:
            extra: dict[str, Any] = {"beside": beside} if beside else {}
            if layers:
                extra["hidden"] = layers
            if shown:
                extra["pictures"] = shown
            result = await _call(settings, engine.score, prefix_text, groups, pin=pin, slot=slot, **route, **extra)
        except Exception as exc:
            if shown and isinstance(exc, RequestError) and exc.code == "BAD_REQUEST":
                entry = pictures.refusal(exc.reason or "", keys)
                if entry is not None:
                    raise Refused([entry]) from None
            _refuse(
                engine,
                exc,
                owners + (free.owners() if free is not None and beside else []),
                request,
                read_owners + (free.read_owners() if free is not None and beside else []),
            )
            raise
        content_free = (
            dict(zip((q.id for q in unmatched), free.finish(mem, result.groups[len(groups) :], request.normalize, out)))
            if free is not None
            else None
        )
    finally:
        if free is not None:
            free.release(mem)
    out.engine_ms = (time.perf_counter() - t0) * 1e3
    out.path = "score"
    if methods:
        out.debias = methods
    done = result.done
    out.computed = _add(out.computed, result.computed)
    out.reused = _add(out.reused, result.reused)
    out.disk = _add(out.disk, result.disk)
    out.snapshot = done.snapshot if done is not None else None
    if fixed_key is not None:
        _after_fixed(mem, fixed_key, photographed, result)
    vectors = result.hidden
    for q, (start, k) in zip(questions, spans):
        mass = question_mass(
            [
                [
                    (text, int(o.context_tokens), o.logprobs[0] if o.logprobs else float("nan"))
                    for text, o in zip(groups[g][1], result.groups[g])
                ]
                for g in range(start, start + k)
            ]
        )
        if mass is not None:
            out.label_mass[q.id] = mass
        if settings.hidden:
            out.hidden[q.id] = {la: vectors[start, la] for la in settings.hidden if (start, la) in vectors}
        head = matched.get(q.id)
        if head is not None and (start, head.layer) in vectors:
            out.probs[q.id] = scoring.report(head.predict(vectors[start, head.layer]))
            out.heads[q.id] = head.name
            out.head_debias[q.id] = tuple(head.methods)
            continue
        rows = [[tuple(o.logprobs) for o in result.groups[g]] for g in range(start, start + k)]
        counts = {len(x) for x in rows[0]}
        if request.normalize == "mean" and len(counts) > 1:
            log.warning("question %r: normalize=mean over options of %d to %d tokens", q.id, min(counts), max(counts))
            out.warnings.append(
                f"question {q.id!r}: normalize=mean over options of different token counts "
                f"({min(counts)} to {max(counts)}): a per-token average favours the longer options"
            )
        try:
            if methods:
                per_read = [
                    readings.log_probs(read_owners[start + j], lps, request.normalize) for j, lps in enumerate(rows)
                ]
                cf = content_free.get(q.id) if content_free is not None else None
                p = softmax(readings.combine(per_read, cf))
            else:
                p = softmax(option_scores(rows[0], request.normalize))
            if calibration is not None:
                before = p
                p, out.calibration[q.id] = calibration.apply(q.type, p, methods)
                if out.calibration[q.id] != IDENTITY:
                    out.uncalibrated[q.id] = scoring.report(before)
            out.probs[q.id] = scoring.report(p)
        except ValueError as exc:
            raise UnusableScores(f"the engine's scores for {q.id!r} are unusable: {exc}") from None
    longest = 0
    for group in result.groups[: len(groups)]:  # the content-free groups are counted by finish()
        for o in group:
            longest = max(longest, int(o.context_tokens) + len(o.logprobs))
            out.output_tokens += len(o.logprobs)
    out.input_tokens = longest
    for q, (start, k) in zip(questions, spans):
        out.prompt_tokens[q.id] = max(
            int(o.context_tokens) + len(o.logprobs) for g in range(start, start + k) for o in result.groups[g]
        )


def _after_fixed(mem: Memory, key: tuple[int | None, str], photographed: int | None, result: ScoreResult) -> None:
    """Keep or forget the photograph of a fixed prefix after the SCORE that read a prompt on it.

    A SCORE that finds the prefix in the slot's live KV reports ``snapshot=none`` with the prefix's
    positions in ``reused``; one that restores the photograph reports ``hit``. Either way the prefix
    was not read again, so the photograph is kept: it is forgotten (taken again by the next request)
    only when the engine found it ``stale`` or the SCORE reused fewer positions than it holds (the
    engine evicted it and the slot holds something else). When that happens right after this
    request took it, the photograph is not a token prefix of the prompts (a tokenizer that joins
    the prefix's last characters with what follows): taking it again would read it for nothing each
    time, so it is kept with 0 positions (never taken again; the slot's live KV is all that helps).
    An engine without counters (``reused`` None) keeps it as it is.
    """
    done = result.done
    snapshot = done.snapshot if done is not None else None
    held = mem.fixed.get(key)
    if held is None or result.reused is None:
        return
    if snapshot == "stale":
        mem.fixed.pop(key, None)
    elif int(result.reused) < held:
        if photographed is not None:
            log.info("a fixed prefix's photograph of %d tokens is not a token prefix of its prompt", held)
            mem.fixed[key] = 0
        else:
            mem.fixed.pop(key, None)


@attrs.define
class _FreeReading:
    """A request's content-free readings (:mod:`gateway.decision.debias`): what each question needs,
    what is not remembered yet, and the groups that read it beside the state.

    Each question's readings depend on its content-free reads
    (:func:`gateway.decision.readings.content_free_plan`: stems and scored texts),
    the fixed prefix and ``normalize``, never on the state: read once and
    remembered in :class:`Memory`. The missing ones are read in the request's
    own ``SCORE``, as groups on the prompt's head (up to where the state starts:
    ``Engine.score(beside=...)``), so the slot keeps the state and the request
    reports its snapshot. A request that needs a question another request is
    reading waits for it rather than reading it again; nothing is shielded, so
    a client that leaves cancels its reading and a waiter reads it itself.
    """

    prefix: str  # the prompt up to where the state would start
    keys: list[tuple[Any, ...]]  # per question: (prefix, normalize, ((stem, scored, owner), ...))
    owner_of: dict[tuple[Any, ...], Question]
    missing: list[tuple[Any, ...]] = attrs.field(factory=list)
    event: anyio.Event | None = None

    @classmethod
    def plan(
        cls, settings: Settings, request: SystemOneRequest, questions: list[Question], method: readings.Method
    ) -> _FreeReading:
        prefix = settings.prompts.prefix("", request.prefix)
        keys = []
        for q in questions:
            reads = readings.content_free_plan(q.type, q.instructions, q.criteria, q.n_options, method)
            keys.append(
                (
                    prefix,
                    request.normalize,
                    tuple((settings.prompts.stem(rd.text), rd.scored, rd.owner) for rd in reads),
                )
            )
        owner_of: dict[tuple[Any, ...], Question] = {}
        for key, q in zip(keys, questions):
            owner_of.setdefault(key, q)
        return cls(prefix, keys, owner_of)

    async def wait_for_others(self, mem: Memory) -> None:
        """Wait while another request reads a question this one needs; then ``missing`` is what to read."""
        while True:
            self.missing = [key for key in dict.fromkeys(self.keys) if key not in mem.content_free]
            waiting = [mem.reading[key] for key in self.missing if key in mem.reading]
            if not waiting:
                return
            for event in waiting:
                await event.wait()

    def claim(self, mem: Memory) -> None:
        """Say that this request reads ``missing`` (others wait for it)."""
        self.event = anyio.Event()
        for key in self.missing:
            mem.reading[key] = self.event

    def release(self, mem: Memory) -> None:
        """Done (read, failed or cancelled): wake the waiters, who read what is still missing."""
        if self.event is None:
            return
        for key in self.missing:
            if mem.reading.get(key) is self.event:
                del mem.reading[key]
        self.event.set()
        self.event = None

    def groups(self) -> tuple[str, list[tuple[str, list[str]]]]:
        """``(base, groups)`` for ``Engine.score(beside=...)``: each missing question's reads on each
        content-free state."""
        return self.prefix, [
            (state + stem, list(scored))
            for key in self.missing
            for state in debias.CONTENT_FREE_STATES
            for stem, scored, _ in key[2]
        ]

    def owners(self) -> list[Question | None]:
        """The question of each of :meth:`groups`' groups (to name a refused option's field)."""
        return [self.owner_of[key] for key in self.missing for _ in debias.CONTENT_FREE_STATES for _ in key[2]]

    def read_owners(self) -> list[tuple[int, ...]]:
        """The reply option of each scored text, per group of :meth:`groups`."""
        return [owner for key in self.missing for _ in debias.CONTENT_FREE_STATES for _s, _o, owner in key[2]]

    def finish(self, mem: Memory, scored: list[list[OptionScore]], normalize: str, out: Decided) -> list[list[float]]:
        """Remember the readings of ``missing`` from their groups' results (``scored``: one list of
        :class:`gateway.engine.score.OptionScore` per group of :meth:`groups`); return each question's
        mean content-free log-probabilities, one list of ``n_options`` floats per question."""
        g = 0
        for key in self.missing:
            per_read = []
            for _ in debias.CONTENT_FREE_STATES:
                for _stem, _scored, owner in key[2]:
                    lps = [tuple(o.logprobs) for o in scored[g]]
                    out.output_tokens += sum(len(x) for x in lps)
                    try:
                        per_read.append(readings.log_probs(owner, lps, normalize))
                    except ValueError as exc:
                        raise UnusableScores(f"the engine's content-free scores are unusable: {exc}") from None
                    g += 1
            mem.remember_content_free(key, readings.mean_log_probs(per_read))
        return [mem.content_free[key] for key in self.keys]


async def _decide_path(
    engine: DecisionEngine, settings: Settings, request: SystemOneRequest, questions: list[Question], out: Decided
) -> None:
    if request.prefix is not None:
        raise Refused(
            [
                {
                    "loc": ["body", "prefix"],
                    "type": "value_error",
                    "msg": "A decision engine takes no prefix: put that text in state or instructions",
                }
            ]
        )
    slot = request.cache_slot if request.cache_slot is not None else 0
    _check_slot(engine, request)
    raw = engine.caps.decide_record == "raw"
    # x_decide_json=sent: the raw form's JSON in the caller's key order (an engine that renders it as sent)
    sort_keys = getattr(engine.caps, "decide_json", None) != "sent"
    payload = record.serialize(record.build(request, tuple(questions), raw=raw, sort_keys=sort_keys))
    t0 = time.perf_counter()
    try:
        decision, done = await _call(settings, engine.decide, payload, slot=slot)
    except RequestError as exc:
        if exc.code == "DECIDE_INVALID":
            raise Refused([refusals.decide_refusal(exc.reason or "", questions)]) from None
        raise
    wall_ms = (time.perf_counter() - t0) * 1e3
    try:
        probs = record.probabilities(decision, tuple(questions))
    except UnusableDecision as exc:
        raise UnusableDecision(f"the decision engine's answer is unusable: {exc}") from None
    for q in questions:
        out.probs[q.id] = scoring.report(probs[q.id])
    tokens = decision.get("input_tokens")
    if not isinstance(tokens, int) or isinstance(tokens, bool):
        tokens = done.prompt_tokens
    out.input_tokens = int(tokens)
    engine_ms = decision.get("engine_ms")
    out.engine_ms = (
        float(engine_ms) if isinstance(engine_ms, (int, float)) and not isinstance(engine_ms, bool) else wall_ms
    )
    out.path = "decide"
