"""The decision math (gateway.decision.arithmetic's step 4, gateway.decision.scoring's reported numbers), against values
worked out by hand."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.decision import scoring
from gateway.decision.arithmetic import option_scores, softmax


def test_softmax_recovers_probabilities_from_their_logs():
    p = softmax([math.log(0.2), math.log(0.3), math.log(0.5)])
    assert p == pytest.approx([0.2, 0.3, 0.5], abs=1e-15)


def test_sum_and_mean_normalisation():
    # "yes" one token at p=.25; "no" two tokens at .5 each: sum ties them, mean favours "no".
    lps = [[math.log(0.25)], [math.log(0.5), math.log(0.5)]]
    assert scoring.decide(lps, "sum") == [0.5, 0.5]
    # mean: scores log .25 and log .5 -> softmax = [.25, .5] / .75
    assert scoring.decide(lps, "mean") == [0.333333, 0.666667]


def test_quantize_is_largest_remainder_and_adds_to_one():
    assert scoring.quantize([1 / 3, 1 / 3, 1 / 3]) == [333334, 333333, 333333]
    assert scoring.quantize([2 / 3, 1 / 6, 1 / 6]) == [666667, 166667, 166666]
    assert scoring.quantize([1.0]) == [1_000_000]


def test_confidence_entropy_expected_level():
    assert scoring.confidence([0.9, 0.05, 0.05]) == pytest.approx(0.85)
    assert scoring.confidence([0.5, 0.5]) == 0.0
    assert scoring.confidence([1.0]) == 1.0
    assert scoring.entropy([0.5, 0.5]) == pytest.approx(1.0)
    assert scoring.entropy([1.0, 0.0]) == 0.0
    assert scoring.expected_level([0.1, 0.2, 0.7]) == pytest.approx(1.6)


def test_bad_inputs_name_the_problem():
    with pytest.raises(ValueError, match="normalize"):
        option_scores([[-1.0]], "max")
    with pytest.raises(ValueError, match="option 1 has no scored tokens"):
        option_scores([[-1.0], []])
    with pytest.raises(ValueError, match="non-finite"):
        option_scores([[float("nan")]])


@given(
    st.lists(st.lists(st.floats(min_value=-200, max_value=0), min_size=1, max_size=4), min_size=1, max_size=40),
    st.sampled_from(["sum", "mean"]),
)
def test_reported_probabilities_always_add_to_one(lps, normalize):
    p = scoring.decide(lps, normalize)
    units = [round(x * scoring.QUANTUM) for x in p]
    assert sum(units) == scoring.QUANTUM and min(units) >= 0
    assert 0.0 <= scoring.confidence(p) <= 1.0
    # the argmax of the scores holds the largest reported probability, up to one millionth (a tie broken by the remainder)
    s = option_scores(lps, normalize)
    assert p[s.index(max(s))] >= max(p) - 1.5e-6
