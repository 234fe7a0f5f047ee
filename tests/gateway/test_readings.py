"""``gateway.decision.readings`` and the formats of ``gateway.decision.prompts``: exact prompt texts, the reads of each method,
and the combination arithmetic (spellings, means, batch calibration, PriDe) by hand."""

from __future__ import annotations

import math

import pytest

from gateway.decision import readings
from gateway.decision.prompts import cloze_text, letters_text, question_text, spellings
from gateway.decision.readings import Method

CRIT = {"sales": "plans", "billing": "payments", "technical": None}


def test_listed_order_is_any_permutation():
    assert question_text("choice", "Who?", CRIT, order=[2, 0, 1]) == (
        "Who?\ntechnical\nsales: plans\nbilling: payments\nAnswer with one label.",
        ("sales", "billing", "technical"),
    )
    # rotation applies on top of the order
    assert question_text("choice", "Who?", CRIT, 1, [2, 0, 1])[0] == (
        "Who?\nsales: plans\nbilling: payments\ntechnical\nAnswer with one label."
    )
    assert question_text("noul", "Urgent?", None, order=[1, 0])[0] == "Urgent?\nAnswer no or yes."
    with pytest.raises(ValueError):
        question_text("choice", "Who?", CRIT, order=[0, 0, 1])


def test_cloze_lists_nothing():
    assert cloze_text("choice", "Who?", CRIT) == ("Who?", ("sales", "billing", "technical"))
    assert cloze_text("score", None, ["low", {"k": 1}]) == ("Which level fits the text best?", ("low", '{"k": 1}'))
    assert cloze_text("noul", "Urgent?", {"true": "now"}) == ("Urgent?", ("no", "yes"))
    with pytest.raises(ValueError, match="same text"):
        cloze_text("score", "How?", ["low", "low"])


def test_letter_format_and_spellings():
    assert spellings("A") == ("A", " A", "a", " a")
    assert spellings("yes") == ("yes", " yes", "Yes", " Yes")
    assert spellings("7") == ("7", " 7")
    text, per_option = letters_text("choice", "Who?", CRIT, [1, 2, 0])
    assert text == "Who?\nA. billing: payments\nB. technical\nC. sales: plans\nAnswer with the letter."
    assert per_option == (spellings("C"), spellings("A"), spellings("B"))  # reply order: sales, billing, technical
    assert letters_text("score", "How bad?", ["none", "some"]) == (
        "How bad?\n0. none\n1. some\nAnswer with the number.",
        (("0", " 0"), ("1", " 1")),
    )
    text, _ = letters_text("score", "How bad?", [str(i) for i in range(11)])
    assert text.splitlines()[1:3] == ["A. 0", "B. 1"] and text.endswith("Answer with the letter.")
    assert letters_text("noul", "Urgent?", None) == ("Urgent?\nAnswer yes or no.", (spellings("no"), spellings("yes")))
    with pytest.raises(ValueError, match="at most 26"):
        letters_text("choice", "Q", {str(i): None for i in range(27)})


def test_canonical_reads_do_not_depend_on_the_request_order():
    other = {"technical": None, "sales": "plans", "billing": "payments"}
    a = readings.plan("choice", "Who?", CRIT, 3, Method(canonical=True))
    b = readings.plan("choice", "Who?", other, 3, Method(canonical=True))
    assert (
        [r.text for r in a]
        == [r.text for r in b]
        == ["Who?\nbilling: payments\nsales: plans\ntechnical\nAnswer with one label."]
    )
    # the scored strings too (canonical order); owner maps them to each request's reply order, places
    # say where each reply option is listed
    assert a[0].scored == b[0].scored == ("billing", "sales", "technical")
    assert a[0].owner == (1, 0, 2) and a[0].places == (1, 0, 2)
    assert b[0].owner == (2, 1, 0) and b[0].places == (2, 1, 0)
    rot = readings.plan("choice", "Who?", CRIT, 3, Method(canonical=True, cyclic=True))
    assert [r.text.splitlines()[1] for r in rot] == ["billing: payments", "sales: plans", "technical"]
    assert [r.places for r in rot] == [(1, 0, 2), (0, 2, 1), (2, 1, 0)]
    # a score and a noul have no order of their own: canonical is their natural listing
    assert (
        readings.plan("score", "How?", ["a", "b"], 2, Method(canonical=True))[0].text
        == "How?\n1: a\n2: b\nAnswer with the number."
    )
    noul = readings.plan("noul", "Urgent?", None, 2, Method(canonical=True, cyclic=True))
    assert [r.text for r in noul] == ["Urgent?\nAnswer yes or no.", "Urgent?\nAnswer no or yes."]
    assert [r.places for r in noul] == [(1, 0), (0, 1)]  # reply order (no, yes)


def test_request_order_reads_match_the_listed_prompt():
    reads = readings.plan("choice", "Who?", CRIT, 3, Method(cyclic=True))
    assert [r.text for r in reads] == [question_text("choice", "Who?", CRIT, k)[0] for k in range(3)]
    assert readings.plan("choice", "Who?", CRIT, 3, Method())[0].text == question_text("choice", "Who?", CRIT)[0]
    letters = readings.plan("choice", "Who?", CRIT, 3, Method("letters"))
    assert letters[0].scored[:4] == spellings("A") and letters[0].owner == (0,) * 4 + (1,) * 4 + (2,) * 4
    cloze = readings.plan("choice", "Who?", CRIT, 3, Method("cloze", content_free=True))
    assert [(r.text, r.scored, r.owner, r.places) for r in cloze] == [
        ("Who?", ("billing", "sales", "technical"), (1, 0, 2), None)
    ]


def test_method_names_round_trip():
    for names in [
        (),
        ("cyclic", "content_free"),
        ("canonical", "content_free"),
        ("cloze", "content_free"),
        ("letters",),
        ("canonical", "content_free_listing"),
        ("canonical", "spellings", "content_free_listing"),
    ]:
        assert Method.from_names(names).names == names
    listing = Method.from_names(("canonical", "content_free_listing"))
    assert listing.content_free and listing.listing_only and not listing.spellings


def test_the_content_free_side_of_content_free_is_the_question_as_asked():
    for qtype, instr, crit, n in [
        ("choice", "Who?", CRIT, 3),
        ("noul", "Urgent?", None, 2),
        ("score", "How?", ["a", "b"], 2),
    ]:
        for method in (Method(canonical=True, content_free=True), Method(cyclic=True, content_free=True)):
            assert readings.content_free_plan(qtype, instr, crit, n, method) == readings.plan(
                qtype, instr, crit, n, method
            )


def test_the_content_free_side_of_content_free_listing_reads_the_listing_alone():
    method = Method(canonical=True, content_free=True, listing_only=True)
    free = readings.content_free_plan("choice", "Who should handle it?", CRIT, 3, method)
    real = readings.plan("choice", "Who should handle it?", CRIT, 3, method)
    assert [(r.text, r.scored, r.owner, r.places) for r in free] == [
        (
            "Which of these fits the text best?\nbilling: payments\nsales: plans\ntechnical\nAnswer with one label.",
            ("billing", "sales", "technical"),
            (1, 0, 2),
            (1, 0, 2),
        )
    ]
    # the scored texts and their owners are the question's own: the subtraction is option by option
    assert (free[0].scored, free[0].owner, free[0].places) == (real[0].scored, real[0].owner, real[0].places)
    assert real[0].text.startswith("Who should handle it?\n")
    # another question on the same options (in any order) shares the reading
    other = {"technical": None, "billing": "payments", "sales": "plans"}
    assert [r.text for r in readings.content_free_plan("choice", "Which team?", other, 3, method)] == [free[0].text]
    assert readings.content_free_plan("noul", "Urgent?", None, 2, method) == readings.content_free_plan(
        "noul", "Is it spam?", None, 2, method
    )
    assert [r.text for r in readings.content_free_plan("noul", "Urgent?", None, 2, method)] == [
        "Is this true of the text?\nAnswer yes or no."
    ]
    assert [r.text for r in readings.content_free_plan("noul", "Urgent?", {"true": "now"}, 2, method)] == [
        "Is this true of the text?\nyes: now\nAnswer yes or no."
    ]
    assert [r.text for r in readings.content_free_plan("score", "How bad?", ["low", "high"], 2, method)] == [
        "Which level fits the text best?\n1: low\n2: high\nAnswer with the number."
    ]
    cyc = Method(cyclic=True, content_free=True, listing_only=True)
    assert [r.text for r in readings.content_free_plan("noul", "Urgent?", None, 2, cyc)] == [
        "Is this true of the text?\nAnswer yes or no.",
        "Is this true of the text?\nAnswer no or yes.",
    ]
    # the cloze format's content-free side: the default instructions, the same scored options
    cloze = readings.content_free_plan("choice", "Who?", CRIT, 3, Method("cloze", content_free=True, listing_only=True))
    assert [(r.text, r.scored) for r in cloze] == [
        ("Which of these fits the text best?", ("billing", "sales", "technical"))
    ]


def test_a_long_choice_is_read_content_free_over_its_labels_alone():
    method = Method(canonical=True, content_free=True, listing_only=True)

    def described(n: int) -> dict:
        return {f"q{i:03d}": f"tickets of queue {i}" for i in reversed(range(n))}

    # 64 labels: listed with their descriptions, as the question lists them
    (at_max,) = readings.content_free_plan("choice", "Which queue?", described(64), 64, method)
    assert at_max.text.splitlines()[1:3] == ["q000: tickets of queue 0", "q001: tickets of queue 1"]
    # 65: the same labels in the same order, scored the same, without their descriptions
    (free,) = readings.content_free_plan("choice", "Which queue?", described(65), 65, method)
    (real,) = readings.plan("choice", "Which queue?", described(65), 65, method)
    assert free.text == "\n".join(
        ["Which of these fits the text best?", *(f"q{i:03d}" for i in range(65)), "Answer with one label."]
    )
    assert real.text.splitlines()[1] == "q000: tickets of queue 0"
    assert (free.scored, free.owner, free.places) == (real.scored, real.owner, real.places)
    assert free.owner[:2] == (64, 63)  # reply order is the request's (q064 first), the listing sorted
    # the same labels with other descriptions share the reading; content_free (not listing) keeps them
    other = {k: "x" for k in described(65)}
    assert readings.content_free_plan("choice", "Which queue?", other, 65, method) == [free]
    asked = Method(canonical=True, content_free=True)
    assert readings.content_free_plan("choice", "Which queue?", described(65), 65, asked) == [real]


def test_spellings_read_a_nouls_words_in_every_spelling():
    method = Method(canonical=True, spellings=True)
    (read,) = readings.plan("noul", "Urgent?", None, 2, method)
    assert read.text == "Urgent?\nAnswer yes or no."
    assert read.scored == ("no", " no", "No", " No", "yes", " yes", "Yes", " Yes")
    assert read.owner == (0, 0, 0, 0, 1, 1, 1, 1) and read.places == (1, 0)
    # choices and scores are read as without it
    for qtype, crit, n in [("choice", CRIT, 3), ("score", ["a", "b"], 2)]:
        assert readings.plan(qtype, "Q?", crit, n, method) == readings.plan(
            qtype, "Q?", crit, n, Method(canonical=True)
        )
    # the content-free side reads the same spellings
    free = readings.content_free_plan(
        "noul", "Urgent?", None, 2, Method(canonical=True, spellings=True, content_free=True, listing_only=True)
    )
    assert [(r.text, r.scored, r.owner) for r in free] == [
        ("Is this true of the text?\nAnswer yes or no.", read.scored, read.owner)
    ]
    # no, No, ... summed against yes, Yes, ...: p(no) 0.1 + 0.4, p(yes) 0.3 + 0.1 (the others 0)
    lps = [[math.log(x)] for x in (0.1, 1e-300, 0.4, 1e-300, 0.3, 1e-300, 1e-300, 0.1)]
    assert [math.exp(x) for x in readings.log_probs(read.owner, lps)] == pytest.approx([5 / 9, 4 / 9], abs=1e-12)


def test_log_probs_sum_each_options_spellings():
    # option 0 spelled twice (p 0.2 and 0.1), option 1 twice (0.3 and 0.1): 0.3 vs 0.4 -> 3/7, 4/7
    lps = [[math.log(0.2)], [math.log(0.1)], [math.log(0.3)], [math.log(0.1)]]
    out = readings.log_probs((0, 0, 1, 1), lps)
    assert [math.exp(x) for x in out] == pytest.approx([3 / 7, 4 / 7], abs=1e-12)
    # a multi-token text counts its tokens' sum
    out = readings.log_probs((0, 1), [[math.log(0.5), math.log(0.5)], [math.log(0.5)]])
    assert [math.exp(x) for x in out] == pytest.approx([1 / 3, 2 / 3], abs=1e-12)


def test_combine_means_reads_and_subtracts_the_content_free_ones():
    a = [math.log(0.8), math.log(0.2)]
    b = [math.log(0.5), math.log(0.5)]
    assert readings.combine([a, b], None) == pytest.approx(
        [(math.log(0.8) + math.log(0.5)) / 2, (math.log(0.2) + math.log(0.5)) / 2]
    )
    assert readings.combine([a], [math.log(0.8), math.log(0.2)]) == pytest.approx([0.0, 0.0])


def test_batch_prior_and_divide():
    prior = readings.batch_prior([[0.8, 0.2], [0.6, 0.4]])
    assert prior == pytest.approx([0.7, 0.3])
    # 0.8/0.7 : 0.2/0.3 -> normalised
    q = readings.divide([0.8, 0.2], prior)
    z = 0.8 / 0.7 + 0.2 / 0.3
    assert q == pytest.approx([0.8 / 0.7 / z, 0.2 / 0.3 / z])
    with pytest.raises(ValueError):
        readings.batch_prior([])
    with pytest.raises(ValueError):
        readings.divide([0.5, 0.5], [1.0, 0.0])


def test_pride_prior_by_hand():
    # two rotations of two options: rotation 0 lists (o0, o1), rotation 1 lists (o1, o0)
    r0 = [math.log(0.8), math.log(0.2)]
    r1 = [math.log(0.5), math.log(0.5)]  # o0 now second
    places = [(0, 1), (1, 0)]
    # place 0 held o0 (0.8) then o1 (0.5); place 1 o1 (0.2) then o0 (0.5): softmax of the mean logs
    # ∝ sqrt(0.4) : sqrt(0.1) = 2 : 1
    assert readings.pride_prior([([r0, r1], places)]) == pytest.approx([2 / 3, 1 / 3])
    # averaged over samples in probability space
    flat = [math.log(0.5), math.log(0.5)]
    assert readings.pride_prior([([r0, r1], places), ([flat, flat], places)]) == pytest.approx(
        [(2 / 3 + 0.5) / 2, (1 / 3 + 0.5) / 2]
    )
    # divided out by place: the option listed first loses its place's weight
    assert readings.divide([0.5, 0.5], [2 / 3, 1 / 3], places=(0, 1)) == pytest.approx([1 / 3, 2 / 3])
    assert readings.divide([0.5, 0.5], [2 / 3, 1 / 3], places=(1, 0)) == pytest.approx([2 / 3, 1 / 3])
    with pytest.raises(ValueError):
        readings.pride_prior([])
