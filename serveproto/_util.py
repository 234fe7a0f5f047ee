"""Named sentinels: printable singletons for states and NEED_DATA."""

from __future__ import annotations

__all__ = ["Sentinel", "make_sentinel"]


class Sentinel(type):
    """Metaclass of sentinel classes: the class itself is the value, and its
    repr is its name (as h11 does), so states print as ``SERVING``."""

    def __repr__(cls) -> str:
        return cls.__name__


def make_sentinel(name: str, doc: str) -> Sentinel:
    """Return a new sentinel named ``name`` with docstring ``doc``."""
    return Sentinel(name, (Sentinel,), {"__doc__": doc, "__module__": "serveproto"})
