"""Several supervised engines behind one object: several models, or one engine per GPU.

``async with Pool.spawn([EngineSpec(...), ...]) as pool:`` starts every
engine concurrently (each under its own supervisor and restart policy);
``pool.pick(model, route)`` returns the healthy engine to use: among those
serving ``model`` (its spec ``model``, else its CAPS ``model``, or its spec
name), the one that last served the same routing key unless it is
:data:`AFFINITY_SLACK` requests busier than the least loaded, else the least
loaded. ``submit`` / ``read_out`` / ``score`` / ``decide`` delegate to it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any, cast

import anyio
import attrs
from anyio.abc import TaskGroup, TaskStatus

from gateway.engine.api import Engine, Groups, ReadOut, ScoreResult, Text
from gateway.engine.errors import EngineUnavailable
from gateway.engine.options import EngineOptions
from gateway.engine.process import unwrapped
from gateway.engine.request import RequestStream
from serveproto import Caps, Done

#: Routing keys remembered for engine affinity (least recently used first out).
AFFINITY_KEYS = 4096
#: Leading bytes of a routing key that decide its engine.
AFFINITY_BYTES = 256
#: Requests (in flight + waiting) by which the engine a key last went to may exceed the least loaded
#: engine and still get the key: past that, waiting behind them costs more than reading the state again
#: (a bounded-load rule, after Mirrokni, Thorup and Zadimoghaddam 2018, "Consistent Hashing with Bounded Loads").
AFFINITY_SLACK = 4


def _argv(words: Iterable[str]) -> tuple[str, ...]:
    """:class:`EngineSpec`'s ``argv`` as a tuple (``converter=tuple``, typed)."""
    return tuple(words)


@attrs.frozen
class EngineSpec:
    """One engine of a pool: its ``name``, its command ``argv``, ``options`` (this engine's own
    changes to the pool's :class:`gateway.engine.options.EngineOptions`, by the flat names of
    :meth:`EngineOptions.updated`: timeouts, restarts, ``env`` such as ``CUDA_VISIBLE_DEVICES`` to pin one GPU)
    and the ``model`` name it serves (None: its CAPS ``model``)."""

    name: str
    argv: tuple[str, ...] = attrs.field(converter=_argv)
    options: dict[str, Any] = attrs.field(factory=dict)
    model: str | None = None


class Pool:
    """Engines behind one object; build with :meth:`spawn`."""

    def __init__(self, engines: Sequence[Engine], models: dict[str, str] | None = None) -> None:
        self.engines = list(engines)
        self._models = dict(models or {})  # engine name -> the model name it serves (spec, else first CAPS)
        #: engine name -> the CAPS of its first start (set by :meth:`spawn`).
        self.first_caps: dict[str, Caps] = {}
        self._affinity: OrderedDict[tuple[str | None, bytes], str] = OrderedDict()
        self._turn = 0

    @classmethod
    @asynccontextmanager
    async def spawn(cls, specs: Sequence[EngineSpec], options: EngineOptions | None = None) -> AsyncIterator[Pool]:
        """Start every engine of ``specs`` concurrently, each on ``options`` (default: their defaults)
        with its spec's own changes; yield the :class:`Pool`.

        Raises the first start error (ValueError for an empty or duplicate-named
        list); the engines already started are shut down gracefully.
        """
        if not specs:
            raise ValueError("specs: a pool needs at least one engine")
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"specs: engine names must be unique, got {names}")
        engines: list[Engine | None] = [None] * len(specs)
        caps: dict[str, Caps] = {}
        stop = anyio.Event()

        async def hold(spec: EngineSpec, *, task_status: TaskStatus[Engine] = anyio.TASK_STATUS_IGNORED) -> None:
            own = (options or EngineOptions()).updated(**spec.options)
            async with Engine.spawn(spec.argv, name=spec.name, options=own) as eng:
                caps[spec.name] = eng.caps  # read at its handshake: the process may be gone by the time we yield
                task_status.started(eng)
                await stop.wait()

        async def start_one(i: int, tg: TaskGroup) -> None:
            engines[i] = await tg.start(hold, specs[i])

        with unwrapped():
            async with anyio.create_task_group() as tg:
                try:
                    async with anyio.create_task_group() as starters:
                        for i in range(len(specs)):
                            starters.start_soon(start_one, i, tg)
                    pool = cls(
                        cast("list[Engine]", engines),  # every one started, or the starters raised
                        {s.name: s.model or getattr(caps[s.name], "model", None) or s.name for s in specs},
                    )
                    pool.first_caps = caps
                    yield pool
                finally:
                    stop.set()

    @property
    def healthy(self) -> bool:
        """True when at least one engine serves."""
        return any(e.healthy for e in self.engines)

    def models(self) -> list[str]:
        """The models served now (CAPS ``model``, else the engine's name), deduplicated."""
        out = []
        for e in self.engines:
            name = self.model_of(e)
            if name not in out:
                out.append(name)
        return out

    def pick(self, model: str | None = None, route: str | bytes | None = None) -> Engine:
        """The engine for a request on ``model`` (``None``: any) with routing key ``route``.

        Healthy engines serving ``model`` qualify; the one that served the same
        key (its first ``AFFINITY_BYTES`` bytes) before wins unless its load (in
        flight + waiting) exceeds the least loaded's by more than
        :data:`AFFINITY_SLACK`, else the least loaded, in turn among equals; the
        key then moves to the engine chosen. Raises :class:`EngineUnavailable`
        when none qualifies (naming the model).
        """
        fits = [e for e in self.engines if model is None or model in (self.model_of(e), e.name)]
        if not fits:
            raise EngineUnavailable(f"model: no engine serves {model!r}; served: {self.models()}")
        live = [e for e in fits if e.healthy] or [e for e in fits if not e.gave_up]
        if not live:
            raise EngineUnavailable(f"every engine for {model!r} failed for good")
        key = None
        least = min(e.in_flight + e.waiting for e in live)
        if route is not None:
            raw = route.encode("utf-8") if isinstance(route, str) else route
            key = (model, raw[:AFFINITY_BYTES])
            name = self._affinity.get(key)
            for e in live:
                if e.name == name and e.in_flight + e.waiting <= least + AFFINITY_SLACK:
                    self._affinity.move_to_end(key)
                    return e
        self._turn += 1
        best = min(range(len(live)), key=lambda i: (live[i].in_flight + live[i].waiting, (i - self._turn) % len(live)))
        chosen = live[best]
        if key is not None:
            self._affinity[key] = chosen.name
            self._affinity.move_to_end(key)
            if len(self._affinity) > AFFINITY_KEYS:
                self._affinity.popitem(last=False)
        return chosen

    def submit(self, prompt: Text, *, model: str | None = None, **kw: Any) -> RequestStream:
        """:meth:`Engine.submit` on :meth:`pick` ``(model, route or prompt)``."""
        return self.pick(model, kw.get("route") or prompt).submit(prompt, **kw)

    async def read_out(self, prompt: Text, *, model: str | None = None, **kw: Any) -> ReadOut:
        """:meth:`Engine.read_out` on :meth:`pick` ``(model, route or prompt)``."""
        return await self.pick(model, kw.get("route") or prompt).read_out(prompt, **kw)

    async def score(self, prefix: Text, groups: Groups, *, model: str | None = None, **kw: Any) -> ScoreResult:
        """:meth:`Engine.score` on :meth:`pick` ``(model, route or prefix)``."""
        return await self.pick(model, kw.get("route") or prefix).score(prefix, groups, **kw)

    async def decide(
        self, record: Text | dict[str, Any], *, model: str | None = None, **kw: Any
    ) -> tuple[dict[str, Any], Done]:
        """:meth:`Engine.decide` on a decision engine (CAPS ``decide=1``) for ``model``."""
        fits = [
            e
            for e in self.engines
            if e.healthy and e.caps.decide and (model is None or model in (self.model_of(e), e.name))
        ]
        if not fits:
            raise EngineUnavailable(f"model: no healthy decision engine for {model!r}")
        return await min(fits, key=lambda e: e.in_flight + e.waiting).decide(record, **kw)

    def model_of(self, engine: Engine) -> str:
        """The model ``engine`` serves: its spec's ``model``, else the CAPS ``model`` of its first start
        (:meth:`spawn`) or of its process now, else its name."""
        named = self._models.get(engine.name)
        if named is not None:
            return named
        try:
            return engine.caps.model or engine.name
        except EngineUnavailable:
            return engine.name
