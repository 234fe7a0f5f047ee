"""``serve``'s configuration tree (gateway/cli/config.py) and the engine options it passes whole
(gateway/engine/options.py): the values each flag lands on, the defaults, the errors naming the field."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.cli import build_parser
from gateway.cli.config import DecisionConfig, EnginesConfig, LlamaOptions, ServeConfig, from_args
from gateway.engine.options import EngineOptions, ProcessOptions, RestartPolicy
from gateway.http import Limits
from gateway.server.app import App, AppConfig
from test_routes_support import FakeEngine, make_app


def parse(*argv: str):
    return build_parser().parse_args(["serve", *argv])


def test_the_defaults_are_the_ones_spawn_and_serve_always_had(monkeypatch):
    monkeypatch.delenv("SERVEPROTO_API_KEY", raising=False)
    assert EngineOptions() == EngineOptions(
        ProcessOptions(60.0, 60.0, 5.0, 30.0, 5.0, 2.0, None, None, 1000, 4096, 64 << 20),
        RestartPolicy(3, 60.0, 0.1, 5.0),
    )
    assert ProcessOptions().health_interval is None  # EngineProcess.start alone never PINGs
    cfg = from_args(parse())
    assert cfg == ServeConfig(
        host="127.0.0.1",
        port=8000,
        engines=EnginesConfig(((None, None),), None, 1, None, LlamaOptions()),
        engine=EngineOptions(
            ProcessOptions(handshake_timeout=180.0, health_interval=5.0, ping_timeout=30.0),
            RestartPolicy(max_restarts=3, period=60.0),
        ),
        app=AppConfig(api_key=None, request_timeout=600.0, max_inflight=256),
        limits=Limits(max_body_bytes=16 << 20, max_decoded_bytes=64 << 20),
        decision=DecisionConfig(debias=("canonical", "spellings", "content_free_listing")),
        log_level="INFO",
    )


def test_each_flag_lands_on_its_field(monkeypatch):
    monkeypatch.setenv("SERVEPROTO_API_KEY", "from-env")
    cfg = from_args(
        parse(
            *("--model", "a=/m/a.gguf", "--model", "b=/m/b.gguf", "--engines", "2", "--gpus", "0,1"),
            *("--host", "0.0.0.0", "--port", "0", "--slots", "2", "--ctx", "512", "--ctx-max", "4096"),
            *("--threads", "3", "--numerics", "fast", "--score-cache-mb", "0", "--cache-dir", "off"),
            *("--cache-disk-mb", "9", "--cache-read-only", "--rpc", "h:50052", "--split-mode", "row"),
            *("--tensor-split", "3,1", "--main-gpu", "1", "--debias", "cyclic", "--calibration", "none"),
            *("--heads", "h.json", "--log-decisions", "d.jsonl", "--log-decisions-required"),
            *("--request-timeout", "7", "--handshake-timeout", "8", "--ping-interval", "2", "--ping-timeout", "9"),
            *("--max-restarts", "0", "--restart-period", "11", "--max-inflight", "4", "--max-body", "1000"),
            *("--log-level", "WARNING", "--ubatch", "1024"),
        )
    )
    assert (cfg.host, cfg.port, cfg.log_level) == ("0.0.0.0", 0, "WARNING")
    assert cfg.engines == EnginesConfig(
        (("a", "/m/a.gguf"), ("b", "/m/b.gguf")),
        None,
        2,
        ("0", "1"),
        LlamaOptions(2, 512, 4096, 3, "fast", 0, "h:50052", "row", "3,1", 1, "off", 9, True, "native", 1024),
    )
    assert cfg.engine == EngineOptions(
        ProcessOptions(handshake_timeout=8.0, health_interval=2.0, ping_timeout=9.0),
        RestartPolicy(max_restarts=0, period=11.0),
    )
    assert cfg.app == AppConfig(api_key="from-env", request_timeout=7.0, max_inflight=4)
    assert cfg.limits == Limits(max_body_bytes=1000, max_decoded_bytes=64 << 20)
    assert cfg.decision == DecisionConfig(("cyclic",), "none", "h.json", "d.jsonl", True)
    assert from_args(parse("--api-key", "k")).app.api_key == "k"  # the flag over the environment


def test_keep_restarting_is_no_limit_and_the_long_backoff():
    restart = from_args(parse("--keep-restarting", "--max-restarts", "5")).engine.restart
    assert restart == RestartPolicy(max_restarts=None, period=60.0, backoff_initial=0.1, backoff_max=30.0)
    assert [restart.delay(n) for n in (1, 2, 9, 10)] == [0.1, 0.2, 25.6, 30.0]


def test_the_engine_command_and_its_model():
    cfg = from_args(parse("--model", "/m/t.gguf", "--engine", "engines/bin/serveproto-fixture", "--mode", "decide"))
    assert cfg.engines.command == ("engines/bin/serveproto-fixture", "--mode", "decide")
    assert cfg.engines.default_model_path == "/m/t.gguf" and cfg.decision.debias == ()


def test_log_decisions_required_alone_is_refused_naming_both_flags():
    with pytest.raises(SystemExit) as refused:
        from_args(parse("--log-decisions-required"))
    assert str(refused.value) == "serveproto serve: --log-decisions-required: needs --log-decisions FILE"


def test_spawn_keywords_change_single_fields_of_the_tree():
    base = EngineOptions()
    changed = base.updated(handshake_timeout=1.5, restart_period=7.0, max_restarts=None, max_waiting=2, env={"A": "1"})
    assert changed == dataclasses.replace(
        base,
        process=dataclasses.replace(base.process, handshake_timeout=1.5, env={"A": "1"}),
        restart=RestartPolicy(max_restarts=None, period=7.0),
        max_waiting=2,
    )
    assert base.updated() is base and base == EngineOptions()  # frozen: the base is untouched
    for key in ("period", "timeout"):  # spawn's keyword is restart_period; a request's timeout is no option
        with pytest.raises(TypeError) as refused:
            base.updated(**{key: 3.0})
        assert str(refused.value) == f"{key}: not an engine option (gateway.engine.options.EngineOptions)"
    with pytest.raises(ValueError) as refused:
        base.updated(backoff_max=-1)
    assert str(refused.value) == "backoff_max: must be >= 0, got -1"
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.request_timeout = 3.0  # type: ignore[misc]


def test_the_app_takes_its_config_whole_or_by_field():
    engine = FakeEngine()
    app = make_app(engine, api_key="k", max_inflight=3)
    assert app.config == AppConfig(api_key="k", request_timeout=5.0, max_inflight=3)
    assert app.settings.timeout == 5.0
    whole = App(engine, app.model, config=AppConfig(request_timeout=9.0))
    assert whole.config == AppConfig(None, 9.0, 256) and whole.settings.timeout == 9.0
    with pytest.raises(TypeError):
        App(engine, app.model, timeout=1.0)
