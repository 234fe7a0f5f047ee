"""One scoring path: the engine API's results (``arithmetic.probabilities``), ``serveproto score`` and
``POST /v1/systemone`` read the same option logprobs the same way (gateway.decision.arithmetic).

Good logprobs give the same bits everywhere; logprobs no engine sends (an option with no token,
a NaN or infinite logprob: SCORED carries 1 to 200 finite ones, spec 9.1) are refused everywhere
with the same words: ``ValueError`` from the API, exit 1 and a line on stderr from the CLI, 502
from the server. (Before, the API and the CLI ranked an empty option first under ``sum``, gave a
``-inf`` option probability 0, and the CLI died with a traceback on NaN.)
"""

from __future__ import annotations

import contextlib
import math

import anyio
import httpx2
import pytest

from gateway.cli import build_parser
from gateway.cli.drive import score_lines
from gateway.decision import scoring
from gateway.decision.arithmetic import option_scores, probabilities, softmax
from gateway.engine import OptionScore, ScoreResult
from test_routes_support import FakeEngine, make_app, running

GOOD = [(-0.25, -1.5), (-0.75,), (-2.0, -0.125, -0.5)]
#: (logprobs of the second option, what every face says), for both normalize values.
BAD = [
    ((), "option 1 has no scored tokens"),
    ((-1.0, math.nan), "option 1 has a non-finite logprob: [-1.0, nan]"),
    ((-math.inf,), "option 1 has a non-finite logprob: [-inf]"),
    ((math.inf,), "option 1 has a non-finite logprob: [inf]"),
]


def result_of(rows) -> ScoreResult:
    return ScoreResult([[OptionScore(5, tuple(lps), f"o{i}") for i, lps in enumerate(rows)]])


class BadScores(FakeEngine):
    """The routes' fake engine, answering every SCORE with ``rows`` as its options' logprobs."""

    def __init__(self, rows) -> None:
        super().__init__()
        self.rows = rows

    async def score(self, prefix, groups, pin=False, slot=None, route=None):
        await super().score(prefix, groups, pin, slot, route)
        return ScoreResult([[OptionScore(len(prefix), tuple(lps)) for lps in self.rows] for _ in groups])


def served(rows, normalize: str) -> httpx2.Response:
    labels = [f"label{i}" for i in range(len(rows))]
    body = {
        "state": "s",
        "normalize": normalize,
        "x_debias": "none",
        "questions": {"q": {"type": "choice", "criteria": {k: None for k in labels}}},
    }

    async def ask():
        async with running(make_app(BadScores(rows))) as base:
            async with httpx2.AsyncClient(base_url=base) as c:
                return await c.post("/v1/systemone", json=body)

    return anyio.run(ask)


def cli(rows, normalize: str, capsys, monkeypatch, *extra: str) -> tuple[int, str, str]:
    """``serveproto score`` with the engine replaced by one that answers ``rows``."""
    from gateway.engine import api

    class Spawned:
        async def score(self, prefix, groups, **kw):
            return result_of(rows)

    @contextlib.asynccontextmanager
    async def spawn(cls, argv, **kw):
        yield Spawned()

    monkeypatch.setattr(api.Engine, "spawn", classmethod(spawn))
    args = build_parser().parse_args(
        [
            "score",
            "--engine",
            "unused",
            "--prefix",
            "p",
            "--normalize",
            normalize,
            *[a for i in range(len(rows)) for a in ("--option", f"o{i}")],
            *extra,
        ]
    )
    rc = args.func(args)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("normalize", ["sum", "mean"])
def test_good_logprobs_give_the_same_bits_everywhere(normalize, capsys, monkeypatch):
    want = softmax([math.fsum(x) / (1 if normalize == "sum" else len(x)) for x in GOOD])
    assert probabilities(result_of(GOOD), 0, normalize) == want
    assert softmax(option_scores(GOOD, normalize)) == want
    rc, out, _ = cli(GOOD, normalize, capsys, monkeypatch, "--json")
    assert rc == 0 and [o["probability"] for o in __import__("json").loads(out)["options"]] == want
    reply = served(GOOD, normalize)
    assert reply.status_code == 200
    assert list(reply.json()["answers"]["q"]["probabilities"].values()) == scoring.report(want)


@pytest.mark.parametrize("normalize", ["sum", "mean"])
@pytest.mark.parametrize("bad, message", BAD, ids=["empty", "nan", "-inf", "+inf"])
def test_unusable_logprobs_are_refused_alike(bad, message, normalize, capsys, monkeypatch):
    rows = [GOOD[0], bad, GOOD[2]]
    with pytest.raises(ValueError) as api_error:
        probabilities(result_of(rows), 0, normalize)
    assert str(api_error.value) == message
    for as_json in (False, True):
        with pytest.raises(ValueError) as table_error:
            score_lines(result_of(rows), normalize, as_json=as_json)
        assert str(table_error.value) == message
    for extra in ((), ("--json",)):
        rc, out, err = cli(rows, normalize, capsys, monkeypatch, *extra)
        assert (rc, out, err) == (1, "", f"serveproto score: the engine's scores are unusable: {message}\n")
    reply = served(rows, normalize)
    assert reply.status_code == 502
    assert reply.json()["detail"] == {
        "error_type": "api_error",
        "message": f"the engine's scores for 'q' are unusable: {message}",
    }


def test_an_unknown_normalize_is_refused_by_the_one_check():
    for call in (lambda: probabilities(result_of(GOOD), 0, "max"), lambda: option_scores(GOOD, "max")):
        with pytest.raises(ValueError) as e:
            call()
        assert str(e.value) == "normalize must be 'sum' or 'mean', got 'max'"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["score", "--prefix", "p", "--option", "a", "--normalize", "max"])


def test_step_4_is_written_once_in_the_gateway():
    """No other softmax, sum/mean rule or list of normalize values in gateway/ than decision/arithmetic.py's."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "gateway"
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef) and node.name in (
                "softmax",
                "log_softmax",
                "option_scores",
                "check_normalize",
            ):
                found.append((str(path.relative_to(root)), node.name))
            elif (
                isinstance(node, (ast.Tuple, ast.List, ast.Set))
                and node.elts
                and all(isinstance(e, ast.Constant) for e in node.elts)
                and {e.value for e in node.elts} == {"sum", "mean"}
            ):
                found.append((str(path.relative_to(root)), "('sum', 'mean')"))
    assert sorted(found) == [
        ("decision/arithmetic.py", "('sum', 'mean')"),
        ("decision/arithmetic.py", "check_normalize"),
        ("decision/arithmetic.py", "log_softmax"),
        ("decision/arithmetic.py", "option_scores"),
        ("decision/arithmetic.py", "softmax"),
    ]
