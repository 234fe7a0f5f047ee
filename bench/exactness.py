"""How far the llama engine's logprobs lie from the float64 oracle, on the default model and its F32 transcode.

1. Exactness: each prompt is read out (SUBMIT logprobs=1 max_tokens=0, cold) by
   ``serveproto-llama`` on the Q4_1 GGUF as served by default, and by the same
   binary on the GGUF's F32 transcode (``serve --precision f32``,
   ``gateway/engine/precision.py``: llama.cpp's own quantizer, F32 out), with the same
   token ids; both against ``fixtures/oracle.py``'s float64 forward pass on the
   Q4_1 file's weights, dequantized (the model's exact function). Printed: max
   and mean |logprob difference| over positions 1..n-1 of each prompt, in nats.
   On Q4_1 the difference is the rounding of activations to Q8 before each
   quantized matmul (ggml's vec_dot_type), not an engine error: on F32 weights
   the same binary meets the oracle.
2. Speed (``--reps`` > 0): prefill tokens/s of a ~512-token prompt (read-out of
   every position, and last logit only) and a warm SCORE of one question over a
   pinned prefix (4 one-token options; 4 multi-token options), and greedy
   generation of 32 tokens, both files with the same binary and threads,
   interleaved round by round, best of ``--reps`` (the engines' score cache off,
   so that a repeated SCORE computes).

Usage::

    .venv/bin/python -m bench.exactness [--model PATH] [--threads 2] [--reps 5] [--numerics fast]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from fixtures import oracle
from fixtures.compare import read_out
from fixtures.sync_engine import SyncEngine
from gateway.engine.precision import ensure_f32
from gateway.paths import default_model_path, engine_bin

CHAT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nI have been trying to connect my Stripe account for 3 days and the integration keeps "
    "failing. I am losing sales.\n\nDoes this message express urgency? Answer yes or no.<|im_end|>\n"
    "<|im_start|>assistant\nyes"
)
PARAGRAPH = (
    "Support ticket 4471. The customer writes that the November invoice shows the same annual plan twice, "
    "once on the 3rd and again on the 4th, and that her bank has already taken both payments. She has "
    "attached a screenshot of the statement and asks for the duplicate to be refunded to the original card "
    "rather than kept as credit, because the company closes its books at the end of the month. An agent "
    "replied on Tuesday that the billing system retried a payment that had timed out, apologised for the "
    "trouble, and promised an answer within two working days. The customer answered that two days is too "
    "long, that she has been a subscriber since 2019, and that she will cancel if the money is not back by "
    "Friday. The account shows three seats, an active integration with the accounting software, and no "
    "earlier refunds. The team lead must decide whether to refund at once, escalate to finance, or offer a "
    "discount on the next renewal instead."
)
#: (label, text) of the prompts read out; the first is the one of shared/notes/numerics.md.
PROMPTS = [
    (
        "invoice sentence",
        "The quarterly invoice was charged twice, and the customer asked for a refund of the duplicate payment.",
    ),
    ("France", "The capital of France is Paris"),
    ("ChatML question", CHAT),
    ("ticket paragraph", PARAGRAPH),
]
#: The SCORE of the speed part: a pinned prefix, one question, one-token and multi-token options.
SCORE_STEM = "\n\nQuestion: which team should handle this ticket? Answer:"
ONE_TOKEN = [" billing", " finance", " sales", " support"]
MULTI_TOKEN = [" the billing team", " the finance department", " a sales manager", " customer support staff"]


def q41_mins(path: Path) -> dict[str, np.ndarray]:
    """The block minimums ``m`` (float16 -> float64) of every Q4_1 tensor of ``path``: name ->
    ``(n_out, n_in / 32)`` (ggml's block_q4_1 is d, m as float16, then 16 bytes of nibbles)."""
    from fixtures.gguf_read import GGUFFile

    out = {}
    with GGUFFile(path) as f:
        for name, info in f.tensors.items():
            if info.ggml_type == 3:
                n_in, n_out = info.ne[0], info.ne[1]
                raw = f.tensor_bytes(name, n_out * n_in // 32 * 20).reshape(-1, 20)
                out[name] = raw[:, 2:4].copy().view("<f2").astype(np.float64).reshape(n_out, n_in // 32)
                del raw  # the file's map closes only once no view is left
    return out


def _q8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``x`` ``(n, n_in)`` as Q8 blocks of 32: ``(q, d, d16)``, shapes ``(n, n_in/32, 32)``,
    ``(n, n_in/32, 1)`` twice: ``d = max|x| / 127`` in float32, ``d16`` it as float16 (widened to float64),
    ``q = round(x / d)`` (``quantize_row_q8_1`` in ggml-cpu's quants.c)."""
    b = x.astype(np.float32).reshape(x.shape[0], -1, 32)
    d = np.abs(b).max(axis=-1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d > 0, np.float32(1) / d, np.float32(0))
    return np.round(b * inv), d, d.astype(np.float16).astype(np.float64)


def q8_blocks(x: np.ndarray) -> np.ndarray:
    """``x`` ``(n, n_in)`` as the activations a Q8_0/Q8_1 block holds, ``d16 * q`` (``_q8``), float64."""
    q, _, d16 = _q8(x)
    return (q * d16).reshape(x.shape)


def q8_matmul(types: dict[str, int], mins: dict[str, np.ndarray]):
    """An ``oracle.forward`` matmul hook that rounds activations as ggml-cpu does before a matmul by a
    quantized weight (its ``vec_dot_type``, ``quantize_row_q8_1`` in ggml-cpu's quants.c), the rest
    exact in float64: per 32 values ``d = max|x| / 127`` (float32, stored float16) and ``q = round(x/d)``,
    so ``x`` becomes ``d16 * q``; for Q4_1 weights also the block sum ``s = d * sum(q)`` stored as
    float16, which multiplies the weight block's ``m`` (``mins``, from :func:`q41_mins`). F32 weights:
    no rounding. ``types``: tensor name -> ggml type (``oracle.Model.types``; a tied head has
    token_embd's). Not modelled: ggml's float32 sums, so this shows the size of the rounding and does
    not reproduce the engine's digits."""

    def mm(x: np.ndarray, w: np.ndarray, name: str) -> np.ndarray:
        t = types.get(name, types.get("token_embd.weight") if name == "output.weight" else 0)
        if t == 0:
            return x @ w.T
        q, d, d16 = _q8(x)
        out = (q * d16).reshape(x.shape) @ w.T
        if name in mins:
            sq = q.sum(axis=-1)  # (n, n_in / 32)
            s16 = (d[..., 0] * sq.astype(np.float32)).astype(np.float16).astype(np.float64)
            out += (s16 - d16[..., 0] * sq) @ mins[name].T
        return out

    return mm


def exactness(engines: dict[str, SyncEngine], q41: Path) -> None:
    """Prints the per-prompt table of |engine - oracle| for each engine (the first one tokenizes the
    text), and of the oracle with activations rounded to Q8 (``q8_matmul``, "Q8 sim") against it."""
    names = list(engines)
    print(
        "exactness: |logprob - float64 oracle| over positions 1..n-1 (nats); oracle on the Q4_1 file's "
        "dequantized weights; 'Q8 sim' = that oracle with activations rounded to Q8_1 blocks before each "
        "quantized matmul as ggml stores them, nothing else (q8_matmul)"
    )
    model = oracle.load(q41)
    sim_mm = q8_matmul(model.types, q41_mins(q41))
    cols = names + ["Q8 sim"]
    head = "".join(f" {n + ' max':>12s} {n + ' mean':>12s}" for n in cols)
    print(f"  {'prompt':18s} {'tokens':>6s}{head}")
    diffs: dict[str, list[np.ndarray]] = {n: [] for n in cols}
    for label, text in PROMPTS:
        ids, lp = read_out(engines[names[0]], text.encode(), q41)
        got = {names[0]: lp}
        for n in names[1:]:
            got[n] = read_out(engines[n], ids)[1]
        ref = oracle.logprobs(q41, ids)
        lsm = oracle.log_softmax(oracle.forward(model, ids, matmul=sim_mm))
        got["Q8 sim"] = np.r_[np.nan, lsm[np.arange(len(ids) - 1), ids[1:]]]
        row = ""
        for n in cols:
            d = np.abs(got[n][1:] - ref[1:])
            diffs[n].append(d)
            row += f" {d.max():12.2e} {d.mean():12.2e}"
        print(f"  {label:18s} {len(ids):6d}{row}")
    row = ""
    for n in cols:
        d = np.concatenate(diffs[n])
        row += f" {d.max():12.2e} {d.mean():12.2e}"
    print(f"  {'all':18s} {sum(len(d) + 1 for d in diffs[names[0]]):6d}{row}")


def _timed(engine: SyncEngine, event) -> tuple[float, list]:
    t0 = time.perf_counter()
    evs = engine.request(event, timeout=600)
    dt = time.perf_counter() - t0
    if type(evs[-1]).__name__ == "Error":
        raise RuntimeError(f"engine answered {evs[-1]}")
    return dt, evs


def speed(engines: dict[str, SyncEngine], reps: int, n_tokens: int) -> None:
    """Prints prefill tok/s and warm SCORE ms for each engine, interleaved, best of ``reps``."""
    from serveproto import Score, Submit

    names = list(engines)
    first = engines[names[0]]
    text = (PARAGRAPH + " ") * 4
    n_full = _timed(
        first,
        Submit(
            id=first.new_id(), slot=0, prompt=text.encode(), max_tokens=1, temperature=0.0, top_p=1.0, counters=True
        ),
    )[1][-1].prompt_tokens
    text = text[: len(text) * n_tokens // n_full].encode()

    def prefill(eng, readout):
        # another prompt first, so that the slot keeps nothing of the text (no prefix reuse)
        _timed(eng, Submit(id=eng.new_id(), slot=0, prompt=b"x", max_tokens=1, temperature=0.0, top_p=1.0))
        kw = dict(max_tokens=0, logprobs=1) if readout else dict(max_tokens=1)
        dt, evs = _timed(
            eng, Submit(id=eng.new_id(), slot=0, prompt=text, temperature=0.0, top_p=1.0, counters=True, **kw)
        )
        done = evs[-1]
        assert done.computed == done.prompt_tokens, done
        return dt, done.prompt_tokens

    def score(eng, options):
        job = {"prefix": PARAGRAPH, "groups": [{"stem": SCORE_STEM, "options": options}]}
        _timed(eng, Score(id=eng.new_id(), slot=0, payload=json.dumps({**job, "pin": True}).encode()))
        dt, evs = _timed(eng, Score(id=eng.new_id(), slot=0, payload=json.dumps(job).encode()))
        return dt, evs[-1].computed

    def generate(eng):
        # a short prompt the slot does not hold, then 32 greedy tokens: decode-bound (weights read per token)
        _timed(eng, Submit(id=eng.new_id(), slot=0, prompt=b"x", max_tokens=1, temperature=0.0, top_p=1.0))
        dt, evs = _timed(
            eng,
            Submit(
                id=eng.new_id(),
                slot=0,
                prompt=b"Once upon a time, in a small village,",
                max_tokens=32,
                temperature=0.0,
                top_p=1.0,
                counters=True,
            ),
        )
        return dt, evs[-1].emitted

    rows = [
        ("prefill, read-out (tok/s)", lambda e: prefill(e, True), True),
        ("prefill, last logit (tok/s)", lambda e: prefill(e, False), True),
        ("SCORE 4 one-token (ms)", lambda e: score(e, ONE_TOKEN), False),
        ("SCORE 4 multi-token (ms)", lambda e: score(e, MULTI_TOKEN), False),
        ("generation, 32 tokens (tok/s)", generate, True),
    ]
    print(
        f"speed: best of {reps}, the engines interleaved; prefill of {n_tokens} tokens from cold, "
        "SCORE warm on a pinned prefix"
    )
    print(f"  {'':28s}" + "".join(f" {n:>12s}" for n in names) + f" {names[-1] + '/' + names[0] + ' time':>18s}")
    for label, run, rate in rows:
        best = {n: None for n in names}
        for _ in range(reps):
            for n in names:
                dt, count = run(engines[n])
                if best[n] is None or dt < best[n][0]:
                    best[n] = (dt, count)
        vals = "".join(f" {(best[n][1] / best[n][0] if rate else best[n][0] * 1e3):12.1f}" for n in names)
        print(
            f"  {label:28s}{vals} {best[names[-1]][0] / best[names[0]][0]:18.2f}"
            + ("" if rate else f"   (computed {best[names[0]][1]})")
        )


def main(argv=None) -> int:
    """Entry point: ``bench/exactness.py [--model PATH] [--threads N] [--reps N] [--tokens N]``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=default_model_path(), help="a quantized llama GGUF")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5, help="speed rounds (0: exactness only)")
    ap.add_argument("--tokens", type=int, default=512, help="prefill prompt length, tokens")
    ap.add_argument("--numerics", choices=("invariant", "fast"), help="the engines' --numerics (default: theirs)")
    args = ap.parse_args(argv)
    binary = engine_bin("serveproto-llama")
    if not binary.exists() or not args.model.exists():
        print(f"missing {binary} or {args.model}: run make engines model", file=sys.stderr)
        return 2
    f32 = ensure_f32(args.model, threads=args.threads)
    print(
        f"engine {binary.name}, {args.threads} threads, numerics {args.numerics or 'default'}; "
        f"Q4_1 = {args.model.name}, F32 = {f32.name}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        # no score cache: a repeated SCORE must compute its positions to be timed
        common = ["--threads", str(args.threads), "--slots", "1", "--ctx", "2048", "--score-cache-mb", "0"]
        if args.numerics:
            common += ["--numerics", args.numerics]
        with (
            SyncEngine([str(binary), "--model", str(args.model), *common], Path(tmp) / "q41.log") as q,
            SyncEngine([str(binary), "--model", str(f32), *common], Path(tmp) / "f32.log") as f,
        ):
            engines = {"Q4_1": q, "F32": f}
            exactness(engines, args.model)
            if args.reps > 0:
                speed(engines, args.reps, args.tokens)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
