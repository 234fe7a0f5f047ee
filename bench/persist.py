"""A known state after a restart: restored from its file (``--cache-dir``) against recomputed.

For each state length, one run: an engine with ``--cache-dir`` reads the state once with a
snapshot (``pin``) and exits, leaving its state file; then, side by side, a fresh engine without
the cache and a restarted one with it each answer one new question on that state. The table gives
the state file's size, both times, their ratio, the positions each computed, and whether the two
answers are the same bits (``--float-digits 17``).

    .venv/bin/python bench/persist.py [--tokens 300,2000,13500] [--threads 2]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from digits import numbers, spawn
from gateway.paths import default_model_path

FIRST = [("\nQ: Is it about billing? A:", [" yes", " no"])]  # read when the state is new
QUESTION = [("\nQ: Is the customer angry? A:", [" yes", " no"])]  # the new question after the restart


def state_of(tokens: int) -> str:
    """A support log of about ``tokens`` tokens of the default model (about 25 tokens a line)."""
    lines = [
        f"Entry {i}: the customer wrote again about invoice {1000 + 7 * i}, which was charged {i % 3 + 2} times."
        for i in range(max(1, tokens // 25))
    ]
    return "<|im_start|>user\n" + " ".join(lines)


async def one(model: Path, tokens: int, threads: int) -> dict:
    root = Path(tempfile.mkdtemp(prefix="bench-persist-"))
    state = state_of(tokens)
    ctx = max(4096, 1 << (tokens + 256).bit_length())  # a slot that holds the state (snapshots stay in one)
    common = ("--threads", str(threads), "--slots", "1", "--ctx", str(ctx), "--ctx-max", str(ctx))
    try:
        async with spawn(model, *common, "--cache-dir", str(root)) as eng:
            await eng.score(state, FIRST, pin=True)
        size = sum(p.stat().st_size for p in root.glob("states/*/*.sps"))
        async with spawn(model, *common) as eng:
            t0 = time.perf_counter()
            cold = await eng.score(state, QUESTION)
            t_cold = time.perf_counter() - t0
        async with spawn(model, *common, "--cache-dir", str(root)) as eng:
            t0 = time.perf_counter()
            warm = await eng.score(state, QUESTION, pin=True)
            t_warm = time.perf_counter() - t0
        return {
            "tokens": cold.computed - warm.computed,  # the state's positions
            "mib": size / 2**20,
            "recompute_s": t_cold,
            "restore_s": t_warm,
            "cold_computed": cold.computed,
            "warm_computed": warm.computed,
            "disk": warm.disk,
            "same_bits": numbers(cold) == numbers(warm),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="300,2000,13500")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", type=Path, default=default_model_path())
    args = ap.parse_args()
    print(
        "| state tokens | state file | recompute (cold engine) | restore (restarted engine) | ratio | "
        "positions computed cold / restored (from disk) | same bits |"
    )
    print("|---|---|---|---|---|---|---|")
    for n in (int(x) for x in args.tokens.split(",")):
        r = await one(args.model, n, args.threads)
        print(
            f"| {r['tokens']} | {r['mib']:.1f} MiB | {r['recompute_s']:.3f} s | {r['restore_s']:.3f} s | "
            f"{r['recompute_s'] / r['restore_s']:.1f}x | {r['cold_computed']} / {r['warm_computed']} "
            f"({r['disk']}) | {'yes' if r['same_bits'] else 'NO'} |",
            flush=True,
        )


if __name__ == "__main__":
    anyio.run(main)
