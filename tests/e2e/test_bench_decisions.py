"""bench/decisions.py: the helpers that turn generated answers into probabilities, and the fixture part runs.

No timing is asserted; the fixture run only checks that every table is printed.
"""

from __future__ import annotations

import pytest

from bench import decisions
from gateway.paths import engine_bin
from test_bench_support import run_bench


@pytest.mark.parametrize(
    "text, options, want",
    [
        ("No, this message does not express urgency.", ("no", "yes"), 0),
        ("Yes. The message asks for quick help", ("no", "yes"), 1),
        ("The customer's mood is frustrated.", ("calm", "frustrated", "angry"), 1),
        ("The team should be Technical, then billing", ("billing", "technical", "sales"), 1),  # the earliest wins
        ("I know nothing", ("no", "yes"), None),  # whole words only
        ("checkout page", ("checkout", "checkout page"), 1),  # longest at one position
        ("Your customer impact score is 4.", ("1", "2", "3", "4", "5"), 3),
        ("", ("no", "yes"), None),
    ],
)
def test_parse_answer(text, options, want):
    assert decisions.parse_answer(text, options) == want


def test_sampled_probabilities_count_named_answers_only():
    texts = ["yes", "Yes, it is", "no", "maybe", "YES"]
    assert decisions.sampled_probabilities(texts, ("no", "yes")) == ([0.25, 0.75], 1)
    assert decisions.sampled_probabilities(["hmm", "?"], ("a", "b", "c")) == ([1 / 3, 1 / 3, 1 / 3], 2)


def test_expected_sampling_error_by_hand():
    # k=2, p=.5: c=0 and c=2 (prob .25 each) are .5 away, c=1 is exact -> .25 for either option
    assert decisions.expected_sampling_error([0.5, 0.5], 2) == pytest.approx(0.25, abs=1e-15)
    # k=1, p=.2: c=1 (prob .2) is .8 away, c=0 (prob .8) is .2 away -> .32; the other option the same
    assert decisions.expected_sampling_error([0.2, 0.8], 1) == pytest.approx(0.32, abs=1e-15)
    assert decisions.expected_sampling_error([1.0, 0.0, 0.0], 20) == 0.0


def test_systemone_probabilities_in_option_order():
    noul = {"type": "noul"}
    assert decisions.systemone_probabilities(noul, {"noul": 0.75}) == [0.25, 0.75]
    choice = {"type": "choice", "criteria": {"b": None, "a": None}}
    assert decisions.systemone_probabilities(choice, {"probabilities": {"a": 0.1, "b": 0.9}}) == [0.9, 0.1]
    score = {"type": "score", "criteria": ["low", "high"]}
    assert decisions.systemone_probabilities(score, {"probabilities": {"0": 0.3, "1": 0.7}}) == [0.3, 0.7]
    assert decisions.options_of(score) == ("1", "2") and decisions.options_of(noul) == ("no", "yes")


@pytest.mark.skipif(
    not engine_bin("serveproto-fixture").exists(), reason="the fixture engine is not built (make engines)"
)
def test_fixture_part_runs_without_a_model():
    sizes = ("--share-n", "100", "--load", "40", "--concurrency", "4")
    out = run_bench("decisions", "--fixture-only", *sizes, check=True, timeout=240).stdout
    assert "## the gateway's own share per request" in out
    assert "| HTTP request at the client, this tree |" in out
    assert "| HTTP request at the client, this tree, access log on (--log-level INFO) |" in out
    assert "| the same DECIDE through the supervisor, no HTTP |" in out
    assert "## load on loopback: 40 requests at 4 concurrent connections" in out
    assert "System One vs generation" not in out


def test_cpu_parts_by_innermost_frame():
    raw = "\n".join(
        [
            "main (cli.py:1);helper (tools/else.py:1) 5",  # none of the parts
            "serve (gateway/http/server.py:9);write (asyncio/selector_events.py:1057) 3",  # no: not the transport's
            "serve (gateway/http/server.py:9);_SelectorSocketTransport.write (asyncio/selector_events.py:1057) 2",
            "main (cli.py:1);EpollSelector.select (selectors.py:468) 5",  # the loop's wait: apart
            "x (gateway/server/jev/serving.py:3);quantize (gateway/decision/scoring.py:75) 4",
            "x (gateway/server/app.py:3);next_event (h11/_connection.py:1) 1",
            "x (gateway/server/app.py:3);_read_head (gateway/http/server.py:200) 1",
            "x (gateway/engine/api.py:3);begin (gateway/engine/process.py:482) 1",
            "garbage line",
        ]
    )
    parts = decisions.cpu_parts(raw)
    assert parts == {
        "other": 5 / 17,
        "the route: Jev, the DECIDE record, scoring, metrics": 4 / 17,
        "asyncio scheduling": 3 / 17,
        "the kernel: socket send (loopback delivery), pipe write": 2 / 17,
        "h11": 1 / 17,
        "gateway/http and gateway/server/app": 1 / 17,
        "the supervisor and serveproto": 1 / 17,
        "(epoll wait, left out)": 5 / 22,
    }
    assert list(parts)[:2] == ["other", "the route: Jev, the DECIDE record, scoring, metrics"]
