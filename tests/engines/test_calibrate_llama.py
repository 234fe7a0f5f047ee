"""``serveproto calibrate`` then ``serveproto serve`` on the default model, end to end: the fit is written under
the model's sha256, serve loads it without being told, every answer names it in ``x_calibration``, and its
probabilities are the map applied to what the same server answers with ``--calibration none``."""

from __future__ import annotations

import anyio
import httpx2
import orjson
import pytest

from gateway.cli import main
from gateway.decision import calibration
from gateway.lab import evalset
from test_server_llama import serving

pytestmark = pytest.mark.slow


def test_calibrate_and_serve_on_the_default_model(tmp_path, capsys, model_path, model_cache):
    model = model_path
    data = tmp_path / "labelled.jsonl"
    items = evalset.generate(sizes={"ticket": 2, "review": 2, "email": 2, "order": 2})
    evalset.write_jsonl(items, data)

    assert main(["calibrate", "--data", str(data), "--folds", "2", "--threads", "2"]) == 0
    printed = capsys.readouterr().out
    path = calibration.default_path(calibration.sha256_file(model))
    cal = calibration.load(path)
    assert f"calibration {cal.id} written to {path} (serve loads it for this model)" in printed
    assert "| all | 50 |" in printed and "ECE before -> after" in printed
    assert set(cal.maps) == {"noul", "choice", "score"}
    assert path.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    doc = orjson.loads(path.read_bytes())
    assert doc["held_out"]["all"]["after"]["accuracy"] == doc["held_out"]["all"]["before"]["accuracy"]

    body = items[0].body

    async def ask(*argv):
        async with serving(*argv) as base:
            async with httpx2.AsyncClient(base_url=base, timeout=120) as c:
                return (await c.post("/v1/systemone", json=body)).json()

    calibrated = anyio.run(ask)
    plain = anyio.run(ask, "--calibration", "none")
    # the reply's millionths are rounded after the map here, before it there: a few millionths apart,
    # more where a small probability is raised to a power below 1
    tol = 5e-4
    moved = 0.0
    for qid, q in body["questions"].items():
        a, b = calibrated["answers"][qid], plain["answers"][qid]
        assert b["x_calibration"] == "identity"
        kind = cal.maps[q["type"]].kind
        assert a["x_calibration"] == f"{cal.id}:{kind}"
        if q["type"] == "noul":
            want = cal.maps["noul"].apply([1 - b["noul"], b["noul"]])[1]
            assert a["noul"] == pytest.approx(want, abs=tol)
            moved = max(moved, abs(a["noul"] - b["noul"]))
        else:
            got = list(a["probabilities"].values())
            want = cal.maps[q["type"]].apply(list(b["probabilities"].values()))
            assert got == pytest.approx(want, abs=tol)
            moved = max(moved, max(abs(x - y) for x, y in zip(got, b["probabilities"].values())))
    assert moved > 0.01  # the map did something
