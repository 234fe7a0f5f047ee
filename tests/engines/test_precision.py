"""``serve --precision``: the F32 transcode made once into the cache and reused, and the flag's errors."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from fixtures import tiny_gguf
from fixtures.gguf_read import GGUFFile
from gateway.engine import precision
from gateway.paths import ROOT, engine_bin

QUANTIZE = engine_bin("serveproto-quantize")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVEPROTO_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def tiny_q80(tiny, tmp_path_factory):
    return tiny_gguf.quantized_copy(tiny, tmp_path_factory.mktemp("q80") / "tiny-q80.gguf", weight_type=8)


def _need_tool():
    if not os.access(QUANTIZE, os.X_OK):
        pytest.skip(f"{QUANTIZE} is not built yet (make -C engines all)")


def test_parse_precision_names_the_choices():
    for p in ("native", "f32", "f16", "bf16"):
        assert precision.parse_precision(p) == p
    with pytest.raises(ValueError, match=r"'f8' is not a precision: native .*, f32 .*, f16 or bf16 "):
        precision.parse_precision("f8")


def test_f32_path_is_in_the_cache(cache):
    assert precision.f32_path("/x/y/Model.Q4_1.gguf") == cache / "models" / "Model.Q4_1.f32.gguf"


def test_transcode_once_then_reused(tiny_q80, cache, tmp_path, capfd):
    _need_tool()
    out = precision.ensure_f32(tiny_q80, threads=1)
    err = capfd.readouterr().err
    assert out == precision.f32_path(tiny_q80) and out.is_file()
    assert "transcoding tiny-q80.gguf to F32" in err
    assert "serveproto-quantize: F32: 30/30 tensors" in err and f"wrote {out}" in err  # 3 x 9 + 3 tensors
    with GGUFFile(out) as f:
        assert {t.ggml_type for t in f.tensors.values()} == {0}
        assert f.get(precision.SOURCE_KEY) == precision.source_fingerprint(tiny_q80)
        assert f.get("general.name") == tiny_gguf.NAME  # the source's metadata kept
    assert list(out.parent.glob("*.part")) == []
    st = out.stat()
    # the second call finds it: no tool run (a tool that would fail proves it), same file
    again = precision.ensure_f32(tiny_q80, tool=tmp_path / "no-such-tool")
    assert again == out and out.stat().st_ino == st.st_ino and out.stat().st_mtime_ns == st.st_mtime_ns
    assert "reusing" in capfd.readouterr().err


@pytest.mark.parametrize("kind, type_id", [("f16", 1), ("bf16", 30)])
def test_a_16_bit_transcode_rounds_the_f32_weights(tiny_q80, cache, kind, type_id, capfd):
    """``--precision f16|bf16``: every matrix in that type, every 1-D tensor F32; the F16 matrices are
    the F32 transcode's values rounded to nearest by numpy's own float16 (the same bits)."""
    _need_tool()
    out = precision.ensure_transcode(tiny_q80, kind, threads=1)
    err = capfd.readouterr().err
    assert out == precision.transcode_path(tiny_q80, kind) == cache / "models" / f"tiny-q80.{kind}.gguf"
    assert f"transcoding tiny-q80.gguf to {kind.upper()}" in err and f"{kind.upper()}: 30/30 tensors" in err
    f32 = precision.ensure_f32(tiny_q80, threads=1, quiet=True)
    with GGUFFile(out) as f, GGUFFile(f32) as g:
        assert f.get(precision.SOURCE_KEY) == precision.source_fingerprint(tiny_q80)
        assert {(len(t.ne), t.ggml_type) for t in f.tensors.values()} == {(1, 0), (2, type_id)}
        if kind == "f16":
            for name, t in f.tensors.items():
                want = g.tensor(name) if len(t.ne) == 1 else g.tensor(name).astype(np.float32).astype(np.float16)
                np.testing.assert_array_equal(f.tensor(name), want.astype(np.float64), err_msg=name)
    assert precision.ensure_transcode(out, kind, tool="/no/such/tool") == out  # already of its kind
    with pytest.raises(ValueError, match=r"kind must be one of \['bf16', 'f16', 'f32'\], got 'q8'"):
        precision.ensure_transcode(tiny_q80, "q8")


def test_a_changed_source_is_transcoded_again(tiny, tiny_q80, cache, tmp_path):
    _need_tool()
    src = tmp_path / "m.gguf"
    src.write_bytes(tiny_q80.read_bytes())
    first = precision.ensure_f32(src, quiet=True)
    with GGUFFile(first) as f:
        before = f.tensor("blk.0.attn_q.weight")
    tiny_gguf.quantized_copy(tiny, src, weight_type=3)  # same name, Q4_1 weights now
    second = precision.ensure_f32(src, quiet=True)
    assert second == first
    with GGUFFile(second) as f:
        assert f.get(precision.SOURCE_KEY) == precision.source_fingerprint(src)
        assert not np.array_equal(f.tensor("blk.0.attn_q.weight"), before)


def test_a_torn_transcode_in_the_cache_is_said_and_made_again(tiny_q80, cache, capfd):
    """A file the server finds in its cache by itself and cannot use is named with why, then replaced
    (issue 30, item 3): a transcode cut at 1000 bytes made the GGUF reader raise IndexError out of serve."""
    _need_tool()
    good = precision.ensure_f32(tiny_q80, threads=1, quiet=True)
    whole = good.read_bytes()
    good.write_bytes(whole[:1000])
    capfd.readouterr()
    again = precision.ensure_f32(tiny_q80, threads=1, quiet=True)
    err = capfd.readouterr().err
    assert again == good and again.read_bytes() == whole
    assert err.splitlines() == [
        f"serveproto: precision f32: not reusing {good}: not a readable GGUF "
        "(IndexError: index 0 is out of bounds for axis 0 with size 0); transcoding again"
    ]


def test_an_all_f32_model_is_served_as_it_is(tiny, cache, tmp_path):
    assert precision.ensure_f32(tiny, tool=tmp_path / "no-such-tool", quiet=True) == tiny
    assert not (cache / "models").exists()


def test_a_failing_tool_leaves_nothing(tiny_q80, cache, tmp_path):
    tool = tmp_path / "bad-tool"
    tool.write_text("#!/bin/sh\nfor a; do out=$a; done\necho partial > \"$out\"\necho 'no space left' >&2\nexit 1\n")
    tool.chmod(0o755)
    with pytest.raises(precision.TranscodeError, match=r"failed \(exit 1\):\nno space left"):
        precision.ensure_f32(tiny_q80, tool=tool, quiet=True)
    assert list((cache / "models").iterdir()) == []
    with pytest.raises(precision.TranscodeError, match="is not built"):
        precision.ensure_f32(tiny_q80, tool=tmp_path / "no-such-tool", quiet=True)
    with pytest.raises(FileNotFoundError):
        precision.ensure_f32(tmp_path / "missing.gguf")


def test_a_tool_that_writes_no_f32_gguf_is_refused(tiny_q80, cache, tmp_path):
    tool = tmp_path / "copy-tool"  # exits 0 but "transcodes" by copying the quantized file
    tool.write_text('#!/bin/sh\nfor a; do src=$out; out=$a; done\ncp "$src" "$out"\n')
    tool.chmod(0o755)
    with pytest.raises(precision.TranscodeError, match="not an all-F32 GGUF"):
        precision.ensure_f32(tiny_q80, tool=tool, quiet=True)
    assert list((cache / "models").iterdir()) == []


def _serve(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", *argv], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_bad_precision_value_is_a_clear_error():
    r = _serve("--precision", "q8")
    assert r.returncode == 2
    assert (
        "argument --precision: 'q8' is not a precision: native (the GGUF's own weight types, the default), "
        "f32 (" in r.stderr
    )


def test_precision_with_a_named_engine_is_refused(tmp_path):
    r = _serve("--port", "0", "--precision", "f32", "--engine", str(tmp_path / "engine"))
    assert r.returncode == 1
    assert r.stderr.strip() == (
        "serveproto serve: --precision applies to the llama engine; with --engine, give your engine its model"
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_served_logprobs_with_precision_f32_meet_the_oracle():
    """``serve --precision f32`` on the default model: the /v1/completions read-out is within 1e-4 of
    the float64 oracle on the Q4_1 file's weights, and the model is reported as the transcode."""
    import anyio
    import httpx2

    from fixtures import oracle, vocab
    from gateway.cli import build_parser
    from gateway.cli.serve import serve
    from gateway.paths import default_model_path

    model = default_model_path()
    if not model.exists() or not os.access(QUANTIZE, os.X_OK):
        pytest.skip("needs the default model and engines/bin/serveproto-quantize (make engines model)")
    text = "Support ticket: the November invoice charged the annual plan twice. Refund the duplicate?"
    args = build_parser().parse_args(
        ["serve", "--port", "0", "--log-level", "WARNING", "--threads", "2", "--precision", "f32"]
    )

    async def main():
        async with anyio.create_task_group() as tg:
            port = await tg.start(lambda task_status: serve(args, task_status=task_status))
            async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as c:
                r = await c.post("/v1/completions", json={"prompt": text, "max_tokens": 0, "echo": True, "logprobs": 1})
            tg.cancel_scope.cancel()
        return r

    r = anyio.run(main)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "SmolLM2-135M-Instruct.Q4_1.f32"
    lp = body["choices"][0]["logprobs"]
    v = vocab.load(model)
    ids = [v.id_of(t.encode()) for t in lp["tokens"]]
    assert "".join(lp["tokens"]) == text and len(ids) > 15
    ref = oracle.logprobs(model, ids)
    np.testing.assert_allclose(np.array(lp["token_logprobs"][1:], dtype=float), ref[1:], rtol=0, atol=1e-4)
