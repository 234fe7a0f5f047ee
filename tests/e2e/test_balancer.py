"""docs/http-api.md's nginx configuration, run: two ``serve`` replicas behind nginx's consistent hash on
``x-serveproto-route-key``; every request on one state reaches one replica. nginx is the one on PATH, else the
one ``make nginx`` unpacked into the cache (``make test`` does); without either the test skips, and fails under
``CI`` (CI's ``make test`` must check the scale-out path)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess

import anyio
import httpx2
import orjson
import pytest

from gateway.paths import ROOT, cache_dir
from gateway.server.routing import HEADER, routing_key
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
