"""A known state after a restart: restored from its file (``--cache-dir``) against recomputed.

For each state length, one run: an engine with ``--cache-dir`` reads the state once with a
snapshot (``pin``) and exits, leaving its state file; then, side by side, a fresh engine without
the cache and a restarted one with it each answer one new question on that state. The table gives
the state file's size, both times, their ratio, the positions each computed, and whether the two
answers are the same bits (``--float-digits 17``).

    .venv/bin/python -m bench.persist [--tokens 300,2000,13500] [--threads 2]
"""

from __future__ import annotations

import argparse
import logging
import re
import shutil
import tempfile
import time
from pathlib import Path

import anyio

from bench.digits import numbers, spawn
from gateway.paths import default_model_path

READ_MS: list[float] = []  # the engine's own "restored ... in X ms" lines (stderr, logged by the gateway)


class _Restored(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        m = re.search(r"a state of \d+ positions restored \(.*\) in ([0-9.]+) ms", record.getMessage())
        if m:
            READ_MS.append(float(m.group(1)))


FIRST = [("\nQ: Is it about billing? A:", [" yes", " no"])]  # read when the state is new
QUESTION = [("\nQ: Is the customer angry? A:", [" yes", " no"])]  # the new question after the restart
AGAIN = [("\nQ: Does the customer want a refund? A:", [" yes", " no"])]  # then one on the state in memory
WARMUP = "<|im_start|>user\nHello."  # an unrelated prompt each engine reads first


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
            await eng.score(WARMUP, QUESTION)  # a fresh engine's first decode costs extra: not timed
            t0 = time.perf_counter()
            cold = await eng.score(state, QUESTION)
            t_cold = time.perf_counter() - t0
        async with spawn(model, *common, "--cache-dir", str(root)) as eng:
            await eng.score(WARMUP, QUESTION)  # also reads the scores files (none of them is this question's)
            t0 = time.perf_counter()
            warm = await eng.score(state, QUESTION, pin=True)
            t_warm = time.perf_counter() - t0
            # the baseline in the same engine: one more new question, the state now in memory
            t0 = time.perf_counter()
            await eng.score(state, AGAIN, pin=True)
            t_memory = time.perf_counter() - t0
        return {
            "tokens": cold.computed - warm.computed,  # the state's positions
            "mib": size / 2**20,
            "recompute_s": t_cold,
            "restore_s": t_warm,
            "memory_s": t_memory,
            "read_ms": READ_MS[-1] if READ_MS else float("nan"),
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
    logging.getLogger("gateway.engine").addHandler(_Restored())
    logging.getLogger("gateway.engine").setLevel(logging.INFO)
    print(
        "| state tokens | state file | recompute (cold engine) | restore (restarted engine) | of which the file "
        "read + llama_state_seq_set_data | next question, state in memory | recompute / restore | positions "
        "computed cold / restored (from disk) | same bits |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for n in (int(x) for x in args.tokens.split(",")):
        r = await one(args.model, n, args.threads)
        print(
            f"| {r['tokens']} | {r['mib']:.1f} MiB | {r['recompute_s']:.3f} s | {r['restore_s']:.3f} s | "
            f"{r['read_ms']:.1f} ms | {r['memory_s']:.3f} s | {r['recompute_s'] / r['restore_s']:.1f}x | {r['cold_computed']} / {r['warm_computed']} "
            f"({r['disk']}) | {'yes' if r['same_bits'] else 'NO'} |",
            flush=True,
        )


if __name__ == "__main__":
    anyio.run(main)
