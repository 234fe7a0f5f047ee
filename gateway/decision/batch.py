"""A ``/v1/systemone/batch`` body validated into one :class:`~gateway.decision.schema.SystemOneRequest` per
item: ``{"items": [{"state", "questions", ...}, ...], <fields for every item>}``, bounded, every problem
named by its place in the body (``items[3].state``).

Each item is what the single route reads (:func:`gateway.decision.schema.parse_request`); the fields
beside ``items`` (``model``, a shared ``questions``, ``x_debias``...) go to every item, and a field sent
both there and in an item is refused rather than one of them silently dropped.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.decision.schema import JevValidationError, SystemOneRequest, parse_request

#: States of one batch, at most (Laya's batch route takes 64; a pile of 1,000 tickets is one request here).
MAX_ITEMS = 1000
#: UTF-8 bytes of the items' states and prefixes together, at most (a state sent as JSON counts its
#: compact JSON). A token stands for at least one byte, so this bounds the tokens a batch reads too.
MAX_STATE_BYTES = 8 << 20


def field_name(loc: list[Any]) -> str:
    """A 422 ``loc`` as the caller's field: ``["body", "items", 3, "state"]`` -> ``items[3].state``."""
    out = ""
    for part in loc[1:]:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class BatchInvalid(JevValidationError):
    """A batch that is refused (422): ``errors`` as :class:`JevValidationError`'s, its message and
    ``param`` naming each field as :func:`field_name` does (``items[3].state``)."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(errors)
        self.args = ("; ".join(f"{field_name(e['loc'])}: {e['msg']}" for e in errors),)
        self.param = field_name(errors[0]["loc"])


def _err(loc: list[Any], msg: str, type_: str) -> dict[str, Any]:
    return {"loc": ["body", *loc], "msg": msg, "type": type_}


def item_error(i: int, error: dict[str, Any]) -> dict[str, Any]:
    """``error`` (a 422 ``detail`` entry of a single request, ``loc`` ``["body", field, ...]``) as item
    ``i``'s: ``["body", "items", i, field, ...]``."""
    return {**error, "loc": ["body", "items", i, *error["loc"][1:]]}


def state_bytes(request: SystemOneRequest) -> int:
    """UTF-8 bytes of ``request``'s state and prefix (a JSON state: its compact JSON's bytes)."""
    state = request.state
    n = len(state.encode()) if isinstance(state, str) else len(orjson.dumps(state))
    return n + (len(request.prefix.encode()) if request.prefix else 0)


def parse_batch(body: Any, *, strict: bool = False) -> list[SystemOneRequest]:
    """Validate a decoded ``/v1/systemone/batch`` body; the items' requests in order.

    Raises :class:`BatchInvalid` listing every problem, each at its place in the body: ``items``
    not a list of 1 to :data:`MAX_ITEMS` objects; a field in an item and beside ``items`` both; what
    :func:`parse_request` refuses in an item (``items[i]....``; a field shared by every item is reported
    once, where it was sent); the states past :data:`MAX_STATE_BYTES` (at the item that crosses it).
    ``strict``: as the single route's (``serve --strict``).
    """
    if not isinstance(body, dict):
        raise BatchInvalid([_err([], "Input should be a JSON object", "model_attributes_type")])
    raw = body.get("items")
    if "items" not in body:
        raise BatchInvalid([_err(["items"], "Field required", "missing")])
    if not isinstance(raw, list):
        raise BatchInvalid([_err(["items"], "Input should be a list of items", "list_type")])
    if not 1 <= len(raw) <= MAX_ITEMS:
        kind = "too_short" if not raw else "too_long"
        raise BatchInvalid([_err(["items"], f"Between 1 and {MAX_ITEMS} items are needed, got {len(raw)}", kind)])
    shared = {k: v for k, v in body.items() if k != "items"}
    errors: list[dict[str, Any]] = []
    shared_errors: list[dict[str, Any]] = []
    requests: list[SystemOneRequest] = []
    total = 0
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            errors.append(_err(["items", i], "Input should be a JSON object", "model_attributes_type"))
            continue
        both = [k for k in item if k in shared]
        for k in both:
            msg = f"{k!r} is sent in this item and beside 'items' for every item: send it in one place"
            errors.append(_err(["items", i, k], msg, "value_error"))
        if both:
            continue
        try:
            parsed = parse_request({**shared, **item}, strict=strict)
        except JevValidationError as exc:
            for e in exc.errors:
                field = e["loc"][1] if len(e["loc"]) > 1 else None
                if field is not None and field not in item and field in shared:
                    if e not in shared_errors:
                        shared_errors.append(e)
                else:
                    errors.append(item_error(i, e))
            continue
        total += state_bytes(parsed)
        if total > MAX_STATE_BYTES:
            msg = (
                f"The items' states add up to more than {MAX_STATE_BYTES} bytes at this item: send the rest "
                "in another batch"
            )
            errors.append(_err(["items", i, "state"], msg, "too_long"))
            break
        requests.append(parsed)
    if errors or shared_errors:
        raise BatchInvalid(shared_errors + errors)
    return requests
