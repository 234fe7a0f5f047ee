"""The llama engine on stock llama.cpp (``engines/bin/serveproto-llama-stock``, ``make -C engines all
LLAMA_PATCHES=none``): none of ``engines/llama/patches/`` applied.

It loads, reads out, SCOREs and CANCELs with llama.cpp's own kernels (``--numerics fast``, its default
there), its numbers held to an independent numpy forward pass of the tiny fixture model; it announces
``x_patches=none``, and refuses at load what needs a patch (invariant numerics, the pipeline's output
ring) rather than computing other digits. This is the first test an upgrade of llama.cpp must pass,
before the patches are ported (engines/llama/patches/README.md).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import test_llama_engine as tle
from gateway.paths import default_model_path, engine_bin
from serveproto import Cancel, Data, Error, LoadFail, Ping, Pong, Scored, Submit
from test_llama_engine import PREFIX_IDS, SCORE_JOB, Engine, done, echoes, ids, readout, score

STOCK = engine_bin("serveproto-llama-stock")


@pytest.fixture
def stock(monkeypatch) -> None:
    """test_llama_engine's Engine runs the stock build in this test."""
    if not os.access(STOCK, os.X_OK):
        pytest.skip(f"{STOCK} is not built yet (make engines-stock)")
    monkeypatch.setattr(tle, "ENGINE", STOCK)


def test_stock_engine_announces_no_patch_and_reads_out_the_models_numbers(tiny, stock):
    from fixtures import oracle

    eng = Engine(tiny)
    try:
        assert eng.caps.values["x_patches"] == "none"
        assert eng.caps.values["x_numerics"] == "fast"  # no invariant kernels without the patches
        full = [*PREFIX_IDS, 600, 601, 602]
        got = echoes(readout(eng, 1, ids(full), k=2))
        assert [e.position for e in got] == list(range(11))
        assert np.allclose([e.logprob for e in got[1:]], oracle.logprobs(tiny, full)[1:], atol=1e-4, rtol=0)

        ev = eng.request(
            Submit(id=2, slot=0, prompt=ids(PREFIX_IDS), max_tokens=3, temperature=0.0, top_p=1.0, logprobs=1, ids=True)
        )
        seq = list(PREFIX_IDS)
        for frame in [e for e in ev if isinstance(e, Data)]:
            want = oracle.logprobs(tiny, [*seq, frame.top[0][0]])[-1]
            logits = oracle.logits(tiny, seq)[-1]
            assert frame.top[0][0] == int(np.argmax(logits))  # greedy picks the argmax
            assert abs(frame.logprob - want) <= 1e-4
            seq.append(frame.top[0][0])
        assert done(ev).emitted == 3
    finally:
        assert eng.close() == 0


def test_stock_engine_scores_as_its_own_read_outs(tiny, stock):
    """SCORE's logprobs are those of each whole text read out alone; fast numerics move with the batch,
    so to 1e-4 rather than to the digit (test_llama_engine.py holds the patched build to the digit)."""
    eng = Engine(tiny, "--score-cache-mb", "0")
    try:
        ev = score(eng, 1, SCORE_JOB)
        scored = [e for e in ev if isinstance(e, Scored)]
        assert [(s.group, s.option) for s in scored] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (1, 3)]
        assert done(ev).computed > 0
        for n, s in enumerate(scored):
            g = SCORE_JOB["groups"][s.group]
            whole = echoes(
                readout(eng, 10 + n, (SCORE_JOB["prefix"] + g["stem"] + g["options"][s.option]).encode(), as_ids=False)
            )
            assert len(s.logprobs) == len(whole) - s.context_tokens >= 1
            assert np.allclose(s.logprobs, [e.logprob for e in whole[s.context_tokens :]], atol=1e-4, rtol=0)
    finally:
        assert eng.close() == 0


def test_stock_engine_cancels_a_running_submit_and_keeps_serving(stock):
    model = default_model_path()
    if not model.exists():
        pytest.skip(f"{model} is not fetched yet (make model)")
    eng = Engine(model, "--threads", "2")
    try:
        # several seconds of generation on the default model; the CANCEL reaches it within milliseconds
        eng.send(Submit(id=1, slot=0, prompt=b"Once upon a time", max_tokens=2000, temperature=0.0, top_p=1.0))
        while not isinstance(got := eng.next_event(), Data):  # its ACCEPT, then its first token: it runs
            assert getattr(got, "id", None) == 1 and not isinstance(got, Error), got
        eng.send(Cancel(id=1))
        out = eng.collect(1)
        assert isinstance(out[-1], Error) and out[-1].code == "CANCELLED", out[-1]
        assert sum(isinstance(e, Data) for e in out) < 1999
        pong = eng.request(Ping(id=2))
        assert isinstance(pong[-1], Pong) and pong[-1].values["active"] == "0"
        again = eng.request(Submit(id=3, slot=0, prompt=b"Once upon a time", max_tokens=2, temperature=0.0, top_p=1.0))
        assert done(again).emitted == 2
    finally:
        assert eng.close() == 0


#: 22 tokens: the default model's Q4_1 matmuls take them as two of patch 0017's groups of eight columns, one of
#: 0015's four and two columns alone, where a short prompt would take only the last two ways.
READ_TEXT = b"The weather today is calm. The river is low, the fields are dry and the farmers wait for rain."


@pytest.mark.parametrize("which", ["tiny", "default", "default-avx2"])
def test_the_patches_change_no_digit_of_fast_numerics(tiny, stock, monkeypatch, which):
    """With ``--numerics fast`` the numerics patches are off and the speed patches keep the bits (patches/README.md):
    the stock and the patched build print the same 17 digits, on the tiny F32 model and on the default Q4_1 one
    (whose matmuls go through patch 0017's eight columns and 0015's four). ``default-avx2`` runs the patched build
    with ``GGML_CPU_NO_VNNI=1``: on a CPU with AVX512-VNNI, 0017's other path (maddubs and madd instead of
    VPDPBUSD) gives the same bits too; elsewhere both runs take that path."""
    model = tiny if which == "tiny" else default_model_path()
    if not model.exists():
        pytest.skip(f"{model} is not fetched yet (make model)")
    got = {}
    for engine in (tle.ENGINE, engine_bin("serveproto-llama")):
        monkeypatch.setattr(tle, "ENGINE", engine)
        if which == "default-avx2" and engine != STOCK:
            monkeypatch.setenv("GGML_CPU_NO_VNNI", "1")
        eng = Engine(model, "--numerics", "fast", "--float-digits", "17")
        try:
            scored = [s.logprobs for s in score(eng, 1, SCORE_JOB) if isinstance(s, Scored)]
            ev = echoes(readout(eng, 2, READ_TEXT, as_ids=False, k=3))
            read = [(e.logprob, e.top) for e in ev[1:]]  # position 0: nan, nothing to condition on
        finally:
            assert eng.close() == 0
        assert eng.caps.values["x_numerics"] == "fast" and len(scored) == 7 and len(read) > 16
        got[eng.caps.values["x_patches"] == "none"] = (scored, read)
    assert got[True] == got[False]


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (["--numerics", "invariant"], {}, "--numerics invariant: this engine is built on llama.cpp without"),
        ([], {"SERVEPROTO_PIPELINE": "4"}, "SERVEPROTO_PIPELINE=4: this engine is built on llama.cpp without"),
    ],
)
def test_stock_engine_refuses_what_needs_a_patch(tiny, stock, monkeypatch, args, env, says):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    eng = Engine(tiny, *args)
    try:
        fail = eng.handshake[-1]
        assert isinstance(fail, LoadFail) and fail.kind == "unsupported", fail
        assert fail.detail.startswith(says) and "x_patches=none" in fail.detail, fail.detail
    finally:
        eng.close()
