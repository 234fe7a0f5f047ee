"""Named sentinels: printable singletons for states and NEED_DATA."""

from __future__ import annotations

from typing import Any

__all__ = ["Sentinel"]


class Sentinel(type):
    """Metaclass of sentinel classes: the class itself is the value, and its
    repr is its name (as h11 does), so states print as ``SERVING``.

    Declare one as ``class SERVING(Sentinel, metaclass=Sentinel): "doc"``; its
    type is then ``type[SERVING]``, which type checkers can tell apart from an
    event. Every sentinel reports module ``serveproto``, where the public ones
    are exported.
    """

    def __new__(mcs, name: str, bases: tuple[type, ...], namespace: dict[str, Any]) -> Sentinel:
        namespace["__module__"] = "serveproto"
        return super().__new__(mcs, name, bases, namespace)

    def __repr__(cls) -> str:
        return cls.__name__
