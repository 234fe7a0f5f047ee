"""Several engines and models behind one server (issue 17): ``serve --engines N``, ``--model NAME=PATH``,
routing by state affinity then load, the routing key header, ``/health`` / ``/metrics`` / ``/v1/models``
per engine. Fixture engines here; two llama engines in ``test_serve_engines_llama.py``."""

from __future__ import annotations

import hashlib
import json
import os
import signal

import anyio
import httpx2
import orjson
import pytest
from typesafe_sdk import TypeSafeClient

from gateway.cli import build_parser
from gateway.cli.serve import parse_model_arg, plan_engines
from gateway.engine.pool import EngineSpec, Pool
from gateway.http import HTTPServer
from gateway.server.app import App, AppConfig, ModelInfo
from gateway.server.fleet import Served
from gateway.server.routing import HEADER, routing_key
from test_routes_support import TICKET, serving
from test_server_e2e import check_against_oracle

pytestmark = pytest.mark.anyio


def metric(text: str, name: str, **labels: str) -> float:
    """The value of sample ``name{labels}`` in Prometheus text (labels in any order)."""
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] != name:
            continue
        got = dict(kv.split("=", 1) for kv in head[len(name) + 1 : -1].split(",")) if "{" in head else {}
        if {k: v.strip('"') for k, v in got.items()} == labels:
            return float(value)
    raise KeyError(f"{name}{labels} not in the metrics")


def by_hand(text: str) -> str:
    """The routing key as docs/http-api.md tells a client to compute it."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def test_the_routing_key_is_the_documented_hash():
    assert routing_key("a ticket") == by_hand("a ticket")
    assert routing_key({"b": [1, "é"]}) == by_hand('{"b": [1, "é"]}')  # json.dumps(ensure_ascii=False)
    assert routing_key("state A", prefix="shared rules") == routing_key("state B", prefix="shared rules")
    assert routing_key("state A", prefix="") == routing_key("state A")  # an empty prefix is none
    assert routing_key("state A") != routing_key("state B")


def test_model_flags(tmp_path, monkeypatch):
    assert parse_model_arg("small=/m/a.gguf") == ("small", "/m/a.gguf")
    assert parse_model_arg("/m/a=b.gguf") == (None, "/m/a=b.gguf")  # a path with '=' stays a path
    parser = build_parser()
    args = parser.parse_args(["serve", "--model", "a=/x.gguf", "--model", "b=/y.gguf"])
    assert args.models == [("a", "/x.gguf"), ("b", "/y.gguf")] and args.model == "/x.gguf"
    for argv, says in (  # noqa: B007  (kept as written)
        (["--model", "a=/x", "--model", "a=/y"], "two models named 'a'"),
        (["--model", "/x", "--model", "b=/y"], "name each"),
        (["--model", "a=/x", "--model", "/y"], "name each"),
    ):
        with pytest.raises(SystemExit):
            parser.parse_args(["serve", *argv])
    # threads divided among the engines; CUDA_VISIBLE_DEVICES in turn with --gpus
    engine = tmp_path / "serveproto-llama"
    engine.write_text("#!/bin/sh\n")
    engine.chmod(0o755)
    for name in ("a", "b"):
        (tmp_path / f"{name}.gguf").write_bytes(b"GGUF")
    from gateway.cli import plan as cli_plan

    monkeypatch.setattr(cli_plan, "ensure_engine", lambda name: engine)
    monkeypatch.delenv("SERVEPROTO_THREADS", raising=False)
    args = parser.parse_args(
        [
            "serve",
            "--engines",
            "2",
            "--model",
            f"a={tmp_path}/a.gguf",
            "--model",
            f"b={tmp_path}/b.gguf",
            "--gpus",
            "0,1,2",
        ]
    )
    plans = plan_engines(args, environ={"PATH": "/bin"}, cpu_count=9)
    assert [p.name for p in plans] == ["a", "b"]
    specs = [s for p in plans for s in p.specs]
    assert [s.name for s in specs] == ["a-0", "a-1", "b-0", "b-1"] and [s.model for s in specs] == ["a", "a", "b", "b"]
    assert {s.argv[s.argv.index("--threads") + 1] for s in specs} == {"2"}  # 9 cores // 4 engines
    assert [s.options["env"]["CUDA_VISIBLE_DEVICES"] for s in specs] == ["0", "1", "2", "0"]
    assert specs[0].options["env"]["PATH"] == "/bin"
    # no --gpus: nothing on a CPU build; on a CUDA build (.llama-cuda beside the binary) $CUDA_VISIBLE_DEVICES in turn
    two = parser.parse_args(["serve", "--engines", "2", "--model", f"{tmp_path}/a.gguf"])
    assert all("env" not in s.options for s in plan_engines(two, environ={"CUDA_VISIBLE_DEVICES": "3,5"})[0].specs)
    (tmp_path / ".llama-cuda").touch()
    assert [
        s.options["env"]["CUDA_VISIBLE_DEVICES"]
        for s in plan_engines(two, environ={"CUDA_VISIBLE_DEVICES": "3,5"})[0].specs
    ] == ["3", "5"]
    (tmp_path / ".llama-cuda").unlink()
    one = plan_engines(parser.parse_args(["serve", "--model", f"{tmp_path}/a.gguf"]), environ={}, cpu_count=9)
    assert [s.name for s in one[0].specs] == ["serveproto-llama"] and one[0].specs[0].options == {}
    assert "auto" == one[0].specs[0].argv[one[0].specs[0].argv.index("--threads") + 1]  # the engine adapts


async def test_two_fixture_engines(fixture_engine, probes):
    """``--engines 2``: both answer (the toy's numbers), a state sticks to its engine, the reply names its
    routing key, each engine has its own supervisor (one killed is restarted, the other untouched)."""
    before = probes.child_pids()
    async with serving("--engines", "2", "--engine", str(fixture_engine)) as base:
        engines = probes.child_pids() - before
        assert len(engines) == 2
        async with httpx2.AsyncClient(base_url=base, timeout=30) as c:
            health = (await c.get("/health")).json()
            assert health["status"] == "ok" and health["model"] == "fixture"
            names = [e["name"] for e in health["engines"]]
            assert names == ["serveproto-fixture-0", "serveproto-fixture-1"]
            assert {e["model"] for e in health["engines"]} == {"fixture"}

            async def ask(state: str, model: str | None = None):
                body = {**TICKET, "state": state, **({"model": model} if model else {})}
                r = await c.post(
                    "/v1/systemone", content=orjson.dumps(body), headers={"content-type": "application/json"}
                )
                assert r.status_code == 200, r.text
                return r, body

            states = [TICKET["state"], TICKET["state"] + " Again.", "Another ticket entirely.", "A fourth one."]
            for state in states:
                for _ in range(2):
                    r, body = await ask(state, "jev-latest")  # any other name: the default model
                    assert r.headers[HEADER] == by_hand(state)
                    assert r.json()["model"] == "fixture"
                    check_against_oracle(r.json(), body)
            text = (await c.get("/metrics")).text
            routed = [metric(text, "serveproto_engine_requests_total", engine=n, model="fixture") for n in names]
            assert sum(routed) == 8 and min(routed) >= 2  # distinct states spread over both engines
            assert metric(text, "serveproto_engine_process_up", engine=names[0], model="fixture") == 1.0
            # a state repeated goes where it went before
            per = {}
            for state in states:
                before_counts = [
                    metric(
                        (await c.get("/metrics")).text, "serveproto_engine_requests_total", engine=n, model="fixture"
                    )
                    for n in names
                ]
                await ask(state)
                after = [
                    metric(
                        (await c.get("/metrics")).text, "serveproto_engine_requests_total", engine=n, model="fixture"
                    )
                    for n in names
                ]
                per[state] = [a - b for a, b in zip(after, before_counts)].index(1)
                await ask(state)
                again = [
                    metric(
                        (await c.get("/metrics")).text, "serveproto_engine_requests_total", engine=n, model="fixture"
                    )
                    for n in names
                ]
                assert [a - b for a, b in zip(again, after)].index(1) == per[state]
            assert set(per.values()) == {0, 1}
            # an error reply of a decision route names its key too
            bad = {"state": "s", "questions": {"q": {"type": "sideways"}}}
            r = await c.post("/v1/systemone", content=orjson.dumps(bad), headers={"content-type": "application/json"})
            assert r.status_code == 422 and r.headers[HEADER] == by_hand("s")
            models = (await c.get("/v1/models")).json()
            assert [m["name"] for m in models["models"]] == ["fixture"]
            assert [e["name"] for e in models["models"][0]["x_engines"]] == names

            # one engine killed: its supervisor restarts it, the other one keeps serving
            victim = sorted(engines)[0]
            os.kill(victim, signal.SIGKILL)
            with anyio.fail_after(20):
                while True:
                    rows = (await c.get("/health")).json()["engines"]
                    if any(e["restarts"] == 1 and e["state"] == "serving" for e in rows):
                        break
                    await anyio.sleep(0.05)
            assert sorted(e["restarts"] for e in rows) == [0, 1]
            for state in states:
                r, body = await ask(state)
                check_against_oracle(r.json(), body)
            text = (await c.get("/metrics")).text
            assert sorted(
                metric(text, "serveproto_engine_process_restarts", engine=n, model="fixture") for n in names
            ) == [0.0, 1.0]
            assert metric(text, "serveproto_engine_restarts") == 1.0
    assert probes.child_pids() == before


async def test_a_request_picks_its_model(fixture_engine):
    """Two models (fixture engines named alpha and beta): ``model`` picks one by name, any other name gets
    the first; ``/v1/models`` lists both; a model whose engines are gone is a 503, the other still served."""
    specs = [
        EngineSpec("alpha-0", (str(fixture_engine), "--model", "alpha"), model="alpha"),
        EngineSpec("beta-0", (str(fixture_engine), "--model", "beta"), {"max_restarts": 0}, model="beta"),
    ]
    async with Pool.spawn(specs) as pool:
        served = {n: Served(ModelInfo.load(n)) for n in ("alpha", "beta")}
        app = App(pool, served, config=AppConfig(request_timeout=10))
        async with anyio.create_task_group() as tg:
            listener = await HTTPServer.bind("127.0.0.1", 0)
            port = await HTTPServer(app).start(tg, listener=listener)
            async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as c:
                for asked, answered in (("beta", "beta"), ("alpha", "alpha"), ("jev-latest", "alpha"), (None, "alpha")):
                    body = {**TICKET, **({"model": asked} if asked else {})}
                    r = await c.post(
                        "/v1/systemone", content=orjson.dumps(body), headers={"content-type": "application/json"}
                    )
                    assert r.status_code == 200 and r.json()["model"] == answered, (asked, r.text)
                    check_against_oracle(r.json(), body)
                    d = await c.post(
                        "/v1/decisions",
                        content=orjson.dumps(
                            {"model": asked, "input": "x", "questions": [{"type": "predicate", "question": "?"}]}
                        ),
                    )
                    assert d.status_code == 200 and d.json()["model"] == answered and d.headers[HEADER] == by_hand("x")

                # the official SDK passes its model through: model="beta" is answered by beta, its default by alpha
                def sdk(model):
                    with TypeSafeClient(api_key="k", base_url=f"http://127.0.0.1:{port}") as client:
                        kw = {"model": model} if model else {}
                        return client.system_one(state=TICKET["state"], questions=TICKET["questions"], **kw).model

                assert await anyio.to_thread.run_sync(sdk, "beta") == "beta"
                assert await anyio.to_thread.run_sync(sdk, None) == "alpha"
                text = (await c.get("/metrics")).text
                assert metric(text, "serveproto_engine_requests_total", engine="beta-0", model="beta") == 3.0
                assert metric(text, "serveproto_engine_requests_total", engine="alpha-0", model="alpha") == 7.0
                chat = await c.post(
                    "/v1/chat/completions",
                    content=orjson.dumps(
                        {"model": "beta", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
                    ),
                )
                assert chat.status_code == 200 and chat.json()["model"] == "beta"
                models = (await c.get("/v1/models")).json()
                assert [m["name"] for m in models["models"]] == ["alpha", "beta"]
                assert [m["id"] for m in models["data"]] == ["alpha", "beta"]
                assert [[e["name"] for e in m["x_engines"]] for m in models["models"]] == [["alpha-0"], ["beta-0"]]
                # beta's engine killed, no restart allowed: beta is a 503, alpha still answers, /health says which
                os.kill(pool.engines[1].pid, signal.SIGKILL)
                with anyio.fail_after(10):
                    while not pool.engines[1].gave_up:
                        await anyio.sleep(0.02)
                r = await c.post("/v1/systemone", content=orjson.dumps({**TICKET, "model": "beta"}))
                assert r.status_code == 503 and r.headers["retry-after"]
                r = await c.post("/v1/systemone", content=orjson.dumps({**TICKET, "model": "alpha"}))
                assert r.status_code == 200
                health = await c.get("/health")
                assert health.status_code == 503 and health.json()["unavailable"] == ["beta"]
            tg.cancel_scope.cancel()


def test_json_state_key_matches_python_json():
    state = {"ticket": "Zahlung doppelt", "amount": 12.5, "tags": ["a", "ü"]}
    assert routing_key(state) == by_hand(json.dumps(state, ensure_ascii=False))
