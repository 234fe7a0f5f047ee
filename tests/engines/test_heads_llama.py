"""``serveproto heads fit`` then ``serveproto serve`` on the default model, end to end.

The fit reads labelled requests through the engine's hidden states and writes one head per question
signature under the model's sha256; serve loads it without being told; a question whose signature has
a head answers with ``x_head`` naming it and probabilities that are the head (numpy's arithmetic of the
fitted numbers) applied to the hidden state the same server's engine reads for that prompt; ``"x_head":
"none"`` answers as without heads; a question no head knows answers as before."""

from __future__ import annotations

import anyio
import httpx2
import numpy as np
import orjson
import pytest

from gateway.cli import main
from gateway.decision import calibration, heads, label_mass, pipeline, schema, scoring
from gateway.decision.chat_template import read_gguf
from gateway.decision.prompts import PromptBuilder
from gateway.engine import Engine
from gateway.lab import evalset, head_fit
from gateway.server.jev import protocol
from test_server_llama import serving

pytestmark = pytest.mark.slow


def test_fit_and_serve_heads_on_the_default_model(tmp_path, capsys, model_path, model_cache, llama_engine):
    model = model_path
    data = tmp_path / "labelled.jsonl"
    items = evalset.generate(sizes={"review": 8})
    evalset.write_jsonl(items, data)

    argv = ["heads", "fit", "--data", str(data), "--folds", "2", "--min-labels", "6", "--threads", "2"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    path = heads.default_path(calibration.sha256_file(model))
    assert f"6 heads written to {path}" in printed
    assert "| choice:sentiment | 8 |" in printed
    doc = orjson.loads(path.read_bytes())
    hs = heads.load(path)
    # a fit that finds no question with enough labels writes nothing: the heads above stay
    before = path.read_bytes()
    assert main([*argv[:-4], "--min-labels", "100", "--limit", "1", "--threads", "2"]) == 1
    assert capsys.readouterr().err.endswith(
        "serveproto heads: no question has --min-labels (100) labels from two requests or more: "
        f"no head fitted, nothing written ({path} left as it was)\n"
    )
    assert path.read_bytes() == before
    assert {h["layer"] for h in doc["heads"]} == {19} and {tuple(h["x_debias"]) for h in doc["heads"]} == {()}

    # a new review (not in the fit) plus a question no head knows
    body = evalset.generate(seed=99, sizes={"review": 1})[0].body
    body = {**body, "questions": {**body["questions"], "other": {"type": "noul", "instructions": "Is it long?"}}}
    parsed = schema.parse_request(body)

    async def hidden_of():
        async with Engine.spawn(llama_engine, name="oracle") as eng:
            template, _ = await anyio.to_thread.run_sync(read_gguf, model)
            settings = pipeline.Settings(PromptBuilder(template), hidden=(19,))
            return (await pipeline.decide(parsed, eng, settings, pipeline.Memory())).hidden

    hidden = anyio.run(hidden_of)

    async def ask(extra):
        async with serving() as base:
            async with httpx2.AsyncClient(base_url=base, timeout=300) as c:
                return (await c.post("/v1/systemone", json={**body, **extra})).json()

    with_heads = anyio.run(ask, {})
    without = anyio.run(ask, {"x_head": "none"})
    # "other" was read under the default correction: the reply names it
    assert with_heads["x_debias"] == without["x_debias"] == ["canonical", "spellings", "content_free_listing"]
    for q in parsed.questions:
        a, b = with_heads["answers"][q.id], without["answers"][q.id]
        assert "x_head" not in b
        h = hs.match(q)
        if q.id == "other":
            assert h is None and "x_head" not in a
            continue
        assert a["x_head"] == h.name
        fitted = next(d for d in doc["heads"] if d["signature"] == h.signature)
        expected = scoring.report(list(head_fit.predict(fitted, np.array([hidden[q.id][19]]))[0]))
        # the head's reading is under its own x_debias (none), which the answer says in place of the reply's
        # the margin is the head's (its two best probabilities); the label mass is the language model's reading
        # of the options (issue 48), which the head's answer keeps beside its own probabilities
        assert a.pop("x_margin") == scoring.r6(label_mass.margin(expected))
        mass, argmax = a.pop("x_label_mass"), a.pop("x_argmax_is_label")
        assert 0 < mass <= 1 and argmax in (True, None)
        assert a == protocol.answer(q, expected) | {"x_calibration": "identity", "x_head": h.name, "x_debias": []}
