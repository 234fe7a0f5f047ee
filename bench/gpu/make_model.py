"""Random-weight GGUFs of a real model's geometry, for speed benchmarks (weights do not change speed).

Two jobs, both written with the ``gguf`` package:

``tokenizer``: a GGUF holding only the ``tokenizer.*`` keys of a source model
(no tensors; about 2 MB for SmolLM2's 49,152-token vocabulary), small enough to
carry to a machine without network in place of the 98 MB default model::

    python -m bench.gpu.make_model tokenizer --source MODEL.gguf --out tok.gguf

``model``: a llama-architecture GGUF of a named geometry (``GEOMETRIES``) whose
tokenizer, and so vocabulary size, is copied from such a file (through
``fixtures.tiny_gguf``'s tokenizer copy, byte for byte)::

    python -m bench.gpu.make_model model --tokenizer tok.gguf --out m.gguf [--geometry llama3-8b]
                                         [--type q4_k|q8_0|f16] [--layers N]

The matrices are stored in ``--type``: Q4_K (ggml's 256-weight super-blocks of
144 bytes: f16 ``d``, f16 ``dmin``, 12 bytes of packed 6-bit sub-block scales
and minima, 128 bytes of 4-bit quants), Q8_0 (32 weights in 34 bytes: f16
``d``, 32 int8) or F16; norms are F32 ones. Quant bytes are random; the
block scales are set so that a weight's standard deviation is about
``1/sqrt(n_in)`` (embeddings: about 1), which keeps activations, and so every
logprob, finite through the model. The text it produces is noise: only its
speed means anything. Tensors are streamed to disk one at a time (peak memory
is one tensor plus a 64 MiB pool of random bytes).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

#: Geometries under llama.cpp's GGUF key names (``llama.<key>``). ``llama3-8b``
#: is Meta-Llama-3-8B's (config.json: 32 layers, hidden 4096, 32 heads, 8 KV
#: heads, intermediate 14336, rope theta 500000, rms eps 1e-5, 8192 positions);
#: its 128,256-token vocabulary is replaced by the tokenizer's.
GEOMETRIES = {
    "llama3-8b": {
        "block_count": 32,
        "embedding_length": 4096,
        "feed_forward_length": 14336,
        "attention.head_count": 32,
        "attention.head_count_kv": 8,
        "context_length": 8192,
        "rope.dimension_count": 128,
        "rope.freq_base": 500000.0,
        "attention.layer_norm_rms_epsilon": 1e-5,
    },
    "tiny": {
        "block_count": 2,
        "embedding_length": 256,
        "feed_forward_length": 768,
        "attention.head_count": 4,
        "attention.head_count_kv": 2,
        "context_length": 8192,
        "rope.dimension_count": 64,
        "rope.freq_base": 10000.0,
        "attention.layer_norm_rms_epsilon": 1e-5,
    },
}

_POOL_BYTES = 64 << 20


def _std_per_unit(kind: str) -> float:
    """Standard deviation of a stored weight when the block scale is 1, for random quant bytes.

    Q4_K: a weight is ``d * sc * q - dmin * m`` (sc, m 6-bit, q 4-bit, all
    uniform here) with ``dmin = 7.5 d`` so the expected offset cancels; the
    variance is estimated once by Monte Carlo on the same distribution.
    Q8_0: ``d * q`` with q uniform int8 (std 73.9).
    """
    rng = np.random.default_rng(0)
    if kind == "q4_k":
        sc, m = rng.integers(0, 64, 1 << 20), rng.integers(0, 64, 1 << 20)
        q = rng.integers(0, 16, 1 << 20)
        return float(np.std(sc * q - 7.5 * m))
    if kind == "q8_0":
        return float(np.std(rng.integers(-128, 128, 1 << 20)))
    return 1.0


class RandomTensors:
    """Makes one tensor's bytes at a time from a pool of random bytes (``seed``).

    ``make(n_rows, n_in, std)`` returns a C-contiguous array: uint8 of shape
    ``(n_rows, bytes_per_row)`` for the quantized kinds, float16 ``(n_rows,
    n_in)`` for ``f16``. ``n_in`` must be a multiple of the block size (256 for
    Q4_K, 32 for Q8_0); ValueError otherwise.
    """

    BLOCK = {"q4_k": (256, 144), "q8_0": (32, 34), "f16": (1, 2)}  # noqa: RUF012  (a read-only table)

    def __init__(self, kind: str, seed: int = 20261130):
        if kind not in self.BLOCK:
            raise ValueError(f"--type must be one of {sorted(self.BLOCK)}, got {kind!r}")
        self.kind = kind
        self.rng = np.random.default_rng(seed)
        self.pool = self.rng.integers(0, 256, _POOL_BYTES, dtype=np.uint8)
        if kind == "f16":  # a pool of N(0, 1) halves instead of bytes
            self.pool = self.rng.standard_normal(_POOL_BYTES // 2, dtype=np.float32).astype(np.float16).view(np.uint8)
        self.unit = _std_per_unit(kind)

    def _bytes(self, n: int) -> np.ndarray:
        out = np.empty(n, dtype=np.uint8)
        done = 0
        while done < n:
            start = int(self.rng.integers(0, _POOL_BYTES // 2)) & ~1
            take = min(n - done, _POOL_BYTES - start)
            out[done : done + take] = self.pool[start : start + take]
            done += take
        return out

    def make(self, n_rows: int, n_in: int, std: float) -> np.ndarray:
        per_block, block_bytes = self.BLOCK[self.kind]
        if n_in % per_block:
            raise ValueError(f"n_in={n_in} is not a multiple of the {self.kind} block ({per_block})")
        n_blocks = n_rows * n_in // per_block
        raw = self._bytes(n_blocks * block_bytes)
        if self.kind == "f16":
            return (raw.view(np.float16) * np.float16(std)).reshape(n_rows, n_in)
        blocks = raw.reshape(n_blocks, block_bytes)
        d = np.float16(std / self.unit)
        blocks[:, 0:2] = np.frombuffer(d.tobytes(), dtype=np.uint8)
        if self.kind == "q4_k":
            blocks[:, 2:4] = np.frombuffer(np.float16(7.5 * float(d)).tobytes(), dtype=np.uint8)
        return blocks.reshape(n_rows, n_in // per_block * block_bytes)


def tensor_plan(hp: dict, n_vocab: int) -> list[tuple[str, int, int, float]]:
    """``(name, n_rows, n_in, std)`` of every matrix, in llama.cpp's usual order; norms are separate."""
    d, ff = hp["embedding_length"], hp["feed_forward_length"]
    hd = d // hp["attention.head_count"]
    n_kv = hp["attention.head_count_kv"] * hd
    plan = [("token_embd.weight", n_vocab, d, 1.0)]
    for i in range(hp["block_count"]):
        p = f"blk.{i}."
        plan += [
            (p + "attn_q.weight", d, d, d**-0.5),
            (p + "attn_k.weight", n_kv, d, d**-0.5),
            (p + "attn_v.weight", n_kv, d, d**-0.5),
            (p + "attn_output.weight", d, d, d**-0.5),
            (p + "ffn_gate.weight", ff, d, d**-0.5),
            (p + "ffn_up.weight", ff, d, d**-0.5),
            (p + "ffn_down.weight", d, ff, ff**-0.5),
        ]
    plan.append(("output.weight", n_vocab, d, d**-0.5))
    return plan


def write_tokenizer(source: Path, out: Path) -> Path:
    """Write a GGUF with only ``source``'s ``tokenizer.*`` keys (and its architecture) to ``out``.

    Raises FileNotFoundError when ``source`` is missing, KeyError when it has no
    ``tokenizer.ggml.tokens``.
    """
    import gguf

    from fixtures.gguf_read import GGUFFile
    from fixtures.tiny_gguf import _tokenizer_kv

    if not Path(source).is_file():
        raise FileNotFoundError(f"tokenizer source GGUF not found: {source}")
    src = GGUFFile(source)
    try:
        if src.get("tokenizer.ggml.tokens") is None:
            raise KeyError(f"{source}: no tokenizer.ggml.tokens")
        w = gguf.GGUFWriter(out, "llama")
        for key, value, vtype, sub in _tokenizer_kv(src):
            w.add_key_value(key, value, vtype, sub)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        w.close()
    finally:
        src.close()
    return out


def write_model(
    tokenizer: Path, out: Path, geometry: str = "llama3-8b", kind: str = "q4_k", layers: int | None = None
) -> Path:
    """Write the random-weight model to ``out``; returns ``out``.

    ``geometry``: a key of ``GEOMETRIES``; ``layers`` overrides its block
    count (a quick check of the full width on a CPU). Raises KeyError for an
    unknown geometry, ValueError for an unknown ``kind``.
    """
    import gguf

    from fixtures.gguf_read import GGUFFile
    from fixtures.tiny_gguf import _tokenizer_kv

    hp = dict(GEOMETRIES[geometry])
    if layers is not None:
        hp["block_count"] = layers
    src = GGUFFile(tokenizer)
    n_vocab = len(src.get("tokenizer.ggml.tokens"))
    qtype = {
        "q4_k": gguf.GGMLQuantizationType.Q4_K,
        "q8_0": gguf.GGMLQuantizationType.Q8_0,
        "f16": gguf.GGMLQuantizationType.F16,
    }[kind]
    ftype = {
        "q4_k": gguf.LlamaFileType.MOSTLY_Q4_K_M,
        "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
        "f16": gguf.LlamaFileType.MOSTLY_F16,
    }[kind]
    gen = RandomTensors(kind)
    w = gguf.GGUFWriter(out, "llama")
    w.add_name(f"random-{geometry}-{kind}")
    w.add_type("model")
    w.add_file_type(int(ftype))
    for key, value in hp.items():
        (w.add_float32 if isinstance(value, float) else w.add_uint32)(f"llama.{key}", value)
    w.add_uint32("llama.vocab_size", n_vocab)
    for key, value, vtype, sub in _tokenizer_kv(src):
        w.add_key_value(key, value, vtype, sub)
    src.close()

    d = hp["embedding_length"]
    plan = tensor_plan(hp, n_vocab)
    norms = [f"blk.{i}.{n}_norm.weight" for i in range(hp["block_count"]) for n in ("attn", "ffn")]
    norms.append("output_norm.weight")
    per_block, block_bytes = RandomTensors.BLOCK[kind]
    for name, rows, n_in, _ in plan:
        nbytes = rows * n_in // per_block * block_bytes
        shape = (rows, n_in // per_block * block_bytes) if kind != "f16" else (rows, n_in)
        w.add_tensor_info(
            name,
            shape,
            np.dtype(np.uint8 if kind != "f16" else np.float16),
            nbytes,
            raw_dtype=qtype if kind != "f16" else None,
        )
    for name in norms:
        w.add_tensor_info(name, (d,), np.dtype(np.float32), d * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, rows, n_in, std in plan:  # noqa: B007  (kept as written)
        w.write_tensor_data(gen.make(rows, n_in, std))
    ones = np.ones(d, dtype=np.float32)
    for _ in norms:
        w.write_tensor_data(ones)
    w.close()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="job", required=True)
    t = sub.add_parser("tokenizer", help="a tokenizer-only GGUF from a model")
    t.add_argument("--source", type=Path, help="source GGUF (default: the default model)")
    t.add_argument("--out", type=Path, required=True)
    m = sub.add_parser("model", help="a random-weight model")
    m.add_argument("--tokenizer", type=Path, required=True, help="GGUF whose tokenizer.* keys are copied")
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--geometry", choices=sorted(GEOMETRIES), default="llama3-8b")
    m.add_argument("--type", dest="kind", choices=sorted(RandomTensors.BLOCK), default="q4_k")
    m.add_argument("--layers", type=int, default=None, help="override the geometry's block count")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    if args.job == "tokenizer":
        source = args.source
        if source is None:
            from gateway.paths import default_model_path

            source = default_model_path()
        path = write_tokenizer(source, args.out)
    else:
        path = write_model(args.tokenizer, args.out, args.geometry, args.kind, args.layers)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB) in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
