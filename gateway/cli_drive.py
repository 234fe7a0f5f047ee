"""``serveproto drive`` and ``serveproto score``: engines by hand (filled in with the supervisor)."""
from __future__ import annotations


def add_parsers(sub) -> None:
    pass
