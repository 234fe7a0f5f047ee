"""Issue 48, item 2: the llama engine reads pictures with llama.cpp's multimodal library (``--mmproj``;
spec/llama-engine.md, "Pictures"), held to llama.cpp's own multimodal path.

The model is the tiny fixture GGUF, the projector a tiny random LLaVA one made for it
(``fixtures.tiny_mmproj``), the pictures random 16 x 16 PNGs. The reference is ``llama-mtmd-ref``
(engines/llama/bench/mtmd_ref.c): ``mtmd_tokenize`` of the whole prompt, ``mtmd_helper_eval_chunk_single``
up to the last picture, one ``llama_decode`` of the text after it, logprobs over the engine's own
logsumexp (llama/lse.h) and number format at 17 digits. The engine's read-out (SUBMIT's ECHOs, SCORE's
SCOREDs) must equal it bit for bit: the same kernels (``GGML_CPU_USE_REF=1``, set by the engine and
here for the reference), the same projector code, the same token ids; the engine computes the text
after the picture in its own batches, which invariant numerics make irrelevant. The DONE counters hold
the other half: a picture prompt is computed whole, never from a snapshot, never from the score cache.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gateway.paths import engine_bin

serveproto = pytest.importorskip("serveproto")
from serveproto import Accept, Done, Echo, Error, Image, Score, Scored, Submit  # noqa: E402

ENGINE = Path(os.environ.get("SERVEPROTO_LLAMA_ENGINE") or engine_bin("serveproto-llama"))
REF = engine_bin("llama-mtmd-ref")
MARKER = "<__media__>"
#: A chat turn with one picture; the text after it is what is read out.
HEAD = "<|im_start|>user\nLook at this: "
TAIL = " Is it a cat?<|im_end|>\n<|im_start|>assistant\n"
PROMPT = HEAD + MARKER + TAIL + "Yes, it is a cat."
#: The reference's environment: the engine's own numerics (it sets these for itself).
REF_ENV = {**os.environ, "GGML_CPU_USE_REF": "1", "LLAMA_KV_CELLS_IN_ORDER": "1"}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    for b in (ENGINE, REF):
        if not os.access(b, os.X_OK):
            pytest.skip(f"{b} is not built yet (make -C engines all)")
    from fixtures import tiny_gguf, tiny_mmproj

    d = tmp_path_factory.mktemp("pictures")
    pics = {}
    for seed in (1, 2):
        pixels = tiny_mmproj.picture(seed)
        png = tiny_mmproj.png(pixels)
        (d / f"p{seed}.png").write_bytes(png)
        pics[seed] = (pixels, png, d / f"p{seed}.png")
    return {"model": tiny_gguf.ensure(), "mmproj": tiny_mmproj.ensure(), "pics": pics, "dir": d}


@pytest.fixture(scope="module")
def engine(files):
    from fixtures.sync_engine import SyncEngine

    argv = [str(ENGINE), "--model", str(files["model"]), "--mmproj", str(files["mmproj"])]
    argv += ["--threads", "1", "--slots", "2", "--float-digits", "17"]
    with SyncEngine(argv, files["dir"] / "engine.stderr") as eng:
        yield eng


def reference(files, prompt: str, *seeds: int, model=None) -> tuple[int, list[tuple[int, int, float]]]:
    """llama-mtmd-ref on ``prompt`` with the pictures of ``seeds``: (positions before the text after the
    last picture, [(position, token id, logprob) for that text's tokens but its first, which has none])."""
    pf = files["dir"] / "prompt.txt"
    pf.write_text(prompt)
    argv = [
        str(REF),
        "--model",
        str(model or files["model"]),
        "--mmproj",
        str(files["mmproj"]),
        "--prompt-file",
        str(pf),
    ]
    for s in seeds:
        argv += ["--image", str(files["pics"][s][2])]
    out = subprocess.run(
        argv + ["--threads", "1"], env=REF_ENV, capture_output=True, text=True, timeout=120, check=True
    )
    lines = out.stdout.split("\n")
    assert lines[0].startswith("positions ")
    rows = [line.split() for line in lines[1:] if line]
    assert rows[0][2] == "nan"  # the first token after the picture: no logits at a picture's position
    return int(lines[0].split()[1]), [(int(p), int(t), float(lp)) for p, t, lp in rows[1:]]


def submit(eng, prompt: str, pictures, **kw) -> list:
    """IMAGE frames (PNG bytes, or (pixels,) for raw RGB) then a read-out SUBMIT on slot 0: its events."""
    rid = eng.new_id()
    for p in pictures:
        if isinstance(p, tuple):
            eng.send(Image(rid, p[0].tobytes(), p[0].shape[0], p[0].shape[1]), flush=False)
        else:
            eng.send(Image(rid, p, 0, 0), flush=False)
    args = {"max_tokens": 0, "logprobs": 1, "counters": True, **kw}
    return eng.request(Submit(rid, 0, prompt.encode(), args.pop("max_tokens"), 0.0, 1.0, **args))


def score(eng, prefix: str, stem: str, options, pictures, slot: int = 1) -> list:
    import orjson

    rid = eng.new_id()
    for p in pictures:
        eng.send(Image(rid, p, 0, 0), flush=False)
    payload = orjson.dumps({"prefix": prefix, "groups": [{"stem": stem, "options": options}]})
    return eng.request(Score(rid, slot, payload))


def test_caps_say_vision_only_with_a_projector(files, engine):
    from fixtures.sync_engine import SyncEngine

    assert engine.caps.vision is True
    with SyncEngine(
        [str(ENGINE), "--model", str(files["model"]), "--threads", "1"], files["dir"] / "plain.stderr"
    ) as e:
        assert e.caps.vision is False


def test_submit_reads_out_what_llama_cpps_multimodal_path_computes(files, engine):
    for seed in (1, 2):
        n_pos, ref = reference(files, PROMPT, seed)
        evs = submit(engine, PROMPT, [files["pics"][seed][1]])
        accept, done = evs[0], evs[-1]
        echoes = [e for e in evs if isinstance(e, Echo)]
        assert isinstance(accept, Accept) and isinstance(done, Done), evs
        # the prelude (text before the picture and its 16 positions), then the text after it
        assert n_pos == len(engine_tokens_before(engine, HEAD)) + 16
        assert accept.prompt_tokens == n_pos + len(ref) + 1
        # read-out from the second position after the picture, bit for bit the reference's
        assert [(e.position, e.logprob) for e in echoes] == [(p, lp) for p, _, lp in ref]
        assert (done.computed, done.reused, done.snapshot) == (accept.prompt_tokens, 0, "none")


def engine_tokens_before(eng, text: str) -> list[int]:
    """The tokens of ``text`` as the engine tokenizes a prompt (BOS as the model asks), from its read-out."""
    evs = eng.request(Submit(eng.new_id(), 1, text.encode(), 0, 0.0, 1.0, logprobs=1))
    return [e.position for e in evs if isinstance(e, Echo)]


def test_the_picture_matters(files, engine):
    one = [e.logprob for e in submit(engine, PROMPT, [files["pics"][1][1]]) if isinstance(e, Echo)]
    two = [e.logprob for e in submit(engine, PROMPT, [files["pics"][2][1]]) if isinstance(e, Echo)]
    assert len(one) == len(two) > 5
    assert max(abs(a - b) for a, b in zip(one, two)) > 0.1


def test_raw_rgb_pixels_read_as_the_same_picture_encoded(files, engine):
    pixels, png, _ = files["pics"][1]
    raw = [(e.position, e.logprob) for e in submit(engine, PROMPT, [(pixels,)]) if isinstance(e, Echo)]
    enc = [(e.position, e.logprob) for e in submit(engine, PROMPT, [png]) if isinstance(e, Echo)]
    assert raw == enc and raw


def test_two_pictures_in_order(files, engine):
    prompt = HEAD + MARKER + " and " + MARKER + TAIL + "Yes."
    n_pos, ref = reference(files, prompt, 1, 2)
    evs = submit(engine, prompt, [files["pics"][1][1], files["pics"][2][1]])
    echoes = [(e.position, e.logprob) for e in evs if isinstance(e, Echo)]
    assert echoes == [(p, lp) for p, _, lp in ref]
    assert echoes[0][0] == n_pos + 1  # read-out from the second token after the last picture
    assert evs[0].prompt_tokens == n_pos + len(ref) + 1
    swapped = submit(engine, prompt, [files["pics"][2][1], files["pics"][1][1]])
    assert [e.logprob for e in swapped if isinstance(e, Echo)] != [lp for _, _, lp in ref]


def test_score_equals_the_reference_and_is_computed_whole_each_time(files, engine):
    prefix = HEAD + MARKER + TAIL
    options = ["Yes", "No, it is a dog"]
    png = files["pics"][1][1]
    first = score(engine, prefix, "", options, [png])
    again = score(engine, prefix, "", options, [png])
    other = score(engine, prefix, "", options, [files["pics"][2][1]])
    scored = [e for e in first if isinstance(e, Scored)]
    assert len(scored) == 2, first
    for opt, sc in zip(options, scored):
        _, ref = reference(files, prefix + opt, 1)
        n = len(sc.logprobs)
        assert [lp for _, _, lp in ref[-n:]] == list(sc.logprobs)
        assert sc.context_tokens == ref[-n][0]
    # again on the same slot with the same picture: nothing reused, nothing from the score cache
    d1, d2 = first[-1], again[-1]
    assert isinstance(d1, Done) and isinstance(d2, Done)
    assert (d2.computed, d2.reused, d2.snapshot) == (d1.computed, 0, "none")
    assert [e.logprobs for e in again if isinstance(e, Scored)] == [s.logprobs for s in scored]
    assert [e.logprobs for e in other if isinstance(e, Scored)] != [s.logprobs for s in scored]


def test_a_picture_prompt_never_resumes_from_a_snapshot(files, engine):
    text = HEAD + "a picture follows" + TAIL
    pinned = engine.request(Submit(engine.new_id(), 0, text.encode(), 0, 0.0, 1.0, logprobs=1, pin=True, counters=True))
    assert pinned[-1].snapshot == "none"
    hit = engine.request(Submit(engine.new_id(), 0, (text + "Yes").encode(), 0, 0.0, 1.0, logprobs=1, counters=True))
    assert hit[-1].snapshot == "hit"  # the snapshot is there for a text prompt
    evs = submit(engine, HEAD + MARKER + TAIL + "Yes", [files["pics"][1][1]])
    assert (evs[-1].reused, evs[-1].snapshot) == (0, "none")
    assert evs[-1].computed == evs[0].prompt_tokens


def error_of(evs) -> tuple[str, str]:
    assert isinstance(evs[-1], Error), evs
    return evs[-1].code, evs[-1].reason


def test_clear_errors_naming_the_field(files, engine):
    png = files["pics"][1][1]
    assert error_of(submit(engine, "no marker here", [png])) == (
        "BAD_REQUEST",
        "prompt: 0 picture markers <__media__> for 1 picture",
    )
    assert error_of(submit(engine, PROMPT + MARKER, [png])) == (
        "BAD_REQUEST",
        "prompt: 2 picture markers <__media__> for 1 picture",
    )
    assert error_of(submit(engine, PROMPT, [])) == (
        "BAD_REQUEST",
        "prompt: 1 picture marker <__media__> for 0 pictures (IMAGE frames)",
    )
    assert error_of(submit(engine, PROMPT, [b"not a picture"])) == (
        "BAD_REQUEST",
        "image 1 of 1: the bytes are not a picture (PNG, JPEG, BMP, GIF; or raw RGB with grid_h and grid_w)",
    )
    assert error_of(submit(engine, PROMPT, [png], pin=True)) == (
        "BAD_REQUEST",
        "pin: a prompt with pictures takes no snapshot",
    )
    assert error_of(submit(engine, HEAD + MARKER, [png])) == (
        "BAD_REQUEST",
        "prompt: no text after its last picture marker (a picture's positions have no logits to read the next "
        "token from)",
    )
    assert error_of(score(engine, HEAD + MARKER + TAIL, MARKER, ["Yes"], [png])) == (
        "BAD_REQUEST",
        "groups[0].stem: the picture marker <__media__> is only read in the prefix",
    )
    # the engine still serves: a plain prompt reads out
    ok = engine.request(Submit(engine.new_id(), 0, b"Hello there", 0, 0.0, 1.0, logprobs=1))
    assert isinstance(ok[-1], Done)


def raw_session(files, frames: bytes, *args: str) -> list[bytes]:
    """A fresh engine fed ``frames`` (raw: the sans-IO connection refuses to send what these test), its
    stdout lines after the handshake once its stdin ends."""
    argv = [str(ENGINE), "--model", str(files["model"]), "--threads", "1", *args]
    out = subprocess.run(argv, input=frames, capture_output=True, timeout=120, check=True).stdout
    return [line for line in out.split(b"\n") if line.startswith((b"ERROR", b"DONE", b"PONG", b"ACCEPT"))]


def test_an_image_without_its_request_is_refused_and_without_a_projector_not_supported(files):
    png = files["pics"][1][1]
    image = b"IMAGE 1 %d 0 0\n" % len(png) + png + b"\n"
    hello = b"SUBMIT 2 0 5 0 0 1 logprobs=1\nHello\n"
    lines = raw_session(files, image + hello, "--mmproj", str(files["mmproj"]))
    assert lines[0] == b"ERROR 1 BAD_REQUEST IMAGE: not followed by its SUBMIT or SCORE"
    assert lines[1] == b"ACCEPT 2 1" and lines[2].startswith(b"DONE 2 ")  # then served on its own
    lines = raw_session(files, image + b"SUBMIT 1 0 5 0 0 1 logprobs=1\nHello\nPING 3\n")
    assert lines == [b"ERROR 1 NOT_SUPPORTED this engine has no image tower (vision=0; --mmproj)", b"PONG 3 active=0"]


def test_a_projector_that_is_not_one_for_the_model_is_a_load_fail(files):
    missing = files["dir"] / "missing.gguf"
    for mmproj, kind, says in (
        (missing, "io", f"--mmproj {missing}: No such file or directory"),
        (files["model"], "unsupported", f"--mmproj {files['model']}: not a projector for this model"),
    ):
        argv = [str(ENGINE), "--model", str(files["model"]), "--threads", "1", "--mmproj", str(mmproj)]
        done = subprocess.run(argv, input=b"", capture_output=True, timeout=120)
        line = done.stdout.decode().splitlines()[0]
        assert done.returncode != 0 and line.startswith(f"LOAD_FAIL kind={kind} {says}"), line


def test_on_a_model_that_adds_bos_the_text_after_the_picture_has_none(files):
    """mtmd_tokenize puts BOS before the prelude only: the engine's SUBMIT and SCORE read the text after
    the picture without one too (a Llama-like tokenizer; the fixture's SmolLM2 one adds none)."""
    from fixtures import tiny_gguf
    from fixtures.sync_engine import SyncEngine

    bos = tiny_gguf.with_bos(files["model"], files["dir"] / "tiny-bos.gguf")
    argv = [str(ENGINE), "--model", str(bos), "--mmproj", str(files["mmproj"]), "--threads", "1"]
    with SyncEngine([*argv, "--float-digits", "17"], files["dir"] / "bos.stderr") as eng:
        n_pos, ref = reference(files, PROMPT, 1, model=bos)
        evs = submit(eng, PROMPT, [files["pics"][1][1]])
        assert [(e.position, e.logprob) for e in evs if isinstance(e, Echo)] == [(p, lp) for p, _, lp in ref]
        assert evs[0].prompt_tokens == n_pos + len(ref) + 1
        prefix = HEAD + MARKER + TAIL
        scored = [
            e for e in score(eng, prefix, "", ["Yes", "No"], [files["pics"][1][1]], slot=0) if isinstance(e, Scored)
        ]
        for opt, sc in zip(["Yes", "No"], scored):
            _, ref = reference(files, prefix + opt, 1, model=bos)
            assert [lp for _, _, lp in ref[-len(sc.logprobs) :]] == list(sc.logprobs)
            assert sc.context_tokens == ref[-len(sc.logprobs)][0]
        plain = eng.request(Submit(eng.new_id(), 0, b"Hello", 0, 0.0, 1.0, logprobs=1))
        assert plain[0].prompt_tokens == 2  # this model does add BOS to a plain prompt
