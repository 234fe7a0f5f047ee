"""Reproducible digits: which cells of issue 12's matrix give the same bits, on any engine build.

Each cell scores the same three questions (GROUPS) on the same state (STATE) another way: a
plain read-out from position 0; SCORE; SCORE with the groups reversed; each group alone, first
of 16 and 9th of 16; the pinned one-by-one fallback; after a longer pinned state; after 20
unrelated requests; the state reached in three pieces. The engine prints every number with
``--float-digits 17`` (a double reads back to its own bits), so ``==`` compares bits.
``tests/engines/test_llama_digits.py`` asserts every cell equal on the CPU; on a GPU build this prints
which cells move and by how much::

    python -m bench.digits [--model M.gguf] [--engine-arg=--flash-attn ...] [--threads 1]

Output: one line per cell, its largest difference from the read-out (nats), and whether its
bits are equal.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import anyio

from gateway.engine import Engine
from gateway.engine.options import EngineOptions
from gateway.paths import default_model_path, engine_bin

STATE = (
    "<|im_start|>user\nI have been trying to connect my Stripe account for 3 days and the "
    "integration keeps failing. I am losing sales."
)
GROUPS = [
    ("\nQ: Which team handles this? Options: billing, technical, sales. A:", [" billing", " technical", " sales"]),
    ("\nQ: Is this urgent? Answer yes or no. A:", [" yes", " no"]),
    ("\nQ: How severe is it? A:", [" no impact", " minor inconvenience", " losing money", " business down"]),
    # no stem: alone, its one computed position (" Please") is a one-row batch with logits
    ("", [" Please help", " Thanks"]),
]
FILLER = [(f"\nQ: Filler question {i}? A:", [" a", " b c", " maybe not"]) for i in range(15)]


def spawn(model, *args: str, threads: int = 1, **kw):
    """The llama engine on ``model`` printing 17 digits; an async context manager (:class:`Engine`).
    ``kw``: engine options by their flat names (:meth:`EngineOptions.updated`, e.g. ``drain_timeout``)."""
    return Engine.spawn(
        [
            str(engine_bin("serveproto-llama")),
            "--model",
            str(model),
            "--threads",
            str(threads),
            "--float-digits",
            "17",
            *args,
        ],
        options=EngineOptions().updated(**kw),
    )


def numbers(result) -> list[list[float]]:
    """``(n_groups, n_options)``: each option's summed logprob, nats."""
    return [[o.logprob for o in g] for g in result.groups]


async def read_out_scores(eng: Engine, prefix: str, groups) -> list[list[float]]:
    """Each option's logprob from plain read-outs (no snapshot taken, so each is read from position 0)
    of ``prefix + stem`` and ``prefix + stem + option``: the positions past the stem's tokens, summed
    (spec 9.1's definition)."""
    out = []
    for stem, options in groups:
        base = (await eng.read_out(prefix + stem, logprobs=1)).done.prompt_tokens
        row = []
        for option in options:
            readout = await eng.read_out(prefix + stem + option, logprobs=1)
            assert readout.done.reused == 0
            row.append(sum(e.logprob for e in readout.echoes if e.position >= base))
        out.append(row)
    return out


async def the_matrix(model, *args: str, threads: int = 1) -> dict[str, list[list[float]]]:
    """Every cell's numbers for GROUPS on STATE, keyed by the cell's name: ``(n_groups, n_options)``
    summed logprobs (nats). ``args``: more engine arguments (the score cache is always off)."""
    cells = {}
    async with spawn(model, "--score-cache-mb", "0", *args, threads=threads) as eng:
        cells["read-out"] = await read_out_scores(eng, STATE, GROUPS)
    async with spawn(model, "--score-cache-mb", "0", *args, threads=threads) as eng:
        cells["score"] = numbers(await eng.score(STATE, GROUPS))
        cells["reversed"] = numbers(await eng.score(STATE, GROUPS[::-1]))[::-1]
        cells["alone"] = [numbers(await eng.score(STATE, [g]))[0] for g in GROUPS]
        cells["first of 16"] = [numbers(await eng.score(STATE, [g] + FILLER))[0] for g in GROUPS]
        cells["9th of 16"] = [numbers(await eng.score(STATE, FILLER[:8] + [g] + FILLER[8:]))[8] for g in GROUPS]
        cells["one by one"] = numbers(await eng.score(STATE, GROUPS, fast=False))
        # a longer pinned state, then the shorter one (its rows reused live, the rest dropped)
        await eng.score(STATE + " I also cannot log in since yesterday.", GROUPS[:1], pin=True)
        cells["after a longer state"] = numbers(await eng.score(STATE, GROUPS))
        for i in range(20):
            if i % 2:
                await eng.read_out(f"Unrelated text number {i} about the weather and the sea.", logprobs=2)
            else:
                await eng.score(
                    f"Another customer, case {i}, writes about a late parcel.",
                    [("\nQ: Late? A:", [" yes", " no"]), ("\nQ: Angry? A:", [" very much", " no"])],
                )
        cells["after 20 unrelated requests"] = numbers(await eng.score(STATE, GROUPS))
    async with spawn(model, "--score-cache-mb", "0", *args, threads=threads) as eng:
        # the state reached in three pieces: each SCORE extends the last one's rows
        words = STATE.split(" ")
        for cut in (len(words) // 3, 2 * len(words) // 3):
            await eng.score(" ".join(words[:cut]), GROUPS[1:2], pin=True)
        cells["state in pieces"] = numbers(await eng.score(STATE, GROUPS))
    return cells


def differences(cells: dict[str, list[list[float]]]) -> dict[str, float]:
    """Each cell's largest |difference| from the plain read-out, nats (0.0 only when the bits are equal)."""
    ref = cells["read-out"]
    return {
        name: (0.0 if v == ref else max(abs(a - b) for ra, rb in zip(v, ref) for a, b in zip(ra, rb)))
        for name, v in cells.items()
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(default_model_path()))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--engine-arg", action="append", default=[], help="an engine argument (repeatable)")
    ap.add_argument("--dump", metavar="FILE", help="write every cell's numbers to FILE (JSON)")
    ap.add_argument(
        "--against",
        metavar="FILE",
        action="append",
        default=[],
        help="another run's --dump: how far its read-out lies from this one's (repeatable)",
    )
    args = ap.parse_args(argv)
    cells = anyio.run(lambda: the_matrix(args.model, *args.engine_arg, threads=args.threads))
    print(f"digits matrix: {Path(args.model).name}, engine args {args.engine_arg or 'default'}, {args.threads} threads")
    for name, d in differences(cells).items():
        print(f"  {name:30s} max |d| {d:.3e}  {'equal bits' if cells[name] == cells['read-out'] else 'DIFFERENT'}")
    if args.dump:
        Path(args.dump).write_text(json.dumps(cells))
    for other in args.against:
        theirs = json.loads(Path(other).read_text())["read-out"]
        diffs = [abs(a - b) for ra, rb in zip(cells["read-out"], theirs) for a, b in zip(ra, rb)]
        print(
            f"  read-out against {Path(other).name}: max |d| {max(diffs):.3e}, mean {sum(diffs) / len(diffs):.3e} nats"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
