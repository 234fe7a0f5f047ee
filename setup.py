"""The build hook the wheel needs; the metadata is in setup.cfg.

A wheel (or an sdist's wheel) carries the engines' sources: the ``engines/`` Makefiles, C files
and patches, copied to ``gateway/engine/engines/``, where ``gateway.engine.build`` finds them
to build an engine into the cache on first use outside a clone. An editable install copies
nothing: a clone builds ``engines/bin/`` with ``make``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ENGINES = Path(__file__).resolve().parent / "engines"
#: What of engines/ a build needs (engines/bin/, where make writes, is left out).
ENGINE_SOURCE_SUFFIXES = {".c", ".h", ".mk", ".patch"}
#: Where the wheel carries them, relative to the wheel's root.
PACKAGED = Path("gateway", "engine", "engines")


def engine_sources() -> list[Path]:
    """The engine source files, relative to engines/."""
    out = []
    for path in sorted(ENGINES.rglob("*")):
        rel = path.relative_to(ENGINES)
        if (
            path.is_file()
            and rel.parts[0] != "bin"
            and (path.suffix in ENGINE_SOURCE_SUFFIXES or path.name == "Makefile")
        ):
            out.append(rel)
    return out


class build_py_with_engines(build_py):
    """build_py, then the engine sources into the build folder (not for an editable install)."""

    def run(self) -> None:
        editable = getattr(self, "editable_mode", False)
        if not editable:  # an in-tree build (pip install .) must not ship a stale build/lib (fixtures/...)
            shutil.rmtree(self.build_lib, ignore_errors=True)
        super().run()
        if editable:
            return
        dest = Path(self.build_lib) / PACKAGED
        shutil.rmtree(dest, ignore_errors=True)
        for rel in engine_sources():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ENGINES / rel, target)


setup(cmdclass={"build_py": build_py_with_engines})
