"""The llama engine against the independent oracle, on the tiny fixture GGUF.

Every logprob the engine reads out (ECHO, DATA tails, SCORED) must equal the
numpy float64 forward pass of ``fixtures/oracle.py`` within 1e-4, and its top-k
must list the same token ids. Prompts go in as token ids (``ids=1``) so the ids
are known, or as text whose ids are recovered from the ECHO payloads through
the vocabulary (``fixtures/vocab.py``).

The engine is driven through the sans-IO ``serveproto.GatewayConnection`` over
a plain subprocess (``fixtures.sync_engine``); these tests skip only while the
binary or the package is missing. ``python -m fixtures.compare`` prints the
measured differences.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fixtures import oracle, tiny_gguf, vocab
from gateway.paths import engine_bin

TOL = 1e-4
ENGINE = engine_bin("serveproto-llama")

serveproto = pytest.importorskip("serveproto")
if not hasattr(serveproto, "GatewayConnection"):
    pytest.skip("serveproto.GatewayConnection not landed yet (engineer P)", allow_module_level=True)
if not ENGINE.exists():
    pytest.skip(f"{ENGINE} not built yet (engineer L; make -C engines all)", allow_module_level=True)

from fixtures.sync_engine import SyncEngine  # noqa: E402
from serveproto import Accept, Data, Done, Echo, Error, Score, Scored, Submit  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def tiny():
    return tiny_gguf.ensure()


@pytest.fixture(scope="module")
def engine(tiny, tmp_path_factory):
    argv = [str(ENGINE), "--model", str(tiny), "--slots", "1", "--ctx", "1024", "--threads", "2"]
    eng = SyncEngine(argv, tmp_path_factory.mktemp("engine") / "stderr.log")
    yield eng
    assert eng.close() == 0


def _ids_payload(ids) -> bytes:
    return " ".join(str(int(i)) for i in ids).encode()


def _random_ids(seed: int, n: int) -> list[int]:
    # above the 17 control tokens, so every token is ordinary text
    return [int(x) for x in np.random.default_rng(seed).integers(17, 49152, size=n)]


def _readout(engine, prompt: bytes, *, ids: bool, k: int = 5, pin: bool = False) -> list[Echo]:
    rid = engine.new_id()
    evs = engine.request(
        Submit(id=rid, slot=0, prompt=prompt, max_tokens=0, temperature=0.0, top_p=1.0, logprobs=k, ids=ids, pin=pin)
    )
    assert not isinstance(evs[-1], Error), evs[-1]
    assert isinstance(evs[0], Accept) and isinstance(evs[-1], Done)
    echoes = [e for e in evs if isinstance(e, Echo)]
    assert len(echoes) == len(evs) - 2
    assert evs[-1].emitted == 0 and evs[-1].prompt_tokens == evs[0].prompt_tokens
    return echoes


def _assert_top_matches(top, ref_ids, ref_lps, where):
    """Top-k ids equal the oracle's, except that ids whose oracle logprobs lie within
    TOL of each other may come in either order; logprobs within TOL."""
    got_ids = [t for t, _ in top]
    got_lps = np.array([lp for _, lp in top])
    np.testing.assert_allclose(got_lps, ref_lps, rtol=0, atol=TOL, err_msg=where)
    for j, (g, r) in enumerate(zip(got_ids, ref_ids)):
        if g != r:
            near = [int(i) for i, lp in zip(ref_ids, ref_lps) if abs(lp - ref_lps[j]) <= TOL]
            assert g in near, f"{where}: top[{j}] is token {g}, oracle says {r} ({list(ref_ids)})"


def _assert_echoes_match(tiny, ids, echoes, first):
    """ECHO positions first..n-1 of prompt ``ids`` equal the oracle's read-out."""
    lp, top_ids, top_lps = oracle.readout(tiny, ids, len(echoes[-1].top))
    assert [e.position for e in echoes] == list(range(first, len(ids)))
    for e in echoes:
        if e.position == 0:
            assert math.isnan(e.logprob) and e.top == ()
            continue
        assert abs(e.logprob - lp[e.position]) <= TOL, (
            f"position {e.position}: engine {e.logprob!r}, oracle {lp[e.position]!r} "
            "(a difference near 1e-3 means an F16 KV cache or flash attention: fixtures/README.md)"
        )
        _assert_top_matches(e.top, top_ids[e.position], top_lps[e.position], f"position {e.position}")


def test_caps_describe_the_tiny_model(engine):
    assert engine.caps.n_vocab == 49152
    assert engine.caps.model in ("tiny-v1", "serveproto-tiny-v1")  # file stem or general.name


@pytest.mark.parametrize("n, seed", [(19, 1), (300, 2)])
def test_echo_of_token_ids_equals_oracle(engine, tiny, n, seed):
    ids = _random_ids(seed, n)
    echoes = _readout(engine, _ids_payload(ids), ids=True)
    _assert_echoes_match(tiny, ids, echoes, first=0)
    pieces = vocab.load(tiny).pieces
    assert [e.text for e in echoes] == [pieces[i] for i in ids]


def test_echo_of_text_equals_oracle(engine, tiny):
    text = b"The capital of France is Paris. Is that true? Answer yes or no.\n"
    echoes = _readout(engine, text, ids=False)
    assert b"".join(e.text for e in echoes) == text
    v = vocab.load(tiny)
    ids = [v.id_of(e.text) for e in echoes]
    assert len(ids) < len(text) // 2  # BPE merged: these are words, not bytes
    _assert_echoes_match(tiny, ids, echoes, first=0)


def test_echo_of_a_chat_prompt_equals_oracle(engine, tiny):
    """ChatML markers in the text are read as SmolLM2's control tokens, one token each."""
    text = b"<|im_start|>user\nIs the sky green?<|im_end|>\n<|im_start|>assistant\n"
    echoes = _readout(engine, text, ids=False)
    v = vocab.load(tiny)
    ids = [v.id_of(e.text) for e in echoes]
    assert ids[0] == 1 and ids.count(1) == 2 and ids.count(2) == 1  # <|im_start|>, <|im_end|>
    assert b"".join(e.text for e in echoes) == text
    _assert_echoes_match(tiny, ids, echoes, first=0)


def test_readout_resumed_from_snapshot_equals_oracle(engine, tiny):
    """A pinned prefix, then prefix + more: the read-out starts at the first fresh
    position, whose logprob comes from the snapshot's saved logits."""
    head, tail = _random_ids(3, 40), _random_ids(4, 12)
    _readout(engine, _ids_payload(head), ids=True, k=1, pin=True)
    echoes = _readout(engine, _ids_payload(head + tail), ids=True, k=3)
    _assert_echoes_match(tiny, head + tail, echoes, first=len(head))


def test_greedy_generation_follows_oracle(engine, tiny):
    ids = _random_ids(5, 30)
    n_new = 6
    rid = engine.new_id()
    evs = engine.request(
        Submit(
            id=rid, slot=0, prompt=_ids_payload(ids), max_tokens=n_new, temperature=0.0, top_p=1.0, logprobs=3, ids=True
        )
    )
    assert isinstance(evs[-1], Done), evs[-1]
    data = [e for e in evs if isinstance(e, Data)]
    assert len(data) == evs[-1].emitted == n_new and evs[-1].length_limited
    pieces = vocab.load(tiny).pieces
    seq = list(ids)
    for step, d in enumerate(data):
        lsm = oracle.log_softmax(oracle.logits(tiny, seq)[-1])
        want = int(np.argmax(lsm))
        assert want > 16, "precondition: the oracle's greedy path hits no control token"
        assert d.top[0][0] == want, f"step {step}: engine picked {d.top[0][0]}, oracle argmax {want}"
        assert abs(d.logprob - lsm[want]) <= TOL and abs(d.top[0][1] - lsm[want]) <= TOL
        assert d.text == pieces[want]
        seq.append(want)


def _text_ids(engine, tiny, text: str) -> list[int]:
    v = vocab.load(tiny)
    return [v.id_of(e.text) for e in _readout(engine, text.encode(), ids=False, k=1)]


def test_score_equals_oracle(engine, tiny):
    """SCORE of two groups (one- and many-token options) vs the oracle on each whole text."""
    if not engine.caps.x_score:
        pytest.skip("engine does not advertise x_score")
    prefix = "Paris is in France."
    groups = [
        (" Is it true? Answer:", [" yes", " no", " it depends on the map"]),
        (" Which country? ", ["France", "Germany"]),
    ]
    payload = json.dumps({"prefix": prefix, "groups": [{"stem": st, "options": opts} for st, opts in groups]}).encode()
    rid = engine.new_id()
    evs = engine.request(Score(id=rid, slot=0, payload=payload))
    assert isinstance(evs[-1], Done), evs[-1]
    scored = [e for e in evs if isinstance(e, Scored)]
    assert [(s.group, s.option) for s in scored] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    it = iter(scored)
    n_scored = []
    for stem, options in groups:
        context = _text_ids(engine, tiny, prefix + stem)
        for opt in options:
            s = next(it)
            full = _text_ids(engine, tiny, prefix + stem + opt)
            common = next((i for i, (a, b) in enumerate(zip(context, full)) if a != b), min(len(context), len(full)))
            assert s.context_tokens == common
            assert len(s.logprobs) == len(full) - common >= 1
            n_scored.append(len(s.logprobs))
            np.testing.assert_allclose(s.logprobs, oracle.logprobs(tiny, full)[common:], rtol=0, atol=TOL)
    assert max(n_scored) >= 4 and min(n_scored) == 1


def test_sync_engine_reports_a_load_failure(tmp_path):
    from fixtures.sync_engine import EngineGone

    with pytest.raises(EngineGone, match=r"LOAD_FAIL io .*missing\.gguf"):
        SyncEngine([str(ENGINE), "--model", str(tmp_path / "missing.gguf")], tmp_path / "stderr.log")


def test_compare_prints_the_differences(capsys):
    from fixtures import compare

    assert compare.main(["--tokens", "12", "--k", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("   12 tokens: max |logprob diff| ")
    assert float(out[1].split("max |logprob diff| ")[1].split(",")[0]) <= TOL
    assert out[1].endswith("top-3 ids agree 1.0000")
