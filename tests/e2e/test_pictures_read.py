"""Issue 48, item 2 (the reading half): ``serve --mmproj`` reads Jev's image assets on ``/v1/systemone``.

The server runs the llama engine on the tiny random-weight GGUF with a tiny random projector made for
it (``fixtures.tiny_mmproj``). Each answer is rebuilt outside the server from llama.cpp's own
multimodal path (``llama-mtmd-ref``: ``mtmd_tokenize`` + ``mtmd_helper_eval_chunk_single``): the
prompt the server must have built (the GGUF's chat template, the placeholder replaced by the engine's
marker), each option's scored tokens (past the longest common token prefix with the question's stem,
spec 9.1), their logprobs, the softmax by hand. A JSON ``assets`` field and the official SDK's
``Image`` asset (a multipart body) are both read; the pictures change the answer; such a request is
computed whole (``x_positions``: nothing reused, no snapshot). Servers without a projector keep
refusing pictures (tests/gateway/test_pictures_refused.py).
"""

from __future__ import annotations

import base64
import math
import os
import subprocess

import anyio
import httpx2
import orjson
import pytest
from typesafe_sdk import Image, TypeSafeClient

from fixtures import tiny_mmproj
from gateway.decision import schema
from gateway.decision.chat_template import ChatTemplate
from gateway.decision.pictures import MARKER
from gateway.decision.prompts import PromptBuilder
from gateway.paths import engine_bin
from test_routes_support import serving as serve_in_process

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.usefixtures("llama_bin")]

PLACEHOLDER = "<image:1>"
STATE = f"A photo: {PLACEHOLDER} Answer about what it shows."
QUESTIONS = {"cat": {"type": "noul", "instructions": "Is there a cat in the photo?"}}
REF = engine_bin("llama-mtmd-ref")


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    d = tmp_path_factory.mktemp("assets")
    out = []
    for seed in (1, 2):
        data = tiny_mmproj.png(tiny_mmproj.picture(seed))
        (d / f"p{seed}.png").write_bytes(data)
        out.append((data, d / f"p{seed}.png"))
    return out


def ref_tokens(tiny, prompt: str, image, tmp) -> list[tuple[int, float]]:
    """(token id, logprob) of the text after the picture, by llama-mtmd-ref (the first token's is nan)."""
    pf = tmp / "prompt.txt"
    pf.write_text(prompt)
    mmproj = tiny_mmproj.ensure()
    argv = [str(REF), "--model", str(tiny), "--mmproj", str(mmproj), "--prompt-file", str(pf), "--image", str(image)]
    env = {**os.environ, "GGML_CPU_USE_REF": "1", "LLAMA_KV_CELLS_IN_ORDER": "1"}
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=True).stdout
    return [(int(t), float(lp)) for _, t, lp in (line.split() for line in out.splitlines()[1:])]


def expected_noul(tiny, image, tmp) -> float:
    """The probability of the noul's ``true`` side from the reference, as the server computes it."""
    b = PromptBuilder(ChatTemplate.from_gguf(tiny))
    parsed = schema.parse_request({"state": STATE, "questions": QUESTIONS})
    prefix = b.prefix(parsed.state).replace(PLACEHOLDER, MARKER)
    q = parsed.questions[0]
    qp = b.question(q.type, q.instructions, q.criteria)
    context = [t for t, _ in ref_tokens(tiny, prefix + qp.stem, image, tmp)]
    scores = []
    for opt in qp.options:
        full = ref_tokens(tiny, prefix + qp.stem + opt, image, tmp)
        common = next((i for i, (x, (y, _)) in enumerate(zip(context, full)) if x != y), len(context))
        assert 0 < common < len(full)
        scores.append(math.fsum(lp for _, lp in full[common:]))
    m = max(scores)
    e = [math.exp(s - m) for s in scores]
    return e[1] / sum(e)


async def test_json_assets_are_read_as_llama_cpps_multimodal_path_reads_them(tiny, pictures, tmp_path):
    mmproj = tiny_mmproj.ensure()
    replies = []
    async with serve_in_process(
        "--threads", "2", "--model", str(tiny), "--mmproj", str(mmproj), "--ctx", "1024"
    ) as base:
        async with httpx2.AsyncClient(base_url=base, timeout=60) as c:
            for data, _ in pictures:
                asset = {"type": "image", "format": "png", "data_base64": base64.b64encode(data).decode()}
                body = {"state": STATE, "questions": QUESTIONS, "assets": {PLACEHOLDER: asset}}
                r = await c.post(
                    "/v1/systemone", content=orjson.dumps(body), headers={"content-type": "application/json"}
                )
                assert r.status_code == 200, r.text
                replies.append(r.json())
    got = [r["answers"]["cat"]["noul"] for r in replies]
    want = [expected_noul(tiny, path, tmp_path) for _, path in pictures]
    assert got == [pytest.approx(w, abs=2e-6) for w in want]
    assert abs(want[0] - want[1]) > 1e-4  # the picture matters
    for r in replies:  # computed whole: no snapshot taken or restored, nothing reused
        assert r["x_positions"]["reused"] == 0 and r["x_positions"]["snapshot"] == "none"


async def test_the_sdks_image_asset_is_read(tiny, pictures, tmp_path):
    mmproj = tiny_mmproj.ensure()
    data, path = pictures[0]
    async with serve_in_process(
        "--threads", "2", "--model", str(tiny), "--mmproj", str(mmproj), "--ctx", "1024"
    ) as base:

        def call():
            with TypeSafeClient(api_key="k", base_url=base) as client:
                return client.system_one(
                    state=f"A photo: {PLACEHOLDER} Answer about what it shows.",
                    questions=QUESTIONS,
                    assets={PLACEHOLDER: Image(data)},
                )

        reply = await anyio.to_thread.run_sync(call)
    assert reply.answers["cat"].noul == pytest.approx(expected_noul(tiny, path, tmp_path), abs=2e-6)


async def test_pictures_out_of_place_are_refused_naming_the_field(tiny, pictures):
    mmproj = tiny_mmproj.ensure()
    asset = {"type": "image", "format": "png", "data_base64": base64.b64encode(pictures[0][0]).decode()}
    bodies = {
        "in a question": (
            {"state": "a photo", "questions": {"cat": {"type": "noul", "instructions": f"Cat in {PLACEHOLDER}?"}}},
            [
                (["questions", "cat", "instructions"], "A picture is read only in state, not in a question"),
                (["assets", PLACEHOLDER], "The state never names this placeholder"),
            ],
        ),
        "bad base64": (
            {"state": STATE, "questions": QUESTIONS, "assets": {PLACEHOLDER: {"type": "image", "data_base64": "%%"}}},
            [(["assets", PLACEHOLDER, "data_base64"], "Input should be base64-encoded image data")],
        ),
        "not a picture": (
            {"state": STATE, "questions": QUESTIONS, "assets": {PLACEHOLDER: {"type": "image", "data_base64": "aGk="}}},
            [
                (
                    ["assets", PLACEHOLDER],
                    "The engine cannot read this picture: the bytes are not a picture (PNG, JPEG, BMP, GIF; or raw "
                    "RGB with grid_h and grid_w)",
                )
            ],
        ),
        "the marker as text": (
            {"state": f"{STATE} {MARKER}", "questions": QUESTIONS},
            [(["state"], f"{MARKER} is the engine's picture marker: use an asset")],
        ),
    }
    async with serve_in_process(
        "--threads", "2", "--model", str(tiny), "--mmproj", str(mmproj), "--ctx", "1024"
    ) as base:
        async with httpx2.AsyncClient(base_url=base, timeout=60) as c:
            for name, (body, errors) in bodies.items():
                if "assets" not in body and name == "in a question":
                    body = {**body, "assets": {PLACEHOLDER: asset}}
                r = await c.post(
                    "/v1/systemone", content=orjson.dumps(body), headers={"content-type": "application/json"}
                )
                assert r.status_code == 422, (name, r.text)
                assert [(e["loc"][1:], e["msg"]) for e in r.json()["detail"]] == errors, name
