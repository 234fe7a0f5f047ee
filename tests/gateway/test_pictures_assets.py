"""Jev's image assets read (``gateway.decision.pictures``): the placeholders placed in the prompt in order,
the SDK's multipart body taken apart (encoded by the SDK's own encoder), each bad asset named."""

from __future__ import annotations

import base64

import pytest
from typesafe_sdk._core.multipart import Part, encode_multipart

from gateway.decision import pictures, schema
from gateway.decision.pictures import MARKER


def test_placeholders_become_markers_in_the_order_they_occur():
    assets = {"<img>": b"A", "<img2>": b"B"}  # one placeholder is a prefix of the other
    text, keys = pictures.place("x <img2> y <img> z <img2>", assets)
    assert text == f"x {MARKER} y {MARKER} z {MARKER}"
    assert keys == ("<img2>", "<img>", "<img2>")


def test_the_sdks_multipart_body_is_taken_apart():
    ctype, body = encode_multipart(
        [
            Part("request", "application/json", b'{"state": "s"}'),
            Part("asset-0", "image/png", b"\x89PNG\r\n\x1a\n\x00\r\n--x", "asset-0"),
            Part("asset-1", "application/octet-stream", b"", "asset-1"),
        ]
    )
    assert pictures.multipart_body(ctype, body) == (
        b'{"state": "s"}',
        {"asset-0": b"\x89PNG\r\n\x1a\n\x00\r\n--x", "asset-1": b""},
    )
    ctype, body = encode_multipart([Part("asset-0", "image/png", b"x")])
    assert pictures.multipart_body(ctype, body) is None  # no request part


def test_each_bad_asset_is_named():
    errors: list = []
    got = pictures.parse_assets(
        {
            "<a>": {"type": "image", "format": "png", "data_base64": base64.b64encode(b"pic").decode()},
            "<b>": {"type": "video"},
            "<c>": {"format": "gif", "data_base64": "cGlj"},
            "<d>": {"data_base64": "not base64!"},
            "<e>": {"part": "asset-9"},
            "<f>": {"part": "asset-0"},
            "<g>": {},
            "<h>": "pic",
        },
        {"asset-0": b"part"},
        errors,
    )
    assert got == {"<a>": b"pic", "<f>": b"part"}
    assert [(e["loc"][2:], e["type"]) for e in errors] == [
        (["<b>", "type"], "literal_error"),
        (["<c>", "format"], "enum"),
        (["<d>", "data_base64"], "value_error"),
        (["<e>", "part"], "value_error"),
        (["<g>"], "missing"),
        (["<h>"], "model_attributes_type"),
    ]


def test_a_request_is_read_with_pictures_only_where_the_engine_reads_them():
    body = {
        "state": "look: <p>",
        "questions": {"q": {"type": "noul", "instructions": "a cat?"}},
        "assets": {"<p>": {"type": "image", "data_base64": "cGlj"}},
    }
    assert schema.parse_request(body, vision=True).pictures == {"<p>": b"pic"}
    with pytest.raises(schema.JevValidationError) as refused:
        schema.parse_request(body)
    assert [(e["loc"], e["type"]) for e in refused.value.errors] == [(["body", "assets"], "not_implemented")]
    with pytest.raises(schema.JevValidationError) as misplaced:
        schema.parse_request({**body, "questions": {"q": {"type": "noul", "instructions": "<p>?"}}}, vision=True)
    assert [e["loc"] for e in misplaced.value.errors] == [["body", "questions", "q", "instructions"]]
