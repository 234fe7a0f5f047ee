"""The engine supervisor's public surface, and the drive-by-hand API.

``async with Engine.spawn(argv, name=...) as eng:`` starts an engine process
(supervised: restarted with backoff when it crashes, hangs or breaks the
protocol, see :mod:`gateway.engine.supervisor`), and gives one object to
``submit`` (stream events), ``read_out`` (prompt log-probabilities),
``score`` (options' log-probabilities, SCORE or the seed's pin + SUBMIT),
``decide`` (a decision engine's DECISION) and ``ping``. Requests are
multiplexed by id over the engine's pipe, queued FIFO per KV slot, and every
one ends with its DONE, its ``RequestError``, or the engine's typed error.
"""

from __future__ import annotations

import json
import os
import re
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, Sequence, Union  # noqa: UP035  (Text and Groups below are runtime aliases)

import anyio
import attrs
import orjson

from gateway.engine.errors import (
    EngineBusy,
    EngineProtocolError,
    EngineTimeout,
    EngineUnavailable,
    RequestError,
)
from gateway.engine.options import EngineOptions
from gateway.engine.process import EngineProcess, Inflight, unwrapped
from gateway.engine.request import RequestStream
from gateway.engine.score import OptionScore, option_tokens
from gateway.engine.slots import SlotLease
from gateway.engine.supervisor import Supervisor
from serveproto import (
    Accept,
    Caps,
    Decide,
    Decision,
    Done,
    Echo,
    Event,
    Hidden,
    Image,
    Ping,
    Pong,
    Score,
    Scored,
    Submit,
)

Text = Union[str, bytes]  # noqa: UP007  (a runtime alias: keep the typing.Union object)
#: ``score()`` groups: ``[(stem, [option, ...]), ...]``, or a flat ``[option, ...]``
#: meaning one group with an empty stem.
Groups = Union[Sequence[tuple[Text, Sequence[Text]]], Sequence[Text]]  # noqa: UP007  (a runtime alias)


def _bytes(value: Text, field: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    raise TypeError(f"{field}: expected str or bytes, got {type(value).__name__}")


def _text(value: Text) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


@attrs.frozen
class ReadOut:
    """A prompt's read-out (``SUBMIT ... max_tokens=0 logprobs=k``).

    ``echoes``: one ``Echo`` per fresh prompt position, in position order
    (``position``, ``logprob`` in nats, ``top``: ``k`` pairs
    ``(token_id, logprob)``, ``text``: the token's bytes); ``done``: the DONE
    (``prompt_tokens``; ``computed`` / ``reused`` / ``snapshot`` when the
    engine has ``x_counters``); ``accept``: the ACCEPT, if any.
    """

    echoes: list[Echo]
    done: Done
    accept: Accept | None = None

    @property
    def logprobs(self) -> list[float]:
        """Shape ``(len(echoes),)``: each read-out position's logprob (nats; ``nan`` at a
        cold position 0)."""
        return [e.logprob for e in self.echoes]

    @property
    def tokens(self) -> list[bytes]:
        """Shape ``(len(echoes),)``: each read-out position's token text."""
        return [e.text for e in self.echoes]


@attrs.frozen
class ScoreResult:
    """Options scored in context (spec 9.1).

    ``groups[g][o]`` is the :class:`OptionScore` of option ``o`` of group
    ``g``, in request order. ``done``: the SCORE's DONE, or ``None`` on the
    fallback path (several SUBMITs). ``computed`` / ``reused``: prompt
    positions run through the model / taken from the KV cache or a snapshot,
    summed over the request (``None`` when the engine has no counters).
    ``disk``: how many of ``reused`` the engine read from files an earlier process of it wrote
    (``None`` when it keeps nothing on disk: no ``x_persist``).
    ``fast``: True when the engine's SCORE did it in one request.
    """

    groups: list[list[OptionScore]]
    done: Done | None = None
    computed: int | None = None
    reused: int | None = None
    fast: bool = False
    disk: int | None = None
    #: SCORE's ``hidden`` (spec 9.1): ``{(group, layer): (n_embd,) float32 values}``; empty when
    #: not asked for, or on a path that does not read them (the fallback, folded stems).
    hidden: dict[tuple[int, int], tuple[float, ...]] = attrs.field(factory=dict)


#: Groups as the engine sends them: ``[(stem, [option, ...]), ...]`` in bytes (:func:`_normalize_groups`).
_Groups = list[tuple[bytes, list[bytes]]]


def _caps(proc: EngineProcess) -> Caps:
    """A serving process's CAPS: :meth:`Supervisor.instance` returns processes past their handshake only."""
    assert proc.caps is not None
    return proc.caps


#: The group of a folded SCORE's refusal (always its group 0), renamed to the caller's group.
_GROUP0 = re.compile(r"^groups\[0\]")


def past_one_batch(exc: RequestError) -> bool:
    """Whether a SCORE was refused because a stem and option do not fit one engine batch (the
    llama engine's ``groups[g].options[o]: the text does not fit one batch of N``), which scoring
    the group on ``prefix + stem`` avoids (:meth:`Engine._score_folded`)."""
    return exc.code == "BAD_REQUEST" and "does not fit one batch" in (exc.reason or "")


def _plus(a: int | None, b: int | None) -> int | None:
    """The sum of two counters, None when either engine call had none."""
    return None if a is None or b is None else a + b


def _normalize_groups(groups: Groups) -> list[tuple[bytes, list[bytes]]]:
    if isinstance(groups, (str, bytes)) or not groups:
        raise ValueError("groups: expected a non-empty list of (stem, [options]) or of options")
    pairs: Sequence[Any] = groups
    if all(isinstance(g, (str, bytes)) for g in groups):
        pairs = [("", list(groups))]
    out = []
    for gi, g in enumerate(pairs):
        try:
            stem, options = g
        except (TypeError, ValueError):
            raise ValueError(f"groups[{gi}]: expected (stem, [options])") from None
        if isinstance(options, (str, bytes)) or not options:
            raise ValueError(f"groups[{gi}].options: expected a non-empty list of texts")
        out.append(
            (
                _bytes(stem, f"groups[{gi}].stem"),
                [_bytes(o, f"groups[{gi}].options[{oi}]") for oi, o in enumerate(options)],
            )
        )
    return out


class Engine:
    """One supervised engine command; see the module docstring. Build with :meth:`spawn`."""

    def __init__(
        self, supervisor: Supervisor, *, request_timeout: float | None = None, max_waiting: int | None = None
    ) -> None:
        self._sup = supervisor
        self.request_timeout = request_timeout
        self.max_waiting = max_waiting

    # ------------------------------------------------------------ lifetime

    @classmethod
    @asynccontextmanager
    async def spawn(
        cls,
        argv: Sequence[str],
        *,
        name: str | None = None,
        options: EngineOptions | None = None,
    ) -> AsyncIterator[Engine]:
        """Start ``argv`` (a list, no shell), wait for its handshake, yield the :class:`Engine`.

        ``options``: :class:`gateway.engine.options.EngineOptions` (default: its defaults), passed
        whole to the supervisor and each process (one field changed: ``dataclasses.replace``, or
        :meth:`EngineOptions.updated` by its flat name, ``handshake_timeout=10, max_restarts=0``).
        Its fields, in seconds: ``handshake_timeout`` (READY..STAT), ``health_interval`` (an
        engine with ``x_health`` is PINGed this often, busy or idle; ``None``: never) and
        ``ping_timeout`` (a PING unanswered this long: the engine is stalled, asked for its stack
        when it advertises ``x_stack`` (spec 9.3, up to 1 s), killed and restarted, its requests
        fail with :class:`EngineTimeout` ``what="stall"`` whatever their
        own deadlines; :attr:`healthy` is already False once a PING waits longer than
        ``health_interval``), ``stall_timeout`` (no output while requests are in flight: the
        engine is declared hung the same way; the watchdog of an engine without ``x_health``;
        ``None`` trusts the engine forever, and a request written to an engine that stopped
        reading its stdin then waits with it), ``request_timeout`` (default deadline of each
        request, ``None``: none), ``drain_timeout`` / ``term_timeout`` (the shutdown ladder: EOF,
        drain, SIGTERM, SIGKILL). Restarts: at most ``max_restarts`` within ``restart_period`` s
        (``None``: no limit), backoff doubling from ``backoff_initial`` to ``backoff_max`` s; then
        health fails for good and :meth:`wait_stopped` returns. The engine's stderr is logged
        line by line to ``gateway.engine.<name>`` (at INFO, at most ``stderr_lines_per_s`` lines a
        second, the rest counted; a stack block whole, at WARNING). ``max_waiting``: with that many
        callers already queued for slots,
        a new request raises :class:`EngineBusy` at once (``None``: queue without bound).

        Raises, from the first start (never retried): :class:`EngineLoadError`
        (LOAD_FAIL, or ``argv[0]`` cannot be executed), :class:`EngineTimeout`
        (``what="handshake"``), :class:`EngineCrashed`, :class:`EngineProtocolError`.
        """
        if not argv:
            raise ValueError("argv: the engine command is empty")
        name = name or os.path.basename(os.fspath(argv[0]))
        options = options or EngineOptions()
        sup = Supervisor(argv, name=name, options=options)
        with unwrapped():
            async with anyio.create_task_group() as tg:
                await tg.start(sup.run)
                try:
                    yield cls(sup, request_timeout=options.request_timeout, max_waiting=options.max_waiting)
                finally:
                    sup.close()

    # ------------------------------------------------------------ state

    @property
    def name(self) -> str:
        """The engine's name (logs, errors)."""
        return self._sup.name

    @property
    def caps(self) -> Caps:
        """The serving process's CAPS (typed: ``slots``, ``n_ctx``, ``x_score``, ...).

        Raises :class:`EngineUnavailable` while no process serves (restarting, closed).
        """
        cur = self._sup.current
        if cur is None or cur.caps is None:
            raise EngineUnavailable(f"engine {self.name!r} has no serving process now", name=self.name)
        return cur.caps

    @property
    def healthy(self) -> bool:
        """True while a process serves and answers its PINGs in time; False while it is
        unresponsive, restarting, after giving up, or closed."""
        return self._sup.healthy

    @property
    def state(self) -> str:
        """``"serving"``, ``"unresponsive"``, ``"restarting"``, ``"gave_up"`` or ``"closed"``
        (see :attr:`gateway.engine.supervisor.Supervisor.state`)."""
        return self._sup.state

    @property
    def gave_up(self) -> bool:
        """True once the restart intensity was exceeded: health failed for good."""
        return self._sup.gave_up

    @property
    def restarts(self) -> int:
        """How many times the engine was restarted."""
        return self._sup.restarts

    @property
    def last_error(self) -> BaseException | None:
        """Why the last engine process ended, or ``None``."""
        return self._sup.last_error

    @property
    def exit_statuses(self) -> tuple[int | None, ...]:
        """Exit status of each engine process that served and ended, oldest first
        (negative: killed by that signal; -15 SIGTERM and -9 SIGKILL come from the
        shutdown ladder)."""
        return tuple(self._sup.exit_statuses)

    @property
    def pid(self) -> int | None:
        """The serving process's id, or ``None``."""
        cur = self._sup.current
        return cur.pid if cur is not None else None

    @property
    def in_flight(self) -> int:
        """Requests sent to the serving process and not ended yet."""
        cur = self._sup.current
        return cur.in_flight if cur is not None else 0

    @property
    def waiting(self) -> int:
        """Callers queued for a slot of the serving process."""
        cur = self._sup.current
        return cur.router.waiting() if cur is not None and cur.router is not None else 0

    async def wait_stopped(self) -> None:
        """Return once the supervisor stopped for good: it gave up (:attr:`gave_up`) or was closed."""
        await self._sup.wait_closed()

    async def wait_ready(self) -> None:
        """Wait until a process serves (through a restart).

        Raises :class:`EngineUnavailable` if none will (closed, or gave up)."""
        await self._sup.instance()

    # ------------------------------------------------------------ requests

    def request(
        self,
        make: Callable[[int, int], Event | tuple[Event, ...]],
        *,
        slot: int | None = None,
        route: Text | None = None,
        timeout: float | None = None,
        slotless: bool = False,
        pin: bool = False,
    ) -> RequestStream:
        """Low level: send the request ``make(id, slot)`` builds, stream its replies.

        ``make`` gets a fresh id and the KV slot chosen (explicit ``slot``, or
        routed by ``route``) and returns a ``serveproto`` request event, or a
        tuple of events written together (``Image`` frames, then their request).
        ``slotless`` (PING) takes no slot. ``pin``: the request pins ``route``'s
        state; once it has ended with DONE, later requests on that state may
        take any free slot (:class:`gateway.engine.slots.SlotRouter`).
        See :class:`RequestStream`.
        """
        key = _bytes(route, "route") if route is not None else b""
        timeout = self.request_timeout if timeout is None else timeout

        async def start() -> tuple[EngineProcess, Inflight]:
            proc = await self._sup.instance()
            if slotless:
                return proc, await proc.begin(make, None)
            lease = await self._acquire(proc, slot, key, pin)
            try:
                return proc, await proc.begin(make, lease)
            finally:
                lease.close()

        return RequestStream(start, timeout=timeout, name=self.name)

    async def _acquire(self, proc: EngineProcess, slot: int | None, key: bytes, pin: bool = False) -> SlotLease:
        waiting = proc.router.waiting() if proc.router is not None else 0
        if self.max_waiting is not None and waiting >= self.max_waiting:
            raise EngineBusy(
                f"engine {self.name!r} is busy: {waiting} request(s) already wait for a slot",
                name=self.name,
                waiting=waiting,
            )
        return await proc.acquire(slot, key, pin)

    def _on_lease(self, proc: EngineProcess, lease: SlotLease, make: Callable[[int, int], Event]) -> RequestStream:
        async def start() -> tuple[EngineProcess, Inflight]:
            return proc, await proc.begin(make, lease)

        return RequestStream(start, name=self.name)

    def submit(
        self,
        prompt: Text,
        *,
        max_tokens: int = 16,
        temperature: float = 0.0,
        top_p: float = 1.0,
        logprobs: int = 0,
        pin: bool = False,
        slot: int | None = None,
        counters: bool = True,
        grammar: Text | None = None,
        ids: bool = False,
        route: Text | None = None,
        timeout: float | None = None,
    ) -> RequestStream:
        """``SUBMIT`` a prompt; iterate the reply events.

        ``prompt``: text (UTF-8) or bytes (with ``ids=True``: token ids, ASCII
        decimal separated by spaces). ``max_tokens``: tokens to generate (0 only
        with ``logprobs > 0``: read the prompt out and stop); ``temperature``
        >= 0 (0: greedy); ``top_p`` in (0, 1]; ``logprobs``: 0..32 (an ``Echo``
        per fresh prompt position, a numeric tail on ``Data``); ``pin``: take a
        snapshot at the prompt's end; ``counters``: ask DONE for
        ``computed`` / ``reused`` / ``snapshot`` (sent only to an engine with
        ``x_counters``). ``slot``: explicit KV slot, else routed by ``route``
        (default: the prompt) to the slot that last served a shared prefix.
        Yields ``Accept``, ``Echo``..., ``Data``..., then ``Done``. Raises
        :class:`RequestError` on the engine's ERROR, the engine's error if it dies,
        :class:`EngineTimeout` past ``timeout`` s.
        """
        prompt_b = _bytes(prompt, "prompt")
        grammar_b = _bytes(grammar, "grammar") if grammar is not None else None

        def make(rid: int, slot_no: int) -> Submit:
            # Called by the serving process itself, so its CAPS are current.
            cur = self._sup.current
            x_counters = bool(cur is not None and cur.caps is not None and cur.caps.x_counters)
            return Submit(
                id=rid,
                slot=slot_no,
                prompt=prompt_b,
                max_tokens=max_tokens,
                temperature=temperature,
                top_p=top_p,
                grammar=grammar_b,
                logprobs=logprobs,
                pin=pin,
                ids=ids,
                counters=bool(counters and x_counters),
            )

        return self.request(make, slot=slot, route=route if route is not None else prompt_b, timeout=timeout, pin=pin)

    async def read_out(
        self,
        prompt: Text,
        *,
        logprobs: int = 5,
        pin: bool = False,
        slot: int | None = None,
        counters: bool = True,
        ids: bool = False,
        route: Text | None = None,
        timeout: float | None = None,
    ) -> ReadOut:
        """Read a prompt out: each fresh position's logprob and its ``logprobs`` top tokens.

        ``SUBMIT ... max_tokens=0 logprobs=k`` (``logprobs`` 1..32). Returns a
        :class:`ReadOut`. Errors as :meth:`submit`.
        """
        if not 1 <= logprobs <= 32:
            raise ValueError(f"logprobs: must be 1..32 for a read-out, got {logprobs}")
        events = [
            ev
            async for ev in self.submit(
                prompt,
                max_tokens=0,
                logprobs=logprobs,
                pin=pin,
                slot=slot,
                counters=counters,
                ids=ids,
                route=route,
                timeout=timeout,
            )
        ]
        return _readout(events)

    async def score(
        self,
        prefix: Text,
        groups: Groups,
        *,
        pin: bool = False,
        slot: int | None = None,
        route: Text | None = None,
        timeout: float | None = None,
        fast: bool | None = None,
        beside: tuple[Text, Groups] | None = None,
        hidden: tuple[int, ...] = (),
        pictures: Sequence[bytes] = (),
    ) -> ScoreResult:
        """Log-probabilities of options in context: option ``o`` of group ``g`` is
        the text ``prefix + stem_g + option_o``, scored on its own tokens (spec 9.1).

        ``pictures``: encoded pictures (PNG, JPEG, ...) the prefix marks with the engine's
        marker ``<__media__>``, one each, in order (spec/serve-protocol.md section 4,
        "Pictures"): sent as IMAGE frames before one SCORE, on an engine that advertises
        ``vision`` and ``x_score`` (else :class:`RequestError` ``NOT_SUPPORTED``). Such a
        SCORE pins nothing (``pin`` must be False), reads no ``hidden``, is never folded
        nor read by the fallback; ``beside`` groups are then a second SCORE of their own,
        without the pictures.

        ``groups``: ``[(stem, [option, ...]), ...]``, or ``[option, ...]`` for
        one group with an empty stem. ``pin``: keep a snapshot of the prefix.
        ``beside``: ``(base, more_groups)``, groups scored on ``base``, a leading
        part of ``prefix`` (a content-free reading beside the state): their
        results follow ``groups``' in the result. ``hidden``: layers whose output at each
        group's context end the result carries (``ScoreResult.hidden``), on an engine that
        advertises ``x_hidden`` (else ignored) and only in one SCORE (no fallback, no fold).
        On an engine that advertises
        ``x_score_base`` they go in the same SCORE (spec 9.1, ``base``), so the
        slot keeps the whole prefix; elsewhere in a second call on the same slot.
        ``fast``: ``None`` uses SCORE when the engine advertises ``x_score``,
        ``False`` forces the seed's fallback (``prefix + stem`` with
        ``pin=1 logprobs=1 max_tokens=0``, then each option's text with
        ``logprobs=1 max_tokens=0``, reading the ECHO positions past the common
        tokens), ``True`` forces SCORE. The fallback holds the slot for one
        group at a time, so other clients get turns between groups. Returns
        :class:`ScoreResult`. Raises ValueError for malformed groups,
        :class:`RequestError` (e.g. ``BAD_REQUEST`` for an option with no
        token of its own), the engine's errors, :class:`EngineTimeout`.
        """
        prefix_b = _bytes(prefix, "prefix")
        norm = _normalize_groups(groups)
        for gi, (stem, _) in enumerate(norm):
            if not prefix_b + stem:
                raise ValueError(f"groups[{gi}].stem: prefix + stem is empty; the first option token needs a context")
        base_b, more = b"", []
        if beside is not None:
            base_b, more = _bytes(beside[0], "beside.base"), _normalize_groups(beside[1])
            if not prefix_b.startswith(base_b):
                raise ValueError("beside.base: expected a leading part of the prefix")
            for gi, (stem, _) in enumerate(more):
                if not base_b + stem:
                    raise ValueError(
                        f"beside.groups[{gi}].stem: base + stem is empty; the first option token needs a context"
                    )
        key = _bytes(route, "route") if route is not None else prefix_b or norm[0][0]
        timeout = self.request_timeout if timeout is None else timeout
        deadline = anyio.current_time() + timeout if timeout is not None else float("inf")
        with anyio.CancelScope(deadline=deadline) as scope:
            proc = await self._sup.instance()
            use_fast = _caps(proc).x_score if fast is None else fast
            hid = tuple(hidden) if _caps(proc).x_hidden else ()
            if use_fast and more and _caps(proc).x_score_base and not pictures:
                try:
                    result = await self._score_fast(
                        prefix_b, norm + more, pin, slot, key, len(norm), len(base_b), hidden=hid
                    )
                except RequestError as exc:
                    if not past_one_batch(exc):
                        raise
                    result = await self._score_folded([(prefix_b, norm, key), (base_b, more, None)], slot)
            else:
                if pictures:
                    result = await self._score_pictures(proc, prefix_b, norm, pin, slot, key, tuple(pictures))
                else:
                    result = await self._score_one(prefix_b, norm, pin, slot, key, use_fast, key, hidden=hid)
                if more:
                    extra = await self._score_one(base_b, more, False, slot, key, use_fast, None, first=len(norm))
                    result = attrs.evolve(
                        result,
                        groups=result.groups + extra.groups,
                        computed=_plus(result.computed, extra.computed),
                        reused=_plus(result.reused, extra.reused),
                        disk=_plus(result.disk, extra.disk),
                    )
        if scope.cancelled_caught:
            raise EngineTimeout(
                f"score on engine {self.name!r} did not finish within {timeout} s; cancelled",
                name=self.name,
                what="request",
                seconds=timeout or 0.0,
            )
        return result

    async def _score_pictures(
        self,
        proc: EngineProcess,
        prefix: bytes,
        groups: _Groups,
        pin: bool,
        slot: int | None,
        key: bytes,
        pictures: tuple[bytes, ...],
    ) -> ScoreResult:
        """One SCORE after IMAGE frames of ``pictures`` (:meth:`score`'s ``pictures``)."""
        caps = _caps(proc)
        if not (caps.vision and caps.x_score):
            raise RequestError("NOT_SUPPORTED", f"engine {self.name!r} reads no pictures (CAPS vision=1 and x_score=1)")
        if pin:
            raise ValueError("pin: a prefix with pictures takes no snapshot")
        return await self._score_fast(prefix, groups, False, slot, key, pictures=pictures)

    async def _score_fast(
        self,
        prefix: bytes,
        groups: _Groups,
        pin: bool,
        slot: int | None,
        key: bytes,
        n_plain: int | None = None,
        base: int = 0,
        hidden: tuple[int, ...] = (),
        pictures: tuple[bytes, ...] = (),
    ) -> ScoreResult:
        # groups[n_plain:] continue the prefix's first `base` bytes (spec 9.1, x_score_base)
        n_plain = len(groups) if n_plain is None else n_plain
        payload = orjson.dumps(
            {
                "prefix": _text(prefix),
                "groups": [
                    {"stem": _text(s), "options": [_text(o) for o in opts], **({"base": base} if g >= n_plain else {})}
                    for g, (s, opts) in enumerate(groups)
                ],
                "pin": bool(pin),
                **({"hidden": list(hidden)} if hidden else {}),
            }
        )
        table: dict[tuple[int, int], OptionScore] = {}
        vectors: dict[tuple[int, int], tuple[float, ...]] = {}
        done = None

        def make(rid: int, s: int) -> Event | tuple[Event, ...]:
            score = Score(id=rid, slot=s, payload=payload)
            return (*(Image(id=rid, data=p, grid_h=0, grid_w=0) for p in pictures), score) if pictures else score

        stream = self.request(make, slot=slot, route=key, timeout=None, pin=pin)
        async with stream:
            async for ev in stream:
                if isinstance(ev, Scored):
                    option = _text(groups[ev.group][1][ev.option])
                    table[ev.group, ev.option] = OptionScore(ev.context_tokens, tuple(ev.logprobs), option)
                elif isinstance(ev, Hidden):
                    vectors[ev.group, ev.layer] = ev.values
                elif isinstance(ev, Done):
                    done = ev
        missing = [(g, o) for g, (_, opts) in enumerate(groups) for o in range(len(opts)) if (g, o) not in table]
        if missing:
            raise EngineProtocolError(
                f"engine {self.name!r} answered SCORE without SCORED for (group, option) {missing}", name=self.name
            )
        assert done is not None  # a request's stream ends with its DONE or raises
        return ScoreResult(
            groups=[[table[g, o] for o in range(len(opts))] for g, (_, opts) in enumerate(groups)],
            done=done,
            computed=done.computed,
            reused=done.reused,
            fast=True,
            disk=done.disk,
            hidden=vectors,
        )

    async def _score_one(
        self,
        prefix: bytes,
        groups: _Groups,
        pin: bool,
        slot: int | None,
        key: bytes,
        fast: bool,
        fold_route: bytes | None,
        first: int = 0,
        hidden: tuple[int, ...] = (),
    ) -> ScoreResult:
        """One prefix's groups: a SCORE (``fast``; its stems past one batch folded into the prefix,
        :meth:`_score_folded` with ``fold_route``, refusals numbered from ``first``) or the fallback."""
        if not fast:
            return await self._score_fallback(prefix, groups, pin, slot, key)
        try:
            return await self._score_fast(prefix, groups, pin, slot, key, hidden=hidden)
        except RequestError as exc:
            if not past_one_batch(exc):
                raise
            return await self._score_folded([(prefix, groups, fold_route)], slot, first)

    async def _score_folded(
        self, parts: Sequence[tuple[bytes, _Groups, bytes | None]], slot: int | None, first: int = 0
    ) -> ScoreResult:
        """Score each group in a SCORE of its own whose prefix is ``prefix + stem`` (its stem folded
        into the trunk), for groups whose stem is longer than one engine batch.

        The engine computes a SCORE's stems in one batch (spec/llama-engine.md, "SCORE"), while its
        prefix, the trunk, is read in chunks like any prompt, up to the engine's longest prompt
        (CAPS ``x_max_prompt``); a stem past a batch (255 options listed with a description each,
        about 3,400 tokens on the default model) is refused ``does not fit one batch``. Folded, the
        texts are the same bytes, so the same tokens, the same ``context_tokens`` and (with
        ``x_numerics=invariant``) the same digits; only the stems are no longer read together.
        ``parts``: ``[(prefix, groups, route), ...]`` (route None: the folded prefix itself, so a
        content-free reading does not evict the state it corrects); the result's groups are in
        their order. A refusal names the group as the caller numbered it (``first`` + its index).
        No snapshot is taken: the slot keeps the last folded prefix, and the next request on the
        same prefix reuses it from there.
        """
        out: list[list[OptionScore]] = []
        done = None
        computed: int | None = 0
        reused: int | None = 0
        disk: int | None = 0
        g = first
        for prefix, groups, route in parts:
            for stem, options in groups:
                try:
                    r = await self._score_fast(prefix + stem, [(b"", options)], False, slot, route or prefix + stem)
                except RequestError as exc:
                    raise RequestError(
                        exc.code, _GROUP0.sub(f"groups[{g}]", exc.reason, count=1), request_id=exc.request_id
                    ) from None
                out.append(r.groups[0])
                done = done or r.done
                computed, reused = _plus(computed, r.computed), _plus(reused, r.reused)
                disk = _plus(disk, r.disk)
                g += 1
        return ScoreResult(groups=out, done=done, computed=computed, reused=reused, fast=True, disk=disk)

    async def _score_fallback(
        self, prefix: bytes, groups: _Groups, pin: bool, slot: int | None, key: bytes
    ) -> ScoreResult:
        totals = {"computed": 0, "reused": 0, "counted": True}
        known_prefix: dict[int, bytes] = {}
        out = []
        for gi, (stem, options) in enumerate(groups):
            proc = await self._sup.instance()
            # Only the first group may be refused as busy: a score once begun finishes.
            lease = await (self._acquire(proc, slot, key, pin) if gi == 0 else proc.acquire(slot, key))
            slot = lease.slot  # every group on the slot that holds the snapshots
            try:
                if gi == 0 and prefix and stem and (pin or len(groups) > 1):
                    r = await self._read_on(proc, lease, prefix, True, totals)
                    known_prefix = {e.position: e.text for e in r.echoes}
                r = await self._read_on(proc, lease, prefix + stem, True, totals)
                known = dict(known_prefix)
                known.update((e.position, e.text) for e in r.echoes)
                context_len = r.done.prompt_tokens
                row = []
                for oi, opt in enumerate(options):
                    r = await self._read_on(proc, lease, prefix + stem + opt, False, totals)
                    ctx, lps = option_tokens(r.echoes, known, context_len, where=f"groups[{gi}].options[{oi}]")
                    row.append(OptionScore(ctx, lps, _text(opt)))
                out.append(row)
            finally:
                lease.close()
        counted = totals["counted"]
        return ScoreResult(
            groups=out,
            done=None,
            computed=totals["computed"] if counted else None,
            reused=totals["reused"] if counted else None,
            fast=False,
        )

    async def _read_on(
        self, proc: EngineProcess, lease: SlotLease, text: bytes, pin: bool, totals: dict[str, Any]
    ) -> ReadOut:
        counters = bool(_caps(proc).x_counters)

        def make(rid: int, s: int) -> Submit:
            return Submit(
                id=rid,
                slot=s,
                prompt=text,
                max_tokens=0,
                temperature=0.0,
                top_p=1.0,
                logprobs=1,
                pin=pin,
                counters=counters,
            )

        stream = self._on_lease(proc, lease, make)
        async with stream:
            r = _readout([ev async for ev in stream])
        if r.done.computed is None:
            totals["counted"] = False
        else:
            totals["computed"] += r.done.computed
            totals["reused"] += r.done.reused
        return r

    async def decide(
        self, record: Text | dict[str, Any], *, slot: int = 0, timeout: float | None = None
    ) -> tuple[dict[str, Any], Done]:
        """``DECIDE`` one decision record (spec/decision-record.md) on a ``decide=1`` engine.

        ``record``: the JSON record as text / bytes, or a dict (serialised as
        the spec's "Serialisation" says: ``json.dumps(record, ensure_ascii=False)``).
        Returns ``(decision, done)``: the DECISION's JSON parsed to a dict, and
        the DONE. Raises :class:`RequestError` (``DECIDE_INVALID``
        with ``<field>: <reason>``, ``DECIDE_FAILED``; ``NOT_SUPPORTED`` when the
        engine does not advertise ``decide=1``), the engine's errors.
        """
        # spec/decision-record.md "Serialisation": json.dumps with its default separators.
        data = (
            json.dumps(record, ensure_ascii=False).encode("utf-8")
            if isinstance(record, dict)
            else _bytes(record, "record")
        )
        proc = await self._sup.instance()
        if not _caps(proc).decide:
            raise RequestError("NOT_SUPPORTED", f"engine {self.name!r} does not advertise decide=1")
        decision = done = None
        stream = self.request(lambda rid, s: Decide(id=rid, slot=s, record=data), slot=slot, timeout=timeout)
        async with stream:
            async for ev in stream:
                if isinstance(ev, Decision):
                    decision = ev
                elif isinstance(ev, Done):
                    done = ev
        if decision is None:
            raise EngineProtocolError(f"engine {self.name!r} ended DECIDE without a DECISION", name=self.name)
        try:
            parsed = orjson.loads(decision.record)
        except orjson.JSONDecodeError as exc:
            raise EngineProtocolError(
                f"engine {self.name!r} sent a DECISION that is not JSON: {exc}", name=self.name
            ) from None
        assert done is not None  # a request's stream ends with its DONE or raises
        return parsed, done

    async def ping(self, *, timeout: float | None = 10.0) -> dict[str, str]:
        """``PING`` the engine (``x_health``); returns the PONG's key=value pairs
        (at least ``active``, the requests in flight). Raises :class:`RequestError`
        ``NOT_SUPPORTED`` without ``x_health``, :class:`EngineTimeout` past ``timeout`` s.
        """
        proc = await self._sup.instance()
        if not _caps(proc).x_health:
            raise RequestError("NOT_SUPPORTED", f"engine {self.name!r} does not advertise x_health=1")
        stream = self.request(lambda rid, s: Ping(id=rid), slotless=True, timeout=timeout)
        async with stream:
            async for ev in stream:
                if isinstance(ev, Pong):
                    return dict(ev.values)
        raise EngineProtocolError(f"engine {self.name!r} ended PING without PONG", name=self.name)


def _readout(events: list[object]) -> ReadOut:
    accept = next((e for e in events if isinstance(e, Accept)), None)
    echoes = [e for e in events if isinstance(e, Echo)]
    done = events[-1] if events and isinstance(events[-1], Done) else None
    if done is None:
        raise EngineProtocolError("a read-out ended without DONE")
    return ReadOut(echoes=echoes, done=done, accept=accept)
