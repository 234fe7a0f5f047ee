"""A served pair on real engine processes (issue 47, item 4): two fixture engines, one scoring and one in
decision mode (spec/fixture-engine.md), behind one model; each reader's answers against the two models
asked alone, each combination against an independent numpy computation of the alone answers."""

from __future__ import annotations

import anyio
import httpx2
import numpy as np
import orjson
import pytest

from gateway.decision import readers
from gateway.engine.pool import EngineSpec, Pool
from gateway.http import HTTPServer
from gateway.server.app import App, AppConfig, ModelInfo
from gateway.server.fleet import Served
from test_readers import millionths, numpy_combine, probs_of
from test_routes_support import TICKET

pytestmark = pytest.mark.anyio


async def test_a_pair_of_fixture_engines(fixture_engine):
    specs = [
        EngineSpec("lm-0", (str(fixture_engine), "--model", "lm"), model="lm"),
        EngineSpec("dec-0", (str(fixture_engine), "--model", "dec", "--mode", "decide"), model="dec"),
    ]
    async with Pool.spawn(specs) as pool:
        served = {n: Served(ModelInfo.load(n)) for n in ("lm", "dec")}
        both = Served.pair_of("both", served["lm"], served["dec"], readers.DEFAULT)
        app = App(pool, {"both": both, **served}, config=AppConfig(request_timeout=10))
        async with anyio.create_task_group() as tg:
            listener = await HTTPServer.bind("127.0.0.1", 0)
            port = await HTTPServer(app).start(tg, listener=listener)
            async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as c:

                async def ask(**extra):
                    body = {**TICKET, **extra}
                    r = await c.post(
                        "/v1/systemone", content=orjson.dumps(body), headers={"content-type": "application/json"}
                    )
                    assert r.status_code == 200, r.text
                    return r.json()

                alone = {m: await ask(model=m) for m in ("lm", "dec")}
                default = await ask(model=None)
                got = {r: await ask(model="both", x_reader=r) for r in readers.READERS}
                models = (await c.get("/v1/models")).json()
            tg.cancel_scope.cancel()
    assert default["model"] == "both" and default["x_path"] == "decide"
    assert default["answers"] == {q: {**a, "x_reader": "decider"} for q, a in alone["dec"]["answers"].items()}
    assert got["lm"]["answers"] == {q: {**a, "x_reader": "lm"} for q, a in alone["lm"]["answers"].items()}
    for r in readers.COMBINATIONS:
        assert got[r]["x_path"] == "decide+score"
        for qid, a in got[r]["answers"].items():
            want = numpy_combine(r, probs_of(alone["dec"]["answers"][qid]), probs_of(alone["lm"]["answers"][qid]))
            assert probs_of(a) == millionths(np.asarray(want)) and a["x_reader"] == r, (r, qid)
    assert models["data"][0]["id"] == "both" and models["data"][0]["x_holds"] == {"lm": "lm", "decider": "dec"}
