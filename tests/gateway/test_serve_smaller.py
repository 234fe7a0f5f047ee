"""Issue 48, item 7: ``serve --pin-slots N`` (and ``make serve PIN_SLOTS=N``) reaches the llama engine's
``--pin-slots``; a ``/v1/systemone`` reply carries its request id as a body ``id``, the header's value;
``--calibration FILE`` with no model file to check it against (``--engine`` without ``--model``, the
fixture engine) is refused instead of applied unchecked."""

from __future__ import annotations

import argparse
import os
import random

import httpx2
import orjson
import pytest

from gateway.cli import build_parser
from gateway.cli import config as cli_config
from gateway.cli import plan as cli_plan
from gateway.cli import serve as cli_serve
from gateway.decision import calibration as cal
from gateway.lab import calibration_fit as calfit
from test_routes_support import TICKET, FakeEngine, make_app, running


def llama_argv(tmp_path, monkeypatch, *argv: str, env: str | None = None, cores: int = 2) -> list[str]:
    """The llama engine's command line ``serve *argv`` plans (a stand-in binary and model: nothing is started),
    on a machine of ``cores`` CPUs with ``$SERVEPROTO_THREADS`` set to ``env`` (None: unset)."""
    engine = tmp_path / "serveproto-llama"
    engine.write_text("#!/bin/sh\n")
    engine.chmod(0o755)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    monkeypatch.setattr(cli_plan, "ensure_engine", lambda name: engine)
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    if env is None:
        monkeypatch.delenv("SERVEPROTO_THREADS", raising=False)
    else:
        monkeypatch.setenv("SERVEPROTO_THREADS", env)
    return cli_serve.engine_argv(build_parser().parse_args(["serve", "--model", str(model), *argv]))[0]


def test_pin_slots_reaches_the_engine(tmp_path, monkeypatch):
    argv = llama_argv(tmp_path, monkeypatch, "--pin-slots", "8")
    assert argv[argv.index("--pin-slots") : argv.index("--pin-slots") + 2] == ["--pin-slots", "8"]
    assert "--pin-slots" not in llama_argv(tmp_path, monkeypatch)  # the engine's own default (4)


def test_mmproj_reaches_the_default_models_engine_only(tmp_path, monkeypatch):
    """Issue 48, item 2: ``serve --mmproj PATH`` is the default model's projector; a missing file is refused."""
    proj = tmp_path / "p.gguf"
    proj.write_bytes(b"GGUF")
    argv = llama_argv(tmp_path, monkeypatch, "--mmproj", str(proj))
    assert argv[argv.index("--mmproj") : argv.index("--mmproj") + 2] == ["--mmproj", str(proj)]
    assert "--mmproj" not in llama_argv(tmp_path, monkeypatch)
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF")
    args = build_parser().parse_args(["serve", "--model", str(tmp_path / "m.gguf"), "--mmproj", str(proj)])
    cfg = cli_config.engines_config(args)
    assert "--mmproj" not in cli_plan.engine_argv(cfg, model=str(other))[0]  # another model's engine: none
    with pytest.raises(SystemExit, match=r"--mmproj .*missing\.gguf not found"):
        llama_argv(tmp_path, monkeypatch, "--mmproj", str(tmp_path / "missing.gguf"))


@pytest.mark.parametrize(
    "value, says", [("0", "must be at least 1, got 0"), ("1025", "must be at most 1024, got 1025")]
)
def test_pin_slots_range_is_the_engines(value, says, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--pin-slots", value])
    assert f"argument --pin-slots: {says}" in capsys.readouterr().err


@pytest.mark.anyio
async def test_the_reply_body_carries_the_header_request_id_first():
    async with running(make_app(FakeEngine())) as base:
        async with httpx2.AsyncClient(base_url=base) as client:
            r = await client.post("/v1/systemone", json=TICKET)
    body = r.json()
    assert body["id"] == r.headers["x-typesafe-request-id"] == body["x_request_id"]
    assert list(body)[:4] == ["id", "model", "answers", "usage"]


def _calibration_file(tmp_path) -> str:
    rng = random.Random(0)
    answers = []
    for r in range(40):
        for qtype, n in (("noul", 2), ("choice", 3), ("score", 4)):
            p = [0.1 / (n - 1)] * n
            top = rng.randrange(n)
            p[top] = 0.9
            answers.append((qtype, p, top if rng.random() < 0.6 else (top + 1) % n, f"r{r}"))
    path = tmp_path / "c.json"
    path.write_bytes(orjson.dumps(calfit.document(calfit.fit(answers, k=5), "m", "ab" * 32, (), "x")))
    return str(path)


def test_a_calibration_file_without_a_model_file_to_check_is_refused(tmp_path):
    path = _calibration_file(tmp_path)
    with pytest.raises(SystemExit) as refused:
        cli_serve.load_calibration(path, None)
    assert str(refused.value) == (
        f"serveproto serve: --calibration: {path} was fitted on the model file with sha256 abababababab..., "
        "and this server has no model file to check it against (--engine without --model): pass the "
        "engine's model as --model PATH, or --calibration none"
    )
    # with the model file it was fitted on, it is taken; with none asked, none is
    model = tmp_path / "m.gguf"
    model.write_bytes(b"weights")
    doc = orjson.loads((tmp_path / "c.json").read_bytes())
    doc["model"]["sha256"] = cal.sha256_file(model)
    (tmp_path / "c.json").write_bytes(orjson.dumps(doc))
    assert cli_serve.load_calibration(path, str(model)).model_sha256 == cal.sha256_file(model)
    assert cli_serve.load_calibration("none", None) is None
    assert cli_serve.load_calibration(None, None) is None


def test_serve_with_the_fixture_engine_and_a_calibration_stops_before_starting_it(tmp_path):
    path = _calibration_file(tmp_path)
    args = build_parser().parse_args(["serve", "--calibration", path, "--engine", "engines/bin/serveproto-fixture"])
    assert isinstance(args, argparse.Namespace)
    with pytest.raises(SystemExit, match="no model file to check it against"):
        cli_serve.load_calibrations(args.calibration, [None])
