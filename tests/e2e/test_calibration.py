"""``gateway.decision.calibration`` and ``gateway.lab.calibration_fit``: the maps by hand, fits with known optima, cross-validation, the file, and serve's
loading (``--calibration``) and ``x_calibration`` on the routes' fake engine."""

from __future__ import annotations

import math
import random

import orjson
import pytest

from gateway.decision import calibration as cal
from gateway.lab import calibration_fit as calfit
from gateway.lab import reliability


def test_temperature_and_two_slope_by_hand():
    # beta 0.5: softmax(0.5 ln p) ∝ sqrt(p): sqrt(.8) : sqrt(.2) = 2 : 1
    assert cal.temperature([0.8, 0.2], 0.5) == pytest.approx([2 / 3, 1 / 3])
    # a yes answer (log-odds ln 4) at slope 0.5: ln 2 -> 2/3; a no answer (ln 1/4) at slope 2: ln 1/16 -> 1/17
    assert cal.two_slope([0.2, 0.8], 0.5, 2.0) == pytest.approx([1 / 3, 2 / 3])
    assert cal.two_slope([0.8, 0.2], 0.5, 2.0) == pytest.approx([16 / 17, 1 / 17])


def test_maps_are_monotone_and_keep_the_answer():
    rng = random.Random(4)
    for _ in range(200):
        n = rng.randrange(2, 7)
        w = [rng.random() + 1e-3 for _ in range(n)]
        p = [x / sum(w) for x in w]
        for beta in (0.1, 0.7, 3.0):
            q = cal.temperature(p, beta)
            assert max(range(n), key=q.__getitem__) == max(range(n), key=p.__getitem__)
            assert sorted(range(n), key=q.__getitem__) == sorted(range(n), key=p.__getitem__)
        y = cal.two_slope([p[0] / (p[0] + p[1]), p[1] / (p[0] + p[1])], rng.uniform(0.1, 3), rng.uniform(0.1, 3))
        assert (y[1] >= 0.5) == (p[1] >= p[0])


def test_fits_find_known_optima():
    # confidence 0.9 right 3 times in 4: the calibrated confidence is 0.75, 9^beta = 3, beta = 1/2
    probs = [[0.9, 0.1]] * 4
    assert calfit.fit_inverse_temperature(probs, [0, 0, 0, 1]) == pytest.approx(0.5, abs=1e-6)
    # yes answers at 0.8 right 3 in 5 (4^a = 1.5); no answers at 0.9 right 9 in 10 (already calibrated: 1)
    yes = [[0.2, 0.8]] * 5
    no = [[0.9, 0.1]] * 10
    a_yes, a_no = calfit.fit_two_slope(yes + no, [1, 1, 1, 0, 0] + [0] * 9 + [1])
    assert a_yes == pytest.approx(math.log(1.5) / math.log(4), abs=1e-6)
    assert a_no == pytest.approx(1.0, abs=1e-6)
    assert calfit.fit_inverse_temperature([], []) == 1.0


def _answers(n_requests=100, seed=0):
    """Over-confident answers: the top option claims c (0.9 to 0.999) and is right with probability c - 0.35."""
    rng = random.Random(seed)
    out = []
    for r in range(n_requests):
        for qtype, n in (("noul", 2), ("choice", 3), ("score", 4)):
            top = rng.randrange(n)
            c = rng.uniform(0.9, 0.999)
            p = [(1 - c) / (n - 1)] * n
            p[top] = c
            gold = top if rng.random() < c - 0.35 else (top + 1) % n
            out.append((qtype, p, gold, f"r{r}"))
    return out


def test_fit_halves_the_held_out_ece_of_overconfident_answers_and_keeps_accuracy():
    result = calfit.fit(_answers(), k=5, seed=0)
    assert set(result.maps) == {"noul", "choice", "score"}
    for t in ("noul", "choice", "score", "all"):
        before, after = result.held_out[t]["before"], result.held_out[t]["after"]
        assert after["accuracy"] == before["accuracy"]
        assert after["ece"] < before["ece"] and after["nll"] < before["nll"]
    assert result.held_out["all"]["after"]["ece"] <= result.held_out["all"]["before"]["ece"] / 2
    assert result.held_out["all"]["before"]["n"] == 300
    assert len(result.pooled[0]) == len(result.pooled[1]) == 300
    with pytest.raises(ValueError, match="at least 5 labelled requests"):
        calfit.fit(_answers(3), k=5)


def test_folds_never_split_a_request():
    groups = [f"r{i // 3}" for i in range(30)]
    folds = calfit._folds(groups, 5, seed=1)
    for g in set(groups):
        assert len({f for f, x in zip(folds, groups) if x == g}) == 1
    assert sorted(set(folds)) == [0, 1, 2, 3, 4]


def test_file_round_trip_and_apply(tmp_path):
    result = calfit.fit(_answers(), k=5)
    doc = calfit.document(result, "m", "ab" * 32, ("canonical", "content_free"), "the generated set")
    path = tmp_path / "c.json"
    path.write_bytes(orjson.dumps(doc))
    c = cal.load(path)
    assert c.id == doc["id"] and c.id.startswith("cal-") and len(c.id) == 16
    assert c.model_sha256 == "ab" * 32 and c.debias == ("canonical", "content_free")
    p = [0.1, 0.95 - 0.1 + 0.05, 0.05]
    got, label = c.apply("choice", p, ("canonical", "content_free"))
    assert got == pytest.approx(c.maps["choice"].apply(p)) and label == f"{c.id}:temperature"
    # answers read under other methods, or a single option, are left alone
    assert c.apply("choice", p, ()) == (p, "identity")
    assert c.apply("choice", [1.0], ("canonical", "content_free")) == ([1.0], "identity")
    # the id changes with the maps
    doc2 = calfit.document(calfit.fit(_answers(seed=1), k=5), "m", "ab" * 32, ("canonical", "content_free"), "x")
    assert doc2["id"] != doc["id"]


@pytest.mark.parametrize(
    "doc, message",
    [
        ({"format": "other"}, "not a serveproto-calibration file"),
        ({"format": "serveproto-calibration", "version": 2}, "calibration version 2, this server reads 1"),
        (
            {"format": "serveproto-calibration", "version": 1, "maps": {"noul": {"kind": "spline"}}},
            "maps.noul: unknown map 'spline'",
        ),
        (
            {"format": "serveproto-calibration", "version": 1, "maps": {"choice": {"kind": "temperature", "beta": 0}}},
            "maps.choice.beta: expected a number from 0.02 to 50 (where calibrate fits it), got 0",
        ),
    ],
)
def test_load_refuses_what_it_cannot_apply(tmp_path, doc, message):
    path = tmp_path / "c.json"
    path.write_bytes(orjson.dumps(doc))
    with pytest.raises(ValueError) as e:
        cal.load(path)
    assert str(e.value) == f"{path}: {message}"


def _valid_doc(**changes):
    doc = calfit.document(calfit.fit(_answers(), k=5), "m", "ab" * 32, ("canonical", "content_free"), "x")
    return {**doc, **changes}


_BETA = "expected a number from 0.02 to 50 (where calibrate fits it)"


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"maps": [1, 2]}, "maps: expected an object keyed by question type (noul, choice, score)"),
        ({"maps": {"choice": "temperature"}}, "maps.choice: unknown map None"),
        ({"maps": {"choice": {"kind": ["temperature"]}}}, "maps.choice: unknown map ['temperature']"),
        ({"maps": {"choice": {"kind": "temperature", "beta": 1e308}}}, f"maps.choice.beta: {_BETA}, got 1e+308"),
        ({"maps": {"choice": {"kind": "temperature", "beta": 1e-9}}}, f"maps.choice.beta: {_BETA}, got 1e-09"),
        ({"maps": {"choice": {"kind": "temperature", "beta": "2"}}}, f"maps.choice.beta: {_BETA}, got '2'"),
        ({"maps": {"choice": {"kind": "temperature", "beta": True}}}, f"maps.choice.beta: {_BETA}, got True"),
        ({"maps": {"noul": {"kind": "two_slope", "a_yes": 1.0}}}, f"maps.noul.a_no: {_BETA}, got None"),
        ({"model": "m"}, "model.sha256: expected the model file's sha256, 64 lowercase hex digits"),
        (
            {"model": {"name": "m", "sha256": 7}},
            "model.sha256: expected the model file's sha256, 64 lowercase hex digits",
        ),
        ({"model": {"sha256": "AB" * 32}}, "model.sha256: expected the model file's sha256, 64 lowercase hex digits"),
        (
            {"x_debias": None},
            "x_debias: Input should be 'none', 'cloze', 'letters', 'canonical', 'spellings', 'cyclic', "
            "'content_free', 'content_free_listing' or a list of those",
        ),
        (
            {"x_debias": [1]},
            "x_debias: Input should be 'none', 'cloze', 'letters', 'canonical', 'spellings', 'cyclic', "
            "'content_free', 'content_free_listing' or a list of those",
        ),
        (
            {"x_debias": "canonical,content-free"},
            "x_debias: Unknown debias method 'content-free': use 'none', "
            "'cloze', 'letters', 'canonical', 'spellings', 'cyclic', 'content_free', 'content_free_listing' "
            "or a list of those",
        ),
        ({"id": {"a": 1}}, "id: expected 'cal-' and 12 lowercase hex digits, as calibrate writes it"),
        ({"id": "cal-" + "x" * 1000}, "id: expected 'cal-' and 12 lowercase hex digits, as calibrate writes it"),
    ],
)
def test_load_validates_the_schema_and_the_ranges(tmp_path, changes, message):
    path = tmp_path / "c.json"
    path.write_bytes(orjson.dumps(_valid_doc(**changes)))
    with pytest.raises(ValueError) as e:
        cal.load(path)
    assert str(e.value) == f"{path}: {message}"


def test_load_refuses_a_missing_x_debias_and_a_huge_file(tmp_path):
    path = tmp_path / "c.json"
    doc = _valid_doc()
    del doc["x_debias"]
    path.write_bytes(orjson.dumps(doc))
    with pytest.raises(ValueError) as e:
        cal.load(path)
    assert str(e.value) == f"{path}: x_debias: missing (the methods its scores were read under; [] for none)"
    path.write_bytes(b" " * (cal.MAX_FILE_BYTES + 1))
    with pytest.raises(ValueError) as e:
        cal.load(path)
    assert str(e.value) == f"{path}: 1048577 bytes, more than a calibration file holds (1048576 at most)"


def test_an_x_debias_written_as_a_string_is_read_as_the_flag_is(tmp_path):
    """Not split into characters: the map applies to answers read under those methods."""
    path = tmp_path / "c.json"
    path.write_bytes(orjson.dumps(_valid_doc(x_debias="content_free, canonical")))
    c = cal.load(path)
    assert c.debias == ("canonical", "content_free")
    p = [0.2, 0.5, 0.3]
    assert c.apply("choice", p, ("canonical", "content_free")) == (c.maps["choice"].apply(p), f"{c.id}:temperature")
    path.write_bytes(orjson.dumps(_valid_doc(x_debias="none")))
    assert cal.load(path).debias == ()


def test_reliability_diagrams(tmp_path):
    probs = [[0.9, 0.1], [0.6, 0.4], [0.2, 0.8], [0.45, 0.55]]
    gold = [0, 1, 1, 1]
    text = reliability.reliability_text(probs, gold, n_bins=2, width=10)
    assert text.splitlines() == [
        "confidence  accuracy  n     (| = confidence, # = accuracy)",
        "     0.575     0.500  2     ######|    ",
        "     0.850     1.000  2     ########|##",
    ]
    pytest.importorskip("matplotlib")
    png = tmp_path / "r.png"
    reliability.reliability_png((probs, gold), (probs, gold), png, "t")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_serve_loads_the_models_calibration(tmp_path, monkeypatch):
    from gateway.cli.serve import load_calibration

    monkeypatch.setenv("SERVEPROTO_CACHE", str(tmp_path))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF model bytes")
    sha = cal.sha256_file(model)
    assert load_calibration(None, str(model)) is None  # none fitted yet
    doc = calfit.document(calfit.fit(_answers(), k=5), "m", sha, (), "x")
    cal.default_path(sha).parent.mkdir(parents=True)
    cal.default_path(sha).write_bytes(orjson.dumps(doc))
    assert load_calibration(None, str(model)).id == doc["id"]
    assert load_calibration("none", str(model)) is None
    other = tmp_path / "other.json"
    other.write_bytes(orjson.dumps({**doc, "model": {"name": "m", "sha256": "00" * 32}}))
    with pytest.raises(SystemExit, match="was fitted on another model file"):
        load_calibration(str(other), str(model))
    with pytest.raises(SystemExit, match="not JSON"):
        (tmp_path / "bad.json").write_text("{")
        load_calibration(str(tmp_path / "bad.json"), str(model))


_SKIP = 'answers carry x_calibration "identity" (serveproto calibrate writes a new one)'


@pytest.mark.parametrize(
    "write, why",
    [
        (
            lambda p: p.write_bytes(b"\x00garbage\xff"),
            "not JSON: str is not valid UTF-8: surrogates not allowed: line 1 column 1 (char 0)",
        ),
        (
            lambda p: p.write_bytes(orjson.dumps(_valid_doc(maps=[]))),
            "maps: expected an object keyed by question type (noul, choice, score)",
        ),
        (
            lambda p: p.write_bytes(orjson.dumps(_valid_doc(maps={"noul": {"kind": "temperature", "beta": 1e308}}))),
            f"maps.noul.beta: {_BETA}, got 1e+308",
        ),
        (lambda p: p.write_bytes(orjson.dumps(_valid_doc())), "fitted on another model file (sha256 abababababab...)"),
        (lambda p: p.mkdir(), "Is a directory"),
    ],
)
def test_serve_skips_a_bad_file_it_found_in_the_cache_and_refuses_one_it_was_given(tmp_path, monkeypatch, write, why):
    from gateway.cli.serve import load_calibration

    monkeypatch.setenv("SERVEPROTO_CACHE", str(tmp_path))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF model bytes")
    path = cal.default_path(cal.sha256_file(model))
    path.parent.mkdir(parents=True)
    write(path)
    said: list[str] = []
    assert load_calibration(None, str(model), say=said.append) is None
    assert said == [
        f"serveproto serve: calibration: skipping {path}, found in the cache for this model: {why}; {_SKIP}"
    ]
    with pytest.raises(SystemExit) as e:  # named by the operator: still refused
        load_calibration(str(path), str(model), say=said.append)
    if why == "Is a directory":
        assert str(e.value) == f"serveproto serve: --calibration: cannot read {path}: Is a directory"
    elif why.startswith("fitted"):
        assert str(e.value).startswith(f"serveproto serve: --calibration: {path} was fitted on another model file")
    else:
        assert str(e.value) == f"serveproto serve: --calibration: {path}: {why}"
    assert len(said) == 1


@pytest.mark.anyio
async def test_serve_starts_past_a_corrupted_calibration_in_the_cache(
    tmp_path, monkeypatch, capfd, tiny, fixture_engine
):
    """The issue's case end to end: garbage under the model's sha256 no longer makes ``serve`` exit 1."""
    import httpx2

    from test_routes_support import TICKET, serving

    monkeypatch.setenv("SERVEPROTO_CACHE", str(tmp_path))
    path = cal.default_path(cal.sha256_file(tiny))
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"format": "serveproto-calibration", "version": 1, "maps": {"noul": ')
    async with serving("--model", str(tiny), "--engine", str(fixture_engine)) as base:
        async with httpx2.AsyncClient(base_url=base) as client:
            reply = (await client.post("/v1/systemone", json=TICKET)).json()
    assert {a["x_calibration"] for a in reply["answers"].values()} == {"identity"}
    skipped = [line for line in capfd.readouterr().err.splitlines() if "calibration" in line]
    assert skipped == [
        f"serveproto serve: calibration: skipping {path}, found in the cache for this model: "
        f"not JSON: unexpected end of data: line 1 column 69 (char 68); {_SKIP}"
    ]


@pytest.mark.anyio
async def test_answers_carry_their_calibration():
    import httpx2

    from test_routes_support import TICKET, FakeEngine, make_app, running

    c = cal.load_document(calfit.document(calfit.fit(_answers(), k=5), "m", "ab" * 32, (), "x"))
    app = make_app(FakeEngine())
    async with running(app) as base:
        async with httpx2.AsyncClient(base_url=base) as client:
            plain = (await client.post("/v1/systemone", json=TICKET)).json()
            app.calibration = c
            calibrated = (await client.post("/v1/systemone", json=TICKET)).json()
            other = (await client.post("/v1/systemone", json={**TICKET, "x_debias": "cyclic"})).json()
            decisions = (
                await client.post("/v1/decisions", json={"input": "x", "questions": [{"type": "predicate"}]})
            ).json()
    assert {a["x_calibration"] for a in plain["answers"].values()} == {"identity"}
    assert {q: a["x_calibration"] for q, a in calibrated["answers"].items()} == {
        "urgency": f"{c.id}:{c.maps['noul'].kind}",
        "department": f"{c.id}:temperature",
        "severity": f"{c.id}:temperature",
    }
    before = list(plain["answers"]["department"]["probabilities"].values())
    after = list(calibrated["answers"]["department"]["probabilities"].values())
    assert after == pytest.approx(c.maps["choice"].apply(before), abs=2e-6)
    assert {a["x_calibration"] for a in other["answers"].values()} == {"identity"}  # read under another x_debias
    assert decisions["answers"][0]["x_calibration"].startswith(c.id)


def test_sha256_file_is_remembered_until_the_file_changes(tmp_path):
    import hashlib

    model = tmp_path / "m.gguf"
    model.write_bytes(b"first weights")
    assert cal.sha256_file(model) == hashlib.sha256(b"first weights").hexdigest()
    model.write_bytes(b"the second, longer weights")  # another size: read again, not the remembered one
    assert cal.sha256_file(model) == hashlib.sha256(b"the second, longer weights").hexdigest()
    assert cal.sha256_file(str(model)) == cal.sha256_file(tmp_path / "." / "m.gguf")
