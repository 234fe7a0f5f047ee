"""The llama engine (``engines/bin/serveproto-llama``) on the tiny fixture GGUF.

Each test drives a real engine process over its pipes. Well-formed requests go
through ``serveproto.GatewayConnection`` (which also checks every reply against
the protocol's per-request invariants); malformed frames are written raw and
their ERROR lines read raw. The numbers a snapshot gives are held to a cold
engine's to the printed digit, and the DONE counters prove what was computed.
"""

from __future__ import annotations

import json
import os
import resource
import selectors
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from gateway.paths import default_model_path, engine_bin

serveproto = pytest.importorskip("serveproto")
from serveproto import (  # noqa: E402
    NEED_DATA,
    Accept,
    ConnectionClosed,
    Data,
    Done,
    Echo,
    Error,
    GatewayConnection,
    LoadFail,
    Pong,
    Score,
    Scored,
    Stat,
    Submit,
)

#: The engine under test; SERVEPROTO_LLAMA_ENGINE points at another build (e.g. with ASan).
ENGINE = Path(os.environ.get("SERVEPROTO_LLAMA_ENGINE") or engine_bin("serveproto-llama"))
TIMEOUT_S = 120.0

#: A prompt as token ids (ASCII decimal): 8 ids of the SmolLM2 vocabulary.
PREFIX_IDS = [19556, 905, 1024, 2451, 28, 347, 5, 9]


def ids(tokens) -> bytes:
    return " ".join(str(t) for t in tokens).encode()


@pytest.fixture(scope="module")
def tiny() -> Path:
    if not os.access(ENGINE, os.X_OK):
        pytest.skip(f"{ENGINE} is not built yet (make -C engines all)")
    from fixtures import tiny_gguf

    return tiny_gguf.ensure()


class Proc:
    """A serveproto-llama process and a blocking reader of its stdout."""

    def __init__(self, model: Path | str, *args: str, preexec_fn=None):
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [str(ENGINE), "--model", str(model), "--threads", "1", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            preexec_fn=preexec_fn,
        )
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.proc.stdout, selectors.EVENT_READ)
        self.eof = False

    def read_some(self) -> bytes:
        """The next bytes of stdout (b"" at EOF); fails the test after TIMEOUT_S."""
        if not self.sel.select(TIMEOUT_S):
            self.proc.kill()
            pytest.fail(f"engine silent for {TIMEOUT_S} s; stderr: {self.stderr_text()[-2000:]}")
        data = os.read(self.proc.stdout.fileno(), 1 << 16)
        self.eof = not data
        return data

    def write(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def stderr_text(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")

    def close(self) -> int:
        """Closes stdin (graceful shutdown) and returns the exit status."""
        if not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            return self.proc.wait(TIMEOUT_S)
        finally:
            self.proc.stdout.close()
            self.sel.close()
            self.stderr.close()


class Engine(Proc):
    """Typed events through GatewayConnection, grouped by request id."""

    def __init__(self, model, *args, **kw):
        super().__init__(model, *args, **kw)
        self.conn = GatewayConnection()
        self.backlog: dict[int, list] = {}
        self.handshake = []
        while True:
            ev = self.next_event()
            self.handshake.append(ev)
            if isinstance(ev, (Stat, LoadFail, ConnectionClosed)):
                break
        self.caps = self.conn.caps

    def next_event(self):
        while True:
            ev = self.conn.next_event()
            if ev is not NEED_DATA:
                return ev
            self.conn.receive_data(self.read_some())

    def send(self, *events) -> None:
        self.write(b"".join(self.conn.send(e) for e in events))

    def collect(self, rid: int) -> list:
        """Events of request ``rid`` up to its DONE, ERROR or PONG."""
        out = self.backlog.pop(rid, [])
        while not out or not isinstance(out[-1], (Done, Error, Pong)):
            ev = self.next_event()
            assert not isinstance(ev, ConnectionClosed), self.stderr_text()[-2000:]
            if getattr(ev, "id", None) == rid:
                out.append(ev)
            elif hasattr(ev, "id"):
                self.backlog.setdefault(ev.id, []).append(ev)
        return out

    def request(self, ev) -> list:
        self.send(ev)
        return self.collect(ev.id)


class Raw(Proc):
    """Reply frames as (fields, payload) for tests that write malformed frames."""

    PAYLOAD_FIELD = {b"ECHO": 2, b"DATA": 2, b"DECISION": 2}  # noqa: RUF012  (a read-only table)

    def __init__(self, model, *args):
        super().__init__(model, *args)
        self.buf = b""
        while self.frame()[0][0] != b"STAT":
            pass

    def _fill(self) -> None:
        data = self.read_some()
        assert data, f"engine closed stdout; stderr: {self.stderr_text()[-2000:]}"
        self.buf += data

    def frame(self) -> tuple[list[bytes], bytes | None]:
        while b"\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\n", 1)
        fields = line.split(b" ")
        at = self.PAYLOAD_FIELD.get(fields[0])
        if at is None:
            return fields, None
        n = int(fields[at])
        while len(self.buf) < n + 1:
            self._fill()
        payload, self.buf = self.buf[:n], self.buf[n + 1 :]
        return fields, payload

    def until(self, rid: bytes, kinds=(b"DONE", b"ERROR", b"PONG")) -> list[list[bytes]]:
        """Frame lines up to the first of ``kinds`` for id ``rid`` (other ids' lines kept too)."""
        lines = []
        while True:
            fields, _ = self.frame()
            lines.append(fields)
            if fields[0] in kinds and fields[1] == rid:
                return lines

    def alive(self, rid: int = 999_000) -> None:
        """PING -> PONG: the engine still serves."""
        self.write(b"PING %d\n" % rid)
        assert self.until(b"%d" % rid)[-1][:2] == [b"PONG", b"%d" % rid]


def echoes(events) -> list[Echo]:
    return [e for e in events if isinstance(e, Echo)]


def done(events) -> Done:
    assert isinstance(events[-1], Done), events[-1]
    return events[-1]


def readout(eng: Engine, rid: int, prompt: bytes, *, slot=0, pin=False, as_ids=True, k=1) -> list:
    return eng.request(
        Submit(
            id=rid,
            slot=slot,
            prompt=prompt,
            max_tokens=0,
            temperature=0.0,
            top_p=1.0,
            logprobs=k,
            pin=pin,
            ids=as_ids,
            counters=True,
        )
    )


# ---- handshake ----------------------------------------------------------------------------


def test_handshake_announces_caps(tiny):
    from fixtures.vocab import Vocab

    eng = Engine(tiny, "--slots", "2", "--ctx", "256", "--pin-slots", "3")
    try:
        assert eng.caps.values == {
            "chat": "1",
            "slots": "2",
            "n_ctx": "256",
            "x_max_prompt": "2048",  # the fixture's trained context: one slot at a time may pass 256
            "n_vocab": str(len(Vocab(tiny))),
            "model": "tiny-v1",
            "pin_slots": "3",
            "max_logprobs": "32",
            "x_score": "1",
            "x_score_base": "1",
            "x_hidden": "3",  # SCORE hidden (spec 9.1): the fixture's layers and width
            "x_hidden_dim": "64",
            "x_counters": "1",
            "x_health": "1",
            "x_numerics": "invariant",
            "x_batched": "1",
            "n_ubatch": "256",
            "n_chunk": "128",
            "x_threads": "1",
            "x_stack": "SIGUSR2",  # a stack on stderr at that signal (common/stack.h)
            # the llama.cpp patches this build has (engines/llama/patches/README.md), in their order
            "x_patches": "use_ref,fa_keep_f32,kv_in_order,cuda_invariant,kv_used_cells,eval_sync,isolated_numbers,"
            "bpe_word_cache,cuda_graph_shapes,fa_own_cells,fa_row_blocks,q4_1_four_columns,fa_mask_bits,"
            "q4_1_eight_columns,fa_tile_lanes,output_ring,ring_copies,"
            "decode_profile",
        }
        stat = eng.handshake[-1]
        assert isinstance(stat, Stat) and stat.fields[:3] == (0.0, 0.0, 0.0) and stat.fields[3] > 0
    finally:
        assert eng.close() == 0


def test_threads_auto_starts_on_every_core_the_engine_may_use(tiny):
    import os

    eng = Engine(tiny, "--threads", "auto")  # after the fixture's --threads 1: the last one wins
    try:
        assert eng.caps.values["x_threads"] == f"auto:{len(os.sched_getaffinity(0))}"
    finally:
        assert eng.close() == 0


# ---- read-out, snapshots, counters --------------------------------------------------------


def test_readout_through_snapshot_equals_cold_and_computes_only_new_tokens(tiny):
    full = PREFIX_IDS + [600, 601, 602]
    warm = Engine(tiny)
    cold = Engine(tiny)
    try:
        ev = readout(warm, 1, ids(PREFIX_IDS), pin=True)
        assert [e.position for e in echoes(ev)] == list(range(8))
        d = done(ev)
        assert (d.prompt_tokens, d.computed, d.reused, d.snapshot) == (8, 8, 0, "none")

        ev = readout(warm, 2, ids(full), k=4)
        assert isinstance(ev[0], Accept) and ev[0].prompt_tokens == 11
        got = echoes(ev)
        assert [e.position for e in got] == [8, 9, 10]
        d = done(ev)
        assert (d.prompt_tokens, d.computed, d.reused, d.snapshot) == (11, 3, 8, "hit")

        ref = echoes(readout(cold, 1, ids(full), k=4))
        assert [e.position for e in ref] == list(range(11))
        assert np.isnan(ref[0].logprob) and ref[0].top == ()
        for g, r in zip(got, ref[8:]):
            # equal floats parsed from "%.9g" are equal printed digits
            assert (g.logprob, g.top, g.text) == (r.logprob, r.top, r.text)

        # and both are the model's numbers (independent numpy forward pass)
        from fixtures import oracle

        want = oracle.logprobs(tiny, full)
        assert np.allclose([e.logprob for e in ref[1:]], want[1:], atol=1e-4, rtol=0)
    finally:
        assert warm.close() == 0
        assert cold.close() == 0


def test_long_prompt_reads_out_across_decode_chunks(tiny):
    """600 positions span two llama_decode calls (512 + 88): the read-out is contiguous
    and the position after the boundary equals its value through a snapshot there."""
    toks = [(PREFIX_IDS[i % 8] + 37 * i) % 40000 + 100 for i in range(600)]
    cold = Engine(tiny, "--ctx", "1024")
    warm = Engine(tiny, "--ctx", "1024")
    try:
        ev = readout(cold, 1, ids(toks))
        ref = echoes(ev)
        assert [e.position for e in ref] == list(range(600)) and done(ev).computed == 600
        assert np.all(np.isfinite([e.logprob for e in ref[1:]]))
        done(readout(warm, 1, ids(toks[:512]), pin=True))
        ev = readout(warm, 2, ids(toks))
        assert done(ev).computed == 88
        assert [(e.position, e.logprob, e.top) for e in echoes(ev)] == [
            (e.position, e.logprob, e.top) for e in ref[512:]
        ]
    finally:
        assert cold.close() == 0
        assert warm.close() == 0


def test_deepest_snapshot_wins_and_stale_ones_are_released(tiny):
    a = PREFIX_IDS[:4]
    ab = PREFIX_IDS
    eng = Engine(tiny, "--pin-slots", "4")
    try:
        done(readout(eng, 1, ids(a), pin=True))
        d = done(readout(eng, 2, ids(ab), pin=True))
        assert (d.computed, d.reused, d.snapshot) == (4, 4, "hit")
        d = done(readout(eng, 3, ids(ab + [700])))
        assert (d.computed, d.reused, d.snapshot) == (1, 8, "hit")  # the deeper one

        # a + [800]: restores a (still valid); the slot's rows past a are rewritten,
        # so the snapshot ab is stale from now on
        d = done(readout(eng, 4, ids(a + [800, 801])))
        assert (d.computed, d.reused, d.snapshot) == (2, 4, "hit")
        ev = readout(eng, 5, ids(ab + [900]))
        d = done(ev)
        assert (d.computed, d.reused, d.snapshot) == (5, 4, "hit")  # ab refused, a restored
        assert echoes(ev)[0].position == 4 and np.isfinite(echoes(ev)[0].logprob)
    finally:
        assert eng.close() == 0


def test_stale_snapshot_is_refused_and_read_from_the_start(tiny):
    eng = Engine(tiny)
    cold = Engine(tiny)
    try:
        done(readout(eng, 1, ids(PREFIX_IDS), pin=True))
        # an unrelated prompt on the same slot overwrites the snapshot's rows
        done(readout(eng, 2, ids([1234, 5678, 91])))
        ev = readout(eng, 3, ids(PREFIX_IDS + [600]))
        d = done(ev)
        assert (d.computed, d.reused, d.snapshot) == (9, 0, "stale")
        got = echoes(ev)
        assert got[0].position == 0 and np.isnan(got[0].logprob)
        ref = echoes(readout(cold, 1, ids(PREFIX_IDS + [600])))
        assert [(e.position, e.logprob, e.top) for e in got[1:]] == [(e.position, e.logprob, e.top) for e in ref[1:]]
        # the stale snapshot was released: no snapshot at all now
        d = done(readout(eng, 4, ids(PREFIX_IDS + [601])))
        assert (d.computed, d.reused, d.snapshot) == (9, 0, "none")
    finally:
        assert eng.close() == 0
        assert cold.close() == 0


def test_snapshot_serves_another_slot(tiny):
    eng = Engine(tiny, "--slots", "2")
    cold = Engine(tiny)
    try:
        done(readout(eng, 1, ids(PREFIX_IDS), slot=0, pin=True))
        ev = readout(eng, 2, ids(PREFIX_IDS + [42, 43]), slot=1)
        d = done(ev)
        assert (d.computed, d.reused, d.snapshot) == (2, 8, "hit")
        ref = echoes(readout(cold, 1, ids(PREFIX_IDS + [42, 43])))
        assert [(e.logprob, e.top) for e in echoes(ev)] == [(e.logprob, e.top) for e in ref[8:]]
    finally:
        assert eng.close() == 0
        assert cold.close() == 0


def test_generation_keeps_the_live_prefix(tiny):
    """Without read-out, truncate-and-extend reuses the slot's common prefix."""
    eng = Engine(tiny)
    try:

        def gen(rid, toks):
            return done(
                eng.request(
                    Submit(
                        id=rid,
                        slot=0,
                        prompt=ids(toks),
                        max_tokens=1,
                        temperature=0.0,
                        top_p=1.0,
                        ids=True,
                        counters=True,
                    )
                )
            )

        d = gen(1, PREFIX_IDS)
        assert (d.prompt_tokens, d.computed, d.reused, d.snapshot) == (8, 8, 0, "none")
        d = gen(2, PREFIX_IDS + [50, 51, 52])
        assert (d.computed, d.reused) == (3, 8)
        d = gen(3, PREFIX_IDS[:5] + [60])
        assert (d.computed, d.reused) == (1, 5)
        d = gen(4, PREFIX_IDS[:5] + [60])  # the same prompt: only its last position again
        assert (d.computed, d.reused) == (1, 5)
    finally:
        assert eng.close() == 0


# ---- generation -------------------------------------------------------------------------


def test_greedy_generation_follows_the_oracle(tiny):
    from fixtures import oracle

    eng = Engine(tiny)
    try:
        ev = eng.request(
            Submit(id=7, slot=0, prompt=ids(PREFIX_IDS), max_tokens=4, temperature=0.0, top_p=1.0, logprobs=3, ids=True)
        )
        data = [e for e in ev if isinstance(e, Data)]
        d = done(ev)
        assert d.emitted == len(data) == 4 and d.length_limited is True
        assert d.computed is None  # counters only when asked
        seq = list(PREFIX_IDS)
        for frame in data:
            want = oracle.logits(tiny, seq)[-1]
            lsm = want - (want.max() + np.log(np.exp(want - want.max()).sum()))
            best = int(np.argmax(want))
            assert frame.top[0][0] == best  # greedy picks the argmax
            assert frame.logprob == frame.top[0][1]
            assert abs(frame.logprob - lsm[best]) <= 1e-4
            seq.append(best)
    finally:
        assert eng.close() == 0


def test_sampling_is_seeded_and_respects_max_tokens(tiny):
    texts = []
    for _ in range(2):
        eng = Engine(tiny, "--seed", "7")
        try:
            ev = eng.request(
                Submit(id=3, slot=0, prompt=b"Once upon a time", max_tokens=6, temperature=0.9, top_p=0.95)
            )
            data = [e for e in ev if isinstance(e, Data)]
            d = done(ev)
            assert d.emitted == len(data) <= 6
            assert all(e.logprob is None for e in data)  # no tail without logprobs
            texts.append(b"".join(e.text for e in data))
        finally:
            assert eng.close() == 0
    assert texts[0] == texts[1]


def test_text_and_ids_prompts_read_out_alike(tiny):
    eng = Engine(tiny)
    try:
        by_text = echoes(readout(eng, 1, b"Hello world, again", as_ids=False, k=2))
        # the ids of the text's tokens: each ECHO's text is one vocabulary piece
        from fixtures.vocab import Vocab

        vocab = Vocab(tiny)
        toks = [vocab.id_of(e.text) for e in by_text]
        by_ids = echoes(readout(eng, 2, ids(toks), k=2))
        assert [(e.position, e.text, e.top) for e in by_ids[1:]] == [(e.position, e.text, e.top) for e in by_text[1:]]
        assert [e.logprob for e in by_ids[1:]] == [e.logprob for e in by_text[1:]]
    finally:
        assert eng.close() == 0


# ---- batched scoring ----------------------------------------------------------------------

SCORE_JOB = {
    "prefix": "The weather today is calm. ",
    "groups": [
        {"stem": "Is it raining? Answer:", "options": [" yes", " no", " maybe not"]},
        {"stem": "How warm is it? Answer:", "options": [" 1", " 2", " 3", " very warm indeed"]},
    ],
}


def score(eng: Engine, rid: int, job: dict, slot: int = 0) -> list:
    return eng.request(Score(id=rid, slot=slot, payload=json.dumps(job).encode()))


def test_batched_score_equals_one_by_one_submit(tiny):
    # the score cache off: the second SCORE below shows what a snapshot alone saves
    # (test_llama_digits.py has the cache's own test)
    eng = Engine(tiny, "--score-cache-mb", "0")
    ref = Engine(tiny)
    try:
        ev = score(eng, 1, {**SCORE_JOB, "pin": True})
        scored = [e for e in ev if isinstance(e, Scored)]
        d = done(ev)
        assert [(s.group, s.option) for s in scored] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (1, 3)]

        seqs = []
        for s in scored:
            g = SCORE_JOB["groups"][s.group]
            text = (SCORE_JOB["prefix"] + g["stem"] + g["options"][s.option]).encode()
            whole = readout(ref, 10 + len(seqs), text, as_ids=False)
            stem = readout(ref, 50 + len(seqs), (SCORE_JOB["prefix"] + g["stem"]).encode(), as_ids=False)
            w, st = echoes(whole), echoes(stem)
            seqs.append([e.text for e in w])
            common = 0
            while common < min(len(w), len(st)) and w[common].text == st[common].text:
                common += 1
            assert s.context_tokens == common
            # equal to the printed digit: with invariant numerics a row's arithmetic does
            # not depend on the cells or the batch around it (spec/llama-engine.md)
            assert len(s.logprobs) == len(w) - common
            assert list(s.logprobs) == [e.logprob for e in w[common:]]
        assert isinstance(ev[0], Accept) and ev[0].prompt_tokens == max(len(q) for q in seqs)
        # each distinct position computed once, and an option's last token not at all
        # (it predicts nothing): the distinct prefixes of the texts without their last token
        distinct = {tuple(q[:i]) for q in seqs for i in range(1, len(q))}
        assert len(distinct) < len({tuple(q[:i]) for q in seqs for i in range(1, len(q) + 1)})
        assert (d.computed, d.reused, d.snapshot) == (len(distinct), 0, "none")

        # again: the prefix comes from the snapshot, only stems and options are computed
        prefix = [e.text for e in echoes(readout(ref, 99, SCORE_JOB["prefix"].encode(), as_ids=False))]
        # the prefix's tokens that every text shares (its last one may merge with a stem)
        n_prefix = min(next((i for i, (x, y) in enumerate(zip(prefix, q)) if x != y), len(prefix)) for q in seqs)
        ev2 = score(eng, 2, SCORE_JOB)
        d2 = done(ev2)
        assert (d2.computed, d2.reused, d2.snapshot) == (len(distinct) - n_prefix, n_prefix, "hit")
        assert [s.logprobs for s in ev2 if isinstance(s, Scored)] == [s.logprobs for s in scored]
    finally:
        assert eng.close() == 0
        assert ref.close() == 0


def test_score_spills_into_chunks_with_the_same_numbers(tiny):
    one = Engine(tiny)
    small = Engine(tiny, "--score-seqs", "2")
    try:
        a_ev, b_ev = score(one, 1, SCORE_JOB), score(small, 1, SCORE_JOB)
        a = [(s.group, s.option, s.context_tokens, len(s.logprobs)) for s in a_ev if isinstance(s, Scored)]
        b = [(s.group, s.option, s.context_tokens, len(s.logprobs)) for s in b_ev if isinstance(s, Scored)]
        assert a == b and len(a) == 7
        lp_a = np.concatenate([s.logprobs for s in a_ev if isinstance(s, Scored)])
        lp_b = np.concatenate([s.logprobs for s in b_ev if isinstance(s, Scored)])
        assert list(lp_a) == list(lp_b)  # invariant numerics: the chunking changes no digit
        # two options per llama_decode: later chunks compute their stems again
        assert done(b_ev).computed > done(a_ev).computed
    finally:
        assert one.close() == 0
        assert small.close() == 0


# ---- errors: every path answers its code and the engine keeps serving ----------------------


def frame(line: bytes, payload: bytes) -> bytes:
    """A request line with its payload's byte count appended, then the payload."""
    return b"%s %d%s\n%s\n" % (line.split(b"|")[0], len(payload), line.split(b"|")[1] if b"|" in line else b"", payload)


ERROR_CASES = [
    (b"FROB 1\n", b"0", b"BAD_FRAME"),
    (frame(b"SUBMIT 1 0| 0 0 1", b"hello"), b"1", b"BAD_FRAME"),  # max_tokens=0 without logprobs
    (frame(b"SUBMIT 2 0| 1 0 1 logprobs=33", b"hello"), b"2", b"BAD_FRAME"),
    (frame(b"SUBMIT 3 0| 1 0 1 bogus=1", b"hello"), b"3", b"BAD_FRAME"),
    (frame(b"SUBMIT 4 7| 1 0 1", b"hello"), b"4", b"BAD_REQUEST"),  # slot out of range
    (frame(b"SUBMIT 5 0| 1 0 1", b""), b"5", b"EMPTY_PROMPT"),
    (frame(b"SUBMIT 6 0| 1 0 1 ids=1", b"999999"), b"6", b"BAD_REQUEST"),  # id outside the vocabulary
    (frame(b"SUBMIT 7 0| 1 0 1 ids=1", ids([5] * 40)), b"7", b"BAD_REQUEST"),  # longer than --ctx-max 32
    (b"STOP 8\n", b"8", b"NOT_FOUND"),
    (b"CANCEL 9\n", b"9", b"NOT_FOUND"),
    (frame(b"DECIDE 10 0", b"{}"), b"10", b"NOT_SUPPORTED"),
    (b"SUBMIT 12 0 5 1 0 1 3\nhello\nabc\n", b"12", b"NOT_SUPPORTED"),  # a grammar
    (frame(b"SCORE 13 0", b"{x}"), b"13", b"BAD_REQUEST"),
    (frame(b"SCORE 14 0", b'{"prefix":"a","groups":[]}'), b"14", b"BAD_REQUEST"),
    (frame(b"SCORE 15 0", b'{"prefix":"Hi","groups":[{"stem":" you","options":[""]}]}'), b"15", b"BAD_REQUEST"),
    (frame(b"SCORE 16 5", b'{"prefix":"a","groups":[{"stem":"b","options":["c"]}]}'), b"16", b"BAD_REQUEST"),
]


def test_every_error_path_answers_its_code_and_the_engine_keeps_serving(tiny):
    eng = Raw(tiny, "--ctx", "32", "--ctx-max", "32")  # a prompt of 40 tokens is past the longest
    try:
        for frame, rid, code in ERROR_CASES:
            eng.write(frame)
            lines = eng.until(rid, kinds=(b"DONE", b"ERROR"))
            assert lines[-1][:3] == [b"ERROR", rid, code], (frame, lines)
            assert len(lines) == 1, (frame, lines)
            eng.alive()
        # an IMAGE is refused and its SUBMIT dropped: nothing but the ERROR, then the PONG
        eng.write(b"IMAGE 30 3 1 1\nabc\nSUBMIT 30 0 5 1 0 1\nhello\nPING 31\n")
        assert [f[:3] for f in eng.until(b"31")] == [[b"ERROR", b"30", b"NOT_SUPPORTED"], [b"PONG", b"31", b"active=0"]]
        # and real work still runs
        eng.write(b"SUBMIT 32 0 5 2 0 1\nhello\n")
        assert eng.until(b"32")[-1][:2] == [b"DONE", b"32"]
    finally:
        assert eng.close() == 0


def test_requests_in_flight_duplicate_busy_ping_stop_cancel(tiny):
    eng = Raw(tiny, "--slots", "2")
    try:
        long = b"SUBMIT %d %d 5 150 0 1\nhello\n"
        eng.write(long % (20, 0) + long % (20, 1) + long % (21, 0) + b"PING 22\n")
        lines = eng.until(b"20", kinds=(b"DONE",))
        errors = [f[:3] for f in lines if f[0] == b"ERROR"]
        assert errors == [[b"ERROR", b"20", b"DUPLICATE_ID"], [b"ERROR", b"21", b"SLOT_BUSY"]]
        assert [b"PONG", b"22", b"active=1"] in [f[:3] for f in lines]
        n_data = sum(1 for f in lines if f[:2] == [b"DATA", b"20"])
        assert int(lines[-1][3]) == n_data  # DONE's emitted

        eng.write(long % (23, 0) + b"CANCEL 23\n")
        lines = eng.until(b"23", kinds=(b"DONE", b"ERROR"))
        assert lines[-1][:3] == [b"ERROR", b"23", b"CANCELLED"]
        eng.alive()

        eng.write(long % (24, 1) + b"STOP 24\n")
        lines = eng.until(b"24")
        assert lines[-1][:2] == [b"DONE", b"24"]
        emitted, length_limited = int(lines[-1][3]), lines[-1][8]
        assert emitted < 150 and length_limited == b"0"
        assert emitted == sum(1 for f in lines if f[:2] == [b"DATA", b"24"])
        eng.alive()
    finally:
        assert eng.close() == 0


def test_eof_finishes_the_requests_in_flight(tiny):
    eng = Raw(tiny)
    eng.write(b"SUBMIT 1 0 5 3 0 1\nhello\n")
    eng.proc.stdin.close()
    lines = eng.until(b"1")
    assert lines[-1][:2] == [b"DONE", b"1"] and lines[-1][3] == b"3"
    assert eng.close() == 0


# ---- LOAD_FAIL ------------------------------------------------------------------------------


def _gguf_of_unknown_architecture(path: Path) -> Path:
    import gguf

    w = gguf.GGUFWriter(str(path), "nonesuch")
    w.add_tensor("x", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


@pytest.mark.parametrize(
    "case, kind",
    [
        ("missing", "io"),
        ("directory", "io"),
        ("junk", "format"),
        ("truncated", "format"),
        ("unknown-arch", "unsupported"),
        ("too-little-memory", "nomem"),
    ],
)
def test_load_fail_kinds(tiny, tmp_path, case, kind):
    args, pre = [], None
    if case == "missing":
        model = tmp_path / "absent.gguf"
    elif case == "directory":
        model = tmp_path
    elif case == "junk":
        model = tmp_path / "junk.gguf"
        model.write_bytes(b"not a model at all" * 100)
    elif case == "truncated":
        model = tmp_path / "short.gguf"
        model.write_bytes(tiny.read_bytes()[:20_000_000])
    elif case == "unknown-arch":
        model = _gguf_of_unknown_architecture(tmp_path / "arch.gguf")
    else:
        model, args, pre = tiny, ["--ctx", "1048576", "--slots", "2"], _limit_memory
    eng = Engine(model, *args, preexec_fn=pre)
    ev = eng.handshake
    assert len(ev) == 1 and isinstance(ev[0], LoadFail), ev
    assert ev[0].kind == kind, ev[0]
    assert eng.close() != 0


# ---- the real default model ---------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_smoke_generates_text_and_reads_out_finite_logprobs():
    model = default_model_path()
    if not os.access(ENGINE, os.X_OK) or not model.exists():
        pytest.skip("needs the engine (make -C engines all) and the default model (make model)")
    eng = Engine(model, "--ctx", "1024")
    try:
        assert eng.caps.model == "SmolLM2-135M-Instruct.Q4_1" and eng.caps.n_vocab == 49152
        prompt = b"<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
        ev = eng.request(Submit(id=1, slot=0, prompt=prompt, max_tokens=8, temperature=0.0, top_p=1.0))
        text = b"".join(e.text for e in ev if isinstance(e, Data))
        assert done(ev).emitted >= 1 and text.strip()
        # a short answer ends at the end-of-turn token, which is not sent
        ev = eng.request(Submit(id=4, slot=0, prompt=prompt, max_tokens=64, temperature=0.0, top_p=1.0))
        d = done(ev)
        assert d.length_limited is False and 1 <= d.emitted < 64
        assert b"<|im_end|>" not in b"".join(e.text for e in ev if isinstance(e, Data))
        ev = readout(eng, 2, prompt, as_ids=False, k=3)
        lps = [e.logprob for e in echoes(ev)]
        assert np.isnan(lps[0]) and np.all(np.isfinite(lps[1:])) and len(lps) == done(ev).prompt_tokens
        ev = score(
            eng,
            3,
            {
                "prefix": prompt.decode(),
                "groups": [{"stem": "The capital of France is", "options": [" Paris", " London"]}],
            },
        )
        paris, london = [sum(s.logprobs) for s in ev if isinstance(s, Scored)]
        assert paris > london
    finally:
        assert eng.close() == 0
