"""The gateway's rooms import one way (gateway/__init__.py draws the picture).

Every ``import`` and ``from ... import`` in every module of ``gateway/``, at
any depth (function-level imports included), is read with :mod:`ast` and
checked against the table below. A module of one room that reaches a room
above it, or outside the installed packages (``fixtures``, ``bench``,
``tests``), fails with the file, line and import. Inside the server, each API
has its package (``server/jev/``: ``protocol`` <- ``serving`` <- ``routes``),
which imports no other API's; and the served app imports no numpy (the lab's).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"

#: room -> the rooms its modules may import (its own room always allowed).
ALLOWED = {
    "paths": set(),
    "http": set(),
    "engine": {"paths"},
    "decision": {"engine", "paths"},
    "lab": {"decision", "engine", "paths"},
    "server": {"decision", "engine", "http", "paths"},
    "cli": {"server", "lab", "decision", "engine", "http", "paths"},
}
FORBIDDEN_TOP = {"fixtures", "bench", "tests"}


def room_of(module: str) -> str | None:
    """``gateway.server.app`` -> ``server``; ``gateway.paths`` -> ``paths``; not gateway -> None."""
    parts = module.split(".")
    if parts[0] != "gateway":
        return None
    return parts[1] if len(parts) > 1 else ""


def imports(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in ``path`` (or in ``source``, read as if it were
    ``path``); ``from gateway import x`` gives ``gateway.x``; relative imports are resolved."""
    package = ".".join(path.relative_to(GATEWAY.parent).with_suffix("").parts[:-1])
    out = []
    text = path.read_text() if source is None else source
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if base == "gateway":
                out += [(node.lineno, f"gateway.{alias.name}") for alias in node.names]
            else:
                out.append((node.lineno, base))
    return out


def modules() -> list[Path]:
    return sorted(p for p in GATEWAY.rglob("*.py"))


def test_every_module_is_in_a_room():
    rooms = {room_of(".".join(p.relative_to(GATEWAY.parent).with_suffix("").parts)) for p in modules()}
    assert rooms <= set(ALLOWED) | {"__init__"}, rooms - set(ALLOWED)


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(GATEWAY)))
def test_imports_run_one_way(path: Path):
    here = room_of(".".join(path.relative_to(GATEWAY.parent).with_suffix("").parts))
    if here == "__init__":
        return
    wrong = []
    for line, module in imports(path):
        top = module.split(".")[0]
        there = room_of(module)
        if top in FORBIDDEN_TOP:
            wrong.append(f"{path.name}:{line} imports {module} (not installed with the package)")
        elif there is not None and there != here and there not in ALLOWED[here]:
            wrong.append(f"{path.name}:{line} imports {module}: {here} may not import {there}")
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_a_wrong_import():
    """The checker itself: a decision module importing the server is caught (so the test can fail)."""
    probe = (
        "def f():\n    from gateway.server import app\n    from ..http import Request\n    from gateway import cli\n"
    )
    found = [m for _, m in imports(GATEWAY / "decision" / "probe.py", probe)]
    assert found == ["gateway.server", "gateway.http", "gateway.cli"]
    assert "server" not in ALLOWED["decision"] and "http" not in ALLOWED["decision"]


# --- the server's per-API packages (gateway/server/<api>/{protocol,serving,routes}.py) -----------------

#: An API package's modules, in the order they may import one another: ``protocol`` (the wire) imports
#: none of them, ``serving`` the protocol, ``routes`` both.
API_KINDS = ("protocol", "serving", "routes")
API_PACKAGES = sorted(p.name for p in (GATEWAY / "server").iterdir() if p.is_dir() and (p / "__init__.py").exists())


def api_part(module: str) -> tuple[str, str] | None:
    """``gateway.server.jev.serving`` -> ``("jev", "serving")``; ``gateway.server.jev`` -> ``("jev", "")``;
    anything not in an API package -> None."""
    parts = module.split(".")
    if parts[:2] != ["gateway", "server"] or len(parts) < 3 or parts[2] not in API_PACKAGES:
        return None
    return parts[2], parts[3] if len(parts) > 3 else ""


def module_imports(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """:func:`imports`, with ``from package import module`` read as ``package.module`` where ``module``
    is a module of gateway/ (``from gateway.server.jev import serving`` -> ``gateway.server.jev.serving``)."""
    out = []
    for line, module in imports(path, source):
        out.append((line, module))
    text = path.read_text() if source is None else source
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            folder = GATEWAY.parent.joinpath(*node.module.split("."))
            for alias in node.names:
                if (folder / f"{alias.name}.py").exists() or (folder / alias.name / "__init__.py").exists():
                    out.append((node.lineno, f"{node.module}.{alias.name}"))
    return out


def api_wrong(path: Path, found: list[tuple[int, str]]) -> list[str]:
    """What ``path`` (a module of gateway/server/) imports against the per-API rules: an API package's
    modules only in :data:`API_KINDS` order; no API package another's; the app alone its routes."""
    here = api_part(".".join(path.relative_to(GATEWAY.parent).with_suffix("").parts))
    wrong = []
    for line, module in found:
        there = api_part(module)
        if there is None:
            continue
        what = f"{path.name}:{line} imports {module}"
        if here is not None and here[0] != there[0]:
            wrong.append(f"{what}: the {here[0]} API may not import the {there[0]} API")
        elif here is not None and here[1] in API_KINDS and there[1] in API_KINDS:
            if API_KINDS.index(there[1]) >= API_KINDS.index(here[1]):
                wrong.append(f"{what}: {here[1]} may not import {there[1]} ({' -> '.join(reversed(API_KINDS))})")
        elif here is None and there[1] == "routes" and path.name != "app.py":
            wrong.append(f"{what}: only the app registers an API's routes")
    return wrong


def test_the_server_has_per_api_packages():
    assert {"jev", "openai", "rerank"} <= set(API_PACKAGES)
    for name in API_PACKAGES:
        assert {p.stem for p in (GATEWAY / "server" / name).glob("*.py")} <= {"__init__", *API_KINDS}, name


@pytest.mark.parametrize(
    "path", sorted((GATEWAY / "server").rglob("*.py")), ids=lambda p: str(p.relative_to(GATEWAY / "server"))
)
def test_server_api_packages_import_one_way(path: Path):
    wrong = api_wrong(path, module_imports(path))
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_a_wrong_api_import():
    """The per-API checker itself: a protocol importing its serving, a route module importing another
    API's routes, both caught."""
    probe = "from gateway.server.jev import serving\nfrom gateway.server.jev.routes import register\n"
    path = GATEWAY / "server" / "jev" / "protocol.py"
    assert len(api_wrong(path, module_imports(path, probe))) == 2
    other = GATEWAY / "server" / "routes_ops.py"
    assert api_wrong(other, module_imports(other, probe)) == [
        "routes_ops.py:2 imports gateway.server.jev.routes: only the app registers an API's routes"
    ]


def test_the_served_app_imports_no_numpy():
    """numpy is the lab's (gateway/lab/): importing the server, in a fresh interpreter, loads none of it."""
    probe = "import sys, gateway.server.app; print(sorted(m for m in sys.modules if m.split('.')[0] == 'numpy' or m.startswith('gateway.lab')))"
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=GATEWAY.parent,
        env={**os.environ, "PYTHONPATH": str(GATEWAY.parent)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == "[]\n", out.stdout + out.stderr


#: The configuration and the engine planning are read by ``serveproto``'s parser, before any command runs:
#: at module level they import no room above the engine (the server and the decision rooms bring anyio, h11, jinja2),
#: and the engine's options nothing but the standard library. Imports inside functions, and under
#: ``if TYPE_CHECKING:``, are read only when used.
LIGHT = {
    "engine/options.py": set(),
    "cli/config.py": {"gateway.engine.options"},
    "cli/plan.py": {"gateway.cli.config", "gateway.engine.build", "gateway.paths"},
}


def module_level_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of the imports run when ``path`` is imported: its top level, outside ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text(), str(path))
    top = [n for n in tree.body if not (isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")]
    lines = {n.lineno for n in top if isinstance(n, (ast.Import, ast.ImportFrom))}
    return [(line, module) for line, module in imports(path) if line in lines]


@pytest.mark.parametrize("rel", sorted(LIGHT))
def test_the_configuration_is_read_without_the_server(rel: str):
    import sys

    path = GATEWAY / rel
    wrong = []
    for line, module in module_level_imports(path):
        top = module.split(".")[0]
        if top == "gateway" and module not in LIGHT[rel]:
            wrong.append(f"{rel}:{line} imports {module} at module level")
        elif top != "gateway" and top not in sys.stdlib_module_names and (rel.startswith("engine/") or top != "attrs"):
            wrong.append(f"{rel}:{line} imports {module} at module level (not the standard library)")
    assert not wrong, "\n".join(wrong)


# --- the quick tier and bench/ (issue 49): no test of tests/protocol or tests/gateway reaches a benchmark ------

QUICK_TIER = [GATEWAY.parent / "tests" / "protocol", GATEWAY.parent / "tests" / "gateway"]
#: A benchmark named as a module (``-m bench.load``) or as a file (``bench/load.py``, ``bench/gpu/run.sh``).
BENCH_NAME = re.compile(r"bench(\.\w+)+|(.*/)?bench/[\w/]+\.(py|sh)")
#: ``bench`` and its modules' bare names (imported bare, they came from a ``sys.path`` reaching into ``bench/``).
BENCH_TOPS = {"bench"} | {p.stem for p in (GATEWAY.parent / "bench").glob("*.py")} - {"__init__"}


def bench_uses(source: str, name: str = "<probe>") -> list[tuple[int, str, bool]]:
    """(line, what, through the package) of each reach into ``bench/`` in a test's source, in line order: an
    import of ``bench`` (through the package) or of a benchmark by its bare name (any depth, in functions too),
    a path joined onto ``"bench"`` (``ROOT / "bench"``), or a string naming a benchmark to run (``bench.load``,
    through the package; ``bench/load.py``, not)."""
    out = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Import):
            out += [
                (node.lineno, f"import {a.name}", a.name.split(".")[0] == "bench")
                for a in node.names
                if a.name.split(".")[0] in BENCH_TOPS
            ]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in BENCH_TOPS:
            out.append((node.lineno, f"from {node.module} import ...", node.module.split(".")[0] == "bench"))
        elif (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Div)
            and isinstance(node.right, ast.Constant)
            and node.right.value == "bench"
        ):
            out.append((node.lineno, ast.unparse(node), False))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and BENCH_NAME.fullmatch(node.value):
            out.append((node.lineno, repr(node.value), node.value.startswith("bench.")))
    return sorted(out)


#: Every test module but this one (it names bench/ to look for it).
TEST_FILES = sorted(p for p in (GATEWAY.parent / "tests").rglob("*.py") if p != Path(__file__).resolve())


@pytest.mark.parametrize(
    "path",
    [p for p in TEST_FILES if any(tier in p.parents for tier in QUICK_TIER)],
    ids=lambda p: str(p.relative_to(GATEWAY.parent / "tests")),
)
def test_the_quick_tier_imports_no_benchmark(path: Path):
    """The benchmarks' own tests live in tests/e2e and tests/engines (test_bench_*.py, test_gpu_bench.py)."""
    uses = bench_uses(path.read_text(), str(path))
    wrong = [f"{path.name}:{line} reaches bench/: {what}" for line, what, _ in uses]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("path", TEST_FILES, ids=lambda p: str(p.relative_to(GATEWAY.parent / "tests")))
def test_a_test_reaches_a_benchmark_only_through_the_package(path: Path):
    """``from bench import load``, ``python -m bench.load``: no ``sys.path`` into bench/, no script by its file."""
    uses = bench_uses(path.read_text(), str(path))
    wrong = [f"{path.name}:{line} reaches bench/ by a path: {what}" for line, what, package in uses if not package]
    assert not wrong, "\n".join(wrong)


def test_the_bench_checker_sees_every_spelling():
    """The checker itself: each way a test reached bench/ before issue 49 is caught, a README path is not."""
    probe = (
        "import bench.load\nfrom bench import quality\n"
        "def f():\n    from bench.gpu import make_model\n    run([sys.executable, '-m', 'bench.protocol'])\n"
        "x = ROOT / 'bench/protocol.py'\ny = 'see bench/README.md'\nsys.path.insert(0, str(ROOT / 'bench'))\n"
        "import quality\nimport json\n"
    )
    got = [(line, package) for line, _, package in bench_uses(probe)]
    assert got == [(1, True), (2, True), (4, True), (5, True), (6, False), (8, False), (9, False)]


# ---- the engine's seam with llama.cpp (engines/llama/llamax.c; engines/llama/patches/README.md) ----

ENGINES = GATEWAY.parent / "engines"
LLAMA_PATCHES = ENGINES / "llama" / "patches"
LLAMAX = Path("llama", "llamax.c")


def patch_seams() -> tuple[set[str], set[str]]:
    """(symbols, switches) our llama.cpp patches add: the functions and macros their ``+`` lines declare in
    llama.cpp's public headers (``include/``, ``ggml/include/``), and the environment variables their ``+``
    lines read with ``getenv``."""
    import re

    symbols: set[str] = set()
    switches: set[str] = set()
    for patch in sorted(LLAMA_PATCHES.rglob("*.patch")):
        target = ""
        for line in patch.read_text().splitlines():
            if line.startswith("+++ "):
                target = line[4:].split("\t")[0].removeprefix("b/")
            elif line.startswith("+"):
                switches.update(re.findall(r'getenv\("(\w+)"\)', line))
                if target.startswith(("include/", "ggml/include/")):
                    symbols.update(re.findall(r"^\+\s*#\s*define\s+(\w+)", line))
                    symbols.update(re.findall(r"\b(?:LLAMA_API|GGML_API|GGML_BACKEND_API)\b[^(;]*?\b(\w+)\s*\(", line))
    return symbols, switches


def c_code(source: str) -> str:
    """``source`` with its comments blanked, their line breaks kept (string and character literals kept)."""
    import re

    token = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|/\*.*?\*/|//[^\n]*', re.S)
    return token.sub(lambda m: m.group() if m.group()[0] in "\"'" else " " + "\n" * m.group().count("\n"), source)


def seam_wrong(rel: str, source: str, symbols: set[str], switches: set[str]) -> list[str]:
    """``rel:line`` of each use, in C ``source``, of a patched symbol or a string literal naming a patch's switch."""
    import re

    wrong = []
    for n, line in enumerate(c_code(source).splitlines(), 1):
        for name in sorted(set(re.findall(r"\b\w+\b", line)) & symbols):
            wrong.append(f"{rel}:{n} calls or names {name}, which a llama.cpp patch adds: only {LLAMAX} may")
        for name in sorted(set(re.findall(r'"(\w+)"', line)) & switches):
            wrong.append(f"{rel}:{n} names the patch switch {name}: only {LLAMAX} sets or reads it")
    return wrong


def test_only_the_adapter_reaches_what_the_llama_patches_add():
    symbols, switches = patch_seams()
    # what the engine uses today, so the derivation cannot come back empty unnoticed
    assert {"llama_set_output_ring", "llama_get_logits_prev_ith", "serveproto_decode_profile"} <= symbols
    assert {"SERVEPROTO_PATCH_OUTPUT_RING", "SERVEPROTO_PATCH_CPU_USE_REF"} <= symbols
    assert {"GGML_CPU_USE_REF", "LLAMA_KV_CELLS_IN_ORDER", "GGML_CUDA_INVARIANT", "SERVEPROTO_PROFILE"} <= switches
    wrong = []
    sources = sorted([*ENGINES.rglob("*.c"), *ENGINES.rglob("*.h")])
    assert ENGINES / LLAMAX in sources
    for path in sources:
        rel = path.relative_to(ENGINES)
        if rel != LLAMAX and "bin" not in rel.parts:
            wrong += seam_wrong(str(rel), path.read_text(errors="replace"), symbols, switches)
    assert not wrong, "\n".join(wrong)


def test_the_seam_checker_sees_a_patched_call_and_a_switch():
    symbols, switches = patch_seams()
    source = (
        "/* llama_set_output_ring in a comment is fine */\n"
        "static void f(struct llama_context *c) { llama_set_output_ring(c, 1); }\n"
        'static void g(void) { setenv("LLAMA_KV_CELLS_IN_ORDER", "1", 0); puts("LLAMA_KV_CELLS_IN_ORDER=1 asked"); }\n'
    )
    assert seam_wrong("x.c", source, symbols, switches) == [
        f"x.c:2 calls or names llama_set_output_ring, which a llama.cpp patch adds: only {LLAMAX} may",
        f"x.c:3 names the patch switch LLAMA_KV_CELLS_IN_ORDER: only {LLAMAX} sets or reads it",
    ]
