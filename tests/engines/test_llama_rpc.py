"""One model over several devices: the llama engine's layers on two ggml-rpc-servers (llama.cpp's
RPC backend) on loopback, against the local engine, bit for bit.

The servers are ``engines/bin/ggml-rpc-server``, linked against the engine's patched ggml, started
with ``GGML_CPU_USE_REF=1``: the remote layers then run the same reference kernels as a local
engine with ``--numerics invariant``, and every number printed with ``--float-digits 17`` equals the
local one (``==`` on the parsed doubles compares bits; no tolerance). Servers started without the
variable run ggml's shape-dependent kernels and the same cells differ, so the comparison can fail.
Also: the flags' errors, the unreachable server, the CAPS keys and the numerics default.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import anyio
import httpx2
import orjson
import pytest

from bench.digits import FILLER, GROUPS, STATE, numbers, read_out_scores, spawn
from bench.rpc import rpc_servers
from bench.servers import free_port
from gateway.cli import build_parser
from gateway.cli.serve import engine_argv, serve
from gateway.engine import Engine
from gateway.paths import engine_bin

pytestmark = pytest.mark.slow


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def rpc_server_bin(model_path) -> Path:
    path = engine_bin("ggml-rpc-server")
    if not os.access(path, os.X_OK):
        pytest.skip(f"{path} is not built yet (make -C engines all)")
    return path


async def digits(model, *args: str, servers=()) -> dict:
    """The numbers compared: the state's read-out (every position's logprob and top 3, repr'd so that
    nan == nan), each option's logprob from read-outs, SCORE, and each group scored first of 16; and
    the CAPS, and each of ``servers``' resident bytes once the engine has loaded."""
    async with spawn(model, "--score-cache-mb", "0", *args) as eng:
        rss = [s.rss_bytes() for s in servers]
        echoes = (await eng.read_out(STATE, logprobs=3)).echoes
        return {
            "echoes": [(e.position, repr(e.logprob), repr(e.top), e.text) for e in echoes],
            "read-out": await read_out_scores(eng, STATE, GROUPS),
            "score": numbers(await eng.score(STATE, GROUPS)),
            "first of 16": [numbers(await eng.score(STATE, [g] + FILLER))[0] for g in GROUPS],
            "caps": dict(eng.caps.values),
            "rss": rss,
        }


def max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


@pytest.mark.anyio
async def test_layers_on_two_rpc_servers_give_the_local_bits(model_path, rpc_server_bin):
    local = await digits(model_path)
    with rpc_servers(2) as servers:
        idle = [s.rss_bytes() for s in servers]
        endpoints = ",".join(s.endpoint for s in servers)
        remote = await digits(model_path, "--rpc", endpoints, "--numerics", "invariant", servers=servers)
    # the layers live on the servers: each holds its share of the 92 MiB of weights (34 and 58 MiB)
    assert all(b - a > 25 << 20 for a, b in zip(idle, remote["rss"])), (idle, remote["rss"])
    assert remote["caps"]["x_rpc"] == endpoints
    assert remote["caps"]["x_numerics"] == "invariant"
    assert len(local["echoes"]) > 20
    for key in ("echoes", "read-out", "score", "first of 16"):
        assert remote[key] == local[key], key
    # real logprobs of these options, and the cells agree among themselves (the local invariant)
    assert all(-30 < x < 0 for row in remote["score"] for x in row)
    assert remote["score"] == remote["read-out"] == remote["first of 16"]


@pytest.mark.anyio
async def test_servers_without_the_reference_kernels_move_the_digits(model_path, rpc_server_bin):
    """The comparison above can fail: stock kernels on the servers choose by batch shape."""
    with rpc_servers(2, use_ref=False) as servers:
        remote = await digits(model_path, "--rpc", ",".join(s.endpoint for s in servers), "--numerics", "invariant")
    assert remote["first of 16"] != remote["read-out"]
    assert max_diff(remote["first of 16"], remote["read-out"]) > 1e-3


@pytest.mark.anyio
async def test_rpc_defaults_to_fast_numerics_and_shows_the_flags_in_caps(model_path, rpc_server_bin):
    with rpc_servers(1) as servers:
        async with Engine.spawn(
            [
                str(engine_bin("serveproto-llama")),
                "--model",
                str(model_path),
                "--threads",
                "1",
                "--rpc",
                servers[0].endpoint,
                "--split-mode",
                "layer",
                "--tensor-split",
                "3",
                "--main-gpu",
                "0",
            ]
        ) as eng:
            caps = dict(eng.caps.values)
    assert caps["x_numerics"] == "fast"
    assert caps["x_rpc"] == servers[0].endpoint
    assert (caps["x_split_mode"], caps["x_tensor_split"], caps["x_main_gpu"]) == ("layer", "3", "0")


def run_engine(model_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(engine_bin("serveproto-llama")), "--model", str(model_path), "--threads", "1", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_unreachable_server_is_a_load_fail_naming_the_flag(model_path):
    endpoint = f"127.0.0.1:{free_port()}"
    r = run_engine(model_path, "--rpc", endpoint)
    assert r.returncode == 1
    assert r.stdout.startswith(f"LOAD_FAIL kind=io --rpc {endpoint}: cannot connect: Connection refused"), r.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["--tensor-split", "1,1"],  # more shares than devices (none without --rpc)
        ["--main-gpu", "0"],
    ],
)
def test_values_that_do_not_fit_the_devices_are_unsupported(model_path, args):
    r = run_engine(model_path, *args)
    assert r.returncode == 1
    assert r.stdout.startswith(f"LOAD_FAIL kind=unsupported {args[0]}"), r.stdout
    assert "a CPU build without --rpc" in r.stdout


@pytest.mark.parametrize(
    "flag,value",
    [
        ("--split-mode", "tensor"),
        ("--split-mode", ""),
        ("--tensor-split", "1,-1"),
        ("--tensor-split", "0,0"),
        ("--tensor-split", "a"),
        ("--tensor-split", "1,,2"),
        ("--tensor-split", ",".join(["1"] * 17)),
        ("--main-gpu", "-1"),
        ("--main-gpu", "16"),
        ("--main-gpu", "x"),
        ("--rpc", "localhost"),
        ("--rpc", ":50052"),
        ("--rpc", "h:0"),
        ("--rpc", "h:65536"),
        ("--rpc", "h:1,"),
        ("--rpc", "h:1x"),
    ],
)
def test_bad_values_name_the_flag(flag, value):
    if not os.access(engine_bin("serveproto-llama"), os.X_OK):
        pytest.skip("engines/bin/serveproto-llama is not built yet")
    r = subprocess.run(
        [str(engine_bin("serveproto-llama")), "--model", "unused.gguf", flag, value],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2
    assert r.stderr.startswith(f"serveproto-llama: {flag} must be"), r.stderr
    assert f"got '{value}'" in r.stderr


@pytest.mark.anyio
async def test_serve_passes_rpc_through_and_answers_with_the_local_numbers(model_path, rpc_server_bin):
    request = {
        "state": "The invoice was paid twice and the customer wants the money back before Friday.",
        "questions": {
            "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
            "team": {
                "type": "choice",
                "instructions": "Who handles it?",
                "criteria": {"billing": None, "customer success": None, "legal": None},
            },
        },
    }

    async def answers(*argv: str) -> dict:
        args = build_parser().parse_args(["serve", "--port", "0", "--log-level", "WARNING", "--threads", "1", *argv])
        async with anyio.create_task_group() as tg:
            port = await tg.start(lambda task_status: serve(args, task_status=task_status))
            async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as c:
                r = await c.post(
                    "/v1/systemone", content=orjson.dumps(request), headers={"content-type": "application/json"}
                )
            tg.cancel_scope.cancel()
        assert r.status_code == 200, r.text
        return r.json()

    local = await answers()
    with rpc_servers(2) as servers:
        remote = await answers("--rpc", ",".join(s.endpoint for s in servers), "--numerics", "invariant")
    # the same reply but for the request's id and its time (the numbers as served: 6 digits; the bits
    # are compared at the engine above)
    for reply in (local, remote):
        del reply["id"], reply["x_request_id"], reply["x_engine_ms"]
    assert remote == local
    assert 0 < local["answers"]["refund"]["noul"] < 1


def test_serve_passes_the_split_options_to_the_engine(model_path):
    args = build_parser().parse_args(
        [
            "serve",
            "--rpc",
            "10.0.0.2:50052,10.0.0.3:50052",
            "--split-mode",
            "row",
            "--tensor-split",
            "3,1",
            "--main-gpu",
            "1",
        ]
    )
    argv, _ = engine_argv(args)
    pairs = dict(zip(argv[1::2], argv[2::2]))
    assert (pairs["--rpc"], pairs["--split-mode"], pairs["--tensor-split"], pairs["--main-gpu"]) == (
        "10.0.0.2:50052,10.0.0.3:50052",
        "row",
        "3,1",
        "1",
    )
    assert "--rpc" not in engine_argv(build_parser().parse_args(["serve"]))[0]


@pytest.mark.parametrize(
    "flag,value",
    [
        ("--rpc", "h:0"),
        ("--rpc", "h"),
        ("--tensor-split", "1,-1"),
        ("--tensor-split", "nan"),
        ("--split-mode", "tensor"),
        ("--main-gpu", "-1"),
    ],
)
def test_serve_refuses_bad_values_naming_the_flag(flag, value, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["serve", flag, value])
    assert exc.value.code == 2
    assert f"argument {flag}:" in capsys.readouterr().err


def test_split_options_place_the_layers_as_asked(model_path, rpc_server_bin):
    """llama.cpp's own report (--verbose) of where each of the 30 layers and the output layer went."""
    import collections
    import re

    def placed(*args: str) -> tuple[subprocess.CompletedProcess, dict]:
        r = run_engine(model_path, "--rpc", endpoints, "--verbose", *args)
        return r, dict(collections.Counter(re.findall(r"assigned to device (\S+),", r.stderr)))

    with rpc_servers(2) as servers:
        endpoints = ",".join(s.endpoint for s in servers)
        assert placed()[1] == {"RPC0": 16, "RPC1": 15}  # in proportion to free memory: equal here
        assert placed("--tensor-split", "3,1")[1] == {"RPC0": 24, "RPC1": 7}
        assert placed("--split-mode", "none", "--main-gpu", "1")[1] == {"RPC1": 31}
        r, _ = placed("--split-mode", "row")
    assert r.returncode == 1
    assert r.stdout.startswith("LOAD_FAIL kind=unsupported --split-mode row needs devices with split buffers"), r.stdout
