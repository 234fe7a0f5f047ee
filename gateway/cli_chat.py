"""``serveproto chat --attach URL``: the terminal client (filled in with the chat client)."""
from __future__ import annotations


def add_parsers(sub) -> None:
    pass
