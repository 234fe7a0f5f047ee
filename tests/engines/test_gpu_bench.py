"""The CPU-checkable parts of the GPU benchmark (issue 8): the random-weight model writer
(``bench/gpu/make_model.py``) and a tiny run of ``bench/gpu_decisions.py``. No timing is asserted."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from bench.gpu import make_model
from fixtures.gguf_read import GGUFFile
from gateway.paths import default_model_path, engine_bin
from test_bench_support import run_bench


@pytest.mark.parametrize("kind", ["q4_k", "q8_0", "f16"])
@pytest.mark.parametrize("n_in", [256, 4096, 14336])
def test_random_weights_have_the_planned_scale(kind, n_in):
    """gguf's own dequantizer (an independent reading of the block format) sees weights of the
    standard deviation asked for, centred on zero."""
    import gguf

    qtype = {
        "q4_k": gguf.GGMLQuantizationType.Q4_K,
        "q8_0": gguf.GGMLQuantizationType.Q8_0,
        "f16": gguf.GGMLQuantizationType.F16,
    }[kind]
    std = n_in**-0.5
    raw = make_model.RandomTensors(kind, seed=7).make(48, n_in, std)
    per_block, block_bytes = make_model.RandomTensors.BLOCK[kind]
    if kind == "f16":
        assert raw.dtype == np.float16 and raw.shape == (48, n_in)
        w = raw.astype(np.float32)
    else:
        assert raw.dtype == np.uint8 and raw.shape == (48, n_in // per_block * block_bytes)
        w = gguf.quants.dequantize(raw, qtype)
    assert w.shape == (48, n_in)
    assert np.all(np.isfinite(w))
    assert abs(float(w.std()) / std - 1) < 0.05
    assert abs(float(w.mean())) < 0.1 * std


def test_a_block_that_does_not_divide_the_row_is_refused():
    with pytest.raises(ValueError, match="n_in=100 is not a multiple of the q4_k block"):
        make_model.RandomTensors("q4_k").make(2, 100, 0.1)
    with pytest.raises(ValueError, match="--type must be one of"):
        make_model.RandomTensors("q3_k")


def test_tensor_plan_is_llama3_8b_less_the_vocabulary():
    plan = make_model.tensor_plan(make_model.GEOMETRIES["llama3-8b"], 49152)
    shapes = {name: (rows, n_in) for name, rows, n_in, _ in plan}
    assert shapes["blk.0.attn_k.weight"] == (1024, 4096)  # 8 KV heads of 128
    assert shapes["blk.31.ffn_down.weight"] == (4096, 14336)
    assert shapes["output.weight"] == (49152, 4096)
    n_params = sum(rows * n_in for _, rows, n_in, _ in plan)
    assert n_params == 2 * 49152 * 4096 + 32 * (2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 4096 * 14336)


@pytest.fixture(scope="module")
def tiny_random(tmp_path_factory) -> Path:
    """A 2-block random model with SmolLM2's tokenizer, through the tokenizer-only GGUF."""
    source = default_model_path()
    if not Path(source).is_file():
        pytest.skip(f"{source} is not fetched yet (make model)")
    d = tmp_path_factory.mktemp("gpu_bench")
    tok = make_model.write_tokenizer(source, d / "tok.gguf")
    src, got = GGUFFile(source), GGUFFile(tok)
    try:
        assert got.get("tokenizer.ggml.tokens") == src.get("tokenizer.ggml.tokens")
        assert got.get("tokenizer.chat_template") == src.get("tokenizer.chat_template")
        assert len(got.tensors) == 0
    finally:
        src.close()
        got.close()
    return make_model.write_model(tok, d / "tiny.gguf", geometry="tiny", kind="q4_k")


@pytest.mark.slow
def test_the_llama_engine_reads_the_random_model_to_finite_logprobs(tiny_random):
    from fixtures.sync_engine import SyncEngine
    from serveproto import Echo, Submit

    f = GGUFFile(tiny_random)
    try:
        assert f.get("llama.block_count") == 2 and f.get("llama.vocab_size") == 49152
    finally:
        f.close()
    path = engine_bin("serveproto-llama")
    if not Path(path).exists():
        pytest.skip(f"{path} is not built yet (make -C engines all)")
    with SyncEngine(
        [str(path), "--model", str(tiny_random), "--threads", "2", "--ctx", "256"], tiny_random.with_suffix(".log")
    ) as eng:
        assert eng.caps.n_vocab == 49152
        ev = eng.request(
            Submit(
                id=eng.new_id(),
                slot=0,
                prompt=b"The webhook returns 500 since Monday.",
                max_tokens=0,
                temperature=0.0,
                top_p=1.0,
                logprobs=2,
            )
        )
    echoes = [e for e in ev if isinstance(e, Echo)]
    assert len(echoes) == ev[-1].prompt_tokens > 5
    assert all(math.isfinite(e.logprob) and -30 < e.logprob < 0 for e in echoes[1:])


@pytest.mark.slow
def test_gpu_decisions_runs_on_the_cpu(tiny_random, tmp_path):
    for name in ("serveproto-llama", "llama-prefill-ref"):
        if not Path(engine_bin(name)).exists():
            pytest.skip(f"{engine_bin(name)} is not built yet (make -C engines all)")
    sizes = ("--states", "40", "--questions", "1,2", "--reps", "1", "--ctx", "512", "--threads", "2")
    dest = ("--out-dir", str(tmp_path), "--tag", "t")
    run_bench("gpu_decisions", "--model", str(tiny_random), *sizes, *dest, check=True, timeout=600)
    res = json.loads((tmp_path / "t.json").read_text())
    assert "| state tokens |" in (tmp_path / "t.md").read_text()
    (pre,) = res["prefill"]
    assert pre["tokens"] == pre["llama_tokens"] == res["state_tokens"]["40"]
    assert [(r["questions"], r["snapshot_misses"]) for r in res["scoring"]] == [(1, 0), (2, 0)]
    for r in res["scoring"]:
        assert r["max_diff"] < 1e-4  # CPU backend: SCORE equals one-by-one read-out (spec 9.1)
        assert 0 < r["score_computed"] <= r["one_computed"]
    score_computed = {r["questions"]: r["score_computed"] for r in res["scoring"]}
    for r in res["systemone"]:
        # a warm request computes its questions only, as much as the engine-level SCORE; the
        # route's SCORE asks for pin=1 on a state it has seen, which may recompute the state's
        # last position (its logits go into the snapshot)
        assert score_computed[r["questions"]] <= r["computed_warm"] <= score_computed[r["questions"]] + 1
        assert r["computed_cold"] > r["tokens"] and r["computed_cold"] > r["computed_warm"]
    (gen,) = res["generation"]
    assert gen["generated_tokens"] == 3 * 2


def test_gpu_decisions_refuses_an_unknown_server_part():
    r = run_bench("gpu_decisions", "--model", "unused.gguf", "--server-parts", "systemone,speed", timeout=60)
    assert r.returncode == 2
    assert "--server-parts: systemone and/or generation, not systemone,speed" in r.stderr


def test_fixed_cost_sends_token_ids_as_the_protocol_reads_them():
    from bench.gpu import fixed_cost

    assert fixed_cost.ids_payload([0, 17, 49151]) == b"0 17 49151"


@pytest.mark.slow
def test_fixed_cost_runs_on_the_cpu(tiny_random):
    """Every variant reads the whole prompt (fixed_cost raises when the slot reused a prefix), the
    ids variants have as many tokens as the text, and llama-prefill-ref reads the same count."""
    for name in ("serveproto-llama", "llama-prefill-ref"):
        if not Path(engine_bin(name)).exists():
            pytest.skip(f"{engine_bin(name)} is not built yet (make -C engines all)")
    sizes = ("--tokens", "40", "--reps", "2", "--ctx", "512", "--threads", "2")
    out = run_bench("gpu.fixed_cost", "--model", str(tiny_random), *sizes, check=True, timeout=600).stdout
    head = out.splitlines()[0]
    n = int(head.split(", ")[1].split("-token")[0])
    assert abs(n - 40) <= 1
    rows = {
        line.split(" | ")[0].strip("| "): line
        for line in out.splitlines()
        if line.startswith("| ") and not line.startswith("| variant")
    }
    assert list(rows) == ["text after x", "ids after x", "ids, same shape", "1 token", "PING"]
    for line in rows.values():
        best, median = (float(x) for x in line.strip("| ").split(" | ")[1:])
        assert 0 < best <= median
    ref = next(line for line in out.splitlines() if line.startswith("llama-prefill-ref"))
    assert ref.startswith(f"llama-prefill-ref, {n} tokens")
    assert len(ref.split(": ")[1].split()) == 2


def test_profile_split_reads_the_decodes_by_fill_from_the_profile(tmp_path):
    """bench/gpu/profile_split.py's inner table over an engine profile (engines/llama/profile.c's columns,
    the header's names): two lines a second apart, 10 decodes between them of which 6 held a whole ubatch,
    3 were cut short and 1 starved, give 60% | 30% | 10%; a file from before those columns gives dashes."""
    from bench.gpu import profile_split

    names = (
        "t_s decodes rows outputs gap_ms start_ms fill_ms decode_ms early_ms sync_ms read_ms early_tasks max_rows"
        " batch_ms memory_ms outbuf_ms apply_ms build_ms alloc_ms inputs_ms compute_ms outputs_ms ubatches reused"
        " n_kv tokens pipelined waited whole cut starved"
    ).split()
    a = dict.fromkeys(names, 0.0)
    b = dict(a, t_s=1.0, decodes=10, rows=4800, compute_ms=90.0, ubatches=10, n_kv=30000, tokens=4800)
    b.update(pipelined=9, waited=2, whole=6, cut=3, starved=1)
    path = tmp_path / "prof.1"
    path.write_text("# " + " ".join(names) + "\n" + "\n".join(" ".join(str(d[k]) for k in names) for d in (a, b)))
    stretch = profile_split.busy_stretch(profile_split.read_lines(path))
    row = profile_split.inner_split("prof.1", stretch)
    assert row is not None
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:5] == ["1.00", "480", "3000", "0%"]
    assert cells[-4:] == ["90%", "60%", "30%", "10%"]
    assert profile_split.host_split("prof.1", stretch) is None  # a file from before the host columns
    old = [line[: len(line) - 3] for line in profile_split.read_lines(path)]  # no whole, cut, starved
    cells = [c.strip() for c in profile_split.inner_split("prof.0", (old[0], old[1])).strip("|").split("|")]
    assert cells[-4:] == ["90%", "-", "-", "-"]


def test_profile_split_reads_the_requests_and_the_host_work_from_the_profile(tmp_path):
    """profile_split's host table over a profile with the columns since 2026-12-05's fourth session: 10 decodes
    in a second, 40 requests answered in 2,000 ms in all, 60 ms of reads of which 20 of logsumexps, and 2
    llama_decode calls with no decode in flight taking 9 ms give 50.0 ms a request, 6.00 and 2.00 ms a decode,
    20% of the calls, 4.50 ms each; 300 rows of padding, 30 a decode; 5 late waits of 40 ms in all, 50% of the
    decodes and 4.00 ms a decode (a dash for a file without those columns)."""
    from bench.gpu import profile_split

    names = (
        "t_s decodes rows outputs gap_ms start_ms fill_ms decode_ms early_ms sync_ms read_ms early_tasks max_rows"
        " batch_ms memory_ms outbuf_ms apply_ms build_ms alloc_ms inputs_ms compute_ms outputs_ms ubatches reused"
        " n_kv tokens pipelined waited whole cut starved answered answer_ms readout_ms lse_ms alone alone_ms padded"
        " late late_ms"
    ).split()
    a = dict.fromkeys(names, 0.0)
    b = dict(a, t_s=1.0, decodes=10, rows=4800, ubatches=10, n_kv=30000, tokens=4800)
    b.update(
        answered=40,
        answer_ms=2000.0,
        readout_ms=60.0,
        lse_ms=20.0,
        alone=2,
        alone_ms=9.0,
        padded=300,
        late=5,
        late_ms=40.0,
    )
    path = tmp_path / "prof.2"
    path.write_text("# " + " ".join(names) + "\n" + "\n".join(" ".join(str(d[k]) for k in names) for d in (a, b)))
    row = profile_split.host_split("prof.2", profile_split.busy_stretch(profile_split.read_lines(path)))
    assert row is not None
    assert [c.strip() for c in row.strip("|").split("|")] == [
        "prof.2",
        "40",
        "50.0",
        "6.00",
        "2.00",
        "20%",
        "4.50",
        "30",
        "50%",
        "4.00",
    ]
    older = [line[:-3] for line in profile_split.read_lines(path)]  # no padded, late, late_ms columns
    row = profile_split.host_split("prof.2", (older[0], older[1]))
    assert row is not None and [c.strip() for c in row.strip("|").split("|")][-3:] == ["-", "-", "-"]
