"""Reproducible digits: the llama engine's numbers depend on the tokens only.

The matrix of issue 12 on the default model (SmolLM2-135M Q4_1, where any
change of arithmetic order moves a logprob by ~0.2 nats) and on the tiny F32
fixture. The engine prints every number with ``--float-digits 17``, which a
double reads back from to the same bits, so ``==`` on the parsed floats
compares bits: every cell below is an exact equality, no tolerance.

Cells: SCORE vs pinned one-by-one (the fallback) vs a plain read-out; cold vs
after unrelated requests; questions in any order; a group alone vs 1st / 9th
of 16; after a longer pinned state then a shorter one; a state computed in
pieces vs at once; 1 vs 2 threads; the score cache's answer vs a fresh one;
and ``--numerics fast`` showing that the same cells differ without all this.
"""
from __future__ import annotations

import os

import anyio
import pytest

from gateway.engine import Engine
from gateway.paths import default_model_path, engine_bin

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

STATE = ("<|im_start|>user\nI have been trying to connect my Stripe account for 3 days and the "
         "integration keeps failing. I am losing sales.")
GROUPS = [
    ("\nQ: Which team handles this? Options: billing, technical, sales. A:", [" billing", " technical", " sales"]),
    ("\nQ: Is this urgent? Answer yes or no. A:", [" yes", " no"]),
    ("\nQ: How severe is it? A:", [" no impact", " minor inconvenience", " losing money", " business down"]),
]
FILLER = [(f"\nQ: Filler question {i}? A:", [" a", " b c", " maybe not"]) for i in range(15)]


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def model_path():
    if not os.access(engine_bin("serveproto-llama"), os.X_OK):
        pytest.skip("engines/bin/serveproto-llama is not built yet (make -C engines all)")
    path = default_model_path()
    if not path.exists():
        pytest.skip(f"{path} is not fetched yet (make model)")
    return path


@pytest.fixture(scope="module")
def tiny_path():
    if not os.access(engine_bin("serveproto-llama"), os.X_OK):
        pytest.skip("engines/bin/serveproto-llama is not built yet (make -C engines all)")
    from fixtures import tiny_gguf
    return tiny_gguf.ensure()


def spawn(model, *args: str, threads: int = 1):
    return Engine.spawn([str(engine_bin("serveproto-llama")), "--model", str(model), "--threads", str(threads),
                         "--float-digits", "17", *args])


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


async def the_matrix(model, *args: str) -> dict[str, list[list[float]]]:
    """Every cell's numbers for GROUPS on STATE, keyed by the cell's name."""
    cells = {}
    async with spawn(model, "--score-cache-mb", "0", *args) as eng:
        cells["read-out"] = await read_out_scores(eng, STATE, GROUPS)
    async with spawn(model, "--score-cache-mb", "0", *args) as eng:
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
                await eng.score(f"Another customer, case {i}, writes about a late parcel.",
                                [("\nQ: Late? A:", [" yes", " no"]), ("\nQ: Angry? A:", [" very much", " no"])])
        cells["after 20 unrelated requests"] = numbers(await eng.score(STATE, GROUPS))
    async with spawn(model, "--score-cache-mb", "0", *args) as eng:
        # the state reached in three pieces: each SCORE extends the last one's rows
        words = STATE.split(" ")
        for cut in (len(words) // 3, 2 * len(words) // 3):
            await eng.score(" ".join(words[:cut]), GROUPS[1:2], pin=True)
        cells["state in pieces"] = numbers(await eng.score(STATE, GROUPS))
    return cells


def assert_all_equal(cells: dict[str, list[list[float]]]) -> None:
    ref = cells["read-out"]
    differ = {name: max(abs(a - b) for ra, rb in zip(v, ref) for a, b in zip(ra, rb))
              for name, v in cells.items() if v != ref}
    assert not differ, f"cells whose bits differ from the plain read-out (max |d| nats): {differ}"


async def test_every_cell_is_bit_identical_on_the_default_model(model_path):
    cells = await the_matrix(model_path)
    assert_all_equal(cells)
    # the numbers are real logprobs of these options, not a constant
    assert all(-30 < x < 0 for row in cells["score"] for x in row)
    assert len({x for row in cells["score"] for x in row}) == 9


async def test_every_cell_is_bit_identical_on_the_tiny_fixture(tiny_path):
    assert_all_equal(await the_matrix(tiny_path))


async def test_fast_numerics_differ_in_the_same_cells(model_path):
    """The matrix can fail: llama.cpp's shape-dependent kernels move the default model's digits."""
    cells = await the_matrix(model_path, "--numerics", "fast")
    with pytest.raises(AssertionError, match="cells whose bits differ"):
        assert_all_equal(cells)


async def test_one_and_two_threads_give_the_same_bits(model_path):
    results = []
    for threads in (1, 2):
        async with spawn(model_path, "--score-cache-mb", "0", threads=threads) as eng:
            echoes = (await eng.read_out(STATE, logprobs=3)).echoes
            # repr: a float's shortest exact spelling, and "nan" == "nan" (position 0 has no logprob)
            results.append((numbers(await eng.score(STATE, GROUPS + FILLER[:4])),
                            [(e.position, repr(e.logprob), repr(e.top), e.text) for e in echoes]))
    assert len(results[0][1]) > 20
    assert results[0] == results[1]


async def test_score_cache_answers_a_repeat_with_the_fresh_bits_and_computes_nothing(model_path):
    async with spawn(model_path) as eng:
        first = await eng.score(STATE, GROUPS, pin=True)
        again = await eng.score(STATE, GROUPS[::-1], pin=True)
        assert numbers(again)[::-1] == numbers(first)
        # the first computed the state and every stem and option position, the repeat none of them
        assert first.reused == 0
        assert (again.computed, again.reused) == (0, first.computed)
        assert again.done.snapshot == "hit"
        # one new option on a known question: only its own positions and its stem are computed
        grown = await eng.score(STATE, [(GROUPS[0][0], GROUPS[0][1] + [" legal and compliance"])])
        assert numbers(grown)[0][:3] == numbers(first)[0]
        assert 0 < grown.computed < first.computed
    async with spawn(model_path, "--score-cache-mb", "0") as eng:
        fresh = await eng.score(STATE, GROUPS)
        again = await eng.score(STATE, GROUPS)
        assert numbers(fresh) == numbers(first) and numbers(again) == numbers(first)
        assert again.computed > 0


async def test_numerics_flag_is_checked_and_announced(model_path):
    async with spawn(model_path) as eng:
        assert eng.caps.values["x_numerics"] == "invariant"
    async with spawn(model_path, "--numerics", "fast") as eng:
        assert eng.caps.values["x_numerics"] == "fast"
    proc = await anyio.run_process([str(engine_bin("serveproto-llama")), "--model", str(model_path),
                                    "--numerics", "exact"], check=False)
    assert proc.returncode == 2
    assert b"--numerics must be invariant or fast, got 'exact'" in proc.stderr
