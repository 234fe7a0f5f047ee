"""JSON text of a value at any depth the request parser accepts, byte for byte ``json.dumps``'s.

``json.dumps`` recurses once per level of nesting and raises :class:`RecursionError` well before
the 1,024 levels orjson parses (issue 30, item 5: a state nested 1,000 deep answered 500). The
C encoder serves every value it can; a deeper one is written here with an explicit stack, leaf by
leaf through ``json.dumps`` itself, so the text (hence the prompt, its tokens and the routing key)
is the one ``json.dumps`` would have given with an unbounded stack.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["dumps"]


def dumps(value: Any, *, separators: tuple[str, str] = (", ", ": "), sort_keys: bool = False) -> str:
    """``json.dumps(value, ensure_ascii=False, separators=separators, sort_keys=sort_keys)``, at any
    depth. ``value``: what a JSON parser returns (dicts with string keys, lists, strings, numbers,
    booleans, None). Raises :class:`TypeError` for anything else, as ``json.dumps`` does."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=separators, sort_keys=sort_keys)
    except RecursionError:
        return _dumps_deep(value, separators, sort_keys)


def _leaf(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _dumps_deep(value: Any, separators: tuple[str, str], sort_keys: bool) -> str:
    item_sep, key_sep = separators
    out: list[str] = []
    # A stack of pending work: a value to write, or a literal string to emit.
    stack: list[tuple[bool, Any]] = [(True, value)]
    while stack:
        is_value, v = stack.pop()
        if not is_value:
            out.append(v)
        elif isinstance(v, dict):
            if not v:
                out.append("{}")
                continue
            items = sorted(v.items()) if sort_keys else list(v.items())
            out.append("{")
            stack.append((False, "}"))
            for i in range(len(items) - 1, -1, -1):
                k, x = items[i]
                if not isinstance(k, str):
                    raise TypeError(f"keys must be str, not {type(k).__name__}")
                stack.append((True, x))
                stack.append((False, (item_sep if i else "") + _leaf(k) + key_sep))
        elif isinstance(v, (list, tuple)):
            if not v:
                out.append("[]")
                continue
            out.append("[")
            stack.append((False, "]"))
            for i in range(len(v) - 1, -1, -1):
                stack.append((True, v[i]))
                if i:
                    stack.append((False, item_sep))
        else:
            out.append(_leaf(v))
    return "".join(out)
