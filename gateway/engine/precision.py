"""``serve --precision f32|f16|bf16``: the model transcoded once by llama.cpp's own quantizer, then reused.

On a quantized GGUF, ggml rounds activations to Q8 before each quantized matmul, so
the served logprobs sit about 0.15 nats on average from the model's exact ones
(reproducible under the engine's invariant numerics, but not exact; ``bench/results/NOTEBOOK.md``,
"Exactness"). On an F32
transcode of the same weights (every 2-D tensor dequantized by ggml's own
``to_float``, ``engines/bin/serveproto-quantize``) they match the float64 oracle
(``fixtures/oracle.py``) to 1e-4, for about 5.5 times the file size (92 MiB -> 515
MiB for the default model).

On a GPU the reason is speed, not exactness: ggml-cuda multiplies F16 and BF16 weights with
cuBLAS on the tensor cores, and on an H200 llama.cpp's own prefill of a random Llama-3-8B runs
2.3x faster in F16 than in Q4_K (bench/results/NOTEBOOK.md, "The ceiling"). ``f16`` and ``bf16`` round the
dequantized weights to 16 bits (1-D tensors stay F32); the logprobs then move by that rounding.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from gateway.engine.build import EngineBuildError, ensure_engine
from gateway.paths import cache_dir

#: ``--precision`` values: the GGUF's own tensor types, or every matrix in F32, F16 or BF16.
PRECISIONS = ("native", "f32", "f16", "bf16")
#: GGML type ids of the transcodes' matrices (ggml.h: GGML_TYPE_F32, F16, BF16).
_TYPE_IDS = {"f32": 0, "f16": 1, "bf16": 30}
#: Metadata key of the transcode naming its source (``source_fingerprint``): a file
#: of the same name whose source changed is transcoded again.
SOURCE_KEY = "serveproto.transcode.source"
#: Bytes hashed at each end of the source for its fingerprint.
_EDGE = 1 << 20


class TranscodeError(RuntimeError):
    """The transcode could not be made (tool missing, llama.cpp refused the file, disk full);
    the message says what happened and carries the end of the tool's stderr."""


def parse_precision(text: str) -> str:
    """``text`` when it is one of :data:`PRECISIONS`, else ``ValueError`` naming the choices and what each means."""
    if text in PRECISIONS:
        return text
    raise ValueError(
        f"{text!r} is not a precision: native (the GGUF's own weight types, the default), "
        "f32 (the GGUF transcoded once to F32 with llama.cpp's quantizer: logprobs within "
        "1e-4 of the float64 oracle, about 5.5 times the file size), "
        "f16 or bf16 (transcoded to 16-bit matrices: the fast weights on a GPU)"
    )


def transcode_path(source: str | Path, kind: str = "f32") -> Path:
    """Where the ``kind`` transcode of ``source`` lives: ``$SERVEPROTO_CACHE/models/<stem>.<kind>.gguf``."""
    return cache_dir() / "models" / f"{Path(source).stem}.{kind}.gguf"


def f32_path(source: str | Path) -> Path:
    """:func:`transcode_path` of the F32 transcode."""
    return transcode_path(source, "f32")


def source_fingerprint(source: str | Path) -> str:
    """``"size=<bytes> sha256_ends=<16 hex>"``: the size of ``source`` and a hash of its first and
    last MiB (its metadata, the first and last tensors), cheap on a file of many GB. A cache key,
    not a checksum: it misses an edit in the middle that keeps the size. Raises ``OSError``."""
    p = Path(source)
    size = p.stat().st_size
    digest = hashlib.sha256()
    with open(p, "rb") as f:
        digest.update(f.read(_EDGE))
        f.seek(max(0, size - _EDGE))
        digest.update(f.read(_EDGE))
    return f"size={size} sha256_ends={digest.hexdigest()[:16]}"


def _all_of(path: Path, kind: str, want_source: str | None = None) -> bool:
    """True when ``path`` is a readable GGUF of ``kind`` (f32: every tensor F32; f16, bf16: every
    tensor F32 or that type, and some of that type) and, when ``want_source`` is given, whose
    :data:`SOURCE_KEY` equals it."""
    return _not_of(path, kind, want_source) is None


def _not_of(path: Path, kind: str, want_source: str | None = None) -> str | None:
    """Why ``path`` is not :func:`_all_of` (``"missing"``, unreadable, another source, ...), or None when it is.
    Never raises: a torn or garbage file makes the GGUF reader raise nearly anything (``IndexError``
    on a truncated header), and a file found in the cache must not stop the server."""
    from gguf import GGUFReader

    if not path.exists():
        return "missing"
    try:
        reader = GGUFReader(path)
        if want_source is not None:
            field = reader.get_field(SOURCE_KEY)
            if field is None or field.contents() != want_source:
                return f"transcoded from another file ({SOURCE_KEY} is not {want_source!r})"
        if not reader.tensors:
            return "no tensors"
        want = _TYPE_IDS[kind]
        types = {int(t.tensor_type): t.tensor_type.name for t in reader.tensors}
    except Exception as exc:  # any: see the docstring
        return f"not a readable GGUF ({type(exc).__name__}: {exc})"
    other = sorted(name for tid, name in types.items() if tid not in (want, _TYPE_IDS["f32"]))
    if other:
        return f"tensors of type {', '.join(other)}"
    return None if want in types else f"no tensor of type {kind.upper()}"


def ensure_f32(
    source: str | Path, *, threads: int | None = None, quiet: bool = False, tool: str | Path | None = None
) -> Path:
    """:func:`ensure_transcode` to F32."""
    return ensure_transcode(source, "f32", threads=threads, quiet=quiet, tool=tool)


def ensure_transcode(
    source: str | Path,
    kind: str,
    *,
    threads: int | None = None,
    quiet: bool = False,
    tool: str | Path | None = None,
) -> Path:
    """The path of a GGUF with ``source``'s weights in ``kind`` (``f32``, ``f16`` or ``bf16``: see
    :func:`_all_of`), transcoding it on the first call.

    A ``source`` already of that kind is returned as it is. Otherwise :func:`transcode_path` is
    reused when it holds a transcode of this source (its :data:`SOURCE_KEY` equals
    :func:`source_fingerprint`); else ``tool`` (default ``engines/bin/serveproto-quantize``,
    ``llama_model_quantize`` with ``LLAMA_FTYPE_ALL_F32``, ``MOSTLY_F16`` or ``MOSTLY_BF16``) writes
    it under a temporary name in the same folder, it is checked (its tensor types, the fingerprint
    present) and renamed into place, so a reader never sees half a file and two servers racing both
    end with a whole one.
    Progress goes to stderr unless ``quiet``: one line before, the tool's quarter lines, one after.
    ``threads``: the tool's threads (default: llama.cpp's, all cores).

    Raises ``FileNotFoundError`` for a missing ``source`` and ``TranscodeError`` when the tool is
    not built or fails (the temporary file is removed).
    """
    if kind not in _TYPE_IDS:
        raise ValueError(f"kind must be one of {sorted(_TYPE_IDS)}, got {kind!r}")
    src = Path(source)
    if not src.is_file():
        raise FileNotFoundError(f"model {src} not found")
    if _all_of(src, kind):
        return src
    fingerprint = source_fingerprint(src)
    target = transcode_path(src, kind)
    label, name = f"serveproto: precision {kind}", kind.upper()
    say: Callable[[str], None] = (lambda msg: None) if quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    why = _not_of(target, kind, fingerprint)
    if why is None:
        say(f"{label}: reusing {target}")
        return target
    if why != "missing":  # found in the cache but unusable: said, then made again
        print(f"{label}: not reusing {target}: {why}; transcoding again", file=sys.stderr, flush=True)
    if tool is None:
        try:
            tool = ensure_engine("serveproto-quantize")  # built on first use outside a clone
        except EngineBuildError as exc:
            raise TranscodeError(str(exc)) from None
    tool = Path(tool)
    if not os.access(tool, os.X_OK):
        raise TranscodeError(f"{tool} is not built (run `make engines`)")
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(f"{target.name}.{os.getpid()}.part")
    argv = [str(tool), "--type", kind, "--tag", f"{SOURCE_KEY}={fingerprint}", str(src), str(part)]
    if threads is not None:
        argv[1:1] = ["--threads", str(threads)]
    say(f"{label}: transcoding {src.name} to {name} with llama.cpp's quantizer, once, into {target}")
    t0 = time.monotonic()
    tail: list[str] = []
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
        )
        with proc:
            assert proc.stderr is not None  # stderr=PIPE
            for line in proc.stderr:
                tail = (tail + [line.rstrip("\n")])[-20:]
                if line.startswith(f"serveproto-quantize: {name}:"):
                    say(line.rstrip("\n"))
        if proc.returncode != 0:
            raise TranscodeError(f"{tool.name} {src} failed (exit {proc.returncode}):\n" + "\n".join(tail))
        if not _all_of(part, kind, fingerprint):
            what = {"f32": "an all-F32", "f16": "an F16", "bf16": "a BF16"}[kind]
            raise TranscodeError(f"{tool.name} wrote {part}, which is not {what} GGUF of {src}")
        os.chmod(part, 0o644)
        os.replace(part, target)
    finally:
        part.unlink(missing_ok=True)
    say(f"{label}: wrote {target} ({target.stat().st_size / (1 << 20):.0f} MiB, {time.monotonic() - t0:.1f} s)")
    return target
