"""The distribution as a user installs it: the wheel's files and dependencies, and ``serve``
from a fresh virtual environment outside the clone.

The wheel is built from the sdist of a copy of the clone's files (``git ls-files``), as from a
fresh clone, so nothing this checkout built (``build/``, ``engines/bin/``) can slip into it. The
packages come from pip's usual sources (its cache and configured indexes; no network needed
when they are there already).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import urllib.request
import venv
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

import serveproto

ROOT = Path(__file__).resolve().parents[2]


def test_the_command_without_the_server_extra_names_what_is_missing(monkeypatch, capsys):
    import gateway.cli

    def missing() -> None:
        raise ModuleNotFoundError("No module named 'anyio'", name="anyio")

    monkeypatch.setattr(gateway.cli, "build_parser", missing)
    assert gateway.cli.main(["serve"]) == 1
    assert capsys.readouterr().err == (
        "serveproto: the package anyio is missing: the command needs the server extra "
        "(pip install 'serveproto[server]')\n"
    )


def copy_of_the_clone(dest: Path) -> Path:
    """``dest`` holding the clone's tracked (and new, unignored) files, as a fresh clone has them."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, files):
        path = ROOT / os.fsdecode(name)
        if path.is_file():
            (dest / path.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest / path.relative_to(ROOT))
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel ``pip wheel --no-deps`` builds from the sdist of a copy of the tracked (and new,
    unignored) files: the sdist's MANIFEST.in is tested on the way."""
    tmp = tmp_path_factory.mktemp("dist")
    src = copy_of_the_clone(tmp / "src")
    subprocess.run(
        [sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp / "sdist")],
        cwd=src,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (sdist,) = (tmp / "sdist").glob("serveproto-*.tar.gz")
    out = tmp / "wheel"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(sdist)],
        check=True,
        timeout=600,
    )
    (whl,) = out.glob("serveproto-*.whl")
    return whl


def metadata(whl: Path) -> dict[str, list[str]]:
    """``Requires-Dist`` split by extra: ``{"": [unconditional], "server": [...], ...}``, names only."""
    with zipfile.ZipFile(whl) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        msg = Parser().parsestr(zf.read(name).decode())
    out: dict[str, list[str]] = {}
    for req in msg.get_all("Requires-Dist") or []:
        m = re.match(r"\s*([A-Za-z0-9_.-]+)[^;]*(?:;\s*extra\s*==\s*\"(\w+)\")?\s*$", req)
        assert m, req
        out.setdefault(m.group(2) or "", []).append(m.group(1).lower().replace("_", "-"))
    return out


@pytest.mark.slow
def test_wheel_holds_the_packages_and_engine_sources_only(wheel: Path):
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"serveproto", "gateway"}
    assert "serveproto/py.typed" in names and "serveproto/_connection.py" in names
    assert "gateway/server/static/index.html" in names
    engines = "gateway/engine/engines/"
    for need in (
        "Makefile",
        "common/frame.c",
        "common/common.mk",
        "fixture/fixture.c",
        "llama/llama.mk",
        "llama/main.c",
        "llama/tools/quantize.c",
        "llama/patches/numerics/0001-ggml-cpu-use-ref.patch",
    ):
        assert engines + need in names, need
    assert not [n for n in names if n.startswith(engines) and (n.endswith((".o", ".a")) or "/bin/" in n)]
    assert not [n for n in names if n.startswith(("fixtures/", "tests/", "bench/"))]


@pytest.mark.slow
def test_an_in_tree_build_ships_no_stale_build_folder(tmp_path: Path):
    """``pip install .`` builds in the clone's build/: what an older build left there is not shipped."""
    src = copy_of_the_clone(tmp_path / "src")
    stale = src / "build" / "lib" / "fixtures"
    stale.mkdir(parents=True)
    (stale / "__init__.py").write_text("")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "w"), str(src)],
        check=True,
        timeout=600,
    )
    (whl,) = (tmp_path / "w").glob("serveproto-*.whl")
    with zipfile.ZipFile(whl) as zf:
        tops = {n.split("/")[0] for n in zf.namelist() if ".dist-info/" not in n}
    assert tops == {"serveproto", "gateway"}


@pytest.mark.slow
def test_wheel_requires_attrs_alone_and_the_server_extra_what_serve_needs(wheel: Path):
    req = metadata(wheel)
    assert req[""] == ["attrs"]
    assert {
        "anyio",
        "h11",
        "orjson",
        "zstandard",
        "prometheus-client",
        "gguf",
        "jinja2",
        "prompt-toolkit",
        "rich",
    } <= set(req["server"])
    assert "trio" not in req["server"] and "trio" in req["test"]
    assert "numpy" not in req[""] and "numpy" in req["test"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_serve_from_a_fresh_venv_outside_the_clone(wheel: Path, tmp_path: Path):
    """``pip install serveproto[server]`` into a new venv, then ``serveproto serve --engine
    serveproto-fixture`` from an empty folder: the fixture engine is built from the wheel's sources
    into $SERVEPROTO_CACHE on first use, and the server answers a System One request with the
    toy model's numbers."""
    from test_server_e2e import TICKET, check_against_oracle

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # the protocol alone: attrs is all it brings, and the command says what it misses
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel)], check=True, timeout=600)
    listed = subprocess.run([str(py), "-m", "pip", "list", "--format=json"], capture_output=True, check=True).stdout
    assert {p["name"].lower() for p in json.loads(listed)} - {"pip", "setuptools"} == {"serveproto", "attrs"}
    probe = "import serveproto as sp; c = sp.GatewayConnection(); print(sp.__version__, c.state)"
    out = subprocess.run([str(py), "-c", probe], cwd=work, env=env, capture_output=True, text=True, check=True).stdout
    assert out == f"{serveproto.__version__} HANDSHAKE\n"
    r = subprocess.run(
        [str(env_dir / "bin" / "serveproto"), "serve"], cwd=work, env=env, capture_output=True, text=True
    )
    assert r.returncode == 1 and "needs the server extra (pip install 'serveproto[server]')" in r.stderr, r.stderr
    subprocess.run([str(py), "-m", "pip", "install", "-q", f"{wheel}[server]"], check=True, timeout=600)
    env["SERVEPROTO_CACHE"] = str(tmp_path / "cache")
    port = _free_port()
    proc = subprocess.Popen(
        [str(env_dir / "bin" / "serveproto"), "serve", "--port", str(port), "--engine", "serveproto-fixture"],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()  # after the build (seconds) and the engine's handshake
        assert line == f"serveproto: serving fixture on http://127.0.0.1:{port}\n", (
            proc.stderr.read() if not line else line
        )
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/systemone",
            data=json.dumps(TICKET).encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            body = json.loads(r.read())
        check_against_oracle(body, TICKET)
        proc.terminate()
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        stderr = proc.stderr.read()
    assert "serveproto: building serveproto-fixture into" in stderr
    built = list((tmp_path / "cache" / "engines").glob("*/bin/serveproto-fixture"))
    assert len(built) == 1
    assert built[0].parts[-3].startswith(serveproto.__version__ + "-")
