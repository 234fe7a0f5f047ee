"""The oracle on quantized weights: Q4_1 / Q8_0 blocks dequantized, and the F32 transcode that meets it.

Fast part: hand-made blocks decode to the values ggml's layout gives; a Q4_1 copy
of the tiny fixture, transcoded by ``engines/bin/serveproto-quantize`` (llama.cpp's
quantizer), has exactly the oracle's dequantized weights, and the engine on that
transcode reads out within 1e-4 of the oracle. Slow part (``-m slow``): the same
on the default model (SmolLM2-135M-Instruct Q4_1), where the engine on the Q4_1
file itself sits ~0.1-0.3 nats away (bench/exactness.py prints it).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from fixtures import dequant, oracle, tiny_gguf
from fixtures.compare import read_out
from fixtures.gguf_read import GGUFFile, GGUFFormatError
from gateway.engine import precision
from gateway.paths import default_model_path, engine_bin

TOL = 1e-4
ENGINE = engine_bin("serveproto-llama")
QUANTIZE = engine_bin("serveproto-quantize")
Q4_1, Q8_0 = 3, 8

pytestmark = pytest.mark.timeout(300)


# -- hand-made blocks -----------------------------------------------------------------------------


def _write_gguf(path: Path, tensors: dict[str, tuple[np.ndarray, int | None]]) -> Path:
    """A GGUF with only the given tensors: name -> (array, raw ggml type or None for F32)."""
    import gguf

    w = gguf.GGUFWriter(path, "llama")
    for name, (arr, qtype) in tensors.items():
        if qtype is None:
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, arr, raw_dtype=gguf.GGMLQuantizationType(qtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _f16_bytes(x: float) -> list[int]:
    return list(np.array([x], dtype="<f2").view(np.uint8))


def test_q4_1_block_layout(tmp_path):
    """ggml's block_q4_1: d (f16), m (f16), 16 bytes; value j < 16 is the low nibble of byte j,
    value j >= 16 the high nibble of byte j - 16; value = d * nibble + m."""
    nibbles = np.arange(32) % 16  # 0..15, 0..15
    qs = (nibbles[:16] | (nibbles[16:][::-1] << 4)).astype(np.uint8)  # high nibbles 15..0
    row = []
    for d, m in ((0.5, -2.0), (0.25, 1.0)):  # two blocks: a row of 64 values
        row += _f16_bytes(d) + _f16_bytes(m) + list(qs)
    raw = np.array([row, row[::1]], dtype=np.uint8)  # (2 rows, 40 bytes)
    path = _write_gguf(tmp_path / "q41.gguf", {"w": (raw, Q4_1)})
    with GGUFFile(path) as f:
        got = dequant.tensor(f, "w")
    assert got.shape == (2, 64) and got.dtype == np.float64
    want_nib = np.concatenate([nibbles[:16], nibbles[16:][::-1]])
    np.testing.assert_array_equal(got[0, :32], 0.5 * want_nib - 2.0)
    np.testing.assert_array_equal(got[0, 32:], 0.25 * want_nib + 1.0)
    np.testing.assert_array_equal(got[1], got[0])


def test_q8_0_block_layout(tmp_path):
    """ggml's block_q8_0: d (f16), 32 int8; value = d * q."""
    q = np.arange(-16, 16, dtype=np.int8)
    raw = np.array([_f16_bytes(0.125) + list(q.view(np.uint8))], dtype=np.uint8)  # (1, 34)
    path = _write_gguf(tmp_path / "q80.gguf", {"w": (raw, Q8_0)})
    with GGUFFile(path) as f:
        got = dequant.tensor(f, "w")
    np.testing.assert_array_equal(got, 0.125 * q.astype(np.float64)[None])


def test_f32_tensors_read_as_before(tmp_path):
    arr = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    path = _write_gguf(tmp_path / "f32.gguf", {"w": (arr, None)})
    with GGUFFile(path) as f:
        np.testing.assert_array_equal(dequant.tensor(f, "w"), f.tensor("w"))
        np.testing.assert_array_equal(dequant.tensor(f, "w"), arr.astype(np.float64))


def test_unknown_type_is_a_format_error(tmp_path):
    path = _write_gguf(tmp_path / "f32.gguf", {"w": (np.zeros((2, 32), np.float32), None)})
    with GGUFFile(path) as f:
        f.tensors["w"] = f.tensors["w"]._replace(ggml_type=99)
        with pytest.raises(GGUFFormatError, match="type 99"):
            dequant.tensor(f, "w")


class _FakeFile:
    def __init__(self, tensors, meta):
        self.tensors, self._meta = tensors, meta

    def get(self, key, default=None):
        return self._meta.get(key, default)


@pytest.mark.parametrize(
    "extra_tensor, meta, match",
    [
        ("rope_freqs.weight", {}, "does not model: rope_freqs"),
        ("blk.0.attn_q.bias", {}, "does not model: blk.0.attn_q.bias"),
        (None, {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 2.0}, "rope scaling 'linear'"),
        (None, {"llama.attention.scale": 0.1}, "attention.scale"),
        (None, {"llama.expert_count": 8}, "expert_count"),
        (None, {"llama.attention.key_length": 128}, "key_length"),
    ],
)
def test_oracle_refuses_what_it_does_not_model(extra_tensor, meta, match):
    names = {"token_embd.weight", "output_norm.weight"} | {f"blk.0.{t}.weight" for t in oracle._BLOCK_TENSORS}
    if extra_tensor:
        names.add(extra_tensor)
    fake = _FakeFile(dict.fromkeys(names), meta)
    with pytest.raises(ValueError, match=match):
        oracle._check_supported(fake, Path("m.gguf"), n_layer=1, n_embd=64, n_head=4)
    oracle._check_supported(_FakeFile(dict.fromkeys(names - {extra_tensor}), {}), Path("m.gguf"), 1, 64, 4)


# -- a Q4_1 copy of the tiny fixture ---------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_q41(tiny, tmp_path_factory):
    return tiny_gguf.quantized_copy(tiny, tmp_path_factory.mktemp("q41") / "tiny-q41.gguf")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVEPROTO_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _need_binaries():
    for b in (ENGINE, QUANTIZE):
        if not os.access(b, os.X_OK):
            pytest.skip(f"{b} is not built yet (make -C engines all)")


def test_tiny_q41_dequantizes_to_llama_cpps_own_values(tiny, tiny_q41, cache):
    """The oracle's weights of the Q4_1 file equal, bit for bit, those llama.cpp's quantizer writes
    when it dequantizes the same file to F32 (ggml's to_float)."""
    _need_binaries()
    f32 = precision.ensure_f32(tiny_q41, threads=1, quiet=True)
    q, t = oracle.load(tiny_q41), oracle.load(f32)
    assert q.types["blk.0.attn_q.weight"] == Q4_1 and q.types["token_embd.weight"] == Q8_0
    assert set(t.types.values()) == {dequant.F32}
    assert set(q.weights) == set(t.weights)
    for name in q.weights:
        assert q.weights[name].shape == t.weights[name].shape, name
        np.testing.assert_array_equal(q.weights[name], t.weights[name], err_msg=name)
    # and the quantization was real: the Q4_1 weights are not the F32 fixture's
    src = oracle.load(tiny)
    assert not np.array_equal(src.weights["blk.0.attn_q.weight"], q.weights["blk.0.attn_q.weight"])


def test_engine_on_the_tiny_q41_transcode_meets_the_oracle(tiny, tiny_q41, cache, tmp_path):
    """A read-out through the engine on the F32 transcode equals the oracle of the Q4_1 file within
    1e-4; on the Q4_1 file itself the engine's quantized kernels land near it too (a wrong nibble
    order or scale in the oracle would put them nats apart)."""
    from fixtures.sync_engine import SyncEngine

    _need_binaries()
    f32 = precision.ensure_f32(tiny_q41, threads=1, quiet=True)
    text = b"<|im_start|>user\nThe invoice was charged twice. Is a refund due?<|im_end|>\n<|im_start|>assistant\n"
    common = ["--threads", "2", "--slots", "1", "--ctx", "512"]
    with SyncEngine([str(ENGINE), "--model", str(f32), *common], tmp_path / "f32.log") as eng:
        ids, lp = read_out(eng, text, f32)
    with SyncEngine([str(ENGINE), "--model", str(tiny_q41), *common], tmp_path / "q41.log") as eng:
        _, lp_q = read_out(eng, ids)
    ref = oracle.logprobs(tiny_q41, ids)
    assert len(ids) == 20
    np.testing.assert_allclose(lp[1:], ref[1:], rtol=0, atol=TOL)
    assert np.abs(lp_q[1:] - ref[1:]).max() < 0.5
    # and the oracle on the quantized weights is not the F32 fixture's oracle
    assert np.abs(oracle.logprobs(tiny, ids)[1:] - ref[1:]).max() > 10 * TOL


# -- the default model ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def default_model():
    path = default_model_path()
    if not path.exists():
        pytest.skip(f"{path} is not fetched yet (make model)")
    _need_binaries()
    return path


@pytest.fixture(scope="module")
def default_f32(default_model):
    return precision.ensure_f32(default_model, threads=2, quiet=True)  # the real cache: made once


@pytest.mark.slow
def test_default_model_tensors_dequantize_to_llama_cpps_own(default_model, default_f32):
    """Shapes and types of SmolLM2-135M-Instruct Q4_1 as the oracle reads them, and every weight
    equal to llama.cpp's own dequantization (its F32 transcode), bit for bit."""
    q = oracle.load(default_model)
    hp = q.hparams
    assert (hp.n_layer, hp.n_embd, hp.n_head, hp.n_head_kv, hp.n_rot, hp.n_vocab) == (30, 576, 9, 3, 64, 49152)
    assert hp.rope_base == 100000.0
    assert q.types["token_embd.weight"] == Q8_0 and q.types["blk.7.ffn_down.weight"] == Q4_1
    assert q.types["blk.7.ffn_norm.weight"] == dequant.F32
    assert sum(t == Q4_1 for t in q.types.values()) == 30 * 7
    assert "output.weight" not in q.types and q.weights["output.weight"] is q.weights["token_embd.weight"]
    assert q.weights["token_embd.weight"].shape == (49152, 576)
    assert q.weights["blk.0.attn_k.weight"].shape == (192, 576)  # 3 kv heads x 64
    assert q.weights["blk.0.ffn_down.weight"].shape == (576, 1536)
    with GGUFFile(default_f32) as f:
        assert {i.ggml_type for i in f.tensors.values()} == {dequant.F32}
        for name, info in f.tensors.items():  # noqa: B007  (kept as written)
            np.testing.assert_array_equal(q.weights[name], f.tensor(name), err_msg=name)


PROMPTS = [
    b"The quarterly invoice was charged twice, and the customer asked for a refund of the duplicate payment.",
    b"<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    b"<|im_start|>user\nMy Stripe integration keeps failing. Is this urgent? Answer yes or no.<|im_end|>\n"
    b"<|im_start|>assistant\nyes",
]


@pytest.mark.slow
@pytest.mark.parametrize("prompt", PROMPTS, ids=["sentence", "chat"])
def test_default_model_f32_readout_meets_the_oracle(default_model, default_f32, prompt, tmp_path):
    """The engine on the F32 transcode: every logprob within 1e-4 of the float64 oracle on the Q4_1
    file's weights. On the Q4_1 file itself the same binary is more than 1e-2 off somewhere (the Q8
    rounding of activations), so the comparison does tell the files apart."""
    from fixtures.sync_engine import SyncEngine

    common = ["--threads", "2", "--slots", "1", "--ctx", "512"]
    with SyncEngine([str(ENGINE), "--model", str(default_f32), *common], tmp_path / "f32.log") as eng:
        ids, lp = read_out(eng, prompt, default_f32)
    with SyncEngine([str(ENGINE), "--model", str(default_model), *common], tmp_path / "q41.log") as eng:
        ids_q, lp_q = read_out(eng, prompt, default_model)
    assert ids_q == ids
    ref = oracle.logprobs(default_model, ids)
    np.testing.assert_allclose(lp[1:], ref[1:], rtol=0, atol=TOL)
    assert np.abs(lp_q[1:] - ref[1:]).max() > 1e-2
