"""Reproducible digits: the llama engine's numbers depend on the tokens only.

The matrix of issue 12 on the default model (SmolLM2-135M Q4_1, where any
change of arithmetic order moves a logprob by ~0.2 nats) and on the tiny F32
fixture. The engine prints every number with ``--float-digits 17``, which a
double reads back from to the same bits, so ``==`` on the parsed floats
compares bits: every cell below is an exact equality, no tolerance.

The matrix's cells are built in ``bench/digits.py`` (which prints the same
table for any engine build, e.g. on a GPU); here every cell must equal the
plain read-out. Beside it: 1 vs 2 threads; the score cache's answer vs a fresh
one; ``--numerics fast`` showing that the same cells differ without all this;
and ``/v1/systemone`` answers under question order, label rotation and other
traffic.
"""

from __future__ import annotations

import os

import anyio
import pytest

from bench.digits import FILLER, GROUPS, STATE, differences, numbers, spawn, the_matrix
from gateway.paths import engine_bin

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def tiny_path():
    if not os.access(engine_bin("serveproto-llama"), os.X_OK):
        pytest.skip("engines/bin/serveproto-llama is not built yet (make -C engines all)")
    from fixtures import tiny_gguf

    return tiny_gguf.ensure()


def assert_all_equal(cells: dict[str, list[list[float]]]) -> None:
    differ = {name: d for name, d in differences(cells).items() if cells[name] != cells["read-out"]}
    assert not differ, f"cells whose bits differ from the plain read-out (max |d| nats): {differ}"


async def test_every_cell_is_bit_identical_on_the_default_model(model_path):
    cells = await the_matrix(model_path)
    assert_all_equal(cells)
    # the numbers are real logprobs of these options, not a constant
    assert all(-30 < x < 0 for row in cells["score"] for x in row)
    assert len({x for row in cells["score"] for x in row}) == 11


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
            results.append(
                (
                    numbers(await eng.score(STATE, GROUPS + FILLER[:4])),
                    [(e.position, repr(e.logprob), repr(e.top), e.text) for e in echoes],
                )
            )
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
    proc = await anyio.run_process(
        [str(engine_bin("serveproto-llama")), "--model", str(model_path), "--numerics", "exact"], check=False
    )
    assert proc.returncode == 2
    assert b"--numerics must be invariant or fast, got 'exact'" in proc.stderr


# ---- the same through POST /v1/systemone ------------------------------------------------------

TICKET = {
    "state": "I have been trying to connect my Stripe account for 3 days and the integration keeps failing. "
    "I am losing sales.",
    "questions": {
        "urgency": {"type": "noul", "instructions": "Does this message express urgency?"},
        "department": {
            "type": "choice",
            "instructions": "Which team should handle this?",
            "criteria": {
                "billing": "payments, invoices",
                "technical": "bugs, integration errors",
                "sales": "pricing, plans",
            },
        },
        "severity": {
            "type": "score",
            "instructions": "How severe is the customer impact?",
            "criteria": ["no impact", "minor inconvenience", "blocked on one task", "losing money", "business down"],
        },
    },
}


def reordered(request: dict, order: list[str], rotate: int = 0) -> dict:
    """The request with its questions in ``order`` and each choice's labels rotated by ``rotate``
    (the same cyclic order, so ``cyclic`` reads the same rotations)."""
    questions = {}
    for qid in order:
        q = dict(request["questions"][qid])
        if q["type"] == "choice":
            items = list(q["criteria"].items())
            q["criteria"] = dict(items[rotate:] + items[:rotate])
        questions[qid] = q
    return {**request, "questions": questions}


def answers(body: dict) -> dict:
    """Each answer with its probabilities keyed by label, so that label order does not show."""
    out = {}
    for qid, a in body["answers"].items():
        a = dict(a)
        if "probabilities" in a:
            a["probabilities"] = dict(sorted(a["probabilities"].items()))
        out[qid] = a
    return dict(sorted(out.items()))


@pytest.mark.parametrize("cache_mb", ["0", "64"])
async def test_systemone_answers_do_not_depend_on_order_or_traffic(model_path, cache_mb):
    """Default model, default correction (canonical + spellings + content_free_listing since issue 23, canonical
    + content_free before; this test was written under cyclic + content_free): the same answers, to the last digit of
    the reply, for any question order, a rotated label order and after other requests; with the score
    cache off (every request computes) and on."""
    import httpx2

    from test_server_llama import post, serving

    # the engine's digits, not the shipped calibration's map of them (issue 48): the check below is the model's own
    async with serving("--score-cache-mb", cache_mb, "--calibration", "none") as url:
        async with httpx2.AsyncClient(base_url=url, timeout=300) as c:
            first = await post(c, "/v1/systemone", TICKET)
            assert first["x_debias"] == ["canonical", "spellings", "content_free_listing"]
            seen = [
                await post(c, "/v1/systemone", reordered(TICKET, ["severity", "department", "urgency"])),
                await post(c, "/v1/systemone", reordered(TICKET, ["department", "urgency", "severity"], 1)),
            ]
            for i in range(3):
                await post(
                    c,
                    "/v1/systemone",
                    {
                        "state": f"Order {i} arrived broken, I want a refund.",
                        "questions": {"refund": {"type": "noul", "instructions": "Is a refund asked?"}},
                    },
                )
            seen.append(await post(c, "/v1/systemone", reordered(TICKET, ["urgency", "severity", "department"], 2)))
    assert first["answers"]["department"]["probabilities"]["technical"] > 0.4
    for body in seen:
        assert answers(body) == answers(first)
