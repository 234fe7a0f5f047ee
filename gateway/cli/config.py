"""``serveproto serve``'s configuration: one typed tree, built once from the command line and passed whole.

:func:`from_args` reads the parsed flags (and ``$SERVEPROTO_API_KEY``) into a
:class:`ServeConfig`: what engines to start (:class:`EnginesConfig`, the
input of :mod:`gateway.cli.plan`), how they are supervised
(:class:`gateway.engine.options.EngineOptions`), the application's settings
(:class:`gateway.server.app.AppConfig`), the HTTP limits
(:class:`gateway.http.Limits`) and the decision settings
(:class:`DecisionConfig`). Each node is a frozen value; nothing here starts,
reads or fetches anything, and the server's modules are imported only when a
tree is built.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from gateway.engine.options import EngineOptions, ProcessOptions, RestartPolicy

if TYPE_CHECKING:  # read when built: the CLI parses its flags without importing the server and numpy
    from gateway.http import Limits
    from gateway.server.app import AppConfig

#: The cap of the restart backoff with ``--keep-restarting`` (seconds): a broken engine is retried this often.
KEEP_RESTARTING_BACKOFF_MAX = 30.0

#: ``--debias`` on the default model when not given. ``bench/quality.py`` (400 questions, bench/results/NOTEBOOK.md):
#: accuracy 0.472 against 0.439 raw, 0.440 with the earlier default (canonical,content_free) and 0.406 for the
#: letter read-out of llama-server-based peers; ECE 0.094 (0.178 the peers'); no answer changes with the order
#: of a choice's labels (the prompt is the same); a new question on a known state and known options reads the
#: positions ``none`` reads (the content-free reading is one per set of options, not one per question).
DEFAULT_MODEL_DEBIAS = ("canonical", "spellings", "content_free_listing")


@dataclass(frozen=True)
class LlamaOptions:
    """The llama engine's own flags (``engines/bin/serveproto-llama``; spec/llama-engine.md), each field
    named as ``serve``'s flag (``ctx_max``: ``--ctx-max``); ``None``: the engine's default, left off its
    command line.

    ``slots`` (KV slots), ``ctx`` (tokens per slot), ``ctx_max`` (the longest prompt, tokens),
    ``threads`` (an integer >= 1 or ``"auto"``; ``None``: ``$SERVEPROTO_THREADS``, else ``auto``),
    ``numerics`` (``invariant`` or ``fast``), ``score_cache_mb`` (MB of scored options kept),
    ``rpc`` / ``split_mode`` / ``tensor_split`` / ``main_gpu`` (llama.cpp's placement over devices,
    docs/devices.md), ``cache_dir`` (a folder, ``off``, or ``None``: ``gateway.paths.persist_dir``),
    ``cache_disk_mb`` (its budget, MB), ``cache_read_only`` (default False) and ``precision``
    (``native``, the default, or a transcode: ``f32``, ``f16``, ``bf16``; ``gateway.engine.precision``),
    ``ubatch`` (the rows of one ``llama_decode``, 1 to 2048), ``pin_slots`` (snapshots the engine keeps,
    1 to 1024; the engine's default 4), ``mmproj`` (a vision projector of the default model: its engines
    read pictures, spec/llama-engine.md "Pictures"; ``None``: none).
    """

    slots: int | None = None
    ctx: int | None = None
    ctx_max: int | None = None
    threads: int | str | None = None
    numerics: str | None = None
    score_cache_mb: int | None = None
    rpc: str | None = None
    split_mode: str | None = None
    tensor_split: str | None = None
    main_gpu: int | None = None
    cache_dir: str | None = None
    cache_disk_mb: int | None = None
    cache_read_only: bool = False
    precision: str = "native"
    ubatch: int | None = None
    pin_slots: int | None = None
    mmproj: str | None = None


@dataclass(frozen=True)
class EnginesConfig:
    """What engines ``serve`` starts (:func:`gateway.cli.plan.plan_engines` turns it into engine specs).

    ``models``: ``(NAME or None, PATH or None)`` per model, the first the default
    (``((None, None),)``, the default: the default model, fetched on first use). ``command``:
    ``--engine``'s words (``None``, the default: the llama engine). ``per_model``: engine processes
    per model (default 1). ``gpus``: CUDA device ids given to the engines in turn (``()``: leave
    the environment alone; ``None``, the default: :func:`gateway.cli.plan.gpu_devices` decides).
    ``llama``: :class:`LlamaOptions`.
    """

    models: tuple[tuple[str | None, str | None], ...] = ((None, None),)
    command: tuple[str, ...] | None = None
    per_model: int = 1
    gpus: tuple[str, ...] | None = None
    llama: LlamaOptions = field(default_factory=LlamaOptions)

    @property
    def default_model_path(self) -> str | None:
        """The first model's path (``--model``'s first PATH), None when none was given."""
        return self.models[0][1]


@dataclass(frozen=True)
class DecisionConfig:
    """How questions are answered when a request does not say, and what is recorded.

    ``debias``: the ``x_debias`` methods applied by default (:func:`default_debias`; default ``()``).
    ``calibration`` / ``heads``: a file, ``"none"``, or ``None`` (the default: the model's own in
    ``$SERVEPROTO_CACHE``, when it exists). ``log_decisions``: the decision log's path (``None``,
    the default: none); ``log_decisions_required`` (default False): refuse a request whose lines
    cannot be written. ``pair``: ``(NAME, LM, DECIDER)`` (``--pair NAME=LM,DECIDER``: a served pair
    of two ``--model`` names, the default model; None, the default: none); ``reader``: the pair's
    default reader (``--reader``; None: :data:`gateway.decision.readers.DEFAULT`).
    """

    debias: tuple[str, ...] = ()
    calibration: str | None = None
    heads: str | None = None
    log_decisions: str | None = None
    log_decisions_required: bool = False
    pair: tuple[str, str, str] | None = None
    reader: str | None = None


def _app_config() -> AppConfig:
    from gateway.server.app import AppConfig

    return AppConfig()


def _limits() -> Limits:
    from gateway.http import Limits

    return Limits()


@dataclass(frozen=True)
class ServeConfig:
    """All of ``serveproto serve``: where it listens (``host``, ``port``: 0 picks a free one),
    ``engines`` (:class:`EnginesConfig`), ``engine`` (each engine's timeouts and restart policy,
    :class:`gateway.engine.options.EngineOptions`), ``app`` (:class:`gateway.server.app.AppConfig`),
    ``limits`` (:class:`gateway.http.Limits`), ``decision`` (:class:`DecisionConfig`) and
    ``log_level`` (a :mod:`logging` level name, default ``INFO``)."""

    host: str = "127.0.0.1"
    port: int = 8000
    engines: EnginesConfig = field(default_factory=EnginesConfig)
    engine: EngineOptions = field(default_factory=EngineOptions)
    app: AppConfig = field(default_factory=_app_config)
    limits: Limits = field(default_factory=_limits)
    decision: DecisionConfig = field(default_factory=DecisionConfig)
    log_level: str = "INFO"


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer ``>= low``, else ``argparse.ArgumentTypeError`` saying so."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    return parse


def default_debias(args: argparse.Namespace) -> tuple[str, ...]:
    """The server's default ``x_debias``: ``--debias`` when given, else :data:`DEFAULT_MODEL_DEBIAS` when
    serving the default model (neither ``--model`` nor ``--engine``), else none."""
    if args.debias is not None:
        return tuple(args.debias)
    return DEFAULT_MODEL_DEBIAS if not args.model and not args.engine else ()


def engine_options(args: argparse.Namespace) -> EngineOptions:
    """Each engine's supervision from the flags: ``--handshake-timeout``, ``--ping-interval`` (the
    PING interval), ``--ping-timeout``, ``--max-restarts`` within ``--restart-period`` (no limit, and
    the backoff capped at :data:`KEEP_RESTARTING_BACKOFF_MAX`, with ``--keep-restarting``)."""
    keep = bool(args.keep_restarting)
    process = ProcessOptions(
        handshake_timeout=args.handshake_timeout, health_interval=args.ping_interval, ping_timeout=args.ping_timeout
    )
    restart = RestartPolicy(max_restarts=None if keep else args.max_restarts, period=args.restart_period)
    if keep:
        restart = dataclasses.replace(restart, backoff_max=KEEP_RESTARTING_BACKOFF_MAX)
    return EngineOptions(process, restart)


def engines_config(args: argparse.Namespace) -> EnginesConfig:
    """The engines to start, from ``--model`` (repeatable), ``--engine``, ``--engines``, ``--gpus``
    and the llama engine's flags (each :class:`LlamaOptions` field is its flag's ``dest``)."""
    llama = LlamaOptions(**{f.name: getattr(args, f.name) for f in fields(LlamaOptions)})
    models = tuple(getattr(args, "models", None) or [(None, args.model)])
    command = tuple(args.engine) if args.engine else None
    return EnginesConfig(models, command, getattr(args, "engines", 1) or 1, args.gpus, llama)


def from_args(args: argparse.Namespace) -> ServeConfig:
    """The whole configuration of ``serve`` from its parsed command line (``gateway.cli.serve.add_parsers``)
    and ``$SERVEPROTO_API_KEY`` (when ``--api-key`` is not given).

    Raises ``SystemExit`` for ``--log-decisions-required`` without ``--log-decisions``.
    """
    from gateway.http import Limits
    from gateway.server.app import AppConfig
    from gateway.server.auth import key_from_env

    log_decisions = getattr(args, "log_decisions", None)
    required = bool(getattr(args, "log_decisions_required", False))
    if required and not log_decisions:
        raise SystemExit("serveproto serve: --log-decisions-required: needs --log-decisions FILE")
    return ServeConfig(
        host=args.host,
        port=args.port,
        engines=engines_config(args),
        engine=engine_options(args),
        app=AppConfig(
            api_key=args.api_key or key_from_env(),
            request_timeout=args.request_timeout,
            max_inflight=args.max_inflight,
            strict=bool(getattr(args, "strict", False)),
        ),
        limits=Limits(max_body_bytes=args.max_body, max_decoded_bytes=max(args.max_body, 64 << 20)),
        decision=DecisionConfig(
            debias=default_debias(args),
            calibration=getattr(args, "calibration", None),
            heads=getattr(args, "heads", None),
            log_decisions=log_decisions,
            log_decisions_required=required,
            pair=getattr(args, "pair", None),
            reader=getattr(args, "reader", None),
        ),
        log_level=str(args.log_level),
    )
