"""Many requests in one llama_decode: the llama engine's scheduler on the default model.

The engine fills each decode from every request in flight, a chunk of each
(spec/llama-engine.md, "Many requests at once"). Two promises are held here:

* **Same digits.** Eight different requests (SCOREs with several questions,
  one pinned; read-outs; generations with log-probabilities) sent together to
  one engine give every number bit for bit (``--float-digits 17``, ``==``) as
  each sent alone to a fresh engine. A small ``--ubatch`` makes the chunks
  small, so the requests' rows interleave in many decodes, and the SCOREs'
  scratch rows free cells between the others' chunks. Without the allocation
  rule of patch 0003 (``LLAMA_KV_CELLS_IN_ORDER=0``) llama.cpp puts a
  sequence's later rows in those holes, below its earlier ones, and the
  digits move: the last test shows it.
* **Leaving mid-request.** A CANCELled big SCORE frees the engine within one
  chunk: a request sent after the CANCEL is answered while a generation that
  was running beside the big one still runs, and the generation's digits are
  those it has alone.
"""

from __future__ import annotations

import json

import pytest

from serveproto import Accept, Cancel, Data, Done, Echo, Error, Score, Scored, Submit
from test_llama_engine import Engine

pytestmark = pytest.mark.slow

WORDS = (
    "the invoice for march was charged twice and the customer wants a refund of the duplicate "
    "payment before the end of the week or she will close the account"
).split()


def text(seed: int, n: int) -> str:
    return " ".join(WORDS[(seed * 7 + i * (seed % 5 + 1)) % len(WORDS)] for i in range(n))


def score(rid: int, slot: int, seed: int, n_groups: int, options, pin: bool = False) -> Score:
    groups = [
        {"stem": f"\nQuestion {g}: is {text(seed + g, 6)} true? Answer:", "options": [o.format(g=g) for o in options]}
        for g in range(n_groups)
    ]
    payload = {"prefix": f"Ticket {seed}: {text(seed, 40)}\n", "groups": groups, "pin": pin}
    return Score(id=rid, slot=slot, payload=json.dumps(payload).encode())


def submit(rid: int, slot: int, prompt: str, **kw) -> Submit:
    args = dict(max_tokens=0, temperature=0.0, top_p=1.0, counters=True)
    args.update(kw)
    return Submit(id=rid, slot=slot, prompt=prompt.encode(), **args)


def eight_requests() -> list:
    """Mixed work, each request on its own slot."""
    return [
        score(1, 0, 1, 4, [" yes", " no", " it depends on item {g}"]),
        score(2, 1, 2, 6, [" yes", " no"], pin=True),
        submit(3, 2, f"Read this: {text(3, 120)}", logprobs=3),
        submit(4, 3, f"Write about: {text(4, 30)}", max_tokens=12, logprobs=2),
        score(5, 4, 5, 3, [" only when item {g} is late", " never for item {g}", " maybe"]),
        submit(6, 5, f"Summary: {text(6, 60)}", max_tokens=5, logprobs=1),
        score(7, 6, 7, 8, [" A", " B", " C"]),
        submit(8, 7, f"Tell me: {text(8, 200)}", max_tokens=6),
    ]


def numbers(events) -> list:
    """Every number and text a request's replies carry, in order (floats exact)."""
    assert isinstance(events[-1], Done), events[-1]
    out = []
    for e in events:
        if isinstance(e, Scored):
            out.append(("scored", e.group, e.option, e.context_tokens, tuple(e.logprobs)))
        elif isinstance(e, Echo) and e.position > 0:  # position 0 is nan, which equals nothing
            out.append(("echo", e.position, e.logprob, repr(e.top), e.text))
        elif isinstance(e, Data):
            out.append(("data", e.text, repr(getattr(e, "logprob", None)), repr(getattr(e, "top", None))))
    return out


def engine(model_path, *args) -> Engine:
    return Engine(model_path, "--float-digits", "17", "--slots", "8", "--ctx", "1024", "--ubatch", "32", *args)


def alone(model_path, requests) -> dict[int, list]:
    want = {}
    for r in requests:
        eng = engine(model_path)
        try:
            want[r.id] = numbers(eng.request(r))
        finally:
            eng.close()
    return want


def together(model_path, requests, *args: str) -> dict[int, list]:
    eng = engine(model_path, *args)
    try:
        eng.send(*requests)
        got = {r.id: numbers(eng.collect(r.id)) for r in requests}
        assert eng.close() == 0
    finally:
        if eng.proc.poll() is None:
            eng.proc.kill()
    return got


@pytest.fixture(scope="module")
def alone_numbers(model_path):
    return alone(model_path, eight_requests())


def test_eight_requests_together_give_the_digits_of_each_alone(model_path, alone_numbers):
    got = together(model_path, eight_requests())
    assert all(len(v) > 3 for v in alone_numbers.values())
    differ = [rid for rid in got if got[rid] != alone_numbers[rid]]
    assert not differ, f"requests whose numbers moved when batched: {differ}"


def test_without_cells_in_order_the_digits_move(model_path, alone_numbers, monkeypatch):
    """The test above can fail: llama.cpp's own cell allocator fills holes below a sequence's rows."""
    monkeypatch.setenv("LLAMA_KV_CELLS_IN_ORDER", "0")
    got = together(model_path, eight_requests())
    assert [rid for rid in got if got[rid] != alone_numbers[rid]], "no request's digits moved"


def test_with_overlap_tasks_arriving_in_a_decode_start_before_its_read_with_the_same_digits(
    model_path, alone_numbers, tmp_path, monkeypatch
):
    """Overlap (SERVEPROTO_OVERLAP=1, a GPU build's default, run here on the CPU without the abort
    callback, so stdin is read between decodes only): a request that arrives while a decode runs is
    started right after llama_decode returns, before that decode's rows are read, and joins the next
    decode. Each of the eight is sent after an event of those before, so it lands in a decode; the
    profile counts the tasks started early (0 with SERVEPROTO_OVERLAP=0), and every number is the one
    its request has alone."""
    monkeypatch.setenv("SERVEPROTO_OVERLAP", "1")
    monkeypatch.setenv("SERVEPROTO_NO_ABORT_CALLBACK", "1")
    monkeypatch.setenv("SERVEPROTO_PROFILE", str(tmp_path / "prof"))
    requests = eight_requests()
    requests.insert(0, requests.pop())  # the longest prompt first: its prefill is eight decodes
    eng = engine(model_path)
    try:
        events: dict[int, list] = {r.id: [] for r in requests}
        for r in requests:
            eng.send(r)
            ev = eng.next_event()
            events[ev.id].append(ev)
        while not all(v and isinstance(v[-1], (Done, Error)) for v in events.values()):
            ev = eng.next_event()
            events[ev.id].append(ev)
        got = {rid: numbers(v) for rid, v in events.items()}
        assert eng.close() == 0
    finally:
        if eng.proc.poll() is None:
            eng.proc.kill()
    assert not [rid for rid in got if got[rid] != alone_numbers[rid]], "numbers moved under overlap"
    early = profile_last(tmp_path)["early_tasks"]
    assert 1 <= early <= len(requests), early


@pytest.mark.parametrize(
    "pipeline, fill, wait", [("1", "", None), ("0", "", None), ("1", "100000", "3"), ("1", "", "0")]
)
def test_with_the_pipeline_rows_read_after_the_next_decode_is_queued_keep_their_digits(
    model_path, alone_numbers, tmp_path, monkeypatch, pipeline, fill, wait
):
    """The pipeline (SERVEPROTO_PIPELINE=N, a GPU build's default, off on the CPU; llama.cpp's output ring,
    patch 0010): a decode's rows are left unread while the next decode, filled from the other requests, is
    queued, and read from the ring after it. Run here on the CPU, where it gains nothing but takes the same path:
    the eight requests together give every number they have alone, and the profile counts the decodes read
    so (none with SERVEPROTO_PIPELINE=0, so the count is not vacuous). The wait for more requests after a
    read from the ring that ended some: with SERVEPROTO_PIPELINE_FILL above what the eight can want, each
    such read waits up to SERVEPROTO_PIPELINE_WAIT_MS and the profile counts the wake-ups of those waits;
    with the wait at 0 it counts none. The numbers stay in every case."""
    monkeypatch.setenv("SERVEPROTO_OVERLAP", "1")
    monkeypatch.setenv("SERVEPROTO_PIPELINE", pipeline)
    monkeypatch.setenv("SERVEPROTO_PIPELINE_FILL", fill)
    if wait is None:
        monkeypatch.delenv("SERVEPROTO_PIPELINE_WAIT_MS", raising=False)
    else:
        monkeypatch.setenv("SERVEPROTO_PIPELINE_WAIT_MS", wait)
    monkeypatch.setenv("SERVEPROTO_PROFILE", str(tmp_path / "prof"))
    got = together(model_path, eight_requests())
    assert not [rid for rid in got if got[rid] != alone_numbers[rid]], "numbers moved under the pipeline"
    last = profile_last(tmp_path)
    assert (last["pipelined"] >= 1) == (pipeline == "1"), last
    # llama_decode called with a decode in flight: every call but those after a read at once
    assert (last["alone"] < last["decodes"]) == (pipeline == "1"), last
    if wait is not None:
        assert (last["waited"] >= 1) == (wait != "0"), last


@pytest.mark.parametrize("device_us_row", ["0", "30000"])
def test_the_late_fill_keeps_every_number_and_waits_only_for_a_device(
    model_path, alone_numbers, tmp_path, monkeypatch, device_us_row
):
    """The late fill (SERVEPROTO_PIPELINE_LATE=US, opt-in, with the pipeline): it waits before a fill only
    once it has seen reads from the ring wait for the device. A CPU never makes them wait (llama_decode
    computes before it returns): there it takes the pipeline's own wait, and the profile counts no late
    wait. With the tests' pretend device (SERVEPROTO_TEST_DEVICE_US_ROW: each decode also holds a device
    for that many microseconds a row after llama_decode returns, in order, and its read waits for it), the
    reads wait, it learns the device's time a row and the host's lead, and waits late before the fills that
    would be short of a ubatch (three requests at --ubatch 8: 30 ms a row, 240 ms a decode, four times this
    CPU's own decode of 8 rows, about 60 ms quiet; at 10 ms a row a loaded machine's decode outlasted the
    device and the test failed). Either way the requests keep every number they have alone, bit
    for bit; the read first fetches one row apart (to time the wait), which must not move any."""
    monkeypatch.setenv("SERVEPROTO_OVERLAP", "1")
    monkeypatch.setenv("SERVEPROTO_PIPELINE", "1")
    monkeypatch.setenv("SERVEPROTO_PIPELINE_LATE", "1000")
    monkeypatch.setenv("SERVEPROTO_TEST_DEVICE_US_ROW", device_us_row)
    monkeypatch.setenv("SERVEPROTO_PROFILE", str(tmp_path / "prof"))
    device = device_us_row != "0"
    requests = eight_requests()[:3] if device else eight_requests()
    got = together(model_path, requests, *(("--ubatch", "8") if device else ()))
    assert not [rid for rid in got if got[rid] != alone_numbers[rid]], "numbers moved with the late fill"
    last = profile_last(tmp_path)
    assert last["pipelined"] >= 1, last
    if device:
        assert last["late"] >= 1 and last["late_ms"] > 0, last
    else:
        assert last["late"] == 0 and last["late_ms"] == 0, last


def test_the_profile_counts_each_decode_whole_cut_short_or_starved(model_path, alone_numbers, tmp_path, monkeypatch):
    """The profile's decodes by fill (SERVEPROTO_PROFILE; bench/gpu/profile_split.py's last columns): each
    decode is counted once, as a whole ubatch of rows, as cut short (fewer rows although the runnable requests
    wanted a ubatch: their units and --chunk left rows unused) or as starved (they wanted fewer). The eight
    requests sent together at ``--ubatch 32`` want more than a ubatch at first and less at the end, so the
    profile counts whole and starved decodes, every decode once; their numbers are those each has alone. The
    same profile counts the eight answered, with their time in the engine, times the rows' read and the
    logsumexps within it, and, without the pipeline, counts every llama_decode as called with no decode in
    flight."""
    monkeypatch.setenv("SERVEPROTO_PROFILE", str(tmp_path / "prof"))
    got = together(model_path, eight_requests())
    assert not [rid for rid in got if got[rid] != alone_numbers[rid]], "numbers moved"
    last = profile_last(tmp_path)
    assert last["whole"] + last["cut"] + last["starved"] == last["decodes"], last
    assert last["whole"] >= 1 and last["starved"] >= 1 and last["max_rows"] <= 32, last
    assert last["answered"] == 8 and last["answer_ms"] > 0, last
    assert 0 < last["lse_ms"] <= last["readout_ms"], last
    assert last["alone"] == last["decodes"] and last["alone_ms"] > 0, last


@pytest.mark.parametrize("pad, pipeline", [("8", "0"), ("0", "0"), ("32", "1")])
def test_padded_decodes_keep_every_number(model_path, alone_numbers, tmp_path, monkeypatch, pad, pipeline):
    """SERVEPROTO_PAD_ROWS=M (opt-in, for the GPU's row counts and shapes): a decode of fewer rows than a
    ubatch is padded up to a multiple of M with rows of a sequence of their own. Those rows attend only each
    other, so the eight requests together keep every number they have alone, bit for bit, with the padding
    (counted by the profile apart from the requests' rows) and without it (none counted); also with the
    pipeline, whose next fill drops the padding of the decode in flight."""
    monkeypatch.setenv("SERVEPROTO_PAD_ROWS", pad)
    monkeypatch.setenv("SERVEPROTO_OVERLAP", pipeline)
    monkeypatch.setenv("SERVEPROTO_PIPELINE", pipeline)
    monkeypatch.setenv("SERVEPROTO_PROFILE", str(tmp_path / "prof"))
    got = together(model_path, eight_requests())
    assert not [rid for rid in got if got[rid] != alone_numbers[rid]], "numbers moved with padded decodes"
    last = profile_last(tmp_path)
    assert (last["padded"] >= 1) == (pad != "0"), last
    assert (last["pipelined"] >= 1) == (pipeline == "1"), last
    assert last["max_rows"] <= 32, last  # the requests' rows: the padding is counted apart


def profile_last(tmp_path) -> dict[str, float]:
    """The last line of the one SERVEPROTO_PROFILE file under tmp_path, by its header's column names."""
    (prof,) = tmp_path.glob("prof.*")
    lines = prof.read_text().splitlines()
    names = lines[0].split()[1:]  # after the "#"
    values = [float(x) for x in lines[-1].split()]
    assert len(names) == len(values), (names, values)
    return dict(zip(names, values, strict=True))


BIG = score(20, 0, 11, 12, [" it depends on the size of item {g} today", " only when item {g} is late again"])


def test_a_cancelled_big_score_frees_the_engine_within_one_chunk(model_path):
    gen = submit(21, 1, f"Write about: {text(9, 20)}", max_tokens=40, logprobs=1)
    small = score(22, 0, 3, 1, [" yes", " no"])  # the big one's slot, once it is free
    want_gen = alone(model_path, [gen])[21]
    want_small = alone(model_path, [small])[22]

    eng = engine(model_path)
    try:
        # the big SCORE and a generation run together
        eng.send(BIG, gen)
        events = {20: [], 21: [], 22: []}

        def step():
            ev = eng.next_event()
            events[ev.id].append(ev)
            return ev

        while sum(isinstance(e, Data) for e in events[21]) < 3:
            step()
        assert isinstance(events[20][0], Accept) and len(events[20]) == 1
        # the big SCORE has hundreds of trie rows to go: CANCEL it
        eng.send(Cancel(id=20))
        tokens_before = sum(isinstance(e, Data) for e in events[21])
        while not events[20][1:]:
            step()
        big_end = events[20][-1]
        assert isinstance(big_end, Error) and big_end.code == "CANCELLED", big_end
        # within one chunk: the generation (one token a decode) went on by at
        # most the decode in flight and the next
        assert sum(isinstance(e, Data) for e in events[21]) - tokens_before <= 2
        # the next request on the freed slot is answered while the generation runs
        eng.send(small)
        while not events[22] or not isinstance(events[22][-1], (Done, Error)):
            step()
        assert not isinstance(events[21][-1], Done), "the generation ended before the small request"
        while not isinstance(events[21][-1], (Done, Error)):
            step()
        assert numbers(events[22]) == want_small
        assert numbers(events[21]) == want_gen
        assert eng.close() == 0
    finally:
        if eng.proc.poll() is None:
            eng.proc.kill()


#: One question whose trie is several ubatches of 32 rows: 24 options of about 8 tokens each.
WIDE = Score(
    id=30,
    slot=0,
    payload=json.dumps(
        {
            "prefix": f"Ticket 30: {text(30, 40)}\n",
            "groups": [
                {
                    "stem": "\nWhich queue should take it? Answer:",
                    "options": [f" queue {k} for {text(k, 6)}" for k in range(24)],
                }
            ],
        }
    ).encode(),
)


def test_no_decode_holds_more_than_one_ubatch(model_path, tmp_path, monkeypatch):
    """A question larger than a ubatch is cut between decodes (its stem kept in the carry), so no decode
    holds more than ``--ubatch`` rows, the most a CANCEL waits on a GPU build (the engine's profile,
    SERVEPROTO_PROFILE, counts the rows of its largest decode); its numbers are those of one decode. The
    same profile's inner columns (llama_decode's own host parts) add up within its decode time."""
    one = Engine(model_path, "--float-digits", "17", "--slots", "8", "--ctx", "1024", "--ubatch", "512")
    try:
        want = numbers(one.request(WIDE))
    finally:
        one.close()
    monkeypatch.setenv("SERVEPROTO_PROFILE", str(tmp_path / "prof"))
    eng = engine(model_path)
    try:
        assert numbers(eng.request(WIDE)) == want
        assert eng.close() == 0
    finally:
        if eng.proc.poll() is None:
            eng.proc.kill()
    last = profile_last(tmp_path)
    decodes, rows, max_rows = last["decodes"], last["rows"], last["max_rows"]
    assert rows > 3 * 32 and decodes >= 4 and max_rows <= 32, (decodes, rows, max_rows)
    # llama_decode's own split (llama/patches/profile/0007): each decode is one ubatch of its rows, each
    # attending at least its own cells, and the inner parts are inside the decode part
    assert (last["ubatches"], last["tokens"]) == (decodes, rows), last
    assert last["n_kv"] >= rows and last["reused"] <= last["ubatches"], last
    inner = ("batch", "memory", "outbuf", "apply", "build", "alloc", "inputs", "compute", "outputs")
    assert 0 < sum(last[f"{p}_ms"] for p in inner) <= last["decode_ms"] + 0.1 * len(inner), last


def test_without_the_abort_callback_a_cancel_ends_a_big_score_between_decodes(model_path, monkeypatch):
    """A GPU build's path on the CPU (SERVEPROTO_NO_ABORT_CALLBACK=1: llama.cpp never asks, stdin is read
    between decodes only): a CANCEL of a SCORE of many decodes ends it at the next decode, the generation
    beside it going on by at most the decode in flight and the next, and gives its own digits."""
    gen = submit(31, 1, f"Write about: {text(9, 20)}", max_tokens=40, logprobs=1)
    want_gen = alone(model_path, [gen])[31]
    monkeypatch.setenv("SERVEPROTO_NO_ABORT_CALLBACK", "1")
    eng = engine(model_path)
    try:
        eng.send(WIDE, gen)
        events = {30: [], 31: []}
        while sum(isinstance(e, Data) for e in events[31]) < 2:
            ev = eng.next_event()
            events[ev.id].append(ev)
        assert isinstance(events[30][0], Accept) and len(events[30]) == 1  # its trie is decodes from done
        eng.send(Cancel(id=30))
        tokens_before = sum(isinstance(e, Data) for e in events[31])
        while not events[30][1:]:
            ev = eng.next_event()
            events[ev.id].append(ev)
        assert isinstance(events[30][-1], Error) and events[30][-1].code == "CANCELLED", events[30][-1]
        assert sum(isinstance(e, Data) for e in events[31]) - tokens_before <= 2
        while not isinstance(events[31][-1], (Done, Error)):
            ev = eng.next_event()
            events[ev.id].append(ev)
        assert numbers(events[31]) == want_gen
        assert eng.close() == 0
    finally:
        if eng.proc.poll() is None:
            eng.proc.kill()
