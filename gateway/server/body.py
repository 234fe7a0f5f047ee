"""A request body as JSON: decoded by orjson, refused with Jev's 422 shape, a repeated key refused."""

from __future__ import annotations

import json
from typing import Any

import orjson

from gateway.http import HTTPError, Request
from gateway.server.jev.protocol import validation_body


def parse_json(request: Request) -> Any:
    """The request body as JSON (orjson). Raises a 422 ``json_invalid`` with Jev's ``detail`` list, a 422
    ``duplicate_key`` naming the first object that repeats a key (:func:`duplicate_key`), and a 415 for a
    multipart body (the SDK's image assets: this server serves text models)."""
    ctype = (request.header("content-type") or "").lower()
    if ctype.startswith("multipart/"):
        raise HTTPError(415, "unsupported_media_type", "multipart bodies (image assets) are not supported: send JSON")
    return parse_json_bytes(request.body)


def parse_json_bytes(body: bytes) -> Any:
    """``body`` as JSON, refused as :func:`parse_json` refuses a request's (a multipart body's ``request``
    part, :mod:`gateway.decision.pictures`)."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        detail = [{"loc": ["body", exc.pos], "msg": f"JSON decode error: {exc.msg}", "type": "json_invalid"}]
        message = f"the body is not valid JSON: {exc.msg} (at character {exc.pos})"
        raise HTTPError(422, "invalid_request_error", message, body=validation_body(detail, message, "")) from None
    dup = duplicate_key(body) if isinstance(value, (dict, list)) else None
    if dup is not None:
        path, key = dup
        loc = ["body", *path, key]
        msg = f"The key {key!r} is sent more than once in this object: send it once"
        param = ".".join(map(str, loc[1:]))
        detail = [{"loc": loc, "msg": msg, "type": "duplicate_key"}]
        raise HTTPError(
            422, "invalid_request_error", f"{param}: {msg}", body=validation_body(detail, f"body.{param}: {msg}", param)
        )
    return value


class _Repeats(dict[str, Any]):
    """An object of the body that repeats a key (``repeated``: the first such key)."""

    repeated: str


def duplicate_key(body: bytes) -> tuple[list[Any], str] | None:
    """``(path, key)`` of the first object (depth first, in document order) of the JSON ``body`` that
    sends ``key`` twice, or None. ``path``: keys and list indices from the top. orjson keeps the last
    value silently, other parsers the first: a request that repeats a key is refused, not guessed.

    The stdlib parser reports every key pair (``object_pairs_hook``); only called on a body orjson
    parsed. A body nested past the stdlib's recursion limit is not checked (orjson bounds the depth).
    """
    found = False

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal found
        obj = dict(items)
        if len(obj) == len(items):
            return obj
        seen: set[str] = set()
        repeats = _Repeats(obj)
        for k, _ in items:
            if k in seen:
                repeats.repeated = k
                break
            seen.add(k)
        found = True
        return repeats

    try:
        tree = json.loads(body, object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return None
    if not found:
        return None
    stack: list[tuple[list[Any], Any]] = [([], tree)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, _Repeats):
            return path, node.repeated
        children = (
            list(node.items()) if isinstance(node, dict) else list(enumerate(node)) if isinstance(node, list) else []
        )
        stack.extend((path + [k], v) for k, v in reversed(children))
    return None
