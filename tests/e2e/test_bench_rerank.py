"""bench/rerank.py: the labelled set's grades by rule, nDCG@10 and MRR against values worked out by hand."""

from __future__ import annotations

import math

from bench import rerank as bench


def test_each_query_has_one_answer_three_on_topic_six_others_and_the_answer_names_its_town():
    data = bench.labelled_set()
    assert len(data) == 12 * 5
    for item in data:
        assert sorted(item["grades"]) == [0] * 6 + [1] * 3 + [2]
        town = next(t for t in bench.TOWNS if t in item["query"])
        answer = item["documents"][item["grades"].index(2)]
        assert town in answer
        assert all(town in d for d, g in zip(item["documents"], item["grades"]) if g == 1)
        assert all(town not in d for d, g in zip(item["documents"], item["grades"]) if g == 0)
    assert bench.labelled_set() == data  # fixed by its seed
    assert len({tuple(x["grades"]) for x in data}) > 1  # shuffled: the answer is not always in one place


def test_ndcg_and_reciprocal_rank_by_hand():
    grades = [0, 2, 1]
    assert bench.ndcg_at(grades, [1, 2, 0]) == 1.0
    # DCG of [0, 2, 1]: 0 + 3/log2(3) + 1/2; ideal: 3 + 1/log2(3)
    assert math.isclose(bench.ndcg_at(grades, [0, 1, 2]), (3 / math.log2(3) + 0.5) / (3 + 1 / math.log2(3)))
    assert bench.reciprocal_rank(grades, [0, 2, 1]) == 1 / 3
    assert bench.ranked([0.5, 0.9, 0.5]) == [1, 0, 2]


def test_bm25_ranks_the_lexical_trap_over_the_answer_somewhere():
    # the set is built so that word overlap is not enough: BM25's MRR is below 1
    data = bench.labelled_set()
    mrr = sum(bench.reciprocal_rank(x["grades"], o) for x, o in zip(data, bench.bm25_orders(data))) / len(data)
    assert mrr < 0.5
