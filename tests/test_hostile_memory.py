"""A refused request must not keep its memory (issue 30, item 0), measured on a real server.

100 new 15 MB states, each refused with 422, once took the server from 48 MB to 1.6 GB of RSS
(the slot router's shared-prefix cache kept every state alive); the caches are bounded by bytes
now, and the server's RSS stays within a few copies of one request of where it was.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx2
import pytest

from gateway.paths import ROOT

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
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--port", "0", "--log-level", "ERROR"]
        + ["--engine", str(fixture_engine)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
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
    finally:
        proc.terminate()
        proc.wait(timeout=30)
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
        mem.fixed[key] = True
        del key
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(mem.fixed) == SEEN_STATES
    assert grown < 1 << 20  # 2,048 prefixes of 10 kB kept were 20 MB
    assert (None, "P" * 10_000 + str(2 * SEEN_STATES - 1)) in mem.fixed
    assert (None, "P" * 10_000 + "0") not in mem.fixed
    assert mem.fixed.pop((None, "P" * 10_000 + str(2 * SEEN_STATES - 1)), None) is True
    assert mem.fixed.pop((None, "P" * 10_000 + str(2 * SEEN_STATES - 1)), None) is None
    from gateway.decision.keyset import KeySet

    with pytest.raises(ValueError, match="limit"):
        KeySet(0)
