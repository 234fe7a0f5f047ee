"""``serveproto serve``: the decision server, an engine under the supervisor behind the HTTP server.

    serveproto serve [--model [NAME=]PATH ...] [--engines N] [--host H] [--port P] [--api-key KEY]
                     [--keep-restarting] [--precision native|f32|f16|bf16] [--engine CMD ...]

With no ``--engine`` it serves ``engines/bin/serveproto-llama --model PATH``
(``PATH`` defaulting to the SmolLM2 model, fetched on first use). ``--engine``
takes the rest of the command line as the engine's argv, e.g. ``--engine
engines/bin/serveproto-fixture --mode decide``; a bare ``serveproto-fixture``
or ``serveproto-llama`` is the project's engine. Installed from a wheel (not
a clone), an engine is built into the cache on first use
(:mod:`gateway.engine.build`). ``--engines N`` starts N engine processes per
model (each under its own supervisor); ``--model NAME=PATH``, repeatable,
serves several models, the first the default. It answers from its bind on:
while the engines load, ``/health`` 200 and ``/ready`` 503 (:mod:`gateway.server.starting`).
Once they have loaded it prints one line, ``serveproto: serving <model> on
http://<host>:<port>`` (with several engines, one line per model first).

The flags are read once into a :class:`gateway.cli.config.ServeConfig`, passed
whole from there; the engines' commands are planned by :mod:`gateway.cli.plan`.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import attrs

from gateway.cli import config, plan, sub_command
from gateway.cli.config import KEEP_RESTARTING_BACKOFF_MAX, int_at_least
from gateway.cli.plan import THREADS_ENV
from gateway.engine.build import ENGINES
from gateway.engine.errors import EngineError
from gateway.engine.options import RestartPolicy
from gateway.server.auth import API_KEY_ENV

if TYPE_CHECKING:
    from anyio import CancelScope
    from anyio.abc import TaskStatus

    from gateway.decision.calibration import Calibration
    from gateway.decision.decision_log import DecisionLog
    from gateway.decision.heads import HeadSet
    from gateway.engine.api import Engine
    from gateway.engine.pool import Pool
    from gateway.http import HTTPServer
    from gateway.server.app import App
    from gateway.server.fleet import Served

T = TypeVar("T")


SERVE_HELP = """\
Start the decision server: an engine under a supervisor, behind an HTTP/1.1
server that answers POST /v1/systemone (TypeSafe's Jev System One API: the
official SDK works unchanged), POST /v1/decisions, the OpenAI-style
/v1/chat/completions, /v1/completions and /v1/models, and /health, /metrics
and the browser page at /. Routes are described in docs/http-api.md.

The port is bound first: a port in use ends the command at once with status 2.
With no --engine the engine is engines/bin/serveproto-llama on --model
(default: the fetched SmolLM2-135M-Instruct). --engine takes the rest of the
command line as the engine's command, e.g.

  serveproto serve --port 8123 --engine engines/bin/serveproto-fixture --mode decide

--engines N starts N engine processes per model, each its own process under
its own supervisor and restart policy; the CPU threads are divided among
them (or, on a CUDA build, each gets its own CUDA_VISIBLE_DEVICES: --gpus).
--model NAME=PATH, repeatable, serves several models: a request's "model"
picks one by NAME, any other name gets the first. Requests go to the engine
that last served their state (the routing key, x-serveproto-route-key), else
to the least loaded one.

While the engine loads it answers GET /health 200 ("loading") and GET /ready
503 (a readiness probe); once loaded it prints one line,
"serveproto: serving <model> on http://<host>:<port>", then logs one JSON
line per request on stderr. SIGINT or SIGTERM stops it.

The engine is PINGed every --ping-interval seconds; one that does not answer
within --ping-timeout is killed and restarted. If it fails more than
--max-restarts times within --restart-period seconds, the server answers the
requests in flight and exits with status 1 and one line saying why, so that a
process manager restarts it; --keep-restarting retries forever instead. With
several engines each counts its own restarts, and the server exits once every
engine of one model has given up.
Limits and timeouts: docs/http-api.md, "Security and limits".
"""


class ListenFailed(Exception):
    """The server could not listen (port in use, address not available, no permission); the message is
    the one line shown to the user, and ``serveproto serve`` exits with status 2."""


class EngineGaveUp(Exception):
    """The engine's restart intensity was exceeded (without ``--keep-restarting``): the server answered
    the requests in flight and stopped; the message is the one line shown, and the status is 1."""


#: Seconds the server gives the requests in flight to be answered after the engine's supervisor gave up.
GIVE_UP_DRAIN = 10.0

_positive_int = int_at_least(1)
_non_negative_int = int_at_least(0)


def _ubatch(text: str) -> int:
    """``--ubatch``: an integer from 1 to 2048 (the engine's batch is at most 2048 rows)."""
    value = _positive_int(text)
    if value > 2048:
        raise argparse.ArgumentTypeError(f"must be at most 2048, got {value}")
    return value


def _pin_slots(text: str) -> int:
    """``--pin-slots``: an integer from 1 to 1024 (the llama engine's own range)."""
    value = _positive_int(text)
    if value > 1024:
        raise argparse.ArgumentTypeError(f"must be at most 1024, got {value}")
    return value


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``serve`` sub-command and its flags, in the order ``--help`` lists them."""
    p = sub_command(sub, "serve", "start the decision server (POST /v1/systemone and the OpenAI routes)", SERVE_HELP)
    p.add_argument(
        "--model",
        action=_ModelArg,
        metavar="[NAME=]PATH",
        help="GGUF model for the llama engine (default: the fetched SmolLM2-135M-Instruct); "
        "also read for its chat template when --engine is given. Repeatable as NAME=PATH: "
        "several models, picked by a request's model field (any other name: the first)",
    )
    p.add_argument(
        "--engines",
        type=_positive_int,
        default=1,
        metavar="N",
        help="engine processes per model (default 1), each under its own supervisor; requests go "
        "to the engine that last served their state, else to the least loaded",
    )
    p.add_argument(
        "--gpus",
        type=_gpu_list,
        default=None,
        metavar="IDS",
        help="CUDA devices given to the engines in turn (engine i: CUDA_VISIBLE_DEVICES=IDS[i mod "
        "n]), e.g. 0,1; default on a CUDA build with several engines: $CUDA_VISIBLE_DEVICES, "
        "else every GPU nvidia-smi lists; 'none' leaves the environment alone",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    p.add_argument(
        "--api-key", default=None, help=f"required bearer key (default ${API_KEY_ENV}; none: any key passes)"
    )
    _add_llama_flags(p)
    _add_device_flags(p)
    _add_decision_flags(p)
    _add_supervision_flags(p)
    p.add_argument(
        "--max-inflight", type=int, default=256, help="POST requests served at once (503 + Retry-After above)"
    )
    p.add_argument("--max-body", type=int, default=16 << 20, help="largest request body in bytes (413 above)")
    p.add_argument("--log-level", default="INFO", help="logging level (INFO logs one JSON line per request)")
    p.add_argument(
        "--engine",
        nargs=argparse.REMAINDER,
        default=None,
        help="the engine command and its arguments (everything after --engine); a bare "
        f"{', '.join(ENGINES)} is the project's engine (built on first use when installed)",
    )
    p.set_defaults(func=run)


def _add_llama_flags(p: argparse.ArgumentParser) -> None:
    """The llama engine's flags (``gateway.cli.config.LlamaOptions``)."""
    p.add_argument(
        "--slots",
        type=_positive_int,
        default=None,
        help="KV slots of the llama engine: requests served at once, each llama_decode shared by "
        "all of them (default: the engine sizes them from the context and the memory free at "
        "start, 1 to 4, on a GPU 1 to 32; spec/llama-engine.md)",
    )
    p.add_argument(
        "--ubatch",
        type=_ubatch,
        default=None,
        metavar="N",
        help="rows of one llama_decode, shared by the requests in flight, 1 to 2048 (default 512; the engine "
        "caps it at --ctx, CAPS n_ubatch says what it took): larger "
        "decodes keep a GPU busier (an H200 with F16 weights at 32 clients: --slots 32 --ubatch 1024 "
        "answered 1.05-1.14x the requests/s of the defaults, bench/results/NOTEBOOK.md), and a CANCEL waits up to "
        "one of them",
    )
    p.add_argument(
        "--pin-slots",
        type=_pin_slots,
        default=None,
        metavar="N",
        help="snapshots (photographed states and prefixes) the llama engine keeps, least recently used out, "
        "1 to 1024 (default: the engine's, 4; CAPS pin_slots says what it took): nested snapshots and many "
        "states served at once each need their own (spec/llama-engine.md)",
    )
    p.add_argument(
        "--mmproj",
        default=None,
        metavar="PATH",
        help="a vision projector (llama.cpp mmproj GGUF) for the default model: its llama engines read "
        "pictures, and /v1/systemone reads Jev image assets in state (docs/http-api.md, Pictures)",
    )
    p.add_argument("--ctx", type=int, default=None, help="context size per slot of the llama engine")
    p.add_argument(
        "--ctx-max",
        type=int,
        default=None,
        help="the longest prompt in tokens the llama engine serves (default: the model's trained context, "
        "at most 32768); one slot at a time may pass --ctx up to it (spec/llama-engine.md)",
    )
    p.add_argument(
        "--threads",
        type=_threads,
        default=None,
        metavar="N|auto",
        help=f"CPU threads of each llama engine (default ${THREADS_ENV}, else auto: every core, "
        "one fewer while the decodes find the cores shared with the gateway or anything else, "
        "since llama.cpp's threads wait for each other and slow down sharply then; with "
        "several engines the cores are divided among them)",
    )
    p.add_argument(
        "--precision",
        type=_precision,
        default="native",
        metavar="{native,f32,f16,bf16}",
        help="the llama engine's weights: native (the GGUF's own types, default), f32 (the GGUF "
        "transcoded once to F32 by llama.cpp's quantizer into the cache, then reused: logprobs "
        "within 1e-4 of the float64 oracle instead of ~0.15 nats off on average on a quantized "
        "model, for about 5.5 times the file size), or f16 / bf16 (16-bit matrices, the same way: "
        "on a GPU the fast weights, 2.3x the prefill of Q4_K on an H200; see bench/results/NOTEBOOK.md)",
    )
    p.add_argument(
        "--numerics",
        choices=("invariant", "fast"),
        default=None,
        help="the llama engine's arithmetic: invariant (the CPU default: every number depends on the "
        "model, the build and the tokens only, whatever ran before or beside it; on a GPU build for "
        "quantized weights only, so not with --precision, and refused at load otherwise) or fast "
        "(llama.cpp's batch-shape-dependent kernels; the GPU default)",
    )
    p.add_argument(
        "--score-cache-mb",
        type=_non_negative_int,
        default=None,
        metavar="MB",
        help="memory for scored options kept between requests, so a repeated question is not "
        "computed again (llama engine, invariant numerics; default 64, 0 turns it off)",
    )
    p.add_argument(
        "--cache-dir",
        default=None,
        metavar="DIR|off",
        help="where the llama engine keeps scored options (and pinned states) across restarts, so a "
        "restarted server computes nothing it computed before (invariant numerics only; default "
        "$SERVEPROTO_PERSIST, else $SERVEPROTO_CACHE/persist; off keeps nothing on disk; docs/persistence.md)",
    )
    p.add_argument(
        "--cache-disk-mb",
        type=_non_negative_int,
        default=None,
        metavar="MB",
        help="disk budget of --cache-dir, least recently used files out first (default 2048)",
    )
    p.add_argument(
        "--cache-read-only",
        action="store_true",
        help="read --cache-dir, never write it (replicas sharing a folder another server fills)",
    )


def _add_device_flags(p: argparse.ArgumentParser) -> None:
    """One model over several devices: llama.cpp's placement flags, passed through (docs/devices.md)."""
    dev = p.add_argument_group(
        "one model over several devices (the llama engine; llama.cpp's own options, passed through: docs/devices.md)"
    )
    dev.add_argument(
        "--rpc",
        type=_rpc_servers,
        default=None,
        metavar="HOST:PORT,...",
        help="place the model's layers on these ggml-rpc-servers (engines/bin/ggml-rpc-server; "
        "private networks only: the RPC protocol has no authentication and no encryption). "
        "The engine's numerics default to fast with --rpc; --numerics invariant when every "
        "server is this build's ggml-rpc-server on a CPU, started with GGML_CPU_USE_REF=1",
    )
    dev.add_argument(
        "--split-mode",
        choices=("none", "layer", "row"),
        default=None,
        help="how llama.cpp splits the model over the devices: layer (its default: whole layers "
        "per device), row (weight rows over CUDA GPUs; not over RPC servers), none (one device, "
        "--main-gpu)",
    )
    dev.add_argument(
        "--tensor-split",
        type=_tensor_split,
        default=None,
        metavar="A,B,...",
        help="each device's share of the model, in device order (the --rpc servers' devices "
        "first, then local GPUs), e.g. 3,1; default: in proportion to free memory",
    )
    dev.add_argument(
        "--main-gpu",
        type=_non_negative_int,
        default=None,
        metavar="N",
        help="the device index used with --split-mode none (and for intermediate results with row)",
    )


def _pair_arg(text: str) -> tuple[str, str, str]:
    """``--pair``'s value ``NAME=LM,DECIDER`` as ``(NAME, LM, DECIDER)``."""
    name, eq, rest = text.partition("=")
    lm, plus, decider = rest.partition(",")
    if not eq or not plus or not MODEL_NAME.fullmatch(name) or not lm or not decider:
        raise argparse.ArgumentTypeError(
            f"expected NAME=LM,DECIDER (two --model names: a language model and a decision model), got {text!r}"
        )
    return name, lm, decider


def _reader_arg(text: str) -> str:
    from gateway.decision import readers

    if text not in readers.READERS:
        raise argparse.ArgumentTypeError(f"one of {', '.join(readers.READERS)}, got {text!r}")
    return text


def _add_decision_flags(p: argparse.ArgumentParser) -> None:
    """How questions are answered and recorded (``gateway.cli.config.DecisionConfig``)."""
    p.add_argument(
        "--pair",
        type=_pair_arg,
        default=None,
        metavar="NAME=LM,DECIDER",
        help="serve a pair under NAME, the default model: the language model and the decision model "
        "named LM and DECIDER (--model NAME=PATH each), each question read by --reader unless the "
        "request says (x_reader: decider, lm, mean, product or gate; README, 'Two readers')",
    )
    p.add_argument(
        "--reader",
        type=_reader_arg,
        default=None,
        metavar="READER",
        help="who reads a question on the --pair model by default: decider, lm, or a combination of the "
        "two (mean, product, gate); default: the one chosen on the labelled sets (bench/readers.py)",
    )
    p.add_argument(
        "--debias",
        type=_debias_methods,
        default=None,
        metavar="METHODS",
        help="how a language model's option scores are read and corrected when a request does not "
        "say (its x_debias, docs/http-api.md): none, or a comma-separated list of canonical (the "
        "options listed in one fixed order), spellings (a noul's yes and no read in every spelling), "
        "cyclic (each rotation of the listed options read once), content_free (calibrated against a "
        "content-free state), content_free_listing (the same, one reading per set of options), cloze "
        "or letters (other prompt formats). Default: canonical,spellings,content_free_listing on the "
        "default model (it answers by position without), none on a model you name",
    )
    p.add_argument(
        "--calibration",
        default=None,
        metavar="FILE",
        help="a calibration file (serveproto calibrate) applied to the answers read under its x_debias; "
        "'none' for none. Default: $SERVEPROTO_CACHE/calibration/<the model's sha256>.json when it exists, "
        "else the package's own for the model (the default model's ships with it)",
    )
    p.add_argument(
        "--heads",
        default=None,
        metavar="FILE",
        help="a heads file (serveproto heads fit): a question matching one of its heads is answered by it "
        "(x_head in the answer); 'none' for none. Default: $SERVEPROTO_CACHE/heads/<the model's sha256>.json "
        "when it exists",
    )
    p.add_argument(
        "--log-decisions",
        default=None,
        metavar="FILE",
        help="append one JSON line per answered question to FILE: request and question ids, options, "
        "probabilities (before and after calibration), model and x_debias; no state or question "
        "text. Fill in each line's 'answer' and pass the file to `serveproto calibrate --data`. "
        "A request whose lines cannot be written (disk full) is answered all the same, its lines "
        "counted as lost (/metrics) and warned about once a minute",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="refuse a /v1/systemone request that sends a field this server does not read (a typo such as "
        "critera, at any level) with a 422 naming it; by default it is answered, with an x_warnings line "
        "naming the field (Jev clients keep working)",
    )
    p.add_argument(
        "--log-decisions-required",
        action="store_true",
        help="with --log-decisions: refuse (503 naming the log) a request whose lines cannot be "
        "written, instead of answering it unlogged",
    )


def _add_supervision_flags(p: argparse.ArgumentParser) -> None:
    """The engine call's timeout and the supervisor's (``gateway.engine.options.EngineOptions``)."""
    # 600 s: a choice of 255 described labels (about 3,900 tokens) takes 1 to 3 minutes on 2 busy cores under the
    # default correction; a hung engine is caught by the watchdog's PING, not by this
    p.add_argument(
        "--request-timeout", type=float, default=600.0, help="seconds one engine call may take (503 after; default 600)"
    )
    p.add_argument("--handshake-timeout", type=float, default=180.0, help="seconds the engine may take to load")
    p.add_argument(
        "--ping-interval",
        type=_positive_float,
        default=5.0,
        help="seconds between the supervisor's PINGs of the engine, busy or idle (default 5); /health "
        "is 503 while a PING has waited longer than this",
    )
    p.add_argument(
        "--ping-timeout",
        type=_positive_float,
        default=30.0,
        help="seconds a PING may go unanswered before the engine is declared stalled, killed and "
        "restarted, its requests answered 503 (default 30; raise it for a model whose 512-token "
        "decode step takes longer)",
    )
    p.add_argument(
        "--max-restarts",
        type=_non_negative_int,
        default=3,
        help="engine restarts allowed within --restart-period (default 3); one more and the server "
        "answers the requests in flight and exits with status 1, unless --keep-restarting",
    )
    p.add_argument(
        "--restart-period",
        type=_positive_float,
        default=60.0,
        help="seconds of the restart intensity window (default 60)",
    )
    p.add_argument(
        "--keep-restarting",
        action="store_true",
        help="never give up on the engine: restart it for as long as the server runs, the backoff "
        f"doubling from 0.1 s to {KEEP_RESTARTING_BACKOFF_MAX:g} s",
    )


#: A model's name in ``--model NAME=PATH``: what a request's ``model`` field names (no '/', so a path is a path).
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+-]{0,127}")


def parse_model_arg(text: str) -> tuple[str | None, str]:
    """``--model``'s value: ``NAME=PATH`` as ``(NAME, PATH)`` when the text before the first ``=`` is a
    :data:`MODEL_NAME`, else ``(None, text)`` (a path, which may hold ``=``). Raises ``ArgumentTypeError``
    for an empty path."""
    name, sep, path = text.partition("=")
    if sep and MODEL_NAME.fullmatch(name):
        if not path:
            raise argparse.ArgumentTypeError(f"{text!r}: NAME=PATH needs a path after '='")
        return name, path
    if not text:
        raise argparse.ArgumentTypeError("an empty model path")
    return None, text


class _ModelArg(argparse.Action):
    """``--model [NAME=]PATH``, repeatable: ``args.models`` lists ``(NAME or None, PATH)`` in order and
    ``args.model`` is the first PATH (the default model). Two models under one name, or two unnamed
    models, are refused naming the flag."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        try:
            name, path = parse_model_arg(values)
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentError(self, str(exc)) from None
        models = list(getattr(namespace, "models", None) or [])
        if name is not None and any(n == name for n, _ in models):
            raise argparse.ArgumentError(self, f"two models named {name!r}")
        if name is None and models:
            raise argparse.ArgumentError(self, f"{values!r}: with several models, name each: --model NAME=PATH")
        if models and models[0][0] is None:
            raise argparse.ArgumentError(self, f"{models[0][1]!r}: with several models, name each: --model NAME=PATH")
        models.append((name, path))
        namespace.models = models
        namespace.model = models[0][1]


def _gpu_list(text: str) -> tuple[str, ...]:
    """``--gpus``: comma-separated CUDA device ids or UUIDs (``0,1``, ``GPU-...``), or ``none`` (empty)."""
    if text.strip().lower() == "none":
        return ()
    ids = tuple(x.strip() for x in text.split(","))
    if not ids or any(not x or not re.fullmatch(r"[A-Za-z0-9-]+", x) for x in ids):
        raise argparse.ArgumentTypeError(f"must be comma-separated CUDA device ids (0,1) or 'none', got {text!r}")
    return ids


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


#: Devices llama.cpp places a model on (its ``llama_max_devices()``): --tensor-split entries, --rpc servers.
MAX_DEVICES = 16


def _tensor_split(text: str) -> str:
    """An argparse ``type``: at most :data:`MAX_DEVICES` comma-separated non-negative numbers, not all 0
    (the engine's own check, here so that the error names serve's flag before the engine starts)."""
    try:
        shares = [float(x) for x in text.split(",")]
    except ValueError:
        shares = []
    if not shares or len(shares) > MAX_DEVICES or any(not 0 <= x < float("inf") for x in shares) or not sum(shares):
        raise argparse.ArgumentTypeError(
            f"must be a comma-separated list of at most {MAX_DEVICES} non-negative "
            f"numbers, not all 0 (a share of the model per device), got {text!r}"
        )
    return text


def _rpc_servers(text: str) -> str:
    """An argparse ``type``: at most :data:`MAX_DEVICES` comma-separated ``host:port`` (port 1..65535; the host
    without ':', as ggml-rpc reads it)."""

    def ok(ep: str) -> bool:
        host, _, port = ep.partition(":")
        return bool(host) and port.isascii() and port.isdigit() and 1 <= int(port) <= 65535

    servers = text.split(",")
    if len(servers) > MAX_DEVICES or not all(ok(ep) for ep in servers):
        raise argparse.ArgumentTypeError(
            f"must be a comma-separated list of at most {MAX_DEVICES} host:port servers (port 1..65535), got {text!r}"
        )
    return text


def _debias_methods(text: str) -> tuple[str, ...]:
    from gateway.decision import debias

    try:
        return debias.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _precision(text: str) -> str:
    from gateway.engine.precision import parse_precision

    try:
        return parse_precision(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def load_calibration(
    choice: str | None, model_path: str | None, *, say: Callable[[str], None] | None = None
) -> Calibration | None:
    """The calibration ``serve`` applies: ``choice`` (``--calibration``) ``"none"`` for none, a file, or
    None for the model's own (:func:`gateway.decision.calibration.default_path` of its sha256, when it exists,
    else the package's, :func:`gateway.decision.calibration.shipped_path`).

    A file named by ``choice`` that cannot be read, does not validate, was fitted on another model
    file, or cannot be checked (no model file: ``--engine`` without ``--model``) raises ``SystemExit``
    (the operator asked for it). The model's own file, found in the cache
    by the server itself, is skipped instead: one line through ``say`` (default: stderr) names it
    and says why, and the answers carry ``x_calibration: "identity"``.
    """
    from gateway.decision import calibration

    if choice == "none":
        return None
    sha = _model_sha256(model_path)
    if choice is None:
        if sha is None:
            return None
        path = calibration.default_path(sha)
        if not path.exists():
            path = calibration.shipped_path(sha)  # the package's own fit of the default model (issue 48)
            if not path.exists():
                return None
        return _load_found(
            "calibration",
            calibration.load,
            path,
            sha,
            str,
            'answers carry x_calibration "identity" (serveproto calibrate writes a new one)',
            say,
        )
    path = Path(choice)
    cal = _load_or_exit("--calibration", calibration.load, path)
    if sha is None:  # --engine without --model (the fixture engine): nothing to check the file against
        raise SystemExit(
            f"serveproto serve: --calibration: {path} was fitted on the model file with sha256 "
            f"{cal.model_sha256[:12]}..., and this server has no model file to check it against "
            "(--engine without --model): pass the engine's model as --model PATH, or --calibration none"
        )
    if cal.model_sha256 != sha:
        raise SystemExit(
            f"serveproto serve: --calibration: {path} was fitted on another model file "
            f"(sha256 {cal.model_sha256[:12]}..., the served model's is {sha[:12]}...)"
        )
    return cal


class _FittedFile(Protocol):
    @property
    def model_sha256(self) -> str: ...


F = TypeVar("F", bound=_FittedFile)


def _load_found(
    what: str,
    load: Callable[[Path], F],
    path: Path,
    sha: str,
    shown: Callable[[str], str],
    otherwise: str,
    say: Callable[[str], None] | None,
) -> F | None:
    """A file ``serve`` found in the cache for the model (``what``: calibration, heads): loaded, or skipped
    with one line through ``say`` (default: stderr) that names it, says why (unreadable, invalid, fitted on
    another model file; the file's sha256 through ``shown``) and what the server does ``otherwise``."""
    why = None
    try:
        found = load(path)
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else str(exc).removeprefix(f"{path}: ")
    else:
        if found.model_sha256 != sha:
            why = f"fitted on another model file (sha256 {shown(found.model_sha256[:12])}...)"
    if why is None:
        return found
    (say or _say_stderr)(
        f"serveproto serve: {what}: skipping {path}, found in the cache for this model: {why}; {otherwise}"
    )
    return None


def _load_or_exit(flag: str, load: Callable[[Path], T], path: Path, shown: str | None = None) -> T:
    """``load(path)`` for the file ``flag`` names; one that cannot be read or does not validate ends
    ``serve`` with one line naming the flag and the file (as ``shown``, default ``path``): ``SystemExit``."""
    try:
        return load(path)
    except OSError as exc:
        raise SystemExit(f"serveproto serve: {flag}: cannot read {shown or path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise SystemExit(f"serveproto serve: {flag}: {exc}") from None


def _say_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _threads(value: str) -> int | str:
    """``--threads``: an integer >= 1, or ``auto`` (any case)."""
    if value.strip().lower() == "auto":
        return "auto"
    try:
        return _positive_int(value)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (give an integer >= 1, or auto)") from None


def load_heads(
    choice: str | None,
    model_path: str | None,
    hidden: tuple[int, int] | None = None,
    *,
    say: Callable[[str], None] | None = None,
) -> HeadSet | None:
    """The heads ``serve`` answers with (:mod:`gateway.decision.heads`): ``choice`` (``--heads``) ``"none"``
    for none, a file, or None for the model's own (``$SERVEPROTO_CACHE/heads/<sha256>.json`` when it exists),
    checked against the engine's ``hidden`` = ``(x_hidden, x_hidden_dim)`` (CAPS) when given.

    A file named by ``choice`` that cannot be read, does not validate (its ranges, the engine's layers
    and hidden size) or was fitted on another model file raises ``SystemExit`` (the operator asked for
    it). The model's own file, found in the cache by the server itself, is skipped instead: one line
    through ``say`` (default: stderr) names it and says why, and no question is answered by a head.
    """
    from gateway.decision import heads

    if choice == "none":
        return None
    sha = _model_sha256(model_path)
    if choice is None:
        if sha is None or not heads.default_path(sha).exists():
            return None
        return _load_found(
            "heads",
            lambda p: heads.load(p, hidden),
            heads.default_path(sha),
            sha,
            heads.printable,
            "no question is answered by a head (serveproto heads fit writes a new one)",
            say,
        )
    path = Path(choice)
    hs = _load_or_exit("--heads", lambda p: heads.load(p, hidden), path)
    if sha is not None and hs.model_sha256 != sha:
        raise SystemExit(
            f"serveproto serve: --heads: {path} was fitted on another model file (sha256 {hs.model_sha256[:12]}...)"
        )
    return hs


def load_calibrations(choice: str | None, paths: list[str | None]) -> list[Calibration | None]:
    """:func:`load_calibration` for each model of ``paths`` (its GGUF, or None). With several models a
    ``--calibration FILE`` applies to the models it was fitted on (the same sha256) and none to the others;
    it is refused (``SystemExit``) when it fits none of them."""
    if len(paths) == 1 or choice in (None, "none"):
        return [load_calibration(choice, p) for p in paths]
    from gateway.decision import calibration

    cal = _load_or_exit("--calibration", calibration.load, Path(choice), shown=choice)
    shas = [_model_sha256(p) for p in paths]
    if cal.model_sha256 not in shas:
        raise SystemExit(
            f"serveproto serve: --calibration: {choice} was fitted on none of the served model files "
            f"(sha256 {cal.model_sha256[:12]}...)"
        )
    return [cal if sha == cal.model_sha256 else None for sha in shas]


def plan_engines(
    args: argparse.Namespace, environ: Mapping[str, str] = os.environ, cpu_count: int | None = None
) -> list[plan.Planned]:
    """:func:`gateway.cli.plan.plan_engines` on the engines of the parsed command line ``args``."""
    return plan.plan_engines(config.engines_config(args), environ, cpu_count)


def engine_argv(args: argparse.Namespace) -> tuple[list[str], str | None]:
    """:func:`gateway.cli.plan.engine_argv` of the first model of the parsed command line ``args``."""
    return plan.engine_argv(config.engines_config(args))


async def serve(args: argparse.Namespace, *, task_status: TaskStatus[Any] | None = None) -> None:
    """``serveproto serve`` on its parsed command line ``args``: the configuration built once
    (:func:`gateway.cli.config.from_args`), then :func:`serve_config`."""
    await serve_config(config.from_args(args), task_status=task_status)


async def serve_config(cfg: config.ServeConfig, *, task_status: TaskStatus[Any] | None = None) -> None:
    """Start the engines, load each model's description, listen; runs until cancelled."""
    import anyio

    from gateway.engine.pool import Pool
    from gateway.http import HTTPServer, PortInUse
    from gateway.server.app import App
    from gateway.server.starting import Starting

    plans = plan.plan_engines(cfg.engines)
    # the port first: a port in use is reported at once, before a model is loaded for nothing
    try:
        listener = await HTTPServer.bind(cfg.host, cfg.port)
    except PortInUse:
        raise ListenFailed(
            f"serveproto: port {cfg.port} on {cfg.host} is in use (set PORT=..., e.g. PORT=8123 make serve)"
        ) from None
    except OSError as exc:
        raise ListenFailed(f"serveproto: cannot listen on {cfg.host}:{cfg.port}: {exc.strerror or exc}") from None
    try:  # after the bind: a port in use is still reported at once
        if cfg.engines.llama.precision != "native":  # minutes the first time: in a worker thread
            plans = await anyio.to_thread.run_sync(plan.transcoded, plans, cfg.engines.llama)
        decisions = _open_decision_log(cfg.decision)
    except BaseException as exc:
        await listener.aclose()
        from gateway.engine.precision import TranscodeError

        if isinstance(exc, TranscodeError):
            raise SystemExit(f"serveproto serve: --precision {cfg.engines.llama.precision}: {exc}") from None
        raise
    specs = [s for p in plans for s in p.specs]
    gave_up: list[str] = []
    # answering from the bind on: /health 200 and /ready 503 while the engines load (gateway.server.starting)
    handler = Starting()
    server = HTTPServer(handler, cfg.limits)
    accepting = anyio.CancelScope()

    async def answer(*, task_status: TaskStatus[int]) -> None:
        with accepting:
            async with anyio.create_task_group() as connections:
                task_status.started(await server.start(connections, listener=listener))

    async with listener, anyio.create_task_group() as outer:
        port = await outer.start(answer)
        async with Pool.spawn(specs, cfg.engine) as pool:
            served = await _served(pool, plans, cfg.decision, cfg.app.request_timeout, logged=decisions is not None)
            app = App(pool, served, config=cfg.app)
            app.decision_log = decisions
            async with anyio.create_task_group() as tg:  # until a signal, or every engine of a model gave up
                tg.start_soon(_stop_on_signal, tg.cancel_scope)
                handler.app = app
                for engine in pool.engines:
                    tg.start_soon(_fail_upward, pool, engine, server, tg.cancel_scope, cfg.engine.restart, gave_up)
                _say_serving(app, pool, cfg.host, port)
                if task_status is not None:
                    task_status.started(port)
            accepting.cancel()  # the listener and its connections first, then the engines shut down
    if decisions is not None:
        decisions.close()
    if gave_up:
        raise EngineGaveUp(gave_up[0])


def _open_decision_log(decision: config.DecisionConfig) -> DecisionLog | None:
    """The decision log ``--log-decisions`` names (``gateway.decision.decision_log.DecisionLog``, opened
    for appending), None without the flag; a file that cannot be opened ends ``serve`` with one line."""
    if not decision.log_decisions:
        return None
    from gateway.decision.decision_log import DecisionLog

    try:
        return DecisionLog(decision.log_decisions, required=decision.log_decisions_required)
    except OSError as exc:
        raise SystemExit(
            f"serveproto serve: --log-decisions: cannot open {decision.log_decisions}: {exc.strerror or exc}"
        ) from None


async def _served(
    pool: Pool, plans: list[plan.Planned], decision: config.DecisionConfig, timeout: float, *, logged: bool
) -> dict[str, Served]:
    """Each model as the app serves it (``gateway.server.fleet.Served``, built once), by the name requests
    pick it by: its description (from its first engine's CAPS and its GGUF), its default ``x_debias``,
    calibration, heads and decision ``timeout`` (seconds), and with ``logged`` (``--log-decisions``) its
    GGUF's sha256 for the log's lines. Raises ``SystemExit`` for two models under one name."""
    import anyio

    from gateway.server.app import ModelInfo
    from gateway.server.fleet import Served

    by_name = {e.name: e for e in pool.engines}
    cals = await anyio.to_thread.run_sync(load_calibrations, decision.calibration, [p.path for p in plans])
    served: dict[str, Served] = {}
    for p, cal in zip(plans, cals):
        first = by_name[p.specs[0].name]
        info = await anyio.to_thread.run_sync(ModelInfo.load, pool.first_caps[first.name].model, p.path)
        name = p.name or pool.model_of(first)  # the name requests pick it by, and replies carry
        if info.name != name:
            info = attrs.evolve(info, name=name, description=info.description.replace(info.name, name, 1))
        if name in served:
            raise SystemExit(f"serveproto serve: two models are served as {name!r}: name them, --model NAME=PATH")
        caps = pool.first_caps[first.name]
        # checked against what the engine reads: a head of another layer or size fails every question
        # it matches (an engine that reads no hidden states answers none with a head anyway)
        hidden = (caps.x_hidden, caps.x_hidden_dim) if caps.x_hidden else None
        heads = await anyio.to_thread.run_sync(load_heads, decision.heads, p.path, hidden)
        sha = await anyio.to_thread.run_sync(_model_sha256, p.path) if logged else None
        served[name] = Served.of(
            info, debias=decision.debias, calibration=cal, heads=heads, timeout=timeout, model_sha256=sha
        )
    return _with_pair(served, pool, decision)


def _with_pair(served: dict[str, Served], pool: Pool, decision: config.DecisionConfig) -> dict[str, Served]:
    """``served`` with ``--pair``'s model first (the default), when one is asked. Raises ``SystemExit``
    naming ``--pair`` for a name that is taken, a model not served, or models of the wrong kinds."""
    if decision.pair is None:
        return served
    from gateway.decision import readers
    from gateway.server.fleet import Served

    name, lm, decider = decision.pair
    if name in served:
        raise SystemExit(f"serveproto serve: --pair {name}: the name of a served model; name the pair otherwise")
    for model, decide in ((lm, False), (decider, True)):
        if model not in served:
            raise SystemExit(f"serveproto serve: --pair {name}: no --model is named {model!r}; served: {list(served)}")
        engine = next(e for e in pool.engines if pool.model_of(e) == model)
        if bool(pool.first_caps[engine.name].decide) != decide:
            raise SystemExit(
                f"serveproto serve: --pair {name}: {model!r} is not a "
                + ("decision model" if decide else "language model")
            )
    pair = Served.pair_of(name, served[lm], served[decider], decision.reader or readers.DEFAULT)
    return {name: pair, **served}


def _say_serving(app: App, pool: Pool, host: str, port: int) -> None:
    """The lines ``serve`` prints once listening: each model's engines (with several), where it serves,
    the default ``x_debias``, each calibration, each model's trained heads and the decision log."""
    from gateway.decision.heads import printable

    served = app.served
    if len(pool.engines) > 1:
        for name, s in served.items():
            if s.pair is not None:
                print(
                    f"serveproto: model {name}: the pair of {s.pair[0]} and {s.pair[1]}, read by {s.reader} "
                    "unless a request says (x_reader)",
                    flush=True,
                )
                continue
            engines = [e.name for e in pool.engines if pool.model_of(e) == name]
            print(f"serveproto: model {name}: {len(engines)} engine(s) ({', '.join(engines)})", flush=True)
    print(f"serveproto: serving {app.model.name} on http://{host}:{port}", flush=True)
    debias = app.settings.debias
    if debias:
        print(f"serveproto: x_debias defaults to {','.join(debias)} (--debias none to turn it off)", flush=True)
    for name, model in served.items():
        settings = model.settings
        if settings.calibration is not None:
            print(
                f"serveproto: calibration {settings.calibration.id} on answers read under x_debias "
                f"{','.join(settings.calibration.debias) or 'none'}{f' ({name})' if len(served) > 1 else ''} "
                "(--calibration none to turn it off)",
                flush=True,
            )
        if settings.heads is not None:
            names = [printable(n) for n in settings.heads.names]  # a name cannot forge a log line
            print(
                f"serveproto: {len(names)} trained head(s) answer the questions they were fitted on"
                f"{f' ({name})' if len(served) > 1 else ''}: {', '.join(names) or 'none'} "
                "(--heads none to turn them off)",
                flush=True,
            )
    decisions = app.decision_log
    if decisions is not None:
        print(
            f"serveproto: logging decisions to {decisions.path} (ids, options, probabilities; no text)"
            + ("; a request it cannot log is refused" if decisions.required else ""),
            flush=True,
        )


def _model_sha256(model_path: str | None) -> str | None:
    """The model file's sha256 (calibration and heads files name it; so do the decision log's lines), None
    when serve was not given its path or it does not exist; sha256_file remembers, so it is hashed once."""
    from gateway.decision import calibration

    return calibration.sha256_file(model_path) if model_path and Path(model_path).exists() else None


async def _fail_upward(
    pool: Pool, engine: Engine, server: HTTPServer, scope: CancelScope, restart: RestartPolicy, gave_up: list[str]
) -> None:
    """When the supervisors give up on every engine of a model, so does the server (OTP's answer to an
    exceeded restart intensity): it stops accepting, answers the requests in flight (they get 503 from the
    engine's error) within :data:`GIVE_UP_DRAIN` seconds, then ``scope`` is cancelled and :func:`serve_config`
    raises :class:`EngineGaveUp`, so that a process manager sees the exit and restarts the whole server.
    One engine of several giving up leaves its model to the others (``/health`` lists it ``gave_up``)."""
    await engine.wait_stopped()
    if not engine.gave_up:
        return  # closed: the server is stopping anyway
    model = pool.model_of(engine)
    if not all(e.gave_up for e in pool.engines if pool.model_of(e) == model):
        logging.getLogger("serveproto.serve").error(
            "engine %s gave up (last error: %s); model %s is served by its other engines",
            engine.name,
            engine.last_error,
            model,
        )
        return
    failures = (restart.max_restarts or 0) + 1
    who = "the engine" if len(pool.engines) == 1 else f"every engine of model {model}"
    gave_up.append(
        f"serveproto serve: giving up: {who} failed {failures} time(s) within "
        f"{restart.period:g} s (--max-restarts {restart.max_restarts}); last error: "
        f"{engine.last_error}; exiting with status 1 (--keep-restarting keeps retrying)"
    )
    await server.drain(GIVE_UP_DRAIN)
    scope.cancel()


async def _stop_on_signal(scope: CancelScope) -> None:
    """SIGTERM or SIGINT stops the server: listener and connections cancelled, then the engine shut down."""
    import signal

    import anyio

    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            logging.getLogger("serveproto.serve").info("signal %s: shutting down", signum)
            scope.cancel()
            return


def run(args: argparse.Namespace) -> int:
    import anyio

    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO), format="%(message)s", stream=sys.stderr
    )
    try:
        anyio.run(serve, args)
    except KeyboardInterrupt:
        return 0
    except ListenFailed as exc:
        print(exc, file=sys.stderr)
        return 2
    except EngineGaveUp as exc:
        print(exc, file=sys.stderr)
        return 1
    except EngineError as exc:
        tail = getattr(exc, "stderr_tail", ())  # the operator's terminal: the engine's own words help here
        said = f"; its last stderr lines: {' | '.join(tail[-3:])}" if tail else ""
        print(f"serveproto serve: the engine did not start: {exc}{said}", file=sys.stderr)
        return 1
    return 0
