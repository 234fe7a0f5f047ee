"""``serveproto serve`` as a command: the port is bound before the engine starts, and a port in use is one line."""

from __future__ import annotations

import socket
import subprocess

from gateway.paths import ROOT
from support import SERVEPROTO
from test_serve_smaller import llama_argv


def serve_cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SERVEPROTO, "serve", *argv], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_port_in_use_is_one_line_and_status_2_before_the_engine_starts(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # an engine that cannot start: had it been spawned first, the error would be about it
        missing = tmp_path / "no-such-engine"
        r = serve_cli("--port", str(port), "--engine", str(missing))
    assert r.returncode == 2
    assert r.stderr == f"serveproto: port {port} on 127.0.0.1 is in use (set PORT=..., e.g. PORT=8123 make serve)\n"
    assert r.stdout == ""


def test_address_that_cannot_be_bound_is_one_line_and_status_2(tmp_path):
    # 192.0.2.1 (TEST-NET-1, RFC 5737) is not an address of this machine: EADDRNOTAVAIL
    r = serve_cli("--host", "192.0.2.1", "--port", "0", "--engine", str(tmp_path / "no-such-engine"))
    assert r.returncode == 2
    assert r.stderr.startswith("serveproto: cannot listen on 192.0.2.1:0: ") and r.stderr.count("\n") == 1, r.stderr


def threads_of(argv: list[str]) -> str:
    return argv[argv.index("--threads") + 1]


def test_default_threads_are_the_engines_own_choice(tmp_path, monkeypatch):
    # the engine adapts between 1 thread and every core (engines/llama/threads.c)
    for cores in (1, 2, 16):
        assert threads_of(llama_argv(tmp_path, monkeypatch, cores=cores)) == "auto"


def test_threads_flag_then_environment(tmp_path, monkeypatch):
    assert threads_of(llama_argv(tmp_path, monkeypatch, "--threads", "3", env="5", cores=16)) == "3"
    assert threads_of(llama_argv(tmp_path, monkeypatch, "--threads", "auto", env="5", cores=16)) == "auto"
    assert threads_of(llama_argv(tmp_path, monkeypatch, env="5", cores=16)) == "5"
    assert threads_of(llama_argv(tmp_path, monkeypatch, env="", cores=16)) == "auto"


def cache_of(argv: list[str]) -> list[str]:
    return argv[argv.index("--cache-dir") :] if "--cache-dir" in argv else []


def test_the_cache_dir_defaults_to_the_cache_and_can_be_turned_off(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVEPROTO_CACHE", str(tmp_path / "c"))
    monkeypatch.delenv("SERVEPROTO_PERSIST", raising=False)
    assert cache_of(llama_argv(tmp_path, monkeypatch)) == ["--cache-dir", str(tmp_path / "c" / "persist")]
    monkeypatch.setenv("SERVEPROTO_PERSIST", str(tmp_path / "p"))
    assert cache_of(llama_argv(tmp_path, monkeypatch)) == ["--cache-dir", str(tmp_path / "p")]
    assert cache_of(
        llama_argv(tmp_path, monkeypatch, "--cache-dir", "d", "--cache-disk-mb", "5", "--cache-read-only")
    ) == [
        "--cache-dir",
        "d",
        "--cache-disk-mb",
        "5",
        "--cache-read-only",
    ]
    assert cache_of(llama_argv(tmp_path, monkeypatch, "--cache-dir", "off")) == []
    monkeypatch.setenv("SERVEPROTO_PERSIST", "off")
    assert cache_of(llama_argv(tmp_path, monkeypatch)) == []


def test_ubatch_goes_to_the_engine_and_its_range_is_checked(tmp_path, monkeypatch, capsys):
    import pytest

    from gateway.cli import build_parser

    argv = llama_argv(tmp_path, monkeypatch, "--ubatch", "1024")
    assert argv[argv.index("--ubatch") + 1] == "1024"
    assert "--ubatch" not in llama_argv(tmp_path, monkeypatch)  # the engine's own default
    for value, says in (("0", "must be at least 1, got 0"), ("4096", "must be at most 2048, got 4096")):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", "--ubatch", value])
        assert f"argument --ubatch: {says}" in capsys.readouterr().err


def test_bad_threads_flag_says_what_it_takes(capsys):
    import pytest

    from gateway.cli import build_parser

    for value, says in (("many", "not an integer: 'many'"), ("0", "must be at least 1, got 0")):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", "--threads", value])
        assert f"argument --threads: {says} (give an integer >= 1, or auto)" in capsys.readouterr().err
    assert build_parser().parse_args(["serve", "--threads", "AUTO"]).threads == "auto"


def test_bad_threads_environment_names_the_variable(tmp_path, monkeypatch):
    import pytest

    with pytest.raises(SystemExit, match="SERVEPROTO_THREADS: must be at least 1, got 0"):
        llama_argv(tmp_path, monkeypatch, env="0")
    with pytest.raises(SystemExit, match="SERVEPROTO_THREADS: not an integer: 'many'"):
        llama_argv(tmp_path, monkeypatch, env="many")


def help_of(command: str) -> str:
    from gateway.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return sub.choices[command].format_help()


def test_serve_help_is_plain_text_with_a_description():
    text = help_of("serve")
    assert "``" not in text
    assert "Start the decision server" in text and "POST /v1/systemone" in text and "docs/http-api.md" in text
    assert "$SERVEPROTO_THREADS" in text


def test_score_help_has_a_description_and_an_example():
    text = help_of("score")
    assert "``" not in text
    assert "Score a closed question with a language model" in text
    assert "serveproto score --engine engines/bin/serveproto-fixture" in text


def test_score_help_example_is_real_output(fixture_engine):
    from gateway.cli.drive import SCORE_HELP

    r = subprocess.run(
        [*SERVEPROTO, "score", "--engine", str(fixture_engine), "--prefix", "Q: is the sky blue? A:"]
        + ["--option", " yes", "--option", " no"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    shown = [line[2:] for line in SCORE_HELP.split("\n\n")[-1].splitlines() if line.strip()]
    assert r.stdout.splitlines() == shown
