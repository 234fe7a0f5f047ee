"""``gateway.lab.evaluation``: every metric against a value computed by hand on a tiny input."""

from __future__ import annotations

import math

import pytest

from gateway.lab import evaluation as ev


def test_argmax_takes_the_first_on_ties_and_accuracy_is_weighted():
    assert ev.argmax([0.4, 0.4, 0.2]) == 0 and ev.argmax([0.2, 0.4, 0.4]) == 1
    probs = [[0.7, 0.3], [0.2, 0.5, 0.3], [0.5, 0.5]]
    gold = [0, 2, 1]
    assert ev.accuracy(probs, gold) == pytest.approx(1 / 3)
    assert ev.accuracy(probs, gold, [2.0, 1.0, 1.0]) == pytest.approx(2 / 4)
    with pytest.raises(ValueError):
        ev.accuracy([], [])


def test_ece_with_equal_mass_bins_by_hand():
    conf = [0.9, 0.8, 0.6, 0.55]
    correct = [1, 0, 1, 0]
    # two bins of two answers: {0.55, 0.6}: accuracy 0.5, confidence 0.575; {0.8, 0.9}: 0.5 and 0.85
    assert ev.ece(conf, correct, n_bins=2) == pytest.approx(0.5 * 0.075 + 0.5 * 0.35)
    # one bin: |0.5 - 0.7125|
    assert ev.ece(conf, correct, n_bins=1) == pytest.approx(0.2125)
    # a weight of 3 on the 0.9 answer: bins cut at half the weight (3 of 6): {0.55, 0.6, 0.8} and {0.9 x3}
    want = (abs(1 - (0.55 + 0.6 + 0.8)) + 3 * abs(1 - 0.9)) / 6
    assert ev.ece(conf, correct, [3, 1, 1, 1], n_bins=2) == pytest.approx(want)
    # equal confidences stay in one bin: four answers at 0.7, half right, are one bin (|0.5 - 0.7|), not
    # two bins of whatever order the sort left them in
    assert ev.ece([0.7] * 4, [1, 1, 0, 0], n_bins=2) == pytest.approx(0.2)
    assert ev.ece([0.7] * 4 + [0.9] * 4, [1, 1, 0, 0] + [1] * 4, n_bins=2) == pytest.approx((0.2 + 0.1) / 2)


def test_ece_noise_floor():
    # confidences of 1 are always right when calibrated: no noise
    assert ev.ece_floor([1.0] * 10, rounds=20) == (0.0, 0.0)
    # four answers at 0.5 in one bin: E|K/4 - 1/2| for K ~ Binomial(4, 1/2) = 2*(1/16)*(1/2) + 2*(4/16)*(1/4)
    mean, p95 = ev.ece_floor([0.5] * 4, n_bins=1, rounds=20000, seed=1)
    assert mean == pytest.approx(0.1875, abs=0.005)
    assert p95 == pytest.approx(0.5)
    assert ev.ece_floor([0.5] * 4, n_bins=1, rounds=50, seed=3) == ev.ece_floor([0.5] * 4, n_bins=1, rounds=50, seed=3)


def test_brier_and_nll_by_hand():
    probs = [[0.7, 0.3], [0.2, 0.5, 0.3]]
    gold = [0, 2]
    assert ev.brier(probs, gold) == pytest.approx(((0.09 + 0.09) + (0.04 + 0.25 + 0.49)) / 2)
    assert ev.nll(probs, gold) == pytest.approx((-math.log(0.7) - math.log(0.3)) / 2)
    # a reported 0 for the gold option is clipped at one millionth
    assert ev.nll([[1.0, 0.0]], [1]) == pytest.approx(-math.log(1e-6))


def test_macro_f1_per_task_then_averaged():
    # task a: gold x x y, predicted x y y: F1(x) = 2/(2+0+1), F1(y) = 2/(2+1+0): 2/3
    # task b: gold 0 1, predicted 0 0: F1(0) = 2/(2+1+0) = 2/3, F1(1) = 0: 1/3
    pred = ["x", "y", "y", 0, 0]
    gold = ["x", "x", "y", 0, 1]
    tasks = ["a", "a", "a", "b", "b"]
    assert ev.macro_f1(pred, gold, tasks) == pytest.approx((2 / 3 + 1 / 3) / 2)
    # always "no" on a mostly-no noul: accuracy 3/4 but F1 averages 6/7 with 0
    assert ev.macro_f1([0, 0, 0, 0], [0, 0, 0, 1], ["n"] * 4) == pytest.approx((6 / 7 + 0) / 2)


def test_jsd_in_bits_and_order_stability():
    assert ev.jsd([1, 0], [0, 1]) == pytest.approx(1.0)
    assert ev.jsd([0.5, 0.5], [0.5, 0.5]) == 0.0
    p, q = [0.75, 0.25], [0.25, 0.75]
    m = [0.5, 0.5]
    want = 0.5 * sum(a * math.log2(a / b) for a, b in zip(p, m)) + 0.5 * sum(a * math.log2(a / b) for a, b in zip(q, m))
    assert ev.jsd(p, q) == pytest.approx(want)
    same = [{"a": 0.6, "b": 0.4}, {"b": 0.4, "a": 0.6}]
    assert ev.order_stability(same) == (False, 0.0)
    # a tie goes to the first-listed label: the two orders answer differently
    tie = [{"a": 0.5, "b": 0.5}, {"b": 0.5, "a": 0.5}]
    assert ev.order_stability(tie) == (True, 0.0)
    flipped, j = ev.order_stability([{"a": 0.75, "b": 0.25}, {"a": 0.25, "b": 0.75}, {"a": 0.75, "b": 0.25}])
    assert flipped and j == pytest.approx(2 / 3 * want)
    with pytest.raises(ValueError):
        ev.order_stability(same[:1])
