"""Writers: one event -> its frame's bytes (spec sections 1, 3, 4, 5, 9).

The output is canonical (``spec/vectors/README.md``, "Canonical writing"):
floats as C's ``%.9g`` (``nan``, ``inf``, ``-inf``), SUBMIT keys only when
they differ from their defaults, in the order ``logprobs pin ids counters``;
DONE counters in the order ``computed reused snapshot``. Events were
validated when built, so writers only format.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from . import _events as ev
from . import _grammar as g


def fmt(x: float) -> str:
    """Format a float as C's ``%.9g`` (round-trips a float32); NaN is ``nan``."""
    if x != x:
        return "nan"
    return format(x, ".9g")


def _top(top: tuple[tuple[int, float], ...]) -> str:
    return "".join(f" {t} {fmt(lp)}" for t, lp in top)


def write_ready(e: ev.Ready) -> bytes:
    return g.READY_LINE + b"\n"


def write_caps(e: ev.Caps) -> bytes:
    return "".join(["CAPS"] + [f" {k}={v}" for k, v in e.values.items()]).encode() + b"\n"


def write_stat(e: ev.Stat) -> bytes:
    return ("STAT " + " ".join(map(fmt, e.fields)) + "\n").encode()


def write_load_fail(e: ev.LoadFail) -> bytes:
    tail = f" {e.detail}" if e.detail else ""
    return f"LOAD_FAIL kind={e.kind}{tail}\n".encode()


def write_telemetry(e: ev.Telemetry) -> bytes:
    return e.line + b"\n"


def write_submit(e: ev.Submit) -> bytes:
    head = f"SUBMIT {e.id} {e.slot} {len(e.prompt)} {e.max_tokens} {fmt(e.temperature)} {fmt(e.top_p)}"
    if e.grammar is not None:
        head += f" {len(e.grammar)}"
    if e.logprobs:
        head += f" logprobs={e.logprobs}"
    if e.pin:
        head += " pin=1"
    if e.ids:
        head += " ids=1"
    if e.counters:
        head += " counters=1"
    out = head.encode() + b"\n" + e.prompt + b"\n"
    if e.grammar is not None:
        out += e.grammar + b"\n"
    return out


def write_image(e: ev.Image) -> bytes:
    return f"IMAGE {e.id} {len(e.data)} {e.grid_h} {e.grid_w}\n".encode() + e.data + b"\n"


def write_stop(e: ev.Stop) -> bytes:
    return f"STOP {e.id}\n".encode()


def write_cancel(e: ev.Cancel) -> bytes:
    return f"CANCEL {e.id}\n".encode()


def write_ping(e: ev.Ping) -> bytes:
    return f"PING {e.id}\n".encode()


def write_decide(e: ev.Decide) -> bytes:
    return f"DECIDE {e.id} {e.slot} {len(e.record)}\n".encode() + e.record + b"\n"


def write_score(e: ev.Score) -> bytes:
    return f"SCORE {e.id} {e.slot} {len(e.payload)}\n".encode() + e.payload + b"\n"


def write_accept(e: ev.Accept) -> bytes:
    return f"ACCEPT {e.id} {e.prompt_tokens}\n".encode()


def write_echo(e: ev.Echo) -> bytes:
    return (
        (f"ECHO {e.id} {len(e.text)} {e.position} {fmt(e.logprob)} {len(e.top)}{_top(e.top)}\n").encode()
        + e.text
        + b"\n"
    )


def write_data(e: ev.Data) -> bytes:
    tail = "" if e.logprob is None else f" {fmt(e.logprob)} {len(e.top)}{_top(e.top)}"
    return f"DATA {e.id} {len(e.text)}{tail}\n".encode() + e.text + b"\n"


def write_decision(e: ev.Decision) -> bytes:
    return f"DECISION {e.id} {len(e.record)}\n".encode() + e.record + b"\n"


def write_done(e: ev.Done) -> bytes:
    s = (
        f"DONE {e.id} STAT {e.emitted} {fmt(e.tok_s)} {fmt(e.hit_pct)} {fmt(e.rss_gb)} "
        f"{e.prompt_tokens} {int(e.length_limited)}"
    )
    if e.computed is not None:
        s += f" computed={e.computed} reused={e.reused} snapshot={e.snapshot}"
        if e.disk is not None:
            s += f" disk={e.disk}"
    return (s + "\n").encode()


def write_error(e: ev.Error) -> bytes:
    tail = f" {e.reason}" if e.reason else ""
    return f"ERROR {e.id} {e.code}{tail}\n".encode()


def write_scored(e: ev.Scored) -> bytes:
    return (
        f"SCORED {e.id} {e.group} {e.option} {e.context_tokens} {len(e.logprobs)} "
        + " ".join(map(fmt, e.logprobs))
        + "\n"
    ).encode()


def write_hidden(e: ev.Hidden) -> bytes:
    data = struct.pack(f"<{len(e.values)}f", *e.values)
    return f"HIDDEN {e.id} {len(data)} {e.group} {e.layer}\n".encode() + data + b"\n"


def write_pong(e: ev.Pong) -> bytes:
    return "".join([f"PONG {e.id}"] + [f" {k}={v}" for k, v in e.values.items()]).encode() + b"\n"


#: Event class -> writer.
WRITERS: dict[type, Callable[..., bytes]] = {
    ev.Ready: write_ready,
    ev.Caps: write_caps,
    ev.Stat: write_stat,
    ev.LoadFail: write_load_fail,
    ev.Telemetry: write_telemetry,
    ev.Submit: write_submit,
    ev.Image: write_image,
    ev.Stop: write_stop,
    ev.Cancel: write_cancel,
    ev.Ping: write_ping,
    ev.Decide: write_decide,
    ev.Score: write_score,
    ev.Accept: write_accept,
    ev.Echo: write_echo,
    ev.Data: write_data,
    ev.Decision: write_decision,
    ev.Done: write_done,
    ev.Error: write_error,
    ev.Scored: write_scored,
    ev.Hidden: write_hidden,
    ev.Pong: write_pong,
}


def write(e: ev.Event) -> bytes:
    """Return the frame of event ``e``, without any state check (``send()`` does those).

    Raises TypeError for anything that is not a frame event (ConnectionClosed included).
    """
    writer = WRITERS.get(type(e))
    if writer is None:
        raise TypeError(f"{type(e).__name__} has no frame")
    return writer(e)
