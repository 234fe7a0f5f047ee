"""The engines and models behind one server, and what a request routed to one of them sees.

A :class:`Served` model is what the server knows of one model, built once (its
description and its one :class:`gateway.decision.pipeline.Settings`: prompts, default
``x_debias``, calibration, heads, timeout); a
:class:`Backend` is one engine with its model: the object the routes answer
through (``engine``, ``caps``, ``served``: its model and that model's one
``settings``, ``metrics``) and the engine's own scoring memory (which states
and fixed prefixes it holds as snapshots).
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


def prompts_of(info: ModelInfo) -> PromptBuilder:
    """The :class:`PromptBuilder` of ``info``'s chat template; ChatML (with a warning naming the model) when
    the template is unusable."""
    try:
        return PromptBuilder(info.template)
    except TemplateError as exc:
        log.warning("the chat template of %s is unusable (%s): prompts use ChatML", info.name, exc)
        return PromptBuilder(ChatTemplate.chatml())


@attrs.frozen
class Served:
    """One model as the server serves it, built once (``serve``: from its configuration) and passed whole.

    ``info``: ``gateway.server.app.ModelInfo`` (the reply's ``model`` name, description, template, GGUF
    path and pieces). ``settings``: its one :class:`gateway.decision.pipeline.Settings` (the prompts of its
    chat template, the ``x_debias`` of a request that sends none, calibration, heads, the decision
    timeout; default: the prompts alone, :func:`prompts_of`). ``model_sha256``: the GGUF's, for the
    decision log (None when unknown). ``pair``: a served pair's two models, ``(language model, decision
    model)`` (:meth:`pair_of`; None for one model); ``reader``: a pair's default reader
    (:data:`gateway.decision.readers.READERS`).
    """

    info: ModelInfo
    settings: pipeline.Settings = attrs.field(
        default=attrs.Factory(lambda self: pipeline.Settings(prompts_of(self.info)), takes_self=True)
    )
    model_sha256: str | None = None
    pair: tuple[str, str] | None = None
    reader: str = "lm"

    @classmethod
    def of(
        cls,
        info: ModelInfo,
        *,
        debias: tuple[str, ...] = (),
        calibration: Calibration | None = None,
        heads: HeadSet | None = None,
        timeout: float = 120.0,
        model_sha256: str | None = None,
    ) -> Served:
        """``info`` served with its settings built once: :func:`prompts_of` its template, ``debias`` (the
        methods of a request that sends no ``x_debias``), ``calibration``, ``heads`` and ``timeout`` (seconds
        one decision's engine calls may take)."""
        settings = pipeline.Settings(
            prompts_of(info), debias=tuple(debias), calibration=calibration, timeout=timeout, heads=heads
        )
        return cls(info, settings, model_sha256)

    @classmethod
    def pair_of(cls, name: str, lm: Served, decider: Served, reader: str) -> Served:
        """A served pair named ``name``: ``lm``'s language model and ``decider``'s decision engine, each
        question read by ``reader`` unless the request says (``x_reader``). It shares ``lm``'s settings
        (prompts, ``x_debias``, calibration, heads) and model sha256: the language model reads as it does alone."""
        info = attrs.evolve(
            lm.info,
            name=name,
            description=f"{name} served by serveproto: the language model {lm.name} and the decision engine "
            f"{decider.name}, each question read by {reader} unless the request says (x_reader)",
        )
        return attrs.evolve(lm, info=info, pair=(lm.name, decider.name), reader=reader)

    @property
    def name(self) -> str:
        """The model's name (the reply's ``model``)."""
        return self.info.name


class Backend:
    """One engine and its :class:`Served` model, as the routes see the server for one request.

    ``engine``: the supervisor's ``gateway.engine.Engine`` (or anything with its
    interface); ``served``: its :class:`Served` model (``served.settings``: the pipeline's);
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
