"""The engines' C files call one way (engines/: common below, each engine on it).

Read as text, no compiler: every ``#include "..."`` line, and every function a ``.c`` file defines
without ``static`` (its callers elsewhere call it by name) or calls. Checked:

- a file of ``engines/common`` includes no engine's header; an engine's file includes its own headers,
  the common ones and outside ones (llama.cpp's), never another engine's;
- in each folder, the calls from file to file form no circle: the llama engine's scheduler reads
  stdin through the hook main.c sets (``engine_input``), never by calling back up into main.c, and
  the score cache knows nothing of the disk behind it (persist.c wraps it); includes form no circle either.

A circle fails with its files and the functions that close it.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

ENGINES = Path(__file__).resolve().parents[2] / "engines"
FOLDERS = sorted(p.name for p in ENGINES.iterdir() if p.is_dir() and any(p.glob("*.c")))

_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_STRING = re.compile(r'"(?:\\.|[^"\\\n])*"')
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
#: a definition at the start of a line: return type, name, parameters, then the body's brace
_DEFINITION = re.compile(r"^(?!static\b)[A-Za-z_][\w \t*]*?\b(\w+)\s*\([^;{]*\)\s*\{", re.M)
_CALL = re.compile(r"\b(\w+)\s*\(")
#: a static function's declaration or definition: the file's own, whatever another file defines
_STATIC = re.compile(r"^static\b[^;{=(]*?\b(\w+)\s*\(", re.M)


def code_of(text: str) -> str:
    """``text`` without comments and string literals (their lines kept, so line numbers hold)."""
    text = _COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return _STRING.sub('""', text)


def includes(text: str) -> list[str]:
    """The headers ``text`` includes with quotes, in order."""
    return _INCLUDE.findall(_COMMENT.sub("", text))


def call_graph(sources: dict[str, str]) -> dict[str, dict[str, set[str]]]:
    """file -> {other file -> the functions of that file it calls}, for the ``.c`` texts in ``sources``
    (name -> text): a call is a name followed by ``(`` that another file defines without ``static`` (and
    the calling file does not declare ``static`` itself)."""
    code = {name: code_of(text) for name, text in sources.items()}
    defined = {}
    for name, text in code.items():
        for m in _DEFINITION.finditer(text):
            defined.setdefault(m.group(1), name)
    graph: dict[str, dict[str, set[str]]] = {name: {} for name in code}
    for name, text in code.items():
        own = set(_STATIC.findall(text))
        for m in _CALL.finditer(text):
            there = None if m.group(1) in own else defined.get(m.group(1))
            if there is not None and there != name:
                graph[name].setdefault(there, set()).add(m.group(1))
    return graph


def circle(graph: dict[str, dict[str, set[str]]] | dict[str, set[str]]) -> list[str] | None:
    """One circle of ``graph`` (node -> the nodes it reaches) as its nodes, the first again at the end;
    None when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def sources(folder: str, suffixes: tuple[str, ...] = (".c",)) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((ENGINES / folder).iterdir()) if p.suffix in suffixes}


def test_every_engine_folder_is_read():
    assert {"common", "fixture", "llama", "sparrow"} <= set(FOLDERS)


@pytest.mark.parametrize("folder", FOLDERS)
def test_calls_between_files_form_no_circle(folder: str):
    graph = call_graph(sources(folder))
    assert any(graph.values()), f"{folder}: no call between its files was found (the reader is broken)"
    found = circle(graph)
    if found:
        steps = [f"{a} -> {b} ({', '.join(sorted(graph[a][b]))})" for a, b in itertools.pairwise(found)]
        pytest.fail(f"engines/{folder}: the files call in a circle:\n" + "\n".join(steps))


@pytest.mark.parametrize("folder", FOLDERS)
def test_includes_stay_in_their_layer(folder: str):
    own = {p.name for p in (ENGINES / folder).glob("*.h")}
    common = {p.name for p in (ENGINES / "common").glob("*.h")}
    others = {p.name for f in FOLDERS if f not in (folder, "common") for p in (ENGINES / f).glob("*.h")}
    forbidden = (others | common) - own if folder == "common" else others - own - common
    wrong = []
    graph: dict[str, set[str]] = {}
    for name, text in sources(folder, (".c", ".h")).items():
        for header in includes(text):
            if header in forbidden:
                wrong.append(f"engines/{folder}/{name} includes {header!r}")
            if header in own:
                graph.setdefault(name, set()).add(header)
    assert not wrong, "\n".join(wrong)
    assert circle(graph) is None, f"engines/{folder}: includes in a circle: {circle(graph)}"


def test_the_llama_scheduler_reads_stdin_through_its_hook():
    """The circles that were (issue 49): sched.c -> main.c (engine_poll, engine_log_aborting) and
    persist.c <-> score_cache.c; none of the scheduler's files calls main.c at all."""
    graph = call_graph(sources("llama"))
    scheduler = {"sched.c", "tasks.c", "gpu_pipe.c", "readout.c", "late_fill.c", "pad.c", "test_device.c"}
    assert scheduler <= set(graph)
    assert [f for f in scheduler if "main.c" in graph[f]] == []
    assert "persist.c" not in graph["score_cache.c"]
    assert "sched.c" in graph["main.c"] and "score_cache.c" in graph["persist.c"]  # the way down stays


def test_the_checker_sees_a_circle():
    """The checker itself (so the tests above can fail): two files calling each other, one through a
    third, are found; a static function of the same name, a call in a comment or a string is no edge."""
    probe = {
        "a.c": "int a_one(int x)\n{\n    return b_two(x) + 1;\n}\n",
        "b.c": '#include "b.h"\nint b_two(int x)\n{\n    return c_three(x); /* a_one(x) */\n}\n',
        "c.c": 'static int b_two(int x);\nvoid c_three(void)\n{\n    puts("a_one(");\n    a_one(1);\n}\n',
        "d.c": "static int lone(void)\n{\n    return a_one(2);\n}\n",
    }
    graph = call_graph(probe)
    assert graph == {
        "a.c": {"b.c": {"b_two"}},
        "b.c": {"c.c": {"c_three"}},
        "c.c": {"a.c": {"a_one"}},
        "d.c": {"a.c": {"a_one"}},
    }
    assert circle(graph) == ["a.c", "b.c", "c.c", "a.c"]
    del graph["c.c"]["a.c"]
    assert circle(graph) is None
    assert includes(probe["b.c"] + '/* #include "x.h" */\n') == ["b.h"]
