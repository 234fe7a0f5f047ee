"""Issue 48, item 5: the package ships a calibration of the default model, found by its sha256 as
``calibrate`` writes it; ``serve`` loads it when the cache holds none for the model (no engine here)."""

from __future__ import annotations

import orjson
import pytest

from gateway.cli.config import DEFAULT_MODEL_DEBIAS
from gateway.cli.serve import load_calibration
from gateway.decision import calibration
from gateway.paths import default_model_path


def test_every_shipped_calibration_is_valid_and_named_by_its_model():
    files = sorted(calibration.SHIPPED.glob("*.json"))
    assert files, "no calibration shipped"
    for path in files:
        cal = calibration.load(path)
        assert path.name == f"{cal.model_sha256}.json"
        assert set(cal.maps) == {"choice", "score"}  # noul left out: it raised ECE held out (x_left_out)
        # fitted under the default model's correction, which serve applies by default
        assert cal.debias == tuple(DEFAULT_MODEL_DEBIAS)


def test_serve_loads_the_shipped_calibration_when_the_cache_has_none(tmp_path, monkeypatch):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"weights")
    sha = calibration.sha256_file(model)
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    doc = orjson.loads(next(calibration.SHIPPED.glob("*.json")).read_bytes())
    doc["model"]["sha256"] = sha
    (shipped / f"{sha}.json").write_bytes(orjson.dumps(doc))
    monkeypatch.setenv("SERVEPROTO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(calibration, "SHIPPED", shipped)
    cal = load_calibration(None, str(model))
    assert cal is not None and cal.model_sha256 == sha
    # --calibration none still turns it off; without a shipped file, none
    assert load_calibration("none", str(model)) is None
    monkeypatch.setattr(calibration, "SHIPPED", tmp_path / "nowhere")
    assert load_calibration(None, str(model)) is None


def test_the_default_model_has_a_shipped_calibration():
    model = default_model_path()
    if not model.exists():
        pytest.skip(f"{model} is not fetched yet (make model)")
    assert calibration.shipped_path(calibration.sha256_file(model)).exists()
