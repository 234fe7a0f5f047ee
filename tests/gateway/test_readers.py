"""Two readers on one server (issue 47, item 4): a served pair of a language model and a decision engine
(the fake engines of test_routes_support, one scoring, one speaking DECIDE), ``x_reader`` per request and
per question, and the combinations checked against an independent numpy computation."""

from __future__ import annotations

import attrs
import httpx2
import numpy as np
import orjson
import pytest

from gateway.decision import readers
from gateway.engine.pool import Pool
from gateway.server.app import App, AppConfig, ModelInfo
from gateway.server.fleet import Served
from test_routes_support import TICKET, FakeCaps, FakeEngine, running

pytestmark = pytest.mark.anyio


class Named(FakeEngine):
    """A fake engine a :class:`gateway.engine.pool.Pool` can pick."""

    def __init__(self, name: str, caps: FakeCaps) -> None:
        super().__init__(caps)
        self.name = name
        self.in_flight = self.waiting = 0
        self.gave_up = False


def pair_app(reader: str = "lm", pieces: list[bytes] | None = None) -> tuple[App, Named, Named]:
    """A pair ``both`` of ``lm`` and ``dec`` (``pieces``: the language model's token pieces, when known)."""
    lm = Named("lm-0", FakeCaps(model="fake-lm"))
    dec = Named("dec-0", FakeCaps(chat=False, decide=True, slots=1, model="fake-decider"))
    pool = Pool([lm, dec], {"lm-0": "lm", "dec-0": "dec"})
    served = {n: Served(attrs.evolve(ModelInfo.load(n), pieces=pieces if n == "lm" else None)) for n in ("lm", "dec")}
    both = Served.pair_of("both", served["lm"], served["dec"], reader)
    return App(pool, {"both": both, **served}, config=AppConfig(request_timeout=5.0)), lm, dec


async def post(base: str, body: dict) -> httpx2.Response:
    async with httpx2.AsyncClient(base_url=base, timeout=10) as c:
        return await c.post("/v1/systemone", content=orjson.dumps(body), headers={"content-type": "application/json"})


def numpy_combine(reader: str, d: list[float], m: list[float]) -> np.ndarray:
    """The combinations written again with numpy (not gateway.decision.readers)."""
    d_, m_ = np.asarray(d, dtype=np.float64), np.asarray(m, dtype=np.float64)
    if reader == "mean":
        p = (d_ + m_) / 2
    elif reader == "product":
        p = np.exp(np.log(np.maximum(d_, 1e-6)) + np.log(np.maximum(m_, 1e-6)))
    else:  # gate: the decider unless its entropy / log(n) passes one half
        h = -np.sum(d_[d_ > 0] * np.log(d_[d_ > 0])) / np.log(len(d_))
        p = d_ if h <= 0.5 else m_
    return p / p.sum()


def millionths(p: np.ndarray) -> list[float]:
    """Largest-remainder rounding to millionths (Hamilton's method), written again with numpy."""
    raw = p / p.sum() * 1_000_000
    units = np.floor(raw)
    left = int(1_000_000 - units.sum())
    order = sorted(range(len(p)), key=lambda i: (-(raw[i] - units[i]), i))
    for i in order[:left]:
        units[i] += 1
    return [float(u) / 1_000_000 for u in units]


def probs_of(answer: dict) -> list[float]:
    if answer["type"] == "noul":
        return [round(1 - answer["noul"], 6), answer["noul"]]
    return list(answer["probabilities"].values())


@pytest.mark.parametrize("reader", readers.COMBINATIONS)
def test_combine_equals_numpy(reader):
    rng = np.random.default_rng(47)
    for n in (2, 3, 6, 255):
        for _ in range(50):
            d = rng.dirichlet(np.full(n, 0.3 if _ % 2 else 3.0))
            m = rng.dirichlet(np.ones(n))
            d[rng.integers(n)] = 0.0 if _ % 5 == 0 else d[0]  # a reported 0 reads as the floor
            d = d / d.sum()
            got = readers.combine(reader, list(d), list(m))
            assert np.allclose(got, numpy_combine(reader, list(d), list(m)), rtol=0, atol=1e-15)
            assert abs(sum(got) - 1) < 1e-12


def test_combine_refuses_what_it_cannot_combine():
    with pytest.raises(ValueError, match="different sizes: 2 and 3"):
        readers.combine("mean", [0.5, 0.5], [0.2, 0.3, 0.5])
    with pytest.raises(ValueError, match="not a combination: 'lm'"):
        readers.combine("lm", [0.5, 0.5], [0.5, 0.5])


async def test_each_reader_on_the_pair():
    app, _, dec = pair_app()
    async with running(app) as base:
        alone = {m: (await post(base, {**TICKET, "model": m})).json() for m in ("lm", "dec")}
        got = {r: (await post(base, {**TICKET, "model": "both", "x_reader": r})).json() for r in readers.READERS}
        default = (await post(base, {**TICKET, "model": "both"})).json()
    assert [c[0] for c in dec.calls] == ["decide"] * 5  # dec alone, decider and the three combinations
    for r in ("decider", "lm"):
        source = alone["dec" if r == "decider" else "lm"]
        want = {q: {**a, "x_reader": r} for q, a in source["answers"].items()}
        assert got[r]["answers"] == want
        assert got[r]["model"] == "both"
        assert got[r]["x_path"] == ("decide" if r == "decider" else "score")
    assert default["answers"] == {q: {**a, "x_reader": "lm"} for q, a in alone["lm"]["answers"].items()}
    for r in readers.COMBINATIONS:
        body = got[r]
        assert body["x_path"] == "decide+score"
        assert body["usage"] == alone["lm"]["usage"]  # the language model read every option; the decider none
        for qid, a in body["answers"].items():
            want = numpy_combine(r, probs_of(alone["dec"]["answers"][qid]), probs_of(alone["lm"]["answers"][qid]))
            assert probs_of(a) == millionths(want), (r, qid)  # reported in millionths
            assert a["x_reader"] == r and a["x_calibration"] == "identity"
            assert "x_label_mass" not in a  # the language model's own fields belong to its reading alone
    # the mean of the ticket's yes/no, as the reply carries it, whole
    d, m = alone["dec"]["answers"]["urgency"]["noul"], alone["lm"]["answers"]["urgency"]["noul"]
    no, yes = millionths(np.array([(1 - d + 1 - m) / 2, (d + m) / 2]))
    assert (d, m, no, yes) == (0.666667, 0.549834, 0.39175, 0.60825)  # a tie of halves goes to the first option
    assert got["mean"]["answers"]["urgency"] == {
        "type": "noul",
        "noul": yes,
        "x_calibration": "identity",
        "x_margin": round(yes - no, 6),
        "x_reader": "mean",
    }


async def test_reader_per_question_over_the_request():
    app, lm, dec = pair_app(reader="decider")
    body = {
        **TICKET,
        "x_reader": "lm",
        "questions": {**TICKET["questions"], "severity": {**TICKET["questions"]["severity"], "x_reader": "decider"}},
    }
    async with running(app) as base:
        r = await post(base, body)
        only_decider = await post(base, {**TICKET, "x_reader": "decider"})
    assert r.status_code == 200, r.text
    assert {q: a["x_reader"] for q, a in r.json()["answers"].items()} == {
        "urgency": "lm",
        "department": "lm",
        "severity": "decider",
    }
    [(_, record, _)] = [c for c in dec.calls if c[0] == "decide"][:1]
    assert [q["id"] for q in orjson.loads(record)["questions"]] == ["severity"]  # the decider read its own alone
    assert only_decider.json()["x_path"] == "decide"  # the pair is the default model; the LM was not asked
    assert len([c for c in lm.calls if c[0] == "score"]) == 1


async def test_bad_reader_is_refused_naming_the_field():
    app, lm, dec = pair_app()
    bad_q = {**TICKET, "questions": {**TICKET["questions"], "urgency": {"type": "noul", "x_reader": "both"}}}
    async with running(app) as base:
        top = await post(base, {**TICKET, "x_reader": "oracle"})
        per = await post(base, bad_q)
        one = await post(base, {**TICKET, "model": "lm", "x_reader": "decider"})
        one_q = await post(
            base, {**TICKET, "model": "dec", "questions": {"urgency": {"type": "noul", "x_reader": "mean"}}}
        )
        own = await post(base, {**TICKET, "model": "dec", "x_reader": "decider"})
    choices = "'decider', 'lm', 'mean', 'product', 'gate'"
    assert top.status_code == 422 and top.json()["detail"] == [
        {"loc": ["body", "x_reader"], "msg": f"Input should be one of {choices}, got 'oracle'", "type": "literal_error"}
    ]
    assert per.status_code == 422 and per.json()["detail"] == [
        {
            "loc": ["body", "questions", "urgency", "x_reader"],
            "msg": f"Input should be one of {choices}, got 'both'",
            "type": "literal_error",
        }
    ]
    assert one.status_code == 422 and one.json()["detail"][0]["loc"] == ["body", "x_reader"]
    assert one.json()["detail"][0]["msg"] == (
        "The model 'lm' holds one reader ('lm'); 'decider' needs a served pair of a language model and a "
        "decision engine (serve --pair)"
    )
    assert one_q.status_code == 422 and one_q.json()["detail"][0]["loc"] == ["body", "questions", "urgency", "x_reader"]
    assert own.status_code == 200 and "x_reader" not in own.json()["answers"]["urgency"]
    assert [c[0] for c in lm.calls + dec.calls] == ["decide"]  # nothing refused reached an engine


async def test_models_lists_the_pair_with_what_it_holds():
    app, _, _ = pair_app(reader="mean")
    async with running(app) as base, httpx2.AsyncClient(base_url=base) as c:
        r = (await c.get("/v1/models")).json()
    first = r["data"][0]
    assert [m["id"] for m in r["data"]] == ["both", "lm", "dec"]
    assert first["capabilities"] == ["chat", "systemone", "decision"]
    assert first["x_holds"] == {"lm": "lm", "decider": "dec"} and first["x_reader"] == "mean"
    assert [e["name"] for e in first["x_engines"]] == ["lm-0", "dec-0"]
    assert r["models"][0]["description"] == (
        "both served by serveproto: the language model lm and the decision engine dec, each question read by "
        "mean unless the request says (x_reader)"
    )


def test_pair_flags_land_on_the_decision_config(capsys):
    from gateway.cli import build_parser
    from gateway.cli.config import from_args

    def parse(*argv: str):
        return build_parser().parse_args(["serve", *argv])

    cfg = from_args(parse("--model", "lm=a.gguf", "--model", "dec=b.sparrow", "--pair", "both=lm,dec"))
    assert (cfg.decision.pair, cfg.decision.reader) == (("both", "lm", "dec"), None)
    assert from_args(parse("--reader", "gate")).decision.reader == "gate"
    for argv in (("--pair", "both=lm+dec"), ("--pair", "=lm,dec"), ("--reader", "oracle")):
        with pytest.raises(SystemExit):
            parse(*argv)
        assert f"argument {argv[0]}" in capsys.readouterr().err


def test_a_pair_of_unserved_or_wrong_models_is_refused_naming_the_flag():
    from gateway.cli.config import DecisionConfig
    from gateway.cli.serve import _with_pair

    lm = Named("lm-0", FakeCaps(model="fake-lm"))
    dec = Named("dec-0", FakeCaps(chat=False, decide=True, slots=1, model="fake-decider"))
    pool = Pool([lm, dec], {"lm-0": "lm", "dec-0": "dec"})
    pool.first_caps = {"lm-0": lm.caps, "dec-0": dec.caps}
    served = {n: Served(ModelInfo.load(n)) for n in ("lm", "dec")}
    out = _with_pair(served, pool, DecisionConfig(pair=("both", "lm", "dec")))
    assert list(out) == ["both", "lm", "dec"] and out["both"].pair == ("lm", "dec")
    assert out["both"].reader == readers.DEFAULT and out["both"].settings is served["lm"].settings
    for pair, msg in (
        (("lm", "lm", "dec"), "--pair lm: the name of a served model; name the pair otherwise"),
        (("both", "lm", "robot"), "--pair both: no --model is named 'robot'; served: ['lm', 'dec']"),
        (("both", "dec", "lm"), "--pair both: 'dec' is not a language model"),
    ):
        with pytest.raises(SystemExit) as exc:
            _with_pair(served, pool, DecisionConfig(pair=pair))
        assert str(exc.value) == f"serveproto serve: {msg}"


def test_serve_says_what_the_pair_holds(capsys):
    from gateway.cli.serve import _say_serving

    app, _, _ = pair_app(reader="gate")
    _say_serving(app, app.pool, "127.0.0.1", 8000)
    assert capsys.readouterr().out.splitlines()[:4] == [
        "serveproto: model both: the pair of lm and dec, read by gate unless a request says (x_reader)",
        "serveproto: model lm: 1 engine(s) (lm-0)",
        "serveproto: model dec: 1 engine(s) (dec-0)",
        "serveproto: serving both on http://127.0.0.1:8000",
    ]


async def test_decisions_route_reads_x_reader_too():
    app, _, _ = pair_app(reader="decider")
    body = {
        "model": "both",
        "input": TICKET["state"],
        "x_reader": "lm",
        "questions": [{"type": "predicate", "question": "Urgent?"}, {"type": "predicate", "question": "Angry?"}],
    }
    async with running(app) as base, httpx2.AsyncClient(base_url=base) as c:
        r = await c.post("/v1/decisions", json=body)
        bad = await c.post("/v1/decisions", json={**body, "x_reader": "oracle"})
    assert r.status_code == 200, r.text
    assert [a["x_reader"] for a in r.json()["answers"]] == ["lm", "lm"] and "x_warnings" not in r.json()
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "x_reader"


async def test_a_state_past_the_language_models_context_goes_to_the_decider_alone():
    app, lm, dec = pair_app(reader="decider", pieces=[b"ab", b"c"])  # 2 bytes a token at most
    long_state = "word " * 5000  # 25,000 bytes: past 4,096 positions of 2 bytes
    body = {"state": long_state, "questions": {"q": {"type": "noul", "instructions": "Urgent?"}}}
    async with running(app) as base:
        ok = await post(base, body)
        refused = await post(base, {**body, "x_reader": "mean"})
    assert ok.status_code == 200 and ok.json()["answers"]["q"]["x_reader"] == "decider"
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["body", "state"]
    assert [c[0] for c in lm.calls] == [] and [c[0] for c in dec.calls] == ["decide"]


async def test_rerank_on_a_decision_engine_alone_is_refused_pointing_at_systemone():
    # issue 47 item 3: chat, completions and rerank answer 400 on a decision engine; the pair (its language
    # model beside) and the language model rerank
    app, _, _ = pair_app()
    body = {"query": "refund", "documents": ["I want my money back", "The weather is fine"]}
    async with running(app) as base, httpx2.AsyncClient(base_url=base, timeout=10) as c:
        refused = await c.post("/v1/rerank", json={**body, "model": "dec"})
        ranked = await c.post("/v1/rerank", json={**body, "model": "lm"})
    assert refused.status_code == 400
    assert refused.json()["error"] == {
        "message": "dec is a decision engine: it ranks no documents. Ask it with POST /v1/systemone.",
        "type": "invalid_request_error",
        "param": "model",
        "code": None,
    }
    assert ranked.status_code == 200 and len(ranked.json()["results"]) == 2
