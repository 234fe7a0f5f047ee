"""A refused request must not keep its memory (issue 30, item 0), measured on a real server.

100 new 15 MB states, each refused with 422, once took the server from 48 MB to 1.6 GB of RSS
(the slot router's shared-prefix cache kept every state alive); the caches are bounded by bytes
now, and the server's RSS stays within a few copies of one request of where it was.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx2
import pytest

from support import serve_process

#: The bound on the server's RSS growth over the 100 refused requests (bytes): one request's
#: transient copies stay with the allocator (glibc keeps freed 15 MB blocks for reuse), its
#: caches hold at most ``PREFIX_CACHE_BYTES`` + slots x ``MAX_KEY_BYTES`` + ``READY_BYTES``.
RSS_GROWTH_BOUND = 128 << 20

STATE_BYTES = 15 << 20


def rss_bytes(pid: int) -> int:
    """Resident set size of process ``pid`` in bytes (``VmRSS`` of ``/proc/<pid>/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc")
def test_100_refused_15_mb_states_do_not_keep_their_memory(fixture_engine):
    argv = ["--port", "0", "--log-level", "ERROR", "--engine", str(fixture_engine)]
    with serve_process(*argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as proc:
        line = proc.stdout.readline()
        assert line.startswith("serveproto: serving "), line
        base = line.split(" on ")[1].strip()
        head = b'{"questions": {"urgency": {"type": "noul"}}, "state": "'
        body = bytearray(head + b"x" * STATE_BYTES + b'"}')
        statuses = []
        with httpx2.Client(base_url=base, timeout=120) as c:
            small = c.post("/v1/systemone", json={"state": "hello", "questions": {"urgency": {"type": "noul"}}})
            assert small.status_code == 200
            before = rss_bytes(proc.pid)
            for i in range(100):
                body[len(head) : len(head) + 6] = b"%06d" % i  # a new state each time
                r = c.post("/v1/systemone", content=bytes(body), headers={"content-type": "application/json"})
                statuses.append(r.status_code)
            last = r.json()
            after = rss_bytes(proc.pid)
    assert statuses == [422] * 100
    assert last["detail"] == [
        {
            "loc": ["body", "state"],
            "type": "too_long",
            "msg": "The prompt of question 'urgency' (the state, then the question and its options) is longer than "
            "the engine's context of 4096 tokens; this is its longest part",
        }
    ]
    assert after - before < RSS_GROWTH_BOUND, (before >> 20, after >> 20)


def test_the_fixed_prefixes_remembered_keep_no_text_and_are_bounded():
    # Memory.fixed once kept every fixed prefix photographed, as its whole prompt, for ever.
    import tracemalloc

    from gateway.decision.pipeline import SEEN_STATES, Memory

    mem = Memory()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(2 * SEEN_STATES):
        key = (None, "P" * 10_000 + str(i))
        assert key not in mem.fixed
        mem.fixed[key] = 70  # the photograph's tokens (issue 48, item 1)
        del key
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(mem.fixed) == SEEN_STATES
    assert grown < 1 << 20  # 2,048 prefixes of 10 kB kept were 20 MB
    assert (None, "P" * 10_000 + str(2 * SEEN_STATES - 1)) in mem.fixed
    assert (None, "P" * 10_000 + "0") not in mem.fixed
    assert mem.fixed.pop((None, "P" * 10_000 + str(2 * SEEN_STATES - 1)), None) == 70
    assert mem.fixed.pop((None, "P" * 10_000 + str(2 * SEEN_STATES - 1)), None) is None
    from gateway.decision.keyset import KeyCounts, KeySet

    with pytest.raises(ValueError, match="limit"):
        KeySet(0)
    with pytest.raises(ValueError, match="limit"):
        KeyCounts(0)
    with pytest.raises(ValueError, match="count"):
        mem.fixed[(None, "P")] = -1


def test_a_part_over_any_context_is_refused_before_the_engine():
    from gateway.decision.refusals import over_any_context
    from gateway.decision.schema import parse_request

    def detail(q: str, *loc):
        return {
            "loc": ["body", *loc],
            "type": "too_long",
            "msg": f"The prompt of question {q!r} (the state, then the question and its options) is longer than the "
            "engine's context of 100 tokens; this is its longest part",
        }

    questions = {"a": {"type": "noul"}, "b": {"type": "noul", "instructions": "y" * 1001}}
    # 100 tokens of at most 10 bytes: 1,000 bytes at most
    assert over_any_context(parse_request({"state": "x" * 1000, "questions": {"a": {"type": "noul"}}}), 100, 10) is None
    assert over_any_context(parse_request({"state": "x" * 1001, "questions": questions}), 100, 10) == detail(
        "a", "state"
    )
    assert over_any_context(parse_request({"state": "é" * 501, "questions": questions}), 100, 10) == detail(
        "a", "state"
    )  # 1,002 bytes
    assert over_any_context(parse_request({"state": "s", "questions": questions}), 100, 10) == detail(
        "b", "questions", "b"
    )
    big = parse_request({"state": "x" * 5000, "questions": questions})
    assert over_any_context(big, None, 10) is None and over_any_context(big, 100, None) is None


@pytest.mark.anyio
async def test_15_mb_texts_are_refused_before_the_llama_engine_reads_them(llama_engine):
    # On this 2-core machine the llama engine spent more than its 30 s PING timeout tokenizing one
    # 15 MB state: it was killed and restarted, the client got a 503, and four such requests in a
    # minute would have made the server give up. The gateway refuses them itself now (81 bytes is
    # SmolLM2's longest token piece: 1024 tokens are at most 82,944 bytes).
    import anyio

    from gateway.server.app import ModelInfo
    from test_routes_support import serving

    model = llama_engine[llama_engine.index("--model") + 1]
    big = "x" * STATE_BYTES
    info = ModelInfo.load(None, model)
    assert info.max_token_bytes == 81
    chat_bytes = len(info.template.render([{"role": "user", "content": big}]).encode())
    async with serving(
        "--model", model, "--ctx", "1024", "--ctx-max", "1024", "--threads", "1", "--debias", "none"
    ) as base:
        async with httpx2.AsyncClient(base_url=base, timeout=120) as c:
            with anyio.fail_after(60):
                state = await c.post("/v1/systemone", json={"state": big, "questions": {"q": {"type": "noul"}}})
                chat = await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": big}]})
                completion = await c.post("/v1/completions", json={"prompt": big, "max_tokens": 1})
                restarts = (await c.get("/metrics")).text
    assert state.status_code == 422
    assert state.json()["detail"] == [
        {
            "loc": ["body", "state"],
            "type": "too_long",
            "msg": "The prompt of question 'q' (the state, then the question and its options) is longer than the "
            "engine's context of 1024 tokens; this is its longest part",
        }
    ]
    assert chat.status_code == 400
    assert chat.json()["error"] == {
        "message": f"'messages': the prompt is longer than the engine's context of 1024 tokens ({chat_bytes} bytes; "
        "a token of this model stands for at most 81 bytes)",
        "type": "invalid_request_error",
        "param": "messages",
        "code": None,
    }
    assert completion.status_code == 400
    assert completion.json()["error"]["message"] == (
        f"'prompt': the prompt is longer than the engine's context of 1024 tokens ({STATE_BYTES} bytes; "
        "a token of this model stands for at most 81 bytes)"
    )
    assert "serveproto_engine_restarts 0.0" in restarts
