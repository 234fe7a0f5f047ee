"""Load on loopback (issue 15): requests/s, questions/s, p50 and p99 at 1, 4, 16 and 64 concurrent clients.

Two workloads, deterministic for ``--seed``:

- **tickets**: a stream of new support tickets (``gateway.lab.evalset``'s generator, one seed per ticket),
  each asked 3 questions: ``department`` (a choice of 4 described labels), ``refund`` (noul) and
  ``severity`` (a score of 4 levels). Every ticket opens with its own number, so no two requests share
  a prefix beyond the chat template's head and that word, and no server is sent a ticket twice.
- **document**: one document (a support thread, :data:`DOCUMENT`) asked one question per request:
  the 16 questions of ``bench/decisions.py`` in turn, each opened by the request's own number, so no
  reply can come from a score cache or a prompt cache: the document's snapshot is what requests share.

Servers, started here on loopback and measured in turns, cell by cell (a cell: one workload, one
client count, one server), so that the load of the shared machine falls on all of them alike:

- **this tree**: ``serveproto serve`` (``decisions.Server``), ``POST /v1/systemone``; once sending no
  ``x_debias`` (the server's default, ``canonical,spellings,content_free_listing`` on the default model, none on a model
  named with ``--model``; the reply's ``x_debias`` says which) and once with ``x_debias: "none"``
  (``--debias`` picks; when the default is none the second is not run again);
- **the baseline**: the same from another source tree (``--baseline-tree DIR``, its engines built);
- **llama-server** from the same sdist (``make -C engines llama-server``; ``repeat.LlamaServer``),
  ``-np`` slots (``--np``, default the largest client count), continuous batching (its default), KV per
  slot, prompt cache on: for each question one ``POST /completion`` of the very prompt that
  ``x_debias: "none"`` scores (``gateway.decision.prompts``: the chat-templated document and question), with
  ``n_predict: 1, n_probs: 20, temperature: 0``, the questions of a request one after another on one
  connection. It reads the prompt's new tokens, computes the last position's logits and returns the 20
  most likely next tokens; the client takes, per option, the most likely of those tokens that starts
  the option's text (``yes``, ``1``, ``tech`` for ``technical``). That is a first-token read-out, not
  our computation: we score every token of every option as a continuation (a multi-token label costs
  its own positions), and by default list the options in one order and divide by a content-free reading.

Each client is one keep-alive connection (``httpx2.AsyncClient`` under anyio) sending its next request
when the last one is answered, until ``--seconds`` have passed or the cell has started ``--requests``;
requests in flight then finish. A cell's requests/s is its answered requests over the time from its
start to its last answer; p50 and p99 are over the answered requests (``decisions.pct``; p99 is the
slowest up to 51 of them); errors are requests answered with another status or without every question.
"computed a request" is the mean of the reply's ``x_positions.computed`` (llama-server: its
``timings.prompt_n``, summed over the request's questions). Before a workload's cells each server answers
one unmeasured request of it (the document's snapshot, the questions' content-free readings), and
llama-server the document's once per slot (``id_slot``), each slot holding its own copy.

    .venv/bin/python -m bench.load [--clients 1,4,16,64] [--seconds 5] [--requests 1000]
        [--workloads tickets,document] [--debias default,none] [--threads N|auto] [--peer-threads N] [--model PATH]
        [--baseline-tree DIR] [--np N] [--no-llama-server] [--json PATH] [--engine CMD ...]
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import ssl
import sys
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import attrs
import httpx2
import orjson

from bench import ROOT
from bench.decisions import QUESTIONS_16, TICKET, pct
from bench.servers import LlamaServer, Server
from gateway.lab import evalset
from gateway.paths import default_model_path, engine_bin

# The servers this starts keep nothing on disk (serve --cache-dir): each run measures its own cold costs.
os.environ.setdefault("SERVEPROTO_PERSIST", "off")

#: The three questions of a ticket (ids of ``gateway.lab.evalset``'s ticket questions): a choice, a noul, a score.
TICKET_QUESTIONS = ("department", "refund", "severity")

#: The shared document: ``bench/decisions.py``'s ticket and the thread that followed it.
DOCUMENT = TICKET + (
    "\n\nAgent: Thanks for the details. Could you send the webhook delivery log of the last failed attempt "
    "and tell us which version of the plugin you run?"
    "\n\nCustomer: Version 4.2.1, updated last week. The log says 'signature verification failed' for every "
    "event since Monday morning. We changed nothing on our side, except that our hosting provider moved the "
    "shop to a new server on Sunday night. Payments still go through in Stripe itself, but no order in the "
    "shop is marked as paid, so nothing gets shipped and customers write to us every hour."
    "\n\nAgent: That points to the webhook signing secret: the new server may have an old copy of the "
    "settings. Please compare the secret in the plugin with the one in your Stripe dashboard."
    "\n\nCustomer: They differ. I pasted the new one and sent a test event, and it still fails with the same "
    "error. This is the third day without orders being confirmed. If this is not solved today we will "
    "have to look at another payment provider."
)

#: Request numbers of one cell start at ``(cell * settings + setting + 1) * SERIALS`` (``setting``: the
#: index of the ``x_debias`` sent): every cell and setting gets its own tickets and questions, and the
#: servers of one setting the same ones.
SERIALS = 1_000_000

#: Most likely next tokens llama-server returns per question.
N_PROBS = 20


class BadReply(Exception):
    """A reply that is not a full answer (another status, or an answer missing)."""


# --- the workloads -------------------------------------------------------------------------------


@attrs.frozen
class Workload:
    """``name``, its line in the table's heading, ``body(serial)``: the Jev body (no ``x_debias``) of the
    request numbered ``serial``, and ``shared``: whether its requests share a state (read once per slot)."""

    name: str
    title: str
    body: Callable[[int], dict]
    shared: bool


def ticket_body(serial: int, seed: int) -> dict:
    """A new ticket (``evalset.generate`` seeded with ``seed * SERIALS**2 + serial``), its text opened by
    ``Ticket <serial>.``, with :data:`TICKET_QUESTIONS`. A JSON ticket gets its number as the first key."""
    item = evalset.generate(seed * SERIALS**2 + serial, {"ticket": 1})[0]
    state = item.body["state"]
    state = {"ticket": serial, **state} if isinstance(state, dict) else f"Ticket {serial}. {state}"
    return {"state": state, "questions": {q: item.body["questions"][q] for q in TICKET_QUESTIONS}}


def document_body(serial: int) -> dict:
    """:data:`DOCUMENT` and one question: ``QUESTIONS_16``'s ``serial % 16``-th, its instructions opened by
    ``Question <serial>.``."""
    qid, q = list(QUESTIONS_16.items())[serial % len(QUESTIONS_16)]
    return {"state": DOCUMENT, "questions": {qid: {**q, "instructions": f"Question {serial}. {q['instructions']}"}}}


def workloads(seed: int) -> dict[str, Workload]:
    return {
        "tickets": Workload(
            "tickets",
            "a stream of new tickets, 3 questions each (a choice of 4, a noul, a score of 4)",
            lambda serial: ticket_body(serial, seed),
            shared=False,
        ),
        "document": Workload(
            "document",
            "one document asked one new question per request (a shared snapshot)",
            document_body,
            shared=True,
        ),
    }


# --- the servers -----------------------------------------------------------------------------------


@attrs.define
class Target:
    """One row group of the table: a server and what it is sent.

    ``debias``: the ``x_debias`` sent (None: none sent, the server's default); ``setting``: the index of
    the ticket numbers it is sent (the same for every server that reads the same prompts).
    """

    name: str
    base: str
    debias: str | None
    setting: int
    peer: PeerPrompts | None = None
    applied: str = ""  # the x_debias the replies report (ours), filled by the warm-up

    @property
    def label(self) -> str:
        if self.peer is not None:
            return "(none's prompt, first token)"
        if self.debias is None:
            return f"default: {self.applied or 'none'}"
        return self.debias

    async def ask(self, http: httpx2.AsyncClient, body: dict) -> tuple[int, int, int, int]:
        """Send one request; returns (questions answered, positions computed, options read, options) (the
        last two llama-server's, 0 from ours). Raises :class:`BadReply` or ``httpx2.HTTPError``."""
        if self.peer is not None:
            return await self.peer.ask(http, body)
        sent = body if self.debias is None else {**body, "x_debias": self.debias}
        r = await http.post("/v1/systemone", content=orjson.dumps(sent), headers={"content-type": "application/json"})
        if r.status_code != 200:
            raise BadReply(f"HTTP {r.status_code}: {r.content[:200]!r}")
        reply = orjson.loads(r.content)
        if set(reply.get("answers", {})) != set(body["questions"]):
            raise BadReply(f"answers {sorted(reply.get('answers', {}))}, asked {sorted(body['questions'])}")
        self.applied = ",".join(reply.get("x_debias") or [])
        return len(body["questions"]), int(reply.get("x_positions", {}).get("computed", 0)), 0, 0


class PeerPrompts:
    """llama-server's side: each question's prompt (``gateway.decision.prompts`` with the model's chat template,
    the options listed as ``x_debias: "none"`` lists them) and the first-token read-out of its reply;
    ``slots``: its ``-np``."""

    def __init__(self, model: Path, slots: int) -> None:
        from gateway.decision.chat_template import ChatTemplate
        from gateway.decision.prompts import PromptBuilder

        self.builder = PromptBuilder(ChatTemplate.from_gguf(model))
        self.slots = slots

    async def ask(self, http: httpx2.AsyncClient, body: dict, slot: int | None = None) -> tuple[int, int, int, int]:
        """As :meth:`Target.ask`, one ``/completion`` a question, in turn; ``slot``: its ``id_slot``
        (None: llama-server picks, by the prompt's likeness to what each slot holds)."""
        prefix = self.builder.prefix(body["state"])
        computed = read = options = 0
        for q in body["questions"].values():
            qp = self.builder.question(q["type"], q.get("instructions"), q.get("criteria"))
            payload = {
                "prompt": prefix + qp.stem,
                "n_predict": 1,
                "n_probs": N_PROBS,
                "temperature": 0,
                "cache_prompt": True,
                **({"id_slot": slot} if slot is not None else {}),
            }
            r = await http.post(
                "/completion", content=orjson.dumps(payload), headers={"content-type": "application/json"}
            )
            if r.status_code != 200:
                raise BadReply(f"HTTP {r.status_code}: {r.content[:200]!r}")
            reply = orjson.loads(r.content)
            try:
                top = reply["completion_probabilities"][0]["top_logprobs"]
            except (KeyError, IndexError) as exc:
                raise BadReply(f"no completion_probabilities: {str(reply)[:200]}") from exc
            read += sum(first_token_logprob(top, option) is not None for option in qp.options)
            computed += int(reply.get("timings", {}).get("prompt_n", 0))
            options += len(qp.options)
        return len(body["questions"]), computed, read, options


def first_token_logprob(top: list[dict], option: str) -> float | None:
    """The largest ``logprob`` among ``top`` (llama-server's ``top_logprobs``) whose token, without its
    leading space, is a non-empty start of ``option`` ignoring case; None when none is."""
    want = option.lower()
    found = [t["logprob"] for t in top if (tok := t["token"].lstrip().lower()) and want.startswith(tok)]
    return max(found) if found else None


# --- a cell ----------------------------------------------------------------------------------------


@attrs.define
class Cell:
    """What one (workload, clients, target) cell measured: latencies of the answered requests (seconds)."""

    workload: str
    target: str
    debias: str
    clients: int
    latencies: list[float] = attrs.Factory(list)
    errors: int = 0
    first_error: str = ""
    questions: int = 0
    computed: int = 0
    options_read: int = 0
    options: int = 0
    wall: float = 0.0

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.wall if self.wall > 0 else 0.0

    def row(self) -> dict:
        lat = self.latencies
        return {
            "workload": self.workload,
            "server": self.target,
            "x_debias": self.debias,
            "clients": self.clients,
            "requests": len(lat),
            "errors": self.errors,
            "first_error": self.first_error,
            "wall_s": self.wall,
            "requests_per_s": self.rps,
            "questions_per_s": self.questions / self.wall if self.wall > 0 else 0.0,
            "p50_s": pct(lat, 50) if lat else None,
            "p99_s": pct(lat, 99) if lat else None,
            "computed_per_request": self.computed / len(lat) if lat else None,
            "options_read": self.options_read,
            "options": self.options,
        }


def http_client(base: str, timeout: float) -> httpx2.AsyncClient:
    """A client of ``base`` (plain HTTP on loopback). It shares one SSL context: httpx2 builds one per client
    otherwise, 0.1 s each on a busy machine, which kept the last of 64 clients from starting in a cell."""
    return httpx2.AsyncClient(base_url=base, timeout=timeout, verify=_SSL)


_SSL = ssl.create_default_context()


async def run_cell(
    target: Target,
    workload: Workload,
    clients: int,
    first_serial: int,
    seconds: float,
    max_requests: int,
    timeout: float,
) -> Cell:
    """``clients`` connections sending ``workload``'s requests numbered from ``first_serial`` to ``target``
    until ``seconds`` have passed or ``max_requests`` were started; the clients are made before the clock
    starts."""
    cell = Cell(workload.name, target.name, target.label, clients)
    started = 0
    https = [http_client(target.base, timeout) for _ in range(clients)]
    t0 = time.perf_counter()
    deadline = t0 + seconds
    last = t0

    async def client(http: httpx2.AsyncClient) -> None:
        nonlocal started, last
        async with http:
            while started < max_requests and time.perf_counter() < deadline:
                body = workload.body(first_serial + started)
                started += 1
                t = time.perf_counter()
                try:
                    n_q, computed, read, options = await target.ask(http, body)
                except (BadReply, httpx2.HTTPError) as exc:
                    cell.errors += 1
                    cell.first_error = cell.first_error or f"{type(exc).__name__}: {exc}"
                    continue
                last = time.perf_counter()
                cell.latencies.append(last - t)
                cell.questions += n_q
                cell.computed += computed
                cell.options_read += read
                cell.options += options

    async with anyio.create_task_group() as tg:
        for http in https:
            tg.start_soon(client, http)
    cell.debias = target.label  # the default's applied x_debias, as the replies said
    cell.wall = last - t0
    return cell


# --- the table -------------------------------------------------------------------------------------


def fmt_s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s"


def table(cells: list[Cell], workload: Workload, peer: str | None, baseline: str | None) -> str:
    """The markdown table of one workload: a row per cell, by client count then server; the last columns
    compare requests/s with llama-server's and the baseline's (same x_debias) in the same cell."""
    by = {(c.clients, c.target, c.debias): c for c in cells}
    peer_rps = {c.clients: c.rps for c in cells if c.target == peer}
    cols = [
        "server",
        "x_debias",
        "clients",
        "requests",
        "errors",
        "requests/s",
        "questions/s",
        "p50",
        "p99",
        "p99 / p50",
        "computed a request",
    ]
    if peer:
        cols.append("requests/s / llama-server's")
    if baseline:
        cols.append("/ baseline's")
    out = [f"#### {workload.name}: {workload.title}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for c in cells:
        r = c.row()
        p50, p99 = r["p50_s"], r["p99_s"]
        vals = [
            c.target,
            c.debias,
            str(c.clients),
            str(r["requests"]),
            str(c.errors),
            f"{c.rps:.2f}",
            f"{r['questions_per_s']:.2f}",
            fmt_s(p50),
            fmt_s(p99),
            f"{p99 / p50:.2f}" if p50 else "-",
            f"{r['computed_per_request']:.0f}" if r["computed_per_request"] is not None else "-",
        ]
        if peer:
            vals.append(f"{c.rps / peer_rps[c.clients]:.2f}" if peer_rps.get(c.clients) and c.target != peer else "")
        if baseline:
            b = by.get((c.clients, baseline, c.debias))
            vals.append(f"{c.rps / b.rps:.2f}" if b is not None and b.rps and c.target not in (baseline, peer) else "")
        out.append("| " + " | ".join(vals) + " |")
    return "\n".join(out)


# --- main ------------------------------------------------------------------------------------------


def client_counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--clients: comma-separated positive integers, not {text!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"--clients: comma-separated positive integers, not {text!r}")
    return counts


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--clients", type=client_counts, default=[1, 4, 16, 64], help="concurrent clients (default 1,4,16,64)"
    )
    ap.add_argument("--seconds", type=float, default=5.0, help="a cell starts no request after this (default 5)")
    ap.add_argument(
        "--requests", type=int, default=1000, help="a cell starts at most this many requests (default 1000)"
    )
    ap.add_argument("--workloads", default="tickets,document", help="tickets, document or both (default both)")
    ap.add_argument(
        "--debias",
        default="default,none",
        help="this tree's (and the baseline's) rows: default (no x_debias sent), none, or any x_debias value, "
        "comma-separated, or semicolon-separated when a value holds commas ('canonical,content_free;none'); "
        "default: default,none",
    )
    ap.add_argument("--seed", type=int, default=15, help="the tickets' seed (default 15)")
    ap.add_argument(
        "--threads",
        default=None,
        help="engine threads (N or auto) of this tree and the baseline (default: each tree's own "
        "serve default; this tree's is auto)",
    )
    ap.add_argument(
        "--peer-threads", type=int, default=os.cpu_count() or 1, help="llama-server's -t and -tb (default: the cores)"
    )
    ap.add_argument(
        "--model", type=Path, default=None, help="GGUF (default: the default model, served without --model)"
    )
    ap.add_argument("--serve-args", default="", help="more `serve` flags for this tree and the baseline, one string")
    ap.add_argument(
        "--baseline-tree", type=Path, default=None, help="another source tree (its engines built) served beside"
    )
    ap.add_argument("--llama-server", type=Path, default=engine_bin("llama-server"))
    ap.add_argument("--no-llama-server", action="store_true", help="do not run llama-server")
    ap.add_argument("--np", type=int, default=None, help="llama-server's slots (default: the largest --clients)")
    ap.add_argument("--peer-ctx", type=int, default=1024, help="llama-server's context per slot (default 1024)")
    ap.add_argument("--peer-args", default="", help="more llama-server flags, one string (e.g. '-fa on')")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds a request may take (default 600)")
    ap.add_argument("--json", type=Path, default=None, help="also write every cell's numbers here")
    ap.add_argument(
        "--engine",
        nargs=argparse.REMAINDER,
        default=None,
        help="serve --engine CMD... instead of the llama engine (e.g. the fixture engine); no llama-server",
    )
    args = ap.parse_args(argv)
    args.workloads = args.workloads.split(",")
    if not set(args.workloads) <= {"tickets", "document"} or not args.workloads:
        ap.error(f"--workloads: tickets and/or document, not {','.join(args.workloads)}")
    # x_debias values that hold commas themselves are separated by semicolons
    args.debias = args.debias.split(";") if ";" in args.debias else args.debias.split(",")
    if args.requests < 1 or args.requests >= SERIALS:
        ap.error(f"--requests: 1 to {SERIALS - 1}, not {args.requests}")
    if args.engine is not None:
        args.no_llama_server = True
    elif not args.no_llama_server and not args.llama_server.exists():
        ap.error(f"missing {args.llama_server}: make -C engines llama-server (or --no-llama-server)")
    return args


def serve_argv(args, threads: str | None) -> list[str]:
    argv = (["--threads", str(threads)] if threads else []) + (["--model", str(args.model)] if args.model else [])
    argv += shlex.split(args.serve_args)
    return argv + (["--engine", *args.engine] if args.engine is not None else [])


async def warm_up(targets: list[Target], workload: Workload, timeout: float) -> None:
    """One unmeasured request of ``workload`` per target (numbered below the cells'); of a shared state,
    one per slot of llama-server at once (each of its slots reads the document); errors raised."""
    for t in targets:
        if t.peer is None or not workload.shared:
            async with http_client(t.base, timeout) as http:
                await t.ask(http, workload.body(1 + t.setting))
            continue

        async def one(slot: int) -> None:
            async with http_client(t.base, timeout) as http:
                await t.peer.ask(http, workload.body(1 + t.setting), slot=slot)

        async with anyio.create_task_group() as tg:
            for slot in range(t.peer.slots):
                tg.start_soon(one, slot)


def start(args, threads: str | None, model: Path | None, servers: list) -> tuple[list[Target], int]:
    """Start the servers (appended to ``servers`` as they start, for the caller to close); returns the
    targets and how many settings (ticket number ranges) they use."""
    targets: list[Target] = []
    trees = [("this tree", ROOT)] + ([("baseline", args.baseline_tree.resolve())] if args.baseline_tree else [])
    settings = args.debias + ([] if "none" in args.debias else ["none"])  # llama-server reads none's prompts
    for name, tree in trees:
        srv = Server(*serve_argv(args, threads), tree=tree)
        servers.append(srv)
        targets += [Target(name, srv.base, None if d == "default" else d, k) for k, d in enumerate(args.debias)]
    if not args.no_llama_server:
        slots = args.np or max(args.clients)
        peer = LlamaServer(
            args.llama_server,
            model,
            args.peer_threads,
            slots=slots,
            ctx=slots * args.peer_ctx,
            extra=tuple(shlex.split(args.peer_args)),
        )
        servers.append(peer)
        targets.append(
            Target("llama-server", peer.base, "none", settings.index("none"), peer=PeerPrompts(model, slots))
        )
    return targets, len(settings)


def measure(
    args, targets: list[Target], n_settings: int, loads: dict[str, Workload], cells: dict[str, list[Cell]]
) -> None:
    """Every cell, workload by workload, client count by client count, the targets in turn; appended to
    ``cells`` as they end, each also reported on stderr."""
    for w in loads.values():
        _run(warm_up, targets, w, args.timeout)
        # a default that applies nothing is the none row already
        for name in {t.name for t in targets}:
            default = [t for t in targets if t.name == name and t.debias is None and t.peer is None]
            if default and not default[0].applied:
                targets[:] = [t for t in targets if not (t.name == name and t.debias == "none")]
        for k, clients in enumerate(args.clients):
            for t in targets:
                first = (k * n_settings + t.setting + 1) * SERIALS
                cell = _run(run_cell, t, w, clients, first, args.seconds, args.requests, args.timeout)
                cells[w.name].append(cell)
                print(
                    f"  {w.name}, {clients} clients, {t.name} ({t.label}): {len(cell.latencies)} answered, "
                    f"{cell.errors} errors, {cell.rps:.2f} requests/s",
                    file=sys.stderr,
                    flush=True,
                )


class Terminated(Exception):
    """SIGTERM arrived (bench/gpu/run.sh's `timeout`): stop measuring, print the cells so far."""


#: Set by :func:`_on_sigterm`; while an event loop runs, :func:`_watched` turns it into :class:`Terminated`.
_sigterm = False
#: Whether :func:`_run`'s event loop may be running: the handler then only sets :data:`_sigterm`.
_in_loop = False
#: How often the event loop looks at :data:`_sigterm`, seconds.
_SIGTERM_POLL_S = 0.05


def _on_sigterm(signum, frame):
    """SIGTERM's handler. Between the event loops (starting servers, printing) it raises :class:`Terminated`:
    plain Python, safe to raise in. While a loop may run it only sets a flag: an exception raised from a
    signal handler in the middle of the loop's own code once left load.py spinning (and is the likely cause
    of a one-minute hang after the signal in CI), and a signal receiver of the loop's misses a SIGTERM that
    lands while it opens or closes."""
    global _sigterm
    _sigterm = True
    if not _in_loop:
        raise Terminated


async def _watched(fn: Callable, *args):
    """``fn(*args)``, cancelled in order (:class:`Terminated` out of its task group) once SIGTERM's flag is
    seen."""
    result = None
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            while not _sigterm:
                await anyio.sleep(_SIGTERM_POLL_S)
            raise Terminated

        tg.start_soon(watch)
        result = await fn(*args)
        tg.cancel_scope.cancel()
    return result


def _run(fn: Callable, *args):
    """:func:`anyio.run` of ``fn(*args)`` under :func:`_watched`; a SIGTERM that arrived while the loop
    started or closed raises :class:`Terminated` after it."""
    global _in_loop
    _in_loop = True
    try:
        return anyio.run(_watched, fn, *args)
    finally:
        _in_loop = False
        if _sigterm:
            raise Terminated


def _interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is SIGTERM's :class:`Terminated` or a ^C, bare or wrapped by a task group."""
    kinds = (Terminated, KeyboardInterrupt)
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(kinds)[1] is None
    return isinstance(exc, kinds)


def main(argv=None) -> int:
    args = parse_args(argv)
    # `timeout` (bench/gpu/run.sh) sends SIGTERM: the servers are closed and the cells so far printed
    signal.signal(signal.SIGTERM, _on_sigterm)
    threads = args.threads
    model = args.model or (None if args.engine is not None else default_model_path())
    loads = {name: w for name, w in workloads(args.seed).items() if name in args.workloads}
    load0 = os.getloadavg()[0]
    servers: list = []
    cells: dict[str, list[Cell]] = {w: [] for w in loads}
    cut = False
    try:
        targets, n_settings = start(args, threads, model, servers)
        measure(args, targets, n_settings, loads, cells)
    except BaseException as exc:
        if not _interrupted(exc):
            raise
        cut = True
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the closing short
        for s in servers:
            s.close()
    names = {c.target for cs in cells.values() for c in cs}
    peer = next((s for s in servers if isinstance(s, LlamaServer)), None)
    print(
        f"`{shlex.join(['bench/load.py', *(argv if argv is not None else sys.argv[1:])])}`  "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, load average "
        f"{load0:.1f} before, {os.getloadavg()[0]:.1f} after; model {Path(model).name if model else 'of the engine'}; "
        f"engine threads {threads or 'each tree default'}, llama-server's {args.peer_threads}; cells of {args.seconds:g} s or {args.requests} requests)"
        + ("; CUT SHORT (SIGTERM or ^C): the cells measured so far" if cut else "")
    )
    if peer is not None:
        print(f"llama-server: `{shlex.join(['llama-server', '-m', Path(peer.argv[2]).name, *peer.argv[7:]])}`")
    print()
    for name, w in loads.items():
        print(table(cells[name], w, "llama-server" if peer else None, "baseline" if "baseline" in names else None))
        peer_cells = [c for c in cells[name] if c.target == "llama-server"]
        if peer_cells:
            read, options = sum(c.options_read for c in peer_cells), sum(c.options for c in peer_cells)
            print(
                f"\nllama-server's first-token read-out: {read} of {options} options had a token in its "
                f"replies' top {N_PROBS}."
            )
        print()
    failed = [c for cs in cells.values() for c in cs if c.errors]
    for c in failed:
        print(
            f"errors: {c.workload}, {c.clients} clients, {c.target} ({c.debias}): {c.errors}, the first: {c.first_error}"
        )
    if args.json:
        args.json.write_text(
            orjson.dumps(
                {
                    "argv": sys.argv,
                    "threads": threads,
                    "model": str(model),
                    "cut_short": cut,
                    "cells": [c.row() for cs in cells.values() for c in cs],
                },
                option=orjson.OPT_INDENT_2,
            ).decode()
        )
    return 1 if failed or cut else 0


if __name__ == "__main__":
    raise SystemExit(main())
