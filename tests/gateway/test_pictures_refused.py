"""Issue 48, item 2 (the refusal): a request with pictures is refused naming the field, never answered
on its text alone. A JSON ``assets`` field, the official SDK's ``Image`` asset (a multipart body) and
a ``box`` question each get a 422 whose ``msg`` starts ``not implemented:``; 422 rather than 501
because the SDK retries every 5xx twice (a request that cannot succeed would be sent three times)."""

from __future__ import annotations

import anyio
import httpx2
import pytest
import typesafe_sdk
from typesafe_sdk import Image, TypeSafeClient, TypeSafeUnprocessableEntityError

from test_routes_support import TICKET, FakeEngine, Recorder, make_app, running

pytestmark = pytest.mark.anyio

ASSETS_MSG = (
    "not implemented: image assets need a vision model (serve --mmproj), and this server reads no images: "
    "send the request without assets (describe the picture in state)"
)
MULTIPART_MSG = (
    "not implemented: image assets need a vision model (serve --mmproj), and this server reads no images: a multipart "
    "body (the SDK's Image assets) is not read; send the request as JSON without assets"
)
BOX_MSG = (
    "not implemented: a box question locates something in an image, and this server reads no images "
    "(it answers 'noul', 'choice' and 'score')"
)


def refusal(loc: list, msg: str) -> dict:
    return {
        "detail": [{"loc": ["body", *loc], "msg": msg, "type": "not_implemented"}],
        "error": {
            "type": "invalid_request_error",
            "message": f"body.{'.'.join(loc)}: {msg}",
            "param": ".".join(loc),
        },
    }


async def test_a_json_assets_field_is_refused_naming_it():
    engine = FakeEngine()
    assets = {"<image:1>": {"type": "image", "format": "png", "data_base64": "iVBORw0KGgo="}}
    async with running(make_app(engine)) as base:
        async with httpx2.AsyncClient(base_url=base) as client:
            r = await client.post("/v1/systemone", json={**TICKET, "assets": assets})
            none = await client.post("/v1/systemone", json={**TICKET, "assets": None})
    assert r.status_code == 422
    assert r.json() == refusal(["assets"], ASSETS_MSG)
    assert none.status_code == 200  # null: no assets
    assert "x_warnings" not in none.json()  # assets is Jev's own field, not an unknown one


async def test_a_box_question_is_refused_naming_its_type():
    engine = FakeEngine()
    body = {"state": "a photo", "questions": {"where": {"type": "box", "instructions": "Find the cat"}}}
    async with running(make_app(engine)) as base:
        async with httpx2.AsyncClient(base_url=base) as client:
            r = await client.post("/v1/systemone", json=body)
    assert r.status_code == 422
    assert r.json() == refusal(["questions", "where", "type"], BOX_MSG)
    assert engine.calls == []


async def test_the_sdks_image_asset_is_refused_once_naming_assets():
    engine = FakeEngine()
    rec = Recorder(make_app(engine))
    png = b"\x89PNG\r\n\x1a\n" + b"\0" * 32
    async with running(rec) as base:

        def call():
            with TypeSafeClient(api_key="k", base_url=base) as client:  # the SDK's default retry policy
                return client.system_one(
                    state="What is in this picture?",
                    questions={"cat": {"type": "noul", "instructions": "Is there a cat?"}},
                    assets={"photo": Image(png)},
                )

        with pytest.raises(TypeSafeUnprocessableEntityError) as info:
            await anyio.to_thread.run_sync(call)
    assert len(rec.requests) == 1  # a 4xx: the SDK does not send it again
    assert rec.requests[0].header("content-type").startswith("multipart/form-data")
    assert info.value.status == 422 and "assets" in str(info.value)
    assert engine.calls == []
    assert isinstance(info.value, typesafe_sdk.TypeSafeAPIError)


async def test_the_sdk_refusal_body_is_exact():
    async with running(make_app(FakeEngine())) as base:
        async with httpx2.AsyncClient(base_url=base) as client:
            r = await client.post(
                "/v1/systemone",
                content=b'--b\r\nContent-Disposition: form-data; name="request"\r\n\r\n{}\r\n--b--\r\n',
                headers={"content-type": "multipart/form-data; boundary=b"},
            )
    assert r.status_code == 422
    assert r.json() == refusal(["assets"], MULTIPART_MSG)
