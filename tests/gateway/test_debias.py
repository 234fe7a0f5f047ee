"""``gateway.decision.debias`` and the ``x_debias`` extension of ``/v1/systemone``: the arithmetic by hand, the
prompts of each rotation, and what the scoring path asks the engine (over the routes' fake engine).
The numbers on a real model are checked against the numpy oracle in ``test_server_llama.py``."""

from __future__ import annotations

import math

import anyio
import httpx2
import orjson
import pytest

from gateway.cli import build_parser
from gateway.decision import debias, readings
from gateway.decision.arithmetic import log_softmax
from gateway.decision.prompts import question_text
from test_routes_support import TICKET, FakeCaps, FakeEngine, make_app, running

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.parametrize(
    "value, methods",
    [
        ("none", ()),
        ([], ()),
        (["none"], ()),
        ("cyclic", ("cyclic",)),
        ("content_free", ("content_free",)),
        (["content_free", "cyclic"], ("cyclic", "content_free")),
        (["cyclic", "cyclic"], ("cyclic",)),
        ("cyclic,content_free", ("cyclic", "content_free")),
        ("content_free, cyclic", ("cyclic", "content_free")),
        ("content_free,canonical", ("canonical", "content_free")),
        (["content_free", "cloze"], ("cloze", "content_free")),
        ("letters", ("letters",)),
        ("content_free_listing,spellings,canonical", ("canonical", "spellings", "content_free_listing")),
        (["cyclic", "content_free_listing"], ("cyclic", "content_free_listing")),
    ],
)
def test_parse_accepts_names_lists_and_the_flags_form(value, methods):
    assert debias.parse(value) == methods


NAMES = "'none', 'cloze', 'letters', 'canonical', 'spellings', 'cyclic', 'content_free', 'content_free_listing'"
UNKNOWN = "Unknown debias method {!r}: use " + NAMES + " or a list of those"


@pytest.mark.parametrize(
    "value, message",
    [
        ("both", UNKNOWN.format("both")),
        (["cyclic", "x"], UNKNOWN.format("x")),
        (["none", "cyclic"], "'none' cannot be combined with a debias method"),
        ("none,cyclic", "'none' cannot be combined with a debias method"),
        ("cloze,letters", "'cloze' and 'letters' are two prompt formats: choose one"),
        ("cloze,cyclic", "a 'cloze' prompt lists no options: 'cyclic' and 'canonical' do not apply to it"),
        (["canonical", "cloze"], "a 'cloze' prompt lists no options: 'cyclic' and 'canonical' do not apply to it"),
        (3, f"Input should be {NAMES} or a list of those"),
        ([1], f"Input should be {NAMES} or a list of those"),
        (None, f"Input should be {NAMES} or a list of those"),
        (
            "content_free,content_free_listing",
            "'content_free' and 'content_free_listing' are two content-free readings: choose one",
        ),
        ("letters,spellings", "'spellings' is a reading of the listed format ('letters' already sums spellings)"),
        ("cloze,spellings", "'spellings' is a reading of the listed format ('letters' already sums spellings)"),
    ],
)
def test_parse_refuses_anything_else(value, message):
    with pytest.raises(ValueError) as e:
        debias.parse(value)
    assert str(e.value) == message


def test_rotations():
    assert debias.rotations(3, ()) == [0]
    assert debias.rotations(3, ("content_free",)) == [0]
    assert debias.rotations(3, ("cyclic",)) == [0, 1, 2]
    assert debias.rotations(16, ("cyclic",)) == list(range(16))
    assert debias.rotations(40, ("cyclic",)) == [0, 2, 5, 7, 10, 12, 15, 17, 20, 22, 25, 27, 30, 32, 35, 37]


def test_rotations_averaged_and_calibrated_by_hand():
    # readings.combine of each rotation's log-softmax: what the server does with cyclic and content_free
    # rotation 0: scores (0, log 2, log 1) -> p = (1/4, 2/4, 1/4); rotation 1: (log 3, 0, 0) -> (3/5, 1/5, 1/5)
    per_rotation = [[0.0, math.log(2), 0.0], [math.log(3), 0.0, 0.0]]
    mean = readings.combine([log_softmax(r) for r in per_rotation], None)
    want = [
        (math.log(1 / 4) + math.log(3 / 5)) / 2,
        (math.log(2 / 4) + math.log(1 / 5)) / 2,
        (math.log(1 / 4) + math.log(1 / 5)) / 2,
    ]
    assert mean == pytest.approx(want, abs=1e-15)
    # calibration divides by the content-free probabilities: p_i / p_cf_i, renormalised
    cf = [math.log(0.5), math.log(0.25), math.log(0.25)]
    out = readings.combine([log_softmax(r) for r in per_rotation], cf)
    q = [math.exp(m) / math.exp(c) for m, c in zip(want, cf)]
    z = sum(q)
    s = [math.exp(x) for x in out]
    assert [x / sum(s) for x in s] == pytest.approx([x / z for x in q], abs=1e-15)


def test_rotated_question_texts():
    crit = {"billing": "payments", "technical": None, "sales": "plans"}
    assert question_text("choice", "Who?", crit, 1) == (
        "Who?\ntechnical\nsales: plans\nbilling: payments\nAnswer with one label.",
        ("billing", "technical", "sales"),
    )
    assert question_text("choice", "Who?", crit, 3) == question_text("choice", "Who?", crit, 0)
    assert question_text("score", None, ["low", "mid", "high"], 2) == (
        "Which level fits the text best?\n3: high\n1: low\n2: mid\nAnswer with the number.",
        ("1", "2", "3"),
    )
    assert question_text("noul", "Urgent?", {"true": "now"}, 1) == (
        "Urgent?\nyes: now\nAnswer no or yes.",
        ("no", "yes"),
    )
    assert question_text("noul", "Urgent?", {"true": "now", "false": "later"}, 1) == (
        "Urgent?\nno: later\nyes: now\nAnswer no or yes.",
        ("no", "yes"),
    )


async def post(base, body):
    async with httpx2.AsyncClient(base_url=base) as c:
        return await c.post("/v1/systemone", content=orjson.dumps(body), headers={"content-type": "application/json"})


async def test_cyclic_and_content_free_reach_the_engine_once_per_rotation_and_question():
    eng = FakeEngine()
    body = {**TICKET, "x_debias": ["cyclic", "content_free"]}
    async with running(make_app(eng)) as base:
        first = await post(base, body)
        second = await post(base, body)
    assert first.status_code == second.status_code == 200, first.text
    assert first.json()["x_debias"] == ["cyclic", "content_free"]
    scores = [c for c in eng.calls if c[0] == "score"]
    # first request: the state's rotations, with the content-free reading ("N/A" under (2 + 3 + 5) rotations)
    # beside them (on this fake, as on an engine without x_score_base, a second call on the same slot)
    real, free, real2 = scores
    assert real[4] == free[4]
    assert len(real[2]) == 2 + 3 + 5 and len(free[2]) == 10 and len(real2[2]) == 10
    assert real[1].endswith(TICKET["state"]) and not free[1].endswith(TICKET["state"])
    # "N/A" takes the state's place in every stem
    assert [stem.split("\n")[0] for stem, _ in free[2]] == ["N/A"] * 10
    assert [stem[3:] for stem, _ in free[2]] == [stem for stem, _ in real[2]]
    stems = [stem for stem, _ in real[2][2:5]]
    assert [s.split("\n")[3] for s in stems] == [
        "billing: payments, invoices",
        "technical: bugs, integration errors",
        "sales",
    ]
    # the options are the same strings in every rotation, in the reply's order
    assert {tuple(opts) for _, opts in real[2][2:5]} == {("billing", "technical", "sales")}
    # the fake scores an option by its characters alone, so no correction changes its answer
    assert first.json()["answers"] == second.json()["answers"]
    assert first.json()["usage"]["output_tokens"] > second.json()["usage"]["output_tokens"]


async def test_content_free_listing_reads_each_option_set_once_on_na():
    """Issue 23, item 2: the content-free side reads the type's default instructions over the question's
    listing, so a new question on options already read reads nothing beside the state."""
    eng = FakeEngine()
    methods = ["canonical", "spellings", "content_free_listing"]
    asked_again = {
        qid: {**q, "instructions": "Question 2. " + q["instructions"]} for qid, q in TICKET["questions"].items()
    }
    async with running(make_app(eng)) as base:
        first = await post(base, {**TICKET, "x_debias": methods})
        second = await post(base, {**TICKET, "x_debias": methods, "questions": asked_again})
    assert first.status_code == second.status_code == 200, first.text
    assert first.json()["x_debias"] == second.json()["x_debias"] == methods
    real, free, real2 = [c for c in eng.calls if c[0] == "score"]  # the second request: its questions alone
    assert real[1].endswith(TICKET["state"]) and real2[1] == real[1] and not free[1].endswith(TICKET["state"])
    assert free[2] == [
        (
            "N/A\n\nIs this true of the text?\nAnswer yes or no." + CHATML_TAIL,
            ["no", " no", "No", " No", "yes", " yes", "Yes", " Yes"],
        ),
        (
            "N/A\n\nWhich of these fits the text best?\nbilling: payments, invoices\nsales\n"
            "technical: bugs, integration errors\nAnswer with one label." + CHATML_TAIL,
            ["billing", "sales", "technical"],
        ),
        (
            "N/A\n\nWhich level fits the text best?\n1: no impact\n2: minor\n3: blocked\n4: losing money\n"
            "5: business down\nAnswer with the number." + CHATML_TAIL,
            ["1", "2", "3", "4", "5"],
        ),
    ]
    assert real[2][0] == (
        "\n\nDoes this message express urgency?\nAnswer yes or no." + CHATML_TAIL,
        ["no", " no", "No", " No", "yes", " yes", "Yes", " Yes"],
    )
    assert real2[2][0][0] == "\n\nQuestion 2. Does this message express urgency?\nAnswer yes or no." + CHATML_TAIL
    # the fake scores an option by its characters alone and the readings are the same texts: same answers
    assert first.json()["answers"] == second.json()["answers"]


async def test_the_server_default_applies_and_a_request_overrides_it():
    eng = FakeEngine()
    async with running(make_app(eng, debias=("cyclic",))) as base:
        default = await post(base, TICKET)
        null = await post(base, {**TICKET, "x_debias": None})  # null, like absent: the server's default
        off = await post(base, {**TICKET, "x_debias": "none"})
    assert default.json()["x_debias"] == null.json()["x_debias"] == ["cyclic"] and "x_debias" not in off.json()
    scores = [c for c in eng.calls if c[0] == "score"]
    assert [len(c[2]) for c in scores] == [10, 10, 3]


async def test_a_bad_x_debias_is_a_422_naming_the_field():
    async with running(make_app(FakeEngine())) as base:
        r = await post(base, {**TICKET, "x_debias": "both"})
    assert r.status_code == 422
    msg = UNKNOWN.format("both")
    assert r.json() == {
        "detail": [{"loc": ["body", "x_debias"], "msg": msg, "type": "literal_error"}],
        "error": {"type": "invalid_request_error", "message": f"body.x_debias: {msg}", "param": "x_debias"},
    }


async def test_a_decision_engine_ignores_x_debias_with_a_warning():
    eng = FakeEngine(FakeCaps(decide=True, chat=False))
    async with running(make_app(eng)) as base:
        r = await post(base, {**TICKET, "x_debias": "cyclic"})
    assert r.status_code == 200
    assert r.json()["x_warnings"] == ["x_debias is not applied: the decision engine answers natively"]
    assert "x_debias" not in r.json()


def test_serve_flag_and_its_default():
    from gateway.cli.config import default_debias

    parse = build_parser().parse_args
    assert default_debias(parse(["serve"])) == (
        "canonical",
        "spellings",
        "content_free_listing",
    )  # the default model needs it (bench/quality.py)
    assert default_debias(parse(["serve", "--model", "m.gguf"])) == ()
    assert default_debias(parse(["serve", "--engine", "engines/bin/serveproto-fixture"])) == ()
    assert default_debias(parse(["serve", "--debias", "none"])) == ()
    assert default_debias(parse(["serve", "--model", "m.gguf", "--debias", "cyclic,content_free"])) == (
        "cyclic",
        "content_free",
    )
    assert default_debias(parse(["serve", "--debias", "content_free"])) == ("content_free",)
    with pytest.raises(SystemExit):
        parse(["serve", "--debias", "sideways"])


class GatedEngine(FakeEngine):
    """The fake engine whose content-free reading (the SCORE whose prefix ends before the state) waits for ``gate``."""

    def __init__(self):
        super().__init__()
        self.gate = anyio.Event()
        self.free_reads = 0
        self.cancelled = 0

    async def score(self, prefix, groups, pin=False, slot=None, route=None, beside=None):
        if groups[0][0].startswith("N/A"):
            self.free_reads += 1
            try:
                await self.gate.wait()
            except anyio.get_cancelled_exc_class():
                self.cancelled += 1
                raise
        return await super().score(prefix, groups, pin, slot, route, beside)


async def test_a_content_free_reading_ends_with_its_client_and_is_shared_by_the_others():
    """Issue 30, item 1: a reading nobody waits for any more is cancelled (it was shielded, and a storm of
    departed clients held the engine for minutes); requests that need it at the same time read it once."""
    eng = GatedEngine()
    body = {**TICKET, "x_debias": ["cyclic", "content_free"]}
    replies = []
    async with running(make_app(eng)) as base:
        async with httpx2.AsyncClient(base_url=base, timeout=0.5) as c:
            with pytest.raises(httpx2.TimeoutException):  # the client leaves while the reading waits
                await c.post("/v1/systemone", content=orjson.dumps(body), headers={"content-type": "application/json"})
        with anyio.fail_after(5):
            while not eng.cancelled:
                await anyio.sleep(0.01)
        assert (eng.free_reads, eng.cancelled) == (1, 1)

        async def ask():
            replies.append(await post(base, body))

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask)
            tg.start_soon(ask)
            await anyio.sleep(0.3)
            assert eng.free_reads == 2  # one reads again; the other waits for it instead of reading too
            eng.gate.set()
        replies.append(await post(base, body))  # remembered: no reading at all
    assert [r.status_code for r in replies] == [200, 200, 200]
    assert (eng.free_reads, eng.cancelled) == (2, 1)
    assert replies[0].json()["answers"] == replies[1].json()["answers"] == replies[2].json()["answers"]


CHATML_TAIL = "<|im_end|>\n<|im_start|>assistant\n"


async def test_canonical_reads_the_same_prompt_whatever_the_label_order():
    eng = FakeEngine()
    crit = TICKET["questions"]["department"]["criteria"]
    swapped = {k: crit[k] for k in ("sales", "billing", "technical")}  # not a rotation of the request's order
    bodies = [
        {**TICKET, "x_debias": "canonical"},
        {
            **TICKET,
            "x_debias": "canonical",
            "questions": {
                **TICKET["questions"],
                "department": {**TICKET["questions"]["department"], "criteria": swapped},
            },
        },
    ]
    async with running(make_app(eng)) as base:
        a, b = [await post(base, body) for body in bodies]
    assert a.status_code == b.status_code == 200, a.text
    assert a.json()["x_debias"] == ["canonical"]
    first, second = [c for c in eng.calls if c[0] == "score"]
    stems = [[stem for stem, _ in call[2]] for call in (first, second)]
    assert stems[0] == stems[1]
    assert stems[0][1] == (
        "\n\nWhich team should handle this?\nbilling: payments, invoices\nsales\n"
        "technical: bugs, integration errors\nAnswer with one label." + CHATML_TAIL
    )
    assert first[2] == second[2]  # the same bytes to the engine: stems and scored texts (in canonical order)
    assert first[2][1][1] == ["billing", "sales", "technical"]
    pa, pb = a.json()["answers"]["department"]["probabilities"], b.json()["answers"]["department"]["probabilities"]
    assert pa == pb and list(pb) == ["sales", "billing", "technical"]


async def test_letters_and_cloze_reach_the_engine_as_their_prompts():
    eng = FakeEngine()
    async with running(make_app(eng)) as base:
        letters = await post(base, {**TICKET, "x_debias": "letters"})
        cloze = await post(base, {**TICKET, "x_debias": ["cloze", "content_free"]})
    assert letters.status_code == cloze.status_code == 200, letters.text
    assert cloze.json()["x_debias"] == ["cloze", "content_free"]
    lett, clz, free = [c for c in eng.calls if c[0] == "score"]
    stem, options = lett[2][1]
    assert stem == (
        "\n\nWhich team should handle this?\nA. billing: payments, invoices\nB. technical: bugs, "
        "integration errors\nC. sales\nAnswer with the letter." + CHATML_TAIL
    )
    assert options == ["A", " A", "a", " a", "B", " B", "b", " b", "C", " C", "c", " c"]
    assert lett[2][2][1] == [s for k in range(5) for s in (str(k), f" {k}")]  # a score's levels: digits
    # the cloze prompts on the state, then their content-free reading
    assert [g for g in clz[2]] == [
        ("\n\nDoes this message express urgency?" + CHATML_TAIL, ["no", "yes"]),
        ("\n\nWhich team should handle this?" + CHATML_TAIL, ["billing", "sales", "technical"]),
        (
            "\n\nHow severe is the customer impact?" + CHATML_TAIL,
            ["no impact", "minor", "blocked", "losing money", "business down"],
        ),
    ]
    assert [stem for stem, _ in free[2]] == ["N/A" + stem for stem, _ in clz[2]]
    # the fake scores a text by its characters: a letter's probability is the sum over its four spellings
    import math as m

    from test_routes_support import char_logprob

    def p(text):
        return m.exp(sum(char_logprob(c) for c in text))

    mass = [sum(p(s) for s in (x, " " + x, x.lower(), " " + x.lower())) for x in "ABC"]
    want = [x / sum(mass) for x in mass]
    got = list(letters.json()["answers"]["department"]["probabilities"].values())
    assert got == pytest.approx(want, abs=1e-6)


async def test_a_format_that_cannot_ask_a_question_is_a_422():
    body = {"state": "x", "x_debias": "cloze", "questions": {"lvl": {"type": "score", "criteria": ["low", "low"]}}}
    async with running(make_app(FakeEngine())) as base:
        r = await post(base, body)
    assert r.status_code == 422
    assert r.json()["detail"] == [
        {
            "loc": ["body", "questions", "lvl", "criteria"],
            "type": "value_error",
            "msg": "two options have the same text: the cloze format cannot tell them apart",
        }
    ]
