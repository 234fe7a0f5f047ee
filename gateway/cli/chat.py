"""``serveproto chat --attach URL``: the terminal client of a running server.

Plain lines chat (streamed from ``/v1/chat/completions``); ``/decide a | b | c``
(or ``:decide``) switches to System One mode, where each line is asked as one
``choice`` on ``/v1/systemone`` with the conversation so far as the state, and
the answer is drawn as bars with the winner's normalised entropy. Line editing
and TAB completion come from prompt_toolkit, the drawing from rich; the HTTP
side and the arithmetic are in :mod:`gateway.cli.chat_client`.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from gateway.cli.chat_client import (
    Client,
    Decision,
    ServerError,
    ServerUnreachable,
    parse_options,
)
from gateway.decision.conversation import conversation_state

if TYPE_CHECKING:  # imported lazily where used, so that other sub-commands start fast
    from prompt_toolkit import PromptSession
    from prompt_toolkit.completion import CompleteEvent, Completer, Completion
    from prompt_toolkit.document import Document
    from rich.console import Console, Group

#: The commands TAB completes, with the one-line help shown beside them.
COMMANDS = {
    "/decide": "System One: /decide a | b | c; alone, back to chat",
    ":decide": "same as /decide",
    "/clear": "forget the conversation so far",
    "/help": "list the commands",
    "/quit": "leave (Ctrl-D too)",
    "/exit": "leave",
}

#: Width of a probability bar, in terminal cells.
BAR_WIDTH = 26


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``chat`` on the ``serveproto`` sub-command parser ``sub``."""
    p = sub.add_parser(
        "chat",
        help="chat with a running server; /decide a | b | c for System One answers",
        description="Terminal client of a running serveproto server. Plain lines chat; "
        "'/decide a | b | c' asks each following line as one choice among a, b, c "
        "(POST /v1/systemone, the conversation so far as the state); '/decide' alone returns to chat. "
        "Exit status 1 when the server refuses the key at the start, or, with piped input, when any request failed.",
    )
    p.add_argument("--attach", required=True, metavar="URL", help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument(
        "--api-key",
        default=os.environ.get("SERVEPROTO_API_KEY"),
        help="sent as 'Authorization: Bearer KEY' (default: $SERVEPROTO_API_KEY)",
    )
    p.add_argument("--model", default=None, help="model name to send (default: the server's first model)")
    p.add_argument("--max-tokens", type=int, default=256, help="chat reply limit in tokens (default 256)")
    p.add_argument("--timeout", type=float, default=600.0, help="socket timeout in seconds (default 600)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``serveproto chat``; returns the exit status.

    Ctrl-C cancels a request (a ``KeyboardInterrupt``), so SIGINT gets Python's
    default handler back even when the client was started with SIGINT ignored
    (``make test > log &``, ``nohup``): Python installs none then.
    """
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        client = Client(args.attach, api_key=args.api_key, timeout=args.timeout)
    except ValueError as exc:
        print(f"serveproto chat: {exc}", file=sys.stderr)
        return 2
    return ChatSession(client, model=args.model, max_tokens=args.max_tokens).loop()


def command_completer() -> Completer:
    """A prompt_toolkit completer of the first word when it starts with ``/`` or ``:``
    (the :data:`COMMANDS`); imported lazily so other sub-commands start fast."""
    from prompt_toolkit.completion import Completer, Completion

    class CommandCompleter(Completer):
        def get_completions(self, document: Document, complete_event: CompleteEvent) -> Iterator[Completion]:
            text = document.text_before_cursor
            if not text or text[0] not in "/:" or " " in text:
                return
            for cmd, meta in COMMANDS.items():
                if cmd.startswith(text):
                    yield Completion(cmd, start_position=-len(text), display_meta=meta)

    return CommandCompleter()


def format_seconds(seconds: float) -> str:
    """Wall time for people: ``"12.3 ms"`` under a second, ``"58.71s"`` from one on."""
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f}s"


def render_decision(decision: Decision, width: int = BAR_WIDTH) -> Group:
    """The answer as rich renderables: a header, one bar per option (most likely
    first, ties in the request's order), the winner with its entropy and reading,
    and the time and token counts. Returns a ``rich.console.Group``."""
    from rich.cells import cell_len
    from rich.console import Group
    from rich.text import Text

    order = sorted(range(len(decision.options)), key=lambda i: -decision.probabilities[i])
    label_w = max(cell_len(label) for label in decision.options)
    lines = [Text("  ◆ System One", style="bold magenta")]
    for i in order:
        label, p = decision.options[i], decision.probabilities[i]
        filled = min(width, max(0, round(p * width)))
        line = Text("     ")
        line.append(label + " " * (label_w - cell_len(label)), style="bold" if label == decision.winner else "")
        line.append("  ")
        line.append("█" * filled, style="green" if label == decision.winner else "cyan")
        line.append("░" * (width - filled), style="grey50")
        line.append(f"  {100 * p:5.1f}%")
        lines.append(line)
    reading_style = {"sure": "green", "unsure": "yellow"}.get(decision.reading, "red")
    tail = Text("     → ")
    tail.append(decision.winner, style="bold")
    tail.append(f"  entropy {decision.entropy:.3f}  ")
    tail.append(f"({decision.reading})", style=reading_style)
    lines.append(tail)
    lines.append(
        Text(
            f"  {format_seconds(decision.seconds)} · {decision.input_tokens} prompt tokens · "
            f"{decision.output_tokens} option tokens read · nothing generated",
            style="dim",
        )
    )
    return Group(*lines)


class ChatSession:
    """One terminal conversation with a server: the history, the mode, the prompt loop.

    ``messages``: the conversation so far (OpenAI ``{"role", "content"}`` dicts);
    ``options``: the System One labels, or ``None`` in chat mode.
    """

    def __init__(
        self, client: Client, model: str | None = None, max_tokens: int = 256, console: Console | None = None
    ) -> None:
        from rich.console import Console

        self.client = client
        self.model = model
        self.max_tokens = max_tokens
        self.console = console or Console(highlight=False)
        self.messages: list[dict[str, Any]] = []
        self.options: tuple[str, ...] | None = None
        #: requests that failed in this session (each reported once, as it happened)
        self.failures = 0

    # -- output helpers ---------------------------------------------------
    def say(self, text: str, style: str = "") -> None:
        """Print one plain line (no rich markup), wrapped by the terminal, not by rich."""
        self.console.print(text, style=style, markup=False, highlight=False, soft_wrap=True)

    def fail(self, text: str) -> None:
        """Print one red ``✗`` line: how every error reaches the user; counts it in ``failures``."""
        self.failures += 1
        self.say(f"  ✗ {text}", style="red")

    # -- the loop ---------------------------------------------------------
    def loop(self) -> int:
        """Greet, then read lines until ``/quit`` or Ctrl-D (or the end of piped input); returns the exit status.

        A rejected key (401 at the greeting) ends the session at once with 1: no
        later line could succeed. With piped input the status is 1 when any
        request of the session failed (each failure printed once), else 0; at a
        terminal it is 0.
        """
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import InMemoryHistory

        if not self.greet():
            return 1
        if not sys.stdin.isatty():
            # Piped input (a script, a here-document): one command or question per line, no line editor.
            for line in sys.stdin:
                if not self.handle(line):
                    break
            return 1 if self.failures else 0
        session: PromptSession[str] = PromptSession(
            history=InMemoryHistory(), completer=command_completer(), complete_while_typing=False
        )
        while True:
            prompt = "◆ › " if self.options else "› "
            try:
                line = session.prompt(prompt)
            except KeyboardInterrupt:
                continue  # Ctrl-C at the prompt clears the line, as in a shell
            except EOFError:
                self.say("  bye")
                return 0
            if not self.handle(line):
                return 0

    def greet(self) -> bool:
        """Say where we are attached and which model answers (``GET /v1/models``). Returns False when
        the session cannot go on: the key was refused (401), or, with piped input, no usable answer
        came. At a terminal a server that is down is reported, not fatal: the next line tries again."""
        self.say(f"  attached to {self.client.base_url}", style="bold")
        try:
            ids = self.client.model_ids()
        except ServerError as exc:
            self.fail(self.explain(exc))
            return exc.status != 401 and sys.stdin.isatty()
        else:
            if self.model is None and ids:
                self.model = ids[0]
            self.say(f"  model {self.model or '(server default)'} · chat, or /decide a | b | c · /help", style="dim")
        return True

    def explain(self, exc: ServerError) -> str:
        """The one line shown for ``exc``, with a hint where one helps (server down, 401)."""
        if isinstance(exc, ServerUnreachable):
            return f"{exc.message}; is `serveproto serve` running there?"
        if exc.status == 401:
            return f"HTTP 401: {exc.message} (pass --api-key or set SERVEPROTO_API_KEY)"
        return str(exc)

    def handle(self, line: str) -> bool:
        """Act on one input line; returns False to leave."""
        text = line.strip()
        if not text:
            return True
        word, _, rest = text.partition(" ")
        if word in ("/decide", ":decide"):
            self.set_mode(rest.strip())
        elif word in ("/quit", "/exit"):
            self.say("  bye")
            return False
        elif word == "/help":
            for cmd, meta in COMMANDS.items():
                self.say(f"  {cmd:8} {meta}")
        elif word == "/clear":
            self.messages.clear()
            self.say("  ✦ conversation cleared", style="cyan")
        elif word.startswith("/") and len(word) > 1 and word[1:].isalpha():
            self.fail(f"unknown command {word}; /help lists them")
        elif self.options:
            self.decide(text)
        else:
            self.chat(text)
        return True

    def set_mode(self, rest: str) -> None:
        """``/decide`` with ``rest`` = ``"a | b | c"`` enters System One mode; empty returns to chat."""
        if not rest:
            if self.options:
                self.options = None
                self.say("  ✦ chat", style="cyan")
            else:
                self.say("  ✦ chat (already) · /decide a | b | c enters System One", style="cyan")
            return
        try:
            self.options = parse_options(rest)
        except ValueError as exc:
            self.fail(str(exc))
            return
        self.say(
            f"  ✦ System One · {len(self.options)} options · the model no longer generates, it assigns probabilities",
            style="cyan",
        )

    def chat(self, text: str) -> None:
        """Stream the reply to ``text``; the turn joins the conversation only when it completed."""
        turn = {"role": "user", "content": text}
        out = self.console.file
        parts: list[str] = []
        try:
            for delta in self.client.chat_stream(self.messages + [turn], model=self.model, max_tokens=self.max_tokens):
                out.write(delta if parts else "  " + delta)  # the indent comes with the first text
                parts.append(delta)
                out.flush()
            out.write("\n" if parts else "  \n")
        except KeyboardInterrupt:
            if parts:
                out.write("\n")
            self.fail("cancelled; this turn is not kept")
            return
        except ServerError as exc:
            if parts:  # end the partial reply's line; an error before any text prints no empty line
                out.write("\n")
            self.fail(self.explain(exc))
            return
        self.messages += [turn, {"role": "assistant", "content": "".join(parts)}]

    def decide(self, question: str) -> None:
        """Ask ``question`` as one ``choice`` among the current options and draw the answer."""
        assert self.options is not None
        try:
            with self.console.status("  scoring…", spinner="dots"):
                decision = self.client.decide(
                    conversation_state(self.messages), question, self.options, model=self.model
                )
        except KeyboardInterrupt:
            self.fail("cancelled")
            return
        except ServerError as exc:
            self.fail(self.explain(exc))
            return
        self.console.print(render_decision(decision))
        # The question and its answer join the conversation, so chat and later
        # decisions see them.
        self.messages += [
            {"role": "user", "content": question},
            {"role": "assistant", "content": decision.winner},
        ]
