"""docs/http-api.md's nginx configuration, run: two ``serve`` replicas behind nginx's consistent hash on
``x-serveproto-route-key``; every request on one state reaches one replica. nginx is the one on PATH, else the
one ``make nginx`` unpacked into the cache (``make test`` does); without either the test skips, and fails under
``CI`` (CI's ``make test`` must check the scale-out path)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time

import anyio
import httpx2
import orjson
import pytest

from gateway.paths import ROOT, cache_dir
from gateway.server.routing import HEADER, routing_key
from support import first_reply, free_port, serve_process
from test_serve_engines import serving

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def docs_nginx_block() -> str:
    """The ```nginx block of docs/http-api.md, as a reader would copy it."""
    text = (ROOT / "docs" / "http-api.md").read_text()
    blocks = re.findall(r"```nginx\n(.*?)```", text, re.S)
    assert len(blocks) == 1, "docs/http-api.md should show one nginx configuration"
    return blocks[0]


def nginx_binary() -> str | None:
    """nginx on PATH, else ``make nginx``'s (Debian's package unpacked into the cache), else None."""
    unpacked = cache_dir() / "nginx" / "usr" / "sbin" / "nginx"
    return shutil.which("nginx") or (str(unpacked) if os.access(unpacked, os.X_OK) else None)


def need_nginx() -> str:
    """The nginx binary; skips without one, and fails when ``CI`` is set (``.ci/run``: the balancer is checked)."""
    found = nginx_binary()
    if found is None:
        why = "nginx is not installed (make nginx unpacks Debian's package into the cache)"
        if os.environ.get("CI"):
            pytest.fail(f"{why}: CI checks the balancer")
        pytest.skip(why)
    return found


@contextlib.contextmanager
def nginx(tmp_path, block: str):
    """nginx in the foreground (one process) with ``block`` inside ``http {}``; yields its process. Every
    temporary folder is under ``tmp_path`` (an unpacked nginx has no /var/lib/nginx)."""
    binary = need_nginx()
    conf = tmp_path / "nginx.conf"
    conf.write_text(f"""daemon off;
master_process off;
pid {tmp_path}/nginx.pid;
error_log {tmp_path}/error.log warn;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {tmp_path}/body;
    proxy_temp_path {tmp_path}/proxy;
    fastcgi_temp_path {tmp_path}/fastcgi;
    uwsgi_temp_path {tmp_path}/uwsgi;
    scgi_temp_path {tmp_path}/scgi;
{block}
}}
""")
    check = subprocess.run([binary, "-t", "-p", str(tmp_path), "-c", str(conf)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    proc = subprocess.Popen([binary, "-p", str(tmp_path), "-c", str(conf)], stderr=subprocess.PIPE)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


async def test_the_documented_nginx_config_keeps_a_state_on_one_replica(fixture_engine, tmp_path):
    need_nginx()
    block = docs_nginx_block()
    async with (
        serving("--engine", str(fixture_engine), "--model", "alpha") as a,
        serving("--engine", str(fixture_engine), "--model", "beta") as b,
    ):
        pass_through = [f"    server {u.removeprefix('http://')};" for u in (a, b)]
        port = free_port()
        ours = re.sub(r"( *server 10\.0\.0\.\d+:8000;\n)+", "\n".join(pass_through) + "\n", block)
        ours = ours.replace("listen 8080;", f"listen 127.0.0.1:{port};")
        assert ours.count("server 127.0.0.1:") == 2
        with nginx(tmp_path, ours):
            base = f"http://127.0.0.1:{port}"
            async with httpx2.AsyncClient(base_url=base, timeout=30) as c:
                with anyio.fail_after(20):
                    while True:
                        try:
                            await c.get("/health")
                            break
                        except httpx2.TransportError:
                            await anyio.sleep(0.05)
                where: dict[str, set[str]] = {}
                for i in range(8):
                    state = f"Ticket {i}: the integration keeps failing."
                    key = routing_key(state)
                    for _ in range(3):
                        body = {"state": state, "questions": {"q": {"type": "noul", "instructions": "Urgent?"}}}
                        r = await c.post(
                            "/v1/systemone",
                            content=orjson.dumps(body),
                            headers={"content-type": "application/json", HEADER: key},
                        )
                        assert r.status_code == 200, r.text
                        assert r.headers[HEADER] == key
                        where.setdefault(state, set()).add(r.json()["model"])  # the replica's fixture model
    assert all(len(v) == 1 for v in where.values()), where  # a state stays on its replica
    assert set().union(*where.values()) == {"alpha", "beta"}  # and the states spread over both


# --- docs/deploy/: the compose example's balancer and probes ----------------------------------------------

DEPLOY = ROOT / "docs" / "deploy"


def compose_file() -> dict:
    import yaml  # gguf's dependency (the server extra)

    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def test_the_compose_file_matches_its_balancer():
    compose = compose_file()
    services = compose["services"]
    replicas = sorted(n for n in services if n.startswith("serveproto-"))
    upstream = re.findall(r"^\s*server (serveproto-\d+):8000\b", (DEPLOY / "nginx.conf").read_text(), re.M)
    assert upstream == replicas == ["serveproto-1", "serveproto-2", "serveproto-3"]
    for name in replicas:
        assert services[name]["healthcheck"]["test"][-1].count("http://127.0.0.1:8000/ready") == 1
        assert services[name]["command"][:3] == ["serve", "--host", "0.0.0.0"]
    balancer = services["balancer"]
    assert balancer["depends_on"] == {n: {"condition": "service_healthy"} for n in replicas}
    assert "./nginx.conf:/etc/nginx/conf.d/default.conf:ro" in balancer["volumes"]


def healthcheck(port: int) -> int:
    """The compose file's replica healthcheck command, run here against ``port``; its exit status."""
    argv = compose_file()["services"]["serveproto-1"]["healthcheck"]["test"]
    assert argv[:2] == ["CMD", "python3"]
    argv = [sys.executable, *[a.replace("127.0.0.1:8000", f"127.0.0.1:{port}") for a in argv[2:]]]
    return subprocess.run(argv, capture_output=True, timeout=30).returncode


def test_the_compose_healthcheck_fails_while_the_engine_loads_and_passes_after(fixture_engine):
    port = free_port()
    argv = ["--port", str(port), "--log-level", "WARNING", "--engine", str(fixture_engine), "--fault", "slow_start=3"]
    with serve_process(*argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
        with httpx2.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as c:
            loading = first_reply(c, "/health").json()  # bound: /health answers (200 "loading")
            while_loading = healthcheck(port)
            for _ in range(400):
                if c.get("/ready").status_code == 200:
                    break
                time.sleep(0.05)
            loaded = healthcheck(port)
    assert loading == {"status": "loading"}
    assert while_loading != 0 and loaded == 0


async def test_the_deploy_example_balances_three_replicas(fixture_engine, tmp_path):
    need_nginx()
    conf = (DEPLOY / "nginx.conf").read_text()
    async with (
        serving("--engine", str(fixture_engine), "--model", "alpha") as a,
        serving("--engine", str(fixture_engine), "--model", "beta") as b,
        serving("--engine", str(fixture_engine), "--model", "gamma") as g,
    ):
        for i, url in enumerate((a, b, g), 1):
            conf = conf.replace(f"server serveproto-{i}:8000", f"server {url.removeprefix('http://')}")
        port = free_port()
        conf = conf.replace("listen 8080;", f"listen 127.0.0.1:{port};")
        assert "serveproto-" not in conf.split("upstream", 1)[1].split("}", 1)[0]
        with nginx(tmp_path, conf):
            async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as c:
                with anyio.fail_after(20):
                    while True:
                        try:
                            ready = await c.get("/ready")
                            break
                        except httpx2.TransportError:
                            await anyio.sleep(0.05)
                assert ready.status_code == 200 and ready.json()["status"] == "ready"
                where: dict[str, set[str]] = {}
                questions = {"q": {"type": "noul", "instructions": "Urgent?"}}
                for i in range(12):
                    state = f"Ticket {i}: the integration keeps failing."
                    for _ in range(2):
                        r = await c.post(
                            "/v1/systemone",
                            content=orjson.dumps({"state": state, "questions": questions}),
                            headers={"content-type": "application/json", HEADER: routing_key(state)},
                        )
                        assert r.status_code == 200, r.text
                        where.setdefault(state, set()).add(r.json()["model"])
                # a batch through the balancer: one replica answers all its items (no key: any replica)
                items = [{"state": s} for s in where]
                r = await c.post("/v1/systemone/batch", content=orjson.dumps({"questions": questions, "items": items}))
                assert r.status_code == 200 and len(r.json()["items"]) == 12
    assert all(len(v) == 1 for v in where.values()), where
    assert len(set().union(*where.values())) >= 2  # the states spread over the replicas
