"""Jev's image assets, read where the served engine has a vision projector (issue 48, item 2).

A request's ``assets`` maps opaque placeholders (the official SDK's ``<image:<32 hex>>``, or a name the
client chose) to pictures: ``{"type": "image", "format": "png", "data_base64": ...}`` in a JSON body, or
``{"type": "image", "part": "asset-0"}`` naming a part of a ``multipart/form-data`` body (the SDK's
``Image`` assets, :func:`multipart_body`). Each placeholder, wherever it occurs in the ``state``, stands
for its picture there: :func:`place` replaces it, in the rendered prompt prefix, by the engine's marker
(:data:`MARKER`, llama.cpp's ``mtmd_default_marker()``) and lists the pictures in the order of their
occurrences (a placeholder used twice sends its picture twice). The engine reads pictures only before
the questions (spec/serve-protocol.md section 4, "Pictures"), so a placeholder in a question is refused
naming that field. No I/O here: bytes in, bytes out.
"""

from __future__ import annotations

import base64
import binascii
import email.parser
import email.policy
import re
from collections.abc import Mapping
from typing import Any

#: The engine's picture marker (spec/serve-protocol.md section 4, "Pictures").
MARKER = "<__media__>"
#: Jev's image formats (the SDK's ``Format``); the engine detects the real one from the bytes.
FORMATS = ("png", "jpg", "jpeg")
#: The fields of one asset (Jev's ``Asset``).
ASSET_FIELDS = ("type", "format", "data_base64", "part")


def _err(loc: list[Any], msg: str, type_: str) -> dict[str, Any]:
    return {"loc": ["body", *loc], "msg": msg, "type": type_}


def parse_assets(raw: Any, parts: Mapping[str, bytes], errors: list[dict[str, Any]]) -> dict[str, bytes]:
    """The pictures of an ``assets`` object by placeholder. ``parts``: a multipart body's parts by name
    (empty for a JSON body). Appends to ``errors`` (the 422 entries, each naming ``assets.<key>...``)
    and returns what was read: an asset that is not an object, a ``type`` other than ``"image"``, a
    ``format`` Jev does not name, ``data_base64`` that is not base64, neither ``data_base64`` nor a
    ``part``, a ``part`` the body does not hold, an empty placeholder."""
    out: dict[str, bytes] = {}
    if not isinstance(raw, dict) or not raw:
        errors.append(
            _err(["assets"], "Input should be a non-empty object of assets keyed by placeholder", "dict_type")
        )
        return out
    for key, asset in raw.items():
        loc = ["assets", key]
        if not key:
            errors.append(_err(loc, "A placeholder must not be empty", "string_too_short"))
            continue
        if not isinstance(asset, dict):
            errors.append(_err(loc, "Input should be an asset object", "model_attributes_type"))
            continue
        if asset.get("type") not in (None, "image"):
            errors.append(_err([*loc, "type"], "Input should be 'image'", "literal_error"))
            continue
        fmt = asset.get("format")
        if fmt is not None and fmt not in FORMATS:
            errors.append(_err([*loc, "format"], f"Input should be {', '.join(map(repr, FORMATS))}", "enum"))
            continue
        part, data = asset.get("part"), asset.get("data_base64")
        if part is not None:
            if not isinstance(part, str) or part not in parts:
                errors.append(_err([*loc, "part"], "The body has no part of that name", "value_error"))
                continue
            out[key] = parts[part]
        elif isinstance(data, str):
            try:
                out[key] = base64.b64decode(data, validate=True)
            except (binascii.Error, ValueError):
                errors.append(_err([*loc, "data_base64"], "Input should be base64-encoded image data", "value_error"))
        else:
            errors.append(_err(loc, "An image asset needs data_base64 (or, in a multipart body, part)", "missing"))
    return out


def _pattern(keys: Mapping[str, bytes]) -> re.Pattern[str]:
    # the longest first: a placeholder that is a prefix of another never takes its place
    return re.compile("|".join(re.escape(k) for k in sorted(keys, key=len, reverse=True)))


def place(prefix: str, assets: Mapping[str, bytes]) -> tuple[str, tuple[str, ...]]:
    """``prefix`` with each placeholder of ``assets`` replaced by :data:`MARKER`, and the placeholders
    in the order of those occurrences (the engine's pictures are ``assets[k]`` of each, in order)."""
    keys: list[str] = []

    def one(m: re.Match[str]) -> str:
        keys.append(m[0])
        return MARKER

    return _pattern(assets).sub(one, prefix), tuple(keys)


#: The engine's refusal of one picture (spec/serve-protocol.md section 4, "Pictures"): ``image K of M: ...``.
_PICTURE_REFUSED = re.compile(r"image (\d+) of \d+: (.*)")


def refusal(reason: str, keys: tuple[str, ...]) -> dict[str, Any] | None:
    """The 422 entry naming ``assets.<placeholder>`` for the engine's ``BAD_REQUEST`` of picture K
    (``keys``: :func:`place`'s order), or None for another reason."""
    m = _PICTURE_REFUSED.match(reason)
    if m is None or not 1 <= int(m[1]) <= len(keys):
        return None
    return _err(["assets", keys[int(m[1]) - 1]], f"The engine cannot read this picture: {m[2]}", "value_error")


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def misplaced(state: Any, questions: Any, assets: Mapping[str, bytes]) -> list[dict[str, Any]]:
    """The 422 entries of a request whose pictures the engine cannot read as sent: a placeholder in a
    question's ``instructions`` or ``criteria`` (pictures are read in the state only), one that the
    state never names, and the engine's marker written as text (in the state or a question).
    ``questions``: the validated :class:`gateway.decision.schema.Question` objects."""
    errors = []
    pat = _pattern(assets) if assets else None
    for q in questions:
        for field in ("instructions", "criteria"):
            texts = _strings(getattr(q, field))
            if pat is not None and any(pat.search(t) for t in texts):
                errors.append(
                    _err(
                        ["questions", q.id, field], "A picture is read only in state, not in a question", "value_error"
                    )
                )
            elif any(MARKER in t for t in texts):
                errors.append(
                    _err(["questions", q.id, field], f"{MARKER} is the engine's picture marker", "value_error")
                )
    in_state = _strings(state)
    if any(MARKER in t for t in in_state):
        errors.append(_err(["state"], f"{MARKER} is the engine's picture marker: use an asset", "value_error"))
    for key in assets:
        if not any(key in t for t in in_state):
            errors.append(_err(["assets", key], "The state never names this placeholder", "value_error"))
    return errors


def multipart_body(content_type: str, body: bytes) -> tuple[bytes, dict[str, bytes]] | None:
    """A ``multipart/form-data`` body (RFC 7578, the SDK's ``Image`` assets): the JSON of its part
    named ``request`` and every other part's bytes by name, or None when it is not such a body (no
    boundary, no ``request`` part). Parsed by the standard library's MIME parser."""
    msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body
    )
    if not msg.is_multipart():
        return None
    parts: dict[str, bytes] = {}
    for part in msg.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if isinstance(name, str) and isinstance(payload, bytes):
            parts[name] = payload
    request = parts.pop("request", None)
    return None if request is None else (request, parts)
