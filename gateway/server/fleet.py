"""The engines and models behind one server, and what a request routed to one of them sees.

A :class:`Served` model is what the server knows of one model (its
description, chat template, prompts, default ``x_debias``, calibration, heads); a
:class:`Backend` is one engine with its model: the object the routes answer
through (``engine``, ``caps``, ``model``, ``prompts``, ``debias``,
``calibration``, ``request_timeout``, ``metrics``) and the engine's own
scoring memory (which states and fixed prefixes it holds as snapshots).
:meth:`gateway.server.app.App.backend` picks one per request.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import attrs

from gateway.decision import pipeline
from gateway.decision.calibration import Calibration
from gateway.decision.chat_template import ChatTemplate, TemplateError
from gateway.decision.decision_log import DecisionLog
from gateway.decision.heads import HeadSet
from gateway.decision.prompts import PromptBuilder
from gateway.engine.api import Engine
from gateway.engine.errors import EngineError
from gateway.server.lanes import Lanes
from serveproto import Caps

if TYPE_CHECKING:
    from gateway.server.app import ModelInfo
    from gateway.server.metrics import Metrics

log = logging.getLogger("serveproto.serve")


class Served:
    """One model as the server serves it: ``info`` (``gateway.server.app.ModelInfo``: the reply's
    ``model`` name, description, template, GGUF path and pieces), ``debias`` (the methods applied
    when a request sends no ``x_debias``), ``calibration`` (a ``gateway.decision.calibration.Calibration``
    or None), ``heads`` (a ``gateway.decision.heads.HeadSet`` or None), ``model_sha256`` (the GGUF's, for
    the decision log; None when unknown) and the
    :class:`PromptBuilder` of its chat template (ChatML when the template is unusable)."""

    def __init__(
        self,
        info: ModelInfo,
        debias: tuple[str, ...] = (),
        calibration: Calibration | None = None,
        model_sha256: str | None = None,
    ) -> None:
        self.info = info
        self.model_sha256 = model_sha256
        try:
            prompts = PromptBuilder(info.template)
        except TemplateError as exc:
            log.warning("the chat template of %s is unusable (%s): prompts use ChatML", info.name, exc)
            prompts = PromptBuilder(ChatTemplate.chatml())
        #: The decision pipeline's settings for this model (its ``timeout`` set by the app).
        self.settings = pipeline.Settings(prompts, debias=tuple(debias), calibration=calibration)
        #: A served pair's two models (:meth:`pair_of`): ``(language model, decision model)``; None for one model.
        self.pair: tuple[str, str] | None = None
        #: A pair's default reader (:data:`gateway.decision.readers.READERS`).
        self.reader = "lm"

    @classmethod
    def pair_of(cls, name: str, lm: Served, decider: Served, reader: str) -> Served:
        """A served pair named ``name``: ``lm``'s language model and ``decider``'s decision engine, each
        question read by ``reader`` unless the request says (``x_reader``). It shares ``lm``'s settings
        (prompts, ``x_debias``, calibration, heads): the language model reads as it does alone."""
        info = attrs.evolve(
            lm.info,
            name=name,
            description=f"{name} served by serveproto: the language model {lm.name} and the decision engine "
            f"{decider.name}, each question read by {reader} unless the request says (x_reader)",
        )
        pair = cls(info)
        pair.settings = lm.settings
        pair.model_sha256 = lm.model_sha256
        pair.pair = (lm.name, decider.name)
        pair.reader = reader
        return pair

    @property
    def prompts(self) -> PromptBuilder:
        """The prompts of the model's chat template (ChatML when it is unusable)."""
        return self.settings.prompts

    @property
    def debias(self) -> tuple[str, ...]:
        """The ``x_debias`` methods of a request that sends none (settable)."""
        return self.settings.debias

    @debias.setter
    def debias(self, methods: tuple[str, ...]) -> None:
        self.settings.debias = tuple(methods)

    @property
    def calibration(self) -> Calibration | None:
        """The model's calibration, or None (settable: ``serve`` sets it after construction)."""
        return self.settings.calibration

    @calibration.setter
    def calibration(self, value: Calibration | None) -> None:
        self.settings.calibration = value

    @property
    def heads(self) -> HeadSet | None:
        """The model's trained heads (a :class:`gateway.decision.heads.HeadSet`), or None (settable:
        ``serve`` sets them after construction)."""
        return self.settings.heads

    @heads.setter
    def heads(self, value: HeadSet | None) -> None:
        self.settings.heads = value

    @property
    def name(self) -> str:
        """The model's name (the reply's ``model``)."""
        return self.info.name


class Backend:
    """One engine and its :class:`Served` model, as the routes see the server for one request.

    ``engine``: the supervisor's ``gateway.engine.Engine`` (or anything with its
    interface); ``served``: its model (``settings``, ``request_timeout``);
    ``metrics`` and ``decision_log`` are the server's. ``memory`` is the
    pipeline's ``gateway.decision.pipeline.Memory``: what this engine holds is its own.
    """

    def __init__(self, engine: Engine, served: Served, *, metrics: Metrics, memory: pipeline.Memory) -> None:
        self.engine = engine
        self.served = served
        self.metrics = metrics
        self.memory = memory
        self.decision_log: DecisionLog | None = None
        #: The batch route's lanes on this engine (:mod:`gateway.server.lanes`).
        self.lanes = Lanes()

    @property
    def name(self) -> str:
        """The engine's name (``getattr(engine, "name")``; the model's name for an engine without one)."""
        name = getattr(self.engine, "name", None)
        return name if isinstance(name, str) else self.served.name

    @property
    def caps(self) -> Caps:
        """The engine's CAPS (raises :class:`gateway.engine.errors.EngineUnavailable` while it has none)."""
        return self.engine.caps

    @property
    def model(self) -> ModelInfo:
        """The model's :class:`gateway.server.app.ModelInfo` (the reply's ``model`` name, its template)."""
        return self.served.info

    @property
    def settings(self) -> pipeline.Settings:
        """The model's decision settings (prompts, default ``x_debias``, calibration, heads, timeout)."""
        return self.served.settings

    @property
    def request_timeout(self) -> float:
        """Seconds one engine call may take before the client gets a 503."""
        return self.served.settings.timeout

    @property
    def prompts(self) -> PromptBuilder:
        """The model's prompts (its chat template's)."""
        return self.served.prompts

    @property
    def debias(self) -> tuple[str, ...]:
        """The ``x_debias`` methods of a request that sends none."""
        return self.served.debias

    @property
    def calibration(self) -> Calibration | None:
        """The model's calibration, or None."""
        return self.served.calibration

    @property
    def model_sha256(self) -> str | None:
        """The model file's sha256 (the decision log's lines), or None when unknown."""
        return self.served.model_sha256

    @property
    def decider(self) -> Backend | None:
        """The decision engine beside this one's language model (a served pair, :class:`PairBackend`), else None."""
        return None

    def load(self) -> dict[str, Any]:
        """What this engine has to do now, for the scheduling gauges (:mod:`gateway.server.metrics`):
        ``waiting`` (requests queued for its slots, plus batch items waiting for a lane: :attr:`lanes`),
        ``running`` (requests on it) and ``slots`` (CAPS ``slots``; None while it has no CAPS)."""
        eng = self.engine
        try:
            slots: int | None = int(self.caps.slots)
        except EngineError:  # no CAPS while (re)starting
            slots = None
        return {
            "waiting": int(getattr(eng, "waiting", 0) or 0) + self.lanes.waiting,
            "running": int(getattr(eng, "in_flight", 0) or 0),
            "slots": slots,
        }

    def status(self) -> dict[str, Any]:
        """What this engine is doing: ``name``, ``model``, ``state`` (``serving``, ``unresponsive``,
        ``restarting``, ``gave_up``, ``closed``), ``healthy``, ``restarts``, ``in_flight`` and ``waiting``
        (requests on the engine now and queued for its slots)."""
        eng = self.engine
        state = getattr(eng, "state", None)
        healthy = bool(getattr(eng, "healthy", True))
        return {
            "name": self.name,
            "model": self.served.name,
            "state": state if isinstance(state, str) else ("serving" if healthy else "unavailable"),
            "healthy": healthy,
            "restarts": int(getattr(eng, "restarts", 0) or 0),
            "in_flight": int(getattr(eng, "in_flight", 0) or 0),
            "waiting": int(getattr(eng, "waiting", 0) or 0),
        }


class PairBackend(Backend):
    """A served pair as the routes see it for one request: the language model's :class:`Backend` (its
    engine, memory and settings; what chat, completions and rerank use) with the pair's :class:`Served`
    (the reply's ``model``, the default reader) and the decision model's :class:`Backend` beside it
    (:attr:`decider`)."""

    def __init__(self, served: Served, lm: Backend, decider: Backend) -> None:
        super().__init__(lm.engine, served, metrics=lm.metrics, memory=lm.memory)
        self.decision_log = lm.decision_log
        self.lanes = lm.lanes  # the batch route's lanes are the language model engine's, not this view's
        self._decider = decider

    @property
    def decider(self) -> Backend:
        """The decision model's backend."""
        return self._decider
