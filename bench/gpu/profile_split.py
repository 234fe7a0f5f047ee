"""Where a decode step's time goes, from the engine's SERVEPROTO_PROFILE files (engines/llama/profile.c).

    python3 -m bench.gpu.profile_split [--dmon FILE] [--tag NAME] PROFILE_FILE...

Each file holds one line a second of running sums (decodes, rows, outputs, and milliseconds of gap, start,
fill, decode, early, sync, read; files written before the overlap have no early column). The busy part of a run is the longest stretch of one-second intervals whose rows per
second stay at half the busiest interval's or more (a load cell, not the warm-up or the idle tail); the
table gives, over that stretch, the rows and outputs a decode, each part's milliseconds a decode and its
share of the wall time. ``--dmon``: an ``nvidia-smi dmon -s u`` log of the same run; its mean SM
utilisation over its busy stretch (the same rule, dmon_mean) is printed beside.

Files written with llama/patches/profile/0007 carry 13 more sums after ``max_rows``: llama_decode's own host time
(batch checked, memory: ubatches split and cells found, output buffer, cells applied, graph built, graph
allocated, inputs set, graph computed or queued, outputs), then ubatches, graphs reused, KV cells attended
(n_kv) and tokens. For those a second table gives each inner part's milliseconds a decode over the same
stretch, the ubatches a decode, the share of graphs reused and the mean n_kv a ubatch. Files written since
the pipeline (engines/llama/sched.c) end with the decodes whose rows were read after the next decode was queued:
their share of the decodes is the table's pipelined column. Files written since 2026-12-05's third session
end with three more counts (sched.c), each decode in one: a whole ubatch of rows, fewer although the runnable
tasks wanted a ubatch (cut short by their units and n_chunk), fewer because they wanted fewer (starved).
Files written since its fourth session end with the requests answered and their milliseconds from stdin to the
answer, the milliseconds of the rows' read and of its logsumexps, and the llama_decode calls made with no decode
in flight and their milliseconds: a third table gives the mean time of a request in the engine, the read and
logsumexp milliseconds a decode, the share of calls with none in flight and their mean (on a GPU, llama_decode's
own host work: the graph built and its kernels queued); files written with SERVEPROTO_PAD_ROWS's column add the
rows of padding a decode.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

PARTS = ("gap", "start", "fill", "decode", "early", "sync", "read")
INNER = ("batch", "memory", "outbuf", "apply", "build", "alloc", "inputs", "compute", "outputs")
INNER_AT = 13  # the first inner column: after t_s, 3 counts, 7 parts, early_tasks, max_rows
PIPE_AT = INNER_AT + len(INNER) + 4  # then ubatches, reused, n_kv, tokens; here pipelined, waited, whole, cut, starved
HOST_AT = PIPE_AT + 5  # then answered, answer_ms, readout_ms, lse_ms, alone, alone_ms, padded, late, late_ms


def longest_run(values: list[float]) -> tuple[int, int]:
    """``[start, end)`` of the longest run of values at half the largest or more (the first such run on a
    tie): the busy stretch's rule, for the profile's rates and dmon's samples alike. ``values``: not empty,
    its largest above 0."""
    floor = max(values) / 2
    best, start = (0, 0), None
    for i, v in enumerate([*values, 0.0]):
        if v >= floor and start is None:
            start = i
        elif v < floor and start is not None:
            if i - start > best[1] - best[0]:
                best = (start, i)
            start = None
    return best


def busy_stretch(lines: list[list[float]]) -> tuple[list[float], list[float]] | None:
    """The first and last line of the busiest stretch (see the module docstring), or None when idle."""
    rate = [(b[2] - a[2]) / max(b[0] - a[0], 1e-9) for a, b in itertools.pairwise(lines)]
    if not rate or max(rate) <= 0:
        return None
    start, end = longest_run(rate)
    return lines[start], lines[end]


def read_lines(path: Path) -> list[list[float]]:
    """A profile file's data lines as numbers (the ``#`` header skipped)."""
    return [[float(x) for x in ln.split()] for ln in path.read_text().splitlines() if ln and not ln.startswith("#")]


def split(name: str, stretch: tuple[list[float], list[float]] | None) -> str | None:
    """One table row for a profile file's busy stretch, or None when it saw none."""
    if stretch is None:
        return None
    a, b = stretch
    wall_ms = (b[0] - a[0]) * 1e3
    d = b[1] - a[1]
    if d <= 0:
        return None
    parts = PARTS if len(b) > 11 else tuple(p for p in PARTS if p != "early")  # 11: before the overlap
    ms = [b[4 + parts.index(p)] - a[4 + parts.index(p)] if p in parts else 0.0 for p in PARTS]
    cells = [f"{m / d:.2f} ({m / wall_ms:.0%})" for m in ms]
    return (
        f"| {name} | {wall_ms / 1e3:.1f} | {d:.0f} | {(b[2] - a[2]) / d:.0f} | {(b[3] - a[3]) / d:.1f} | "
        f"{(b[2] - a[2]) / (wall_ms / 1e3):.0f} | " + " | ".join(cells) + " |"
    )


def inner_split(name: str, stretch: tuple[list[float], list[float]] | None) -> str | None:
    """One row of the inside-llama_decode table, or None for a file without those columns or a busy stretch."""
    if stretch is None or len(stretch[1]) < INNER_AT + len(INNER) + 4:
        return None
    a, b = stretch
    d = b[1] - a[1]
    delta = [b[INNER_AT + i] - a[INNER_AT + i] for i in range(len(INNER) + 4)]
    ubatches, reused, n_kv, tokens = delta[len(INNER) :]
    if d <= 0 or ubatches <= 0:
        return None
    ms = delta[: len(INNER)]
    at = PIPE_AT  # files written since the pipeline: the decodes read after the next was queued
    piped = f"{(b[at] - a[at]) / d:.0%}" if len(b) > at else "-"
    # files written since the fill counts (sched.c): decodes of a whole ubatch, cut short, starved
    fills = (
        " | ".join(f"{(b[at + 2 + i] - a[at + 2 + i]) / d:.0%}" for i in range(3)) if len(b) > at + 4 else "- | - | -"
    )
    return (
        f"| {name} | {ubatches / d:.2f} | {tokens / ubatches:.0f} | {n_kv / ubatches:.0f} | {reused / ubatches:.0%} | "
        + " | ".join(f"{m / d:.2f}" for m in ms)
        + f" | {sum(ms) / d:.2f} | {piped} | {fills} |"
    )


def host_split(name: str, stretch: tuple[list[float], list[float]] | None) -> str | None:
    """One row of the host table (files written since 2026-12-05's fourth session, after the fill counts:
    requests answered and their milliseconds in the engine, the rows' read and its logsumexps, llama_decode
    calls with no decode in flight and their milliseconds), or None for a file without those columns."""
    at = HOST_AT
    if stretch is None or len(stretch[1]) < at + 6:
        return None
    a, b = stretch
    d = b[1] - a[1]
    answered, answer_ms, readout_ms, lse_ms, alone, alone_ms = (b[at + i] - a[at + i] for i in range(6))
    if d <= 0:
        return None
    per = f"{answer_ms / answered:.1f}" if answered > 0 else "-"
    each = f"{alone_ms / alone:.2f}" if alone > 0 else "-"
    padded = f"{(b[at + 6] - a[at + 6]) / d:.0f}" if len(b) > at + 6 else "-"  # files since SERVEPROTO_PAD_ROWS
    late, late_ms = (
        f"{(b[at + i] - a[at + i]) / d:{f}}" if len(b) > at + 8 else "-" for i, f in ((7, ".0%"), (8, ".2f"))
    )
    return (
        f"| {name} | {answered:.0f} | {per} | {readout_ms / d:.2f} | {lse_ms / d:.2f} | {alone / d:.0%} | {each} "
        f"| {padded} | {late} | {late_ms} |"
    )


def dmon_mean(path: Path) -> str:
    """Mean SM% of an ``nvidia-smi dmon -s u`` log over its busy stretch: the longest run of samples at half
    the busiest sample's or more, as for the profile (the load cells, not the model's upload to the device or
    the warm-up, which read 17-46% for a second or two and, averaged in, pulled earlier means down)."""
    sm = []
    for ln in path.read_text().splitlines():
        f = ln.split()
        if not f or ln.startswith("#"):
            continue
        try:
            sm.append(float(f[2] if len(f) > 2 and ":" in f[0] else f[1]))
        except (ValueError, IndexError):
            continue
    if not sm or max(sm) <= 5:
        return "no busy SM samples"
    start, end = longest_run(sm)
    best = sm[start:end]
    return f"SM busy {sum(best) / len(best):.1f}% over the busy stretch's {len(best)} samples"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--dmon", type=Path, default=None)
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    print(f"\n{args.tag}")
    print(
        "| engine | seconds | decodes | rows a decode | outputs a decode | rows/s | "
        + " | ".join(f"{p} ms (share)" for p in PARTS)
        + " |"
    )
    print("|" + "---|" * (6 + len(PARTS)))
    stretches = [(f.name, busy_stretch(read_lines(f))) for f in args.files]
    for name, stretch in stretches:
        row = split(name, stretch)
        if row:
            print(row)
    inner = [r for r in (inner_split(name, stretch) for name, stretch in stretches) if r]
    if inner:
        print("\ninside llama_decode, host ms a decode")
        print(
            "| engine | ubatches a decode | tokens a ubatch | n_kv a ubatch | graphs reused | "
            + " | ".join(INNER)
            + " | sum | pipelined | whole ubatch | cut short | starved |"
        )
        print("|" + "---|" * (10 + len(INNER)))
        print("\n".join(inner))
    host = [r for r in (host_split(name, stretch) for name, stretch in stretches) if r]
    if host:
        print("\nrequests in the engine, and the host's work")
        print(
            "| engine | answered | ms a request in the engine | read ms a decode | logsumexp ms a decode"
            " | llama_decode calls with none in flight | ms each | padding rows a decode | late waits a decode"
            " | late wait ms a decode |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        print("\n".join(host))
    if args.dmon and args.dmon.exists():
        print(dmon_mean(args.dmon))


if __name__ == "__main__":
    main()
