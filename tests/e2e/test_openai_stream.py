"""Streaming on the OpenAI routes, through real HTTP: ``/v1/completions`` with ``stream`` (``echo``,
``logprobs``, ``stream_options.include_usage``), logprobs in streamed chat, errors before and after
the 200, a client that leaves.

Three engines: the route fake (numbers by hand, so one stream is checked byte for byte), the
fixture engine (its toy model recomputed in Python; the official ``openai`` client), and the tiny
random-weight GGUF on the llama engine (the numpy oracle). The streamed text and logprobs must
equal the whole reply's exactly.
"""

from __future__ import annotations

import contextlib
import math
import os

import anyio
import httpx2
import orjson
import pytest

from fixtures import oracle, tiny_gguf, toy_model
from gateway.decision.prompts import PromptBuilder
from gateway.engine import Engine
from gateway.engine.options import EngineOptions
from gateway.paths import engine_bin
from gateway.server.app import App, AppConfig, ModelInfo
from test_routes_support import EngineCrashed, FakeEngine, RequestError, char_logprob, make_app, running
from test_server_disconnect import raw_post, wait_until
from test_server_disconnect import serving as serving_slow
from test_server_e2e import serving
from test_server_llama import serving as serving_llama

pytestmark = pytest.mark.anyio

#: logprob agreement of llama.cpp with the oracle (fixtures/README.md: F32 KV meets 1e-4)
TOL = 1e-4


async def post(base: str, path: str, body: dict) -> httpx2.Response:
    async with httpx2.AsyncClient(base_url=base, timeout=60) as c:
        return await c.post(path, content=orjson.dumps(body), headers={"content-type": "application/json"})


async def stream(base: str, path: str, body: dict) -> tuple[httpx2.Response, bytes]:
    """POST ``body``; the response and its whole (de-chunked) body."""
    async with httpx2.AsyncClient(base_url=base, timeout=60) as c:
        async with c.stream(
            "POST", path, content=orjson.dumps(body), headers={"content-type": "application/json"}
        ) as r:
            return r, b"".join([chunk async for chunk in r.aiter_bytes()])


def sse_events(raw: bytes) -> list[dict]:
    """The JSON events of an SSE body; checks the framing (``data: ``, blank line) and the final ``[DONE]``."""
    assert raw.endswith(b"\n\n"), raw[-40:]
    frames = raw[:-2].split(b"\n\n")
    assert all(f.startswith(b"data: ") and b"\n" not in f for f in frames), frames
    assert frames[-1] == b"data: [DONE]" and b"data: [DONE]" not in frames[:-1]
    return [orjson.loads(f[len(b"data: ") :]) for f in frames[:-1]]


def merged_completion(events: list[dict]) -> dict:
    """A streamed completion's choice, rebuilt from its chunks the way a client would."""
    choices = [e["choices"][0] for e in events if e.get("choices")]
    lps = [c["logprobs"] for c in choices if c["logprobs"]]
    return {
        "text": "".join(c["text"] for c in choices),
        "finish_reason": choices[-1]["finish_reason"],
        "logprobs": {
            k: [x for lp in lps for x in lp[k]] for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")
        },
    }


# ---- the route fake: exact frames, validation, errors ----


async def test_completion_stream_exact_frames_and_the_whole_reply():
    eng = FakeEngine(reply="Hi yo")
    body = {
        "prompt": "ab",
        "echo": True,
        "logprobs": 1,
        "max_tokens": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with running(make_app(eng)) as base:
        r, raw = await stream(base, "/v1/completions", body)
        whole = (await post(base, "/v1/completions", {**body, "stream": False, "stream_options": None})).json()
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/event-stream" and r.headers["transfer-encoding"] == "chunked"
    rid = r.headers["x-typesafe-request-id"]
    created = orjson.loads(raw.split(b"\n\n")[0][6:])["created"]
    head = b'{"id":"cmpl-%s","object":"text_completion","created":%d,"model":"fake-model",' % (
        rid[4:].encode(),
        created,
    )
    # the fake: position 0 cold (nan), "b" at -(1 + 98 % 7) / 10 = -0.1 with alternative 0 at -0.5;
    # each generated word at -0.25 with alternative 7 at -0.25; no vocabulary, so alternatives read "<id>"
    expected = (
        b"data: " + head + b'"choices":[{"text":"ab","index":0,"logprobs":{"tokens":["a","b"],'
        b'"token_logprobs":[null,-0.1],"top_logprobs":[null,{"<0>":-0.5}],"text_offset":[0,1]},"finish_reason":null}]}\n\n'
        b"data: " + head + b'"choices":[{"text":"Hi","index":0,"logprobs":{"tokens":["Hi"],'
        b'"token_logprobs":[-0.25],"top_logprobs":[{"<7>":-0.25}],"text_offset":[2]},"finish_reason":null}]}\n\n'
        b"data: " + head + b'"choices":[{"text":" yo","index":0,"logprobs":{"tokens":[" yo"],'
        b'"token_logprobs":[-0.25],"top_logprobs":[{"<7>":-0.25}],"text_offset":[4]},"finish_reason":null}]}\n\n'
        b"data: " + head + b'"choices":[{"text":"","index":0,"logprobs":null,"finish_reason":"stop"}]}\n\n'
        b"data: " + head + b'"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":2,"total_tokens":4}}\n\n'
        b"data: [DONE]\n\n"
    )
    assert raw == expected
    assert char_logprob("b") == -0.1
    assert whole["object"] == "text_completion" and whole["usage"] == {
        "prompt_tokens": 2,
        "completion_tokens": 2,
        "total_tokens": 4,
    }
    assert whole["choices"] == [
        {
            "text": "abHi yo",
            "index": 0,
            "finish_reason": "stop",
            "logprobs": {
                "tokens": ["a", "b", "Hi", " yo"],
                "token_logprobs": [None, -0.1, -0.25, -0.25],
                "top_logprobs": [None, {"<0>": -0.5}, {"<7>": -0.25}, {"<7>": -0.25}],
                "text_offset": [0, 1, 2, 4],
            },
        }
    ]
    # both asked the engine for one alternative per token, on a generating SUBMIT
    assert [c[2:6] for c in eng.calls] == [(2, 0.0, 1.0, 1)] * 2


async def test_completion_stream_plain_and_read_out_only():
    eng = FakeEngine(reply="one two three")
    async with running(make_app(eng)) as base:
        _, plain = await stream(base, "/v1/completions", {"prompt": "go", "max_tokens": 2, "stream": True})
        _, echo_only = await stream(
            base, "/v1/completions", {"prompt": "go", "max_tokens": 5, "echo": True, "stream": True}
        )
        _, readout = await stream(
            base, "/v1/completions", {"prompt": "xyz", "max_tokens": 0, "echo": True, "logprobs": 0, "stream": True}
        )
    assert [e["choices"][0] for e in sse_events(plain)] == [
        {"text": "one", "index": 0, "logprobs": None, "finish_reason": None},
        {"text": " two", "index": 0, "logprobs": None, "finish_reason": None},
        {"text": "", "index": 0, "logprobs": None, "finish_reason": "length"},
    ]
    assert [e["choices"][0]["text"] for e in sse_events(echo_only)] == ["go", "one", " two", " three", ""]
    assert sse_events(echo_only)[-1]["choices"][0]["finish_reason"] == "stop"
    # max_tokens=0: the read-out alone, then "length"; logprobs=0 gives each token's logprob and no alternatives
    [prompt, end] = [e["choices"][0] for e in sse_events(readout)]
    assert prompt == {
        "text": "xyz",
        "index": 0,
        "finish_reason": None,
        "logprobs": {
            "tokens": ["x", "y", "z"],
            "token_logprobs": [None, char_logprob("y"), char_logprob("z")],
            "top_logprobs": [None, None, None],
            "text_offset": [0, 1, 2],
        },
    }
    assert end["finish_reason"] == "length"
    assert [c[0] for c in eng.calls] == ["submit", "submit", "read_out"] and eng.calls[-1][2] == 1
    assert eng.calls[1][5] == 0  # echo without logprobs reads nothing out


async def test_chat_stream_carries_logprobs_like_the_whole_reply():
    eng = FakeEngine(reply="Hello there friend")
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "logprobs": True, "top_logprobs": 2}
    async with running(make_app(eng)) as base:
        _, raw = await stream(base, "/v1/chat/completions", {**body, "stream": True})
        whole = (await post(base, "/v1/chat/completions", body)).json()
    choices = [e["choices"][0] for e in sse_events(raw)]

    def entry(text: str) -> dict:
        return {
            "token": text,
            "logprob": -0.25,
            "bytes": list(text.encode()),
            "top_logprobs": [
                {"token": "<7>", "logprob": -0.25, "bytes": list(b"<7>")},
                {"token": "<8>", "logprob": -1.25, "bytes": list(b"<8>")},
            ],
        }

    assert choices == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None},
        {"index": 0, "delta": {"content": "Hello"}, "logprobs": {"content": [entry("Hello")]}, "finish_reason": None},
        {"index": 0, "delta": {"content": " there"}, "logprobs": {"content": [entry(" there")]}, "finish_reason": None},
        {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"},
    ]
    assert whole["choices"][0]["logprobs"] == {"content": [entry("Hello"), entry(" there")]}
    assert whole["choices"][0]["message"]["content"] == "Hello there"
    assert [c[5] for c in eng.calls] == [2, 2]


async def test_stop_string_split_across_tokens_is_never_sent():
    eng = FakeEngine(reply="Hello there friend")
    async with running(make_app(eng)) as base:
        _, raw = await stream(
            base, "/v1/completions", {"prompt": "p", "max_tokens": 9, "stop": "there f", "stream": True}
        )
        whole = (await post(base, "/v1/completions", {"prompt": "p", "max_tokens": 9, "stop": "there f"})).json()
    texts = [e["choices"][0]["text"] for e in sse_events(raw)]
    # " there" might begin the stop string: held back, then cut when " friend" completes it
    assert texts == ["Hello", " ", ""] and whole["choices"][0]["text"] == "Hello "
    assert whole["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    "body, param",
    [
        ({"stream": "yes"}, "stream"),
        ({"stream": True, "stream_options": ["include_usage"]}, "stream_options"),
        ({"stream": True, "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
        ({"echo": "true"}, "echo"),
        ({"logprobs": 33}, "logprobs"),
        ({"logprobs": True}, "logprobs"),
    ],
)
async def test_bad_stream_fields_are_400_naming_the_field(body, param):
    eng = FakeEngine()
    async with running(make_app(eng)) as base:
        r = await post(base, "/v1/completions", {"prompt": "p", **body})
        chat = await post(base, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": 1})
    assert (
        r.status_code == 400
        and r.json()["error"]["param"] == param
        and r.json()["error"]["type"] == "invalid_request_error"
    )
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "logprobs"
    assert eng.calls == []


class FailingMidStream(FakeEngine):
    """The fake, whose generation fails with ``error`` after its first DATA."""

    def __init__(self, error: Exception, **kw) -> None:
        super().__init__(**kw)
        self.error = error

    async def submit(self, prompt, **kw):
        async with contextlib.aclosing(super().submit(prompt, **kw)) as events:
            async for ev in events:
                yield ev
                if type(ev).__name__ == "Data":
                    raise self.error


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/completions", {"prompt": "p", "echo": True, "logprobs": 1}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": True}),
    ],
)
async def test_engine_failure_before_the_200_is_503_after_it_in_band(path, body):
    async with running(make_app(FakeEngine(fail=EngineCrashed("the engine exited")))) as base:
        down, down_raw = await stream(base, path, {**body, "stream": True})
    assert down.status_code == 503 and down.headers["retry-after"] == "1"
    assert orjson.loads(down_raw)["detail"]["error_type"] == "overloaded_error"

    crash = FailingMidStream(EngineCrashed("the engine exited"), reply="a b c")
    refused = FailingMidStream(RequestError("BAD_REQUEST", "no"), reply="a b c")
    events = []
    for eng in (crash, refused):
        async with running(make_app(eng)) as base:
            r, raw = await stream(base, path, {**body, "stream": True, "stream_options": {"include_usage": True}})
        assert r.status_code == 200
        events.append(sse_events(raw))
        assert eng.closed == 1
    for evs in events:
        last = evs[-2]["choices"][0]
        assert (last["text"] if "text" in last else last["delta"]["content"]) == "a"
        assert "usage" not in evs[-2] and all(e["choices"][0]["finish_reason"] is None for e in evs[:-1])
    assert events[0][-1] == {
        "error": {
            "message": "the engine is unavailable: the engine exited",
            "type": "overloaded_error",
            "param": None,
            "code": None,
        }
    }
    assert events[1][-1] == {
        "error": {
            "message": "the engine refused the request: BAD_REQUEST no",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
    }


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/completions", {"prompt": "go", "echo": True, "logprobs": 1}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "go"}]}),
    ],
)
async def test_client_leaving_a_stream_ends_the_engine_request(path, body):
    eng = FakeEngine(reply=" ".join(["word"] * 1000))
    eng.token_delay = 0.01
    async with running(make_app(eng)) as base:
        async with httpx2.AsyncClient(base_url=base) as c:
            async with c.stream("POST", path, content=orjson.dumps({**body, "stream": True, "max_tokens": 1000})) as s:
                async for _ in s.aiter_bytes():
                    break
        with anyio.fail_after(5):
            while eng.closed == 0:
                await anyio.sleep(0.01)
    assert eng.closed == 1


# ---- the fixture engine: its toy model, faults, cancellation, the openai client ----


def toy_readout(text: str) -> list[float]:
    """Each byte's logprob given the bytes before it, by the toy model (bytes are tokens); position 0 has none."""
    toks = list(text.encode())
    hs = toy_model.chain(toks)
    return [toy_model.log_softmax(toy_model.logits(hs[p], toks[p - 1]))[toks[p]] for p in range(1, len(toks))]


async def test_openai_client_streams_both_routes_as_the_whole_replies(fixture_engine):
    import openai

    msgs = [{"role": "user", "content": "say hi"}]
    async with serving(fixture_engine) as base:
        client = openai.AsyncOpenAI(api_key="x", base_url=base + "/v1", max_retries=0)
        kw = {"model": "any", "prompt": "the cat sat", "max_tokens": 6, "echo": True, "logprobs": 2}
        whole = await client.completions.create(**kw)
        chunks = [
            c async for c in await client.completions.create(**kw, stream=True, stream_options={"include_usage": True})
        ]
        chat_kw = {"model": "any", "messages": msgs, "max_tokens": 5, "logprobs": True, "top_logprobs": 3}
        chat_whole = await client.chat.completions.create(**chat_kw)
        chat_chunks = [c async for c in await client.chat.completions.create(**chat_kw, stream=True)]
        await client.close()
    parts = [c.choices[0] for c in chunks if c.choices]
    assert "".join(p.text for p in parts) == whole.choices[0].text
    assert whole.choices[0].text.startswith("the cat sat") and len(whole.choices[0].text) == len("the cat sat") + 6
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert [x for p in parts if p.logprobs for x in getattr(p.logprobs, key)] == getattr(
            whole.choices[0].logprobs, key
        )
    assert parts[-1].finish_reason == whole.choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == whole.usage.model_dump()
    assert whole.usage.completion_tokens == 6 and whole.usage.prompt_tokens == len("the cat sat")
    # the prompt part comes first, whole, and its logprobs are the toy's
    lp = parts[0].logprobs
    assert parts[0].text == "the cat sat" and lp.tokens == list("the cat sat") and lp.token_logprobs[0] is None
    assert lp.token_logprobs[1:] == pytest.approx(toy_readout("the cat sat"), abs=1e-6)
    # chat: the same tokens, logprobs and alternatives, streamed or not
    streamed = [e for c in chat_chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in chat_whole.choices[0].logprobs.content]
    assert len(streamed) == 5 and all(len(e.top_logprobs) == 3 for e in streamed)
    assert (
        "".join(c.choices[0].delta.content or "" for c in chat_chunks if c.choices)
        == chat_whole.choices[0].message.content
    )
    prompt = PromptBuilder().chat(msgs).encode()
    first = toy_model.log_softmax(toy_model.logits(toy_model.chain(list(prompt))[len(prompt)], prompt[-1]))
    assert streamed[0].logprob == pytest.approx(first[streamed[0].bytes[0]], abs=1e-6)


async def test_openai_client_sees_an_engine_crash_mid_stream(fixture_engine):
    import openai

    # the engine exits after its third frame: ACCEPT, DATA, DATA
    async with serving(fixture_engine, "--fault", "exit_after=3", timeout=5.0) as base:
        client = openai.AsyncOpenAI(api_key="x", base_url=base + "/v1", max_retries=0)
        got = []
        with pytest.raises(openai.APIError) as caught:
            async for c in await client.completions.create(model="any", prompt="the cat", max_tokens=8, stream=True):
                got.append(c.choices[0].text)
        await client.close()
    assert len(got) == 2 and all(len(t) == 1 for t in got)  # the toy's tokens are bytes
    assert caught.value.message.startswith("the engine is unavailable: ")
    assert caught.value.body["type"] == "overloaded_error"


async def test_stream_is_503_when_the_engine_is_down_from_the_start(fixture_engine):
    async with serving(fixture_engine, "--fault", "exit_after=0", timeout=2.0) as base:
        with anyio.fail_after(20):
            r, raw = await stream(base, "/v1/completions", {"prompt": "the cat", "stream": True})
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert orjson.loads(raw)["detail"]["error_type"] == "overloaded_error"


@pytest.mark.parametrize("read_first_chunk", [False, True])
async def test_closed_client_cancels_a_streamed_completion(fixture_engine, read_first_chunk):
    """Before the 200 (the handler waits for the first token) or while the body streams, a client that
    closes the connection ends the engine request (CANCEL): the slot is free again."""
    async with serving_slow(fixture_engine) as (engine, port):
        s = await anyio.connect_tcp("127.0.0.1", port)
        await s.send(
            raw_post(
                "/v1/completions", {"prompt": "count", "max_tokens": 400, "stream": True, "echo": True, "logprobs": 1}
            )
        )
        await wait_until(lambda: engine.in_flight == 1, "the completion reached the engine")
        if read_first_chunk:
            got = b""
            with anyio.fail_after(10):
                while b"data: " not in got:
                    got += await s.receive()
            assert got.startswith(b"HTTP/1.1 200 OK\r\n")
        await s.aclose()
        await wait_until(lambda: engine.in_flight == 0, "the engine request was cancelled")
        assert engine.healthy


async def test_echo_after_a_snapshot_is_stitched_whole_and_streamed(fixture_engine):
    """A prompt that extends a snapshot is read out by the engine from the snapshot's end only; the
    route reads the head out on its own (queued behind the generation on the one KV slot) and
    stitches: the streamed and the whole prompt parts both equal the toy's read-out of every position."""
    head = "The state of the ticket, photographed. "
    prompt = head + "Then a question"
    async with Engine.spawn(
        [str(fixture_engine), "--slots", "1"], options=EngineOptions().updated(handshake_timeout=30)
    ) as engine:
        await engine.read_out(head, logprobs=1, pin=True)
        heads = []
        read_out = engine.read_out

        async def recording_read_out(text, **kw):
            heads.append(text)
            return await read_out(text, **kw)

        engine.read_out = recording_read_out
        app = App(engine, ModelInfo.load(engine.caps.model), config=AppConfig(request_timeout=60))
        async with running(app) as base:
            body = {"prompt": prompt, "max_tokens": 4, "echo": True, "logprobs": 1}
            _, raw = await stream(base, "/v1/completions", {**body, "stream": True})
            whole = (await post(base, "/v1/completions", body)).json()["choices"][0]
    assert heads == [head, head]  # the engine resumed from the snapshot both times: the head was read out apart
    events = sse_events(raw)
    assert merged_completion(events) == {k: whole[k] for k in ("text", "finish_reason", "logprobs")}
    lp = events[0]["choices"][0]["logprobs"]
    assert events[0]["choices"][0]["text"] == prompt and "".join(lp["tokens"]) == prompt
    assert lp["token_logprobs"][0] is None
    assert lp["token_logprobs"][1:] == pytest.approx(toy_readout(prompt), abs=1e-6)


# ---- the tiny GGUF on the llama engine: the numpy oracle ----


@pytest.fixture
def tiny():
    if not os.access(engine_bin("serveproto-llama"), os.X_OK):
        pytest.skip("engines/bin/serveproto-llama is not built yet (make -C engines all)")
    return tiny_gguf.ensure()


@pytest.mark.slow
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_tiny_gguf_streams_equal_the_whole_replies_and_the_oracle(tiny, anyio_backend):
    from fixtures import vocab

    ids_of = {p: i for i, p in enumerate(vocab.load(tiny).pieces)}
    comp = {"prompt": "The capital of France is", "max_tokens": 6, "echo": True, "logprobs": 3}
    chat = {
        "messages": [{"role": "user", "content": "Name a colour."}],
        "max_tokens": 6,
        "logprobs": True,
        "top_logprobs": 2,
    }
    async with serving_llama("--model", str(tiny), "--slots", "1", "--ctx", "512") as base:
        whole = (await post(base, "/v1/completions", comp)).json()
        _, raw = await stream(base, "/v1/completions", {**comp, "stream": True})
        chat_whole = (await post(base, "/v1/chat/completions", chat)).json()
        _, chat_raw = await stream(base, "/v1/chat/completions", {**chat, "stream": True})
    events = sse_events(raw)
    choice = whole["choices"][0]
    assert merged_completion(events) == {
        "text": choice["text"],
        "finish_reason": choice["finish_reason"],
        "logprobs": choice["logprobs"],
    }
    assert choice["finish_reason"] == "length" and whole["usage"]["completion_tokens"] == 6
    # the prompt part: one chunk, each position's logprob and top-3 as the oracle computes them
    lp = events[0]["choices"][0]["logprobs"]
    assert events[0]["choices"][0]["text"] == comp["prompt"]
    ids = [ids_of[t.encode()] for t in lp["tokens"]]
    assert len(ids) == whole["usage"]["prompt_tokens"]
    ref = oracle.logprobs(tiny, ids)
    top_ids, top_lps = oracle.top_k(tiny, ids, 3)  # noqa: RUF059  (kept as written)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert max(abs(a - r) for a, r in zip(lp["token_logprobs"][1:], ref[1:])) <= TOL
    for p in range(1, len(ids)):
        assert list(lp["top_logprobs"][p].values()) == pytest.approx(list(top_lps[p]), abs=TOL)
    # the generated tokens: each one the oracle's greedy choice, at the oracle's logprob
    gen = choice["logprobs"]["tokens"][len(ids) :]
    full = ids + [ids_of[t.encode()] for t in gen]
    ref = oracle.logprobs(tiny, full)
    assert max(abs(a - r) for a, r in zip(choice["logprobs"]["token_logprobs"][len(ids) :], ref[len(ids) :])) <= TOL
    greedy = oracle.top_k(tiny, full, 1)[0]
    assert [int(greedy[p][0]) for p in range(len(ids), len(full))] == full[len(ids) :]
    # chat: streamed content and logprobs equal the whole reply's
    chunks = [e["choices"][0] for e in sse_events(chat_raw)]
    assert [x for c in chunks if c["logprobs"] for x in c["logprobs"]["content"]] == chat_whole["choices"][0][
        "logprobs"
    ]["content"]
    assert "".join(c["delta"].get("content", "") for c in chunks) == chat_whole["choices"][0]["message"]["content"]
    assert len(chat_whole["choices"][0]["logprobs"]["content"]) == 6 and not math.isnan(
        chunks[1]["logprobs"]["content"][0]["logprob"]
    )
