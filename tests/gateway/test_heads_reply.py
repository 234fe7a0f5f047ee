"""What a reply says of the answers a trained head gave, and what ``serve`` says of its heads, without a model.

A fake engine that reads hidden states (CAPS ``x_hidden``) answers the support ticket with a head on its
``department`` question: that answer names the head (``x_head``) and the correction its prompt was read
under (``x_debias``: the head's own, none), not the request's; the reply's ``x_debias`` is the correction
of the answers read under it, absent when a head answered every question. ``GET /v1`` lists each model's
default ``x_debias``, calibration and heads; ``serve``'s start-up lines name the heads as they name a
calibration."""

from __future__ import annotations

import math

import attrs
import httpx2
import pytest

from gateway.cli import serve as serve_cli
from gateway.cli.config import DEFAULT_MODEL_DEBIAS
from gateway.decision import heads, schema, scoring
from gateway.server.jev import protocol
from test_routes_support import TICKET, FakeCaps, FakeEngine, make_app, running


@attrs.frozen
class HiddenCaps(FakeCaps):
    x_hidden: int = 30


class HiddenEngine(FakeEngine):
    """The fake engine, plus SCORE's ``hidden``: every group's state at every layer asked is ``(1.0, 0.0)``."""

    async def score(self, prefix, groups, pin=False, slot=None, route=None, beside=None, hidden=()):
        result = await super().score(prefix, groups, pin, slot, route, beside)
        return attrs.evolve(result, hidden={(g, la): (1.0, 0.0) for g in range(len(groups)) for la in hidden})


def department_head() -> heads.Head:
    q = next(q for q in schema.parse_request(TICKET).questions if q.id == "department")
    # logits (2, 0, 1) over billing, technical, sales for the hidden state (1, 0)
    return heads.Head(
        "head-dept",
        heads.signature(q),
        3,
        (0.0, 0.0),
        (1.0, 1.0),
        ((2.0, 0.0), (0.0, 0.0), (1.0, 0.0)),
        (0.0, 0.0, 0.0),
    )


def app_with_head():
    app = make_app(HiddenEngine(HiddenCaps()), debias=DEFAULT_MODEL_DEBIAS)
    head = department_head()
    app.settings = attrs.evolve(app.settings, heads=heads.HeadSet("00" * 32, {head.signature: head}))
    return app


def expected_department() -> dict:
    q = next(q for q in schema.parse_request(TICKET).questions if q.id == "department")
    z = [math.exp(v) for v in (2.0, 0.0, 1.0)]
    p = scoring.report([v / sum(z) for v in z])
    return protocol.answer(q, p) | {
        "x_calibration": "identity",
        "x_head": "head-dept",
        "x_debias": [],
        # issue 48: the head's margin, and the model's own reading of the question (the fake's first-token
        # probabilities add up past 1: capped)
        "x_margin": scoring.r6(p[0] - p[2]),
        "x_label_mass": 1.0,
        "x_argmax_is_label": True,
    }


@pytest.mark.anyio
async def test_a_head_answer_names_its_own_correction_not_the_requests():
    app = app_with_head()
    only = {**TICKET, "questions": {"department": TICKET["questions"]["department"]}}
    async with running(app) as base:
        async with httpx2.AsyncClient(base_url=base) as client:
            mixed = (await client.post("/v1/systemone", json=TICKET)).json()
            alone = (await client.post("/v1/systemone", json=only)).json()
            off = (await client.post("/v1/systemone", json={**TICKET, "x_head": "none"})).json()
    assert mixed["answers"]["department"] == expected_department()
    # the other two were read under the default correction, which the reply names
    assert mixed["x_debias"] == ["canonical", "spellings", "content_free_listing"]
    assert {k for q in ("urgency", "severity") for k in mixed["answers"][q] if k.startswith("x_")} == {
        "x_calibration",
        "x_entropy",
        "x_margin",
        "x_label_mass",
        "x_argmax_is_label",
    }
    # a head answered every question: no answer was read under the request's correction
    assert alone["answers"] == {"department": expected_department()}
    assert "x_debias" not in alone
    # heads off: the question is read as always, under the reply's x_debias
    assert off["x_debias"] == ["canonical", "spellings", "content_free_listing"]
    assert set(off["answers"]["department"]) == {
        "type",
        "choice",
        "probabilities",
        "confidence",
        "x_entropy",
        "x_calibration",
        "x_margin",
        "x_label_mass",
        "x_argmax_is_label",
    }


@pytest.mark.anyio
async def test_get_v1_lists_each_models_correction_calibration_and_heads():
    app = app_with_head()
    plain = make_app()
    async with running(app) as base, running(plain) as base_plain:
        async with httpx2.AsyncClient() as client:
            with_head = (await client.get(base + "/v1")).json()["served"]
            without = (await client.get(base_plain + "/v1")).json()["served"]
    assert with_head == [
        {
            "model": "fake-model",
            "x_debias": ["canonical", "spellings", "content_free_listing"],
            "calibration": None,
            "heads": ["head-dept"],
        }
    ]
    assert without == [{"model": "fake-model", "x_debias": [], "calibration": None, "heads": []}]


class OnePool:
    def __init__(self, app):
        self.engines = [app.engine]


def test_serve_names_its_heads_at_start_up(capsys):
    app = app_with_head()
    serve_cli._say_serving(app, OnePool(app), "127.0.0.1", 8000)
    assert capsys.readouterr().out.splitlines() == [
        "serveproto: serving fake-model on http://127.0.0.1:8000",
        "serveproto: x_debias defaults to canonical,spellings,content_free_listing (--debias none to turn it off)",
        "serveproto: 1 trained head(s) answer the questions they were fitted on: head-dept (--heads none to turn them off)",
    ]
    app.settings = attrs.evolve(app.settings, heads=None)
    serve_cli._say_serving(app, OnePool(app), "127.0.0.1", 8000)
    assert "head" not in capsys.readouterr().out


def test_serve_escapes_head_names_in_its_start_up_line(capsys):
    # issue 46, item 6: a name with a newline and ANSI escapes forged a line of the server's log
    app = app_with_head()
    head = attrs.evolve(department_head(), name="dept\n\x1b[31mserveproto: giving up")
    app.settings = attrs.evolve(app.settings, heads=heads.HeadSet("00" * 32, {head.signature: head}))
    serve_cli._say_serving(app, OnePool(app), "127.0.0.1", 8000)
    assert capsys.readouterr().out.splitlines()[-1] == (
        "serveproto: 1 trained head(s) answer the questions they were fitted on: "
        "dept\\n\\x1b[31mserveproto: giving up (--heads none to turn them off)"
    )


def heads_doc(sha: str, **over) -> dict:
    h = {"name": "h", "signature": "s", "layer": 19, "mean": [0.0] * 4, "scale": [1.0] * 4}
    h.update({"W": [[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]], "b": [0.0, 0.0], "T": 1.0, "x_debias": []})
    h.update(over)
    return {"format": heads.FORMAT, "model": {"name": "m", "sha256": sha}, "heads": [h]}


@pytest.mark.parametrize(
    ("over", "hidden", "why"),
    [
        ({}, (30, 576), "heads[0].mean: 4 values, the served model's hidden state has 576 (CAPS x_hidden_dim)"),
        ({"layer": 30}, (30, 4), "heads[0].layer: 30, the served model has layers 0 to 29 (CAPS x_hidden=30)"),
        (
            {"T": 1e-300},
            None,
            "heads[0].T: expected a number from 0.04 to 25 (heads fit fits it from 0.05 to 20), got 1e-300",
        ),
    ],
)
def test_a_heads_file_found_in_the_cache_is_skipped_and_a_named_one_refused(tmp_path, monkeypatch, over, hidden, why):
    import hashlib

    import orjson

    monkeypatch.setenv("SERVEPROTO_CACHE", str(tmp_path))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF not really")
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    path = heads.default_path(sha)
    path.parent.mkdir(parents=True)
    path.write_bytes(orjson.dumps(heads_doc(sha, **over)))
    said: list[str] = []
    assert serve_cli.load_heads(None, str(model), hidden, say=said.append) is None
    assert said == [
        f"serveproto serve: heads: skipping {path}, found in the cache for this model: {why}; "
        "no question is answered by a head (serveproto heads fit writes a new one)"
    ]
    with pytest.raises(SystemExit) as exc:
        serve_cli.load_heads(str(path), str(model), hidden)
    assert str(exc.value) == f"serveproto serve: --heads: {path}: {why}"
    # the same file, fit for the engine, serves
    path.write_bytes(orjson.dumps(heads_doc(sha)))
    assert serve_cli.load_heads(None, str(model), (30, 4), say=said.append).names == ["h"]
