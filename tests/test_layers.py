"""The gateway's rooms import one way (gateway/__init__.py draws the picture).

Every ``import`` and ``from ... import`` in every module of ``gateway/``, at
any depth (function-level imports included), is read with :mod:`ast` and
checked against the table below. A module of one room that reaches a room
above it, or outside the installed packages (``fixtures``, ``bench``,
``tests``), fails with the file, line and import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

GATEWAY = Path(__file__).resolve().parents[1] / "gateway"

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
