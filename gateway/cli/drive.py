"""``serveproto drive`` and ``serveproto score``: engines by hand.

``drive ENGINE_CMD...`` starts the engine under the supervisor and reads
commands from stdin (a terminal or a pipe): short commands (``submit 0 "text"
--logprobs 5``, ``readout``, ``score``, ``decide``, ``ping``, ``caps``) or a
request frame typed as on the wire. Every reply event is printed on one
readable line. ``score --model PATH --prefix ... --option A --option B``
prints each option's token count, log-probability and softmax probability.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NoReturn

import anyio
import attrs

from gateway.cli import sub_command
from gateway.decision.arithmetic import NORMALIZE, probabilities

if TYPE_CHECKING:
    from gateway.engine.api import Engine, ScoreResult
    from gateway.engine.request import RequestStream

#: A drive command, ready to run (in the foreground or in the background).
Run = Callable[[], Awaitable[None]]

#: Printed by ``help`` in a drive session.
DRIVE_HELP = """\
commands (a trailing ' &' runs one in the background; 'wait' waits for those):
  submit [SLOT] TEXT [--max-tokens N] [--logprobs K] [--pin] [--temp T] [--top-p P]
                     [--no-counters]                    generate / read out
  readout TEXT [--logprobs K] [--pin] [--slot S]        read a prompt out (max_tokens=0)
  score PREFIX OPTION... [--stem S] [--slot S] [--pin] [--fallback]
                                                        options' logprobs + softmax
  decide [SLOT] JSON                                    DECIDE a decision record
  ping | caps | status | wait | help | quit
  cancel ID                                             cancel a background request
  Ctrl-C interrupts the command in the foreground (the engine gets CANCEL).
  SUBMIT 1 0 5 0 0 1 logprobs=3                         a request frame as on the wire;
  hello                                                 its payload on the next line(s)
"""


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{self.prog}: {message}")


def _text(data: bytes) -> str:
    """Bytes shown as a quoted Python string (invalid UTF-8 as \\x escapes)."""
    return repr(data.decode("utf-8", "backslashreplace"))


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    # %.9g, as the protocol prints them: a float32 logprob round-trips exactly.
    return "nan" if math.isnan(x) else format(x, ".9g")


def describe(ev: Any) -> str:
    """One readable line for a reply event (``Accept``, ``Echo``, ``Data``, ...)."""
    kind = type(ev).__name__.upper()
    rid = getattr(ev, "id", None)
    head = f"{kind:<8} id={rid}" if rid is not None else f"{kind:<8}"
    top = ""
    if getattr(ev, "top", None):
        top = "  top: " + " ".join(f"{tid}:{_num(lp)}" for tid, lp in ev.top)
    if kind == "ACCEPT":
        return f"{head} prompt_tokens={ev.prompt_tokens}"
    if kind == "ECHO":
        return f"{head} pos={ev.position} logprob={_num(ev.logprob)} {_text(ev.text)}{top}"
    if kind == "DATA":
        lp = f" logprob={_num(ev.logprob)}" if ev.logprob is not None else ""
        return f"{head} {_text(ev.text)}{lp}{top}"
    if kind == "DONE":
        extra = ""
        if ev.computed is not None:
            extra = f" computed={ev.computed} reused={ev.reused} snapshot={ev.snapshot}"
        return (
            f"{head} emitted={ev.emitted} tok_s={_num(ev.tok_s)} "
            f"prompt_tokens={ev.prompt_tokens} length_limited={int(ev.length_limited)}"
            f" rss_gb={_num(ev.rss_gb)}{extra}"
        )
    if kind == "SCORED":
        lps = " ".join(_num(x) for x in ev.logprobs)
        return (
            f"{head} group={ev.group} option={ev.option} "
            f"context_tokens={ev.context_tokens} logprobs=[{lps}] "
            f"sum={_num(math.fsum(ev.logprobs))}"
        )
    if kind == "DECISION":
        return f"{head} {ev.record.decode('utf-8', 'replace')}"
    if kind == "PONG":
        return f"{head} " + " ".join(f"{k}={v}" for k, v in ev.values.items())
    return f"{head} {ev!r}"


def score_table(result: ScoreResult, normalize: str = "sum") -> list[str]:
    """Lines of a ScoreResult: per group, each option's tokens, logprob and probability.

    The probabilities are :func:`gateway.decision.arithmetic.probabilities` (the server's
    arithmetic); raises its ``ValueError`` for an unusable option (no token, a non-finite logprob).
    """
    lines = []
    for gi, row in enumerate(result.groups):
        probs = probabilities(result, gi, normalize)
        width = max(8, *(len(repr(o.option)) for o in row))
        if len(result.groups) > 1:
            lines.append(f"group {gi}")
        lines.append(f"{'option':<{width}}  tokens  context  {'logprob':>12}  {'p':>8}")
        for o, p in zip(row, probs):
            lines.append(
                f"{o.option!r:<{width}}  {o.n_tokens:>6}  {o.context_tokens:>7}  {o.logprob:>12.6f}  {p:>8.6f}"
            )
    how = "SCORE" if result.fast else "pin + SUBMIT fallback"
    counts = ""
    if result.computed is not None:
        counts = f", computed={result.computed} reused={result.reused}"
    lines.append(f"({how}; normalize={normalize}{counts})")
    return lines


# ---------------------------------------------------------------- drive


class DriveSession:
    """The command interpreter of ``serveproto drive`` over one :class:`Engine`.

    ``out`` is called with each line to print. ``run_line`` runs one command
    line to completion (or starts it in the background with a trailing ``&``);
    frames typed as on the wire need their payload: ``feed_payload`` reads it.
    """

    def __init__(
        self,
        engine: Engine,
        out: Callable[[str], None],
        read_line: Callable[[], Awaitable[str]],
        tg: anyio.abc.TaskGroup,
    ) -> None:
        self.eng = engine
        self.out = out
        self.read_line = read_line
        self.tg = tg
        #: Requests running now, by id (for ``cancel ID``).
        self.running: dict[int | None, RequestStream] = {}
        self._background_count = 0
        self._foreground: anyio.CancelScope | None = None
        self._change = anyio.Event()
        self._idle = anyio.Event()
        self._idle.set()

    async def run_line(self, line: str) -> bool:
        """Run one line; False when the session should end."""
        line = line.strip()
        if not line or line.startswith("#"):
            return True
        background = line.endswith(" &") or line == "&"
        if background:
            line = line[:-1].rstrip()
        word = line.split(None, 1)[0]
        if word in ("quit", "exit"):
            return False
        if word[:1].isupper():
            fn = await self._raw_frame(line)
        else:
            try:
                fn = self._command(word, shlex.split(line)[1:])
            except (_UsageError, ValueError) as exc:
                self.out(f"error: {exc}")
                return True
        if fn is None:
            return True
        if background:
            self.tg.start_soon(self._background, fn)
            return True
        with anyio.CancelScope() as scope:
            self._foreground = scope
            try:
                await self._guarded(fn)
            finally:
                self._foreground = None
        if scope.cancelled_caught:
            self.out("(interrupted)")
        return True

    def interrupt(self) -> bool:
        """Ctrl-C: cancel the command running in the foreground; False when there is none."""
        if self._foreground is None:
            return False
        self._foreground.cancel()
        return True

    async def _guarded(self, fn: Run) -> None:
        from gateway.engine import EngineError, RequestError

        try:
            await fn()
        except RequestError as exc:
            self.out(f"ERROR    id={exc.request_id} {exc.code} {exc.reason}".rstrip())
        except EngineError as exc:
            self.out(f"engine error ({type(exc).__name__}): {exc}")
        except (ValueError, TypeError) as exc:
            self.out(f"error: {exc}")
        except Exception as exc:  # a typed-in frame the protocol layer refuses
            self.out(f"error ({type(exc).__name__}): {exc}")

    async def _background(self, fn: Run) -> None:
        if self._background_count == 0:
            self._idle = anyio.Event()
        self._background_count += 1
        try:
            await self._guarded(fn)
        finally:
            self._background_count -= 1
            if self._background_count == 0:
                self._idle.set()
            self._changed()

    async def wait(self) -> None:
        """Wait for the background commands."""
        await self._idle.wait()

    # -------------------------------------------------------- commands

    def _command(self, word: str, args: list[str]) -> Run | None:
        eng = self.eng
        if word == "help":
            return self._say(DRIVE_HELP.rstrip())
        if word == "caps":
            return self._say(" ".join(f"{k}={v}" for k, v in eng.caps.values.items()))
        if word == "status":
            return self._say(
                f"healthy={int(eng.healthy)} pid={eng.pid} restarts={eng.restarts}"
                f" in_flight={eng.in_flight} waiting={eng.waiting}"
            )
        if word == "wait":
            return self.wait
        if word == "ping":

            async def ping() -> None:
                values = await eng.ping()
                self.out("PONG     " + " ".join(f"{k}={v}" for k, v in values.items()))

            return ping
        if word == "cancel":
            p = _Parser(prog="cancel")
            p.add_argument("id", type=int)
            a = p.parse_args(args)
            return self._cancel(a.id)
        if word == "submit":
            p = _Parser(prog="submit")
            p.add_argument("words", nargs="+")
            p.add_argument("--max-tokens", type=int, default=16)
            p.add_argument("--logprobs", type=int, default=0)
            p.add_argument("--pin", action="store_true")
            p.add_argument("--temp", type=float, default=0.0)
            p.add_argument("--top-p", type=float, default=1.0)
            p.add_argument("--no-counters", action="store_true")
            a = p.parse_args(args)
            slot, text = _slot_and_text(a.words, "submit")
            return self._stream(
                lambda: eng.submit(
                    text,
                    max_tokens=a.max_tokens,
                    temperature=a.temp,
                    top_p=a.top_p,
                    logprobs=a.logprobs,
                    pin=a.pin,
                    slot=slot,
                    counters=not a.no_counters,
                )
            )
        if word == "readout":
            p = _Parser(prog="readout")
            p.add_argument("text")
            p.add_argument("--logprobs", type=int, default=5)
            p.add_argument("--pin", action="store_true")
            p.add_argument("--slot", type=int)
            a = p.parse_args(args)
            return self._stream(lambda: eng.submit(a.text, max_tokens=0, logprobs=a.logprobs, pin=a.pin, slot=a.slot))
        if word == "score":
            p = _Parser(prog="score")
            p.add_argument("prefix")
            p.add_argument("options", nargs="+")
            p.add_argument("--stem", default="")
            p.add_argument("--slot", type=int)
            p.add_argument("--pin", action="store_true")
            p.add_argument("--fallback", action="store_true")
            p.add_argument("--normalize", choices=NORMALIZE, default="sum")
            a = p.parse_args(args)

            async def score() -> None:
                r = await eng.score(
                    a.prefix, [(a.stem, a.options)], pin=a.pin, slot=a.slot, fast=False if a.fallback else None
                )
                for line in score_table(r, a.normalize):
                    self.out(line)

            return score
        if word == "decide":
            p = _Parser(prog="decide")
            p.add_argument("words", nargs="+")
            a = p.parse_args(args)
            slot, record = _slot_and_text(a.words, "decide")

            async def decide() -> None:
                decision, done = await eng.decide(record, slot=slot or 0)
                self.out("DECISION " + json.dumps(decision, ensure_ascii=False))
                self.out(describe(done))

            return decide
        raise _UsageError(f"unknown command {word!r}; try 'help'")

    def _say(self, text: str) -> Run:
        async def say() -> None:
            self.out(text)

        return say

    def _stream(self, make_stream: Callable[[], RequestStream]) -> Run:
        async def run() -> None:
            stream = make_stream()
            try:
                async with stream:
                    async for ev in stream:
                        if stream.request_id not in self.running:
                            self.running[stream.request_id] = stream
                            self._changed()
                        self.out(describe(ev))
            finally:
                self.running.pop(stream.request_id, None)
                self._changed()

        return run

    def _changed(self) -> None:
        self._change.set()
        self._change = anyio.Event()

    def _cancel(self, rid: int) -> Run:
        async def cancel() -> None:
            # A request started in the background may not have its id yet: wait
            # until it shows up, or until no background command is left.
            while rid not in self.running and self._background_count:
                await self._change.wait()
            stream = self.running.get(rid)
            if stream is None:
                self.out(f"error: no request {rid} running")
                return
            await stream.aclose()
            self.out(f"cancelled {rid}")

        return cancel

    async def _raw_frame(self, line: str) -> Run | None:
        """A request frame typed as on the wire; its payload (if any) is read next."""
        from gateway.cli.drive_frames import read_frame

        try:
            event = await read_frame(line, self.read_line)
        except EOFError as exc:
            self.out(f"error: {exc}")
            return None
        except Exception as exc:  # the protocol layer's verdict on the typed frame
            self.out(f"error: bad frame: {exc}")
            return None
        eng = self.eng

        kind = type(event).__name__
        if kind in ("Stop", "Cancel"):
            return self._cancel(event.id)
        if kind == "Image":
            self.out("error: drive cannot send IMAGE frames (they pair with a SUBMIT by id)")
            return None
        slot = getattr(event, "slot", None)

        def make(rid: int, slot_no: int) -> Any:
            changes = {"id": rid}
            if slot is not None:
                changes["slot"] = slot_no
            return attrs.evolve(event, **changes)

        def open_stream() -> RequestStream:
            s = eng.request(make, slot=slot, slotless=slot is None)
            return s

        run = self._stream(open_stream)

        async def announce() -> None:
            self.out(f"(sent {kind.upper()} with a fresh id; typed id {event.id})")
            await run()

        return announce


def _slot_and_text(words: list[str], prog: str) -> tuple[int | None, str]:
    if len(words) == 1:
        return None, words[0]
    if len(words) == 2:
        try:
            return int(words[0]), words[1]
        except ValueError:
            pass
    raise _UsageError(f"{prog}: expected [SLOT] TEXT (quote the text), got {words!r}")


async def _drive(args: argparse.Namespace) -> int:
    from gateway.engine import Engine, EngineError
    from gateway.engine.options import EngineOptions

    def out(text: str) -> None:
        print(text, flush=True)

    async def read_line() -> str:
        return await anyio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)

    try:
        options = EngineOptions().updated(
            handshake_timeout=args.handshake_timeout,
            request_timeout=args.timeout,
            stall_timeout=args.stall_timeout,
            max_restarts=args.max_restarts,
        )
        async with Engine.spawn(args.cmd, name=args.name, options=options) as eng:
            out(f"engine {eng.name} pid {eng.pid}: " + " ".join(f"{k}={v}" for k, v in eng.caps.values.items()))
            interactive = sys.stdin.isatty()
            async with anyio.create_task_group() as tg:
                session = DriveSession(eng, out, read_line, tg)

                async def on_sigint() -> None:
                    with anyio.open_signal_receiver(signal.SIGINT) as signals:
                        async for _ in signals:
                            if not session.interrupt():
                                out("(Ctrl-C: nothing to interrupt; 'quit' or Ctrl-D leaves)")

                tg.start_soon(on_sigint)
                while True:
                    if interactive:
                        print("drive> ", end="", flush=True)
                    line = await read_line()
                    if not line:
                        break
                    if not await session.run_line(line):
                        break
                await session.wait()
                tg.cancel_scope.cancel()
            out(f"closing engine {eng.name} (restarts: {eng.restarts})")
    except EngineError as exc:
        print(f"serveproto drive: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------- score


def _engine_cmd(args: argparse.Namespace) -> list[str]:
    from gateway.cli.plan import default_model_or_exit, engine_or_exit

    if args.engine:
        return shlex.split(args.engine)
    model = args.model or str(default_model_or_exit("serveproto score"))
    return [str(engine_or_exit("serveproto score", "serveproto-llama")), "--model", model]


async def _score(args: argparse.Namespace) -> int:
    from gateway.engine import Engine, EngineError, RequestError
    from gateway.engine.options import EngineOptions

    cmd = _engine_cmd(args)
    try:
        options = EngineOptions().updated(
            handshake_timeout=args.handshake_timeout, request_timeout=args.timeout, max_restarts=0
        )
        async with Engine.spawn(cmd, options=options) as eng:
            result = await eng.score(
                args.prefix, [(args.stem, args.option)], pin=False, fast=False if args.fallback else None
            )
    except (EngineError, RequestError) as exc:
        print(f"serveproto score: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    try:
        lines = score_lines(result, args.normalize, as_json=args.json)
    except ValueError as exc:  # what the server answers 502 for (gateway.decision.errors.UnusableScores)
        print(f"serveproto score: the engine's scores are unusable: {exc}", file=sys.stderr)
        return 1
    for line in lines:
        print(line)
    return 0


def score_lines(result: ScoreResult, normalize: str = "sum", *, as_json: bool = False) -> list[str]:
    """What ``serveproto score`` prints for a one-group ScoreResult: :func:`score_table`, or one JSON
    line (``options``: option, tokens, context_tokens, logprob, logprobs, probability; ``normalize``,
    ``fast``, ``computed``, ``reused``). Raises ``ValueError`` as :func:`gateway.decision.arithmetic.probabilities`."""
    if not as_json:
        return score_table(result, normalize)
    row = result.groups[0]
    probs = probabilities(result, 0, normalize)
    return [
        json.dumps(
            {
                "options": [
                    {
                        "option": o.option,
                        "tokens": o.n_tokens,
                        "context_tokens": o.context_tokens,
                        "logprob": o.logprob,
                        "logprobs": list(o.logprobs),
                        "probability": p,
                    }
                    for o, p in zip(row, probs)
                ],
                "normalize": normalize,
                "fast": result.fast,
                "computed": result.computed,
                "reused": result.reused,
            },
            ensure_ascii=False,
        )
    ]


SCORE_HELP = """\
Score a closed question with a language model: start an engine, read PREFIX
(+ STEM) once, and print each option's token count, the log-probability of
its tokens given the text before them (summed, or averaged with --normalize
mean), and the softmax of those scores over the options. The engine is
stopped when done.

The engine is serveproto-llama on --model (default: the fetched
SmolLM2-135M-Instruct), or any engine command given with --engine. The scoring
uses the engine's SCORE extension when it has one, else one pinned read-out
per option (--fallback forces that path).

example:
  serveproto score --engine engines/bin/serveproto-fixture \\
      --prefix "Q: is the sky blue? A:" --option " yes" --option " no"

  option    tokens  context       logprob         p
  ' yes'         4       22    -21.748388  0.000323
  ' no'          3       22    -13.712094  0.999677
  (SCORE; normalize=sum, computed=27 reused=0)
"""


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``drive`` and ``score`` on the ``serveproto`` sub-command parser."""
    p = sub_command(
        sub,
        "drive",
        "drive an engine by hand (frames or short commands)",
        __doc__.split("\n\n")[1] + "\n\n" + DRIVE_HELP,
    )
    p.add_argument("--name", default=None, help="engine name in logs (default: the command)")
    p.add_argument(
        "--handshake-timeout",
        type=float,
        default=120.0,
        metavar="S",
        help="seconds the engine may take to load and answer READY..STAT",
    )
    p.add_argument("--timeout", type=float, default=None, metavar="S", help="deadline of each request (default: none)")
    p.add_argument(
        "--stall-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds of silence with requests in flight before the engine is declared hung and restarted",
    )
    p.add_argument(
        "--max-restarts", type=int, default=3, metavar="N", help="restarts allowed within 60 s before giving up"
    )
    p.add_argument(
        "cmd", nargs=argparse.REMAINDER, metavar="ENGINE_CMD", help="the engine command and its arguments (after --)"
    )
    p.set_defaults(func=_run_drive)

    s = sub_command(sub, "score", "score options after a prefix: logprob + softmax", SCORE_HELP)
    src = s.add_mutually_exclusive_group()
    src.add_argument("--model", help="GGUF for serveproto-llama (default: the default model)")
    src.add_argument("--engine", help="any engine command line (shell-quoted)")
    s.add_argument("--prefix", required=True, help="the context read before every option")
    s.add_argument("--stem", default="", help="text between the prefix and each option")
    s.add_argument("--option", action="append", required=True, help="an option (repeat)")
    s.add_argument(
        "--normalize",
        choices=NORMALIZE,
        default="sum",
        help="an option's score: the sum (default) or the mean of its token logprobs",
    )
    s.add_argument("--fallback", action="store_true", help="use pin + SUBMIT even when the engine has SCORE")
    s.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    s.add_argument(
        "--handshake-timeout", type=float, default=120.0, metavar="S", help="seconds the engine may take to load"
    )
    s.add_argument("--timeout", type=float, default=None, metavar="S", help="deadline of the scoring (default: none)")
    s.set_defaults(func=_run_score)


def _run_drive(args: argparse.Namespace) -> int:
    if args.cmd and args.cmd[0] == "--":
        args.cmd = args.cmd[1:]
    if not args.cmd:
        print(
            "serveproto drive: give the engine command, e.g. serveproto drive -- engines/bin/serveproto-fixture",
            file=sys.stderr,
        )
        return 2
    _setup_logging()
    return anyio.run(_drive, args)


def _run_score(args: argparse.Namespace) -> int:
    _setup_logging()
    return anyio.run(_score, args)


def _setup_logging() -> None:
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
