"""bench/quality.py: the option orders it asks, the gold answers under them, the stateful corrections and the
README table's markers (no engine, no timing)."""

from __future__ import annotations

import random

import pytest

from bench import quality
from gateway.lab import evalset


def test_rotations_are_recognised():
    assert quality.is_rotation((1, 2, 3), (3, 1, 2))
    assert not quality.is_rotation((1, 2, 3), (2, 1, 3))


@pytest.mark.parametrize("n", [3, 4, 5, 12])
def test_orders_are_distinct_and_not_all_rotations(n):
    labels = [f"l{i}" for i in range(n)]
    for seed in range(20):
        out = quality.orders(labels, random.Random(seed))
        assert len(out) == 3 and len({tuple(o) for o in out}) == 3
        assert all(sorted(o) == sorted(labels) for o in out)
        assert any(not quality.is_rotation(tuple(out[0]), tuple(o)) for o in out[1:])


def test_two_labels_get_both_orders():
    out = quality.orders(["a", "b"], random.Random(0))
    assert {tuple(out[0]), tuple(out[1])} == {("a", "b"), ("b", "a")} and out[2] == out[0]


def test_pass_bodies_move_the_gold_answer_with_its_label():
    items = evalset.generate()[:3]
    bodies, golds = quality.pass_bodies(items, seed=0)
    for p in range(quality.PASSES):
        for item, body, gold in zip(items, bodies[p], golds[p]):
            for qid, q in body["questions"].items():
                sent = item.body["questions"][qid]
                if q["type"] == "choice":
                    assert list(q["criteria"])[gold[qid]] == list(sent["criteria"])[item.gold[qid]]
                    assert q["criteria"] == sent["criteria"]  # same labels and descriptions, another order
                else:
                    assert q == sent and gold[qid] == item.gold[qid]
    # every request of a task shares the task's order in a pass
    assert len({tuple(b["questions"]["area"]["criteria"]) for b in bodies[1]}) == 1


def test_the_readme_table_is_replaced_between_its_markers(tmp_path):
    path = tmp_path / "README.md"
    path.write_text(f"head\n{quality.README_START}\nold\n{quality.README_END}\ntail\n")
    quality.write_readme("| new |", path)
    assert path.read_text() == f"head\n{quality.README_START}\n| new |\n{quality.README_END}\ntail\n"
    (tmp_path / "bare.md").write_text("nothing")
    with pytest.raises(SystemExit):
        quality.write_readme("x", tmp_path / "bare.md")
