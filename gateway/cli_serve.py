"""``serveproto serve``: the decision server (filled in with the HTTP server)."""
from __future__ import annotations


def add_parsers(sub) -> None:
    p = sub.add_parser("serve", help="start the decision server")
    p.set_defaults(func=lambda args: print("not yet") or 1)
