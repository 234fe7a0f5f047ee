"""Calibration by a fit, as served: per question type, a monotone map of the probabilities that keeps
the answer, read from its file and applied.

``serveproto calibrate`` (:mod:`gateway.cli.calibrate`; the fitting is the lab's,
:mod:`gateway.lab.calibration_fit`) fits one map per question type on labelled answers
and writes a versioned file keyed by the model file's sha256; ``serveproto serve``
loads it (:func:`load`) and applies it to the answers read under the same ``x_debias``
(:meth:`Calibration.apply`), and every answer says which map it got
(``x_calibration``; ``"identity"`` when none). Plain Python floats, no numpy.

The maps (each never changes which option is most likely):

``temperature`` (choice, score, and a noul's fallback)
    ``p'_i ∝ p_i^(1/T)``: temperature scaling of the log-probabilities
    (Guo et al. 2017, "On Calibration of Modern Neural Networks", ICML,
    sec. 4.2). ``T > 1`` softens over-confident answers.
``two_slope`` (noul)
    Platt scaling of the yes log-odds ``z = ln(p_yes / p_no)``,
    ``z' = a z + b`` (Platt 1999), with the intercept replaced by a second
    slope so that the sign of ``z``, the answer, is kept: ``z' = a_yes z``
    for ``z >= 0`` and ``a_no z`` for ``z < 0``. It can shrink the
    confidence of yes answers more than no answers (the default model's
    nouls lean to yes) without moving the 0.5 threshold. A free intercept
    would change answers, which a calibration here must not.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import orjson

from gateway.decision import debias
from gateway.decision.jsonfile import read_document

FORMAT = "serveproto-calibration"
VERSION = 1
IDENTITY = "identity"

#: The bracket of inverse temperatures (and slopes) searched: T from 0.02 to 50.
BETA_RANGE = (0.02, 50.0)

#: The smallest probability a map reads (a logged 0 is read as this, so its log stays finite).
EPS = 1e-12


def clip(p: float) -> float:
    """``p`` clipped to ``[EPS, 1 - EPS]``."""
    return min(max(p, EPS), 1 - EPS)


def temperature(p: Sequence[float], beta: float) -> list[float]:
    """``softmax(beta * ln p)``: temperature ``1 / beta``. Shape ``(n,)``; ``beta > 0``."""
    logs = [beta * math.log(max(x, EPS)) for x in p]
    m = max(logs)
    e = [math.exp(x - m) for x in logs]
    z = math.fsum(e)
    return [x / z for x in e]


def two_slope(p: Sequence[float], a_yes: float, a_no: float) -> list[float]:
    """A noul's ``[p_no, p_yes]`` with its log-odds scaled by ``a_yes`` (yes answers) or ``a_no`` (no answers)."""
    z = math.log(clip(p[1])) - math.log(clip(p[0]))
    z2 = (a_yes if z >= 0 else a_no) * z
    yes = 1 / (1 + math.exp(-z2)) if z2 >= 0 else math.exp(z2) / (1 + math.exp(z2))
    return [1 - yes, yes]


@attrs.frozen
class TypeMap:
    """One question type's map: ``kind`` (``"temperature"`` or ``"two_slope"``) and its parameters
    (``beta``; ``a_yes``, ``a_no``)."""

    kind: str
    params: dict[str, float]

    def apply(self, p: Sequence[float]) -> list[float]:
        """The calibrated probabilities, shape ``(n,)``; the argmax is kept."""
        if self.kind == "temperature":
            return temperature(p, self.params["beta"])
        if self.kind == "two_slope":
            return two_slope(p, self.params["a_yes"], self.params["a_no"])
        raise ValueError(f"unknown calibration kind {self.kind!r}")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.params}


# --- the file ------------------------------------------------------------------------------

#: sha256_file's results by (resolved path, size, mtime in ns).
_SHA256: dict[tuple[str, int, int], str] = {}


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """The hex sha256 of a file (the model's key). Remembered while the file's path, size and mtime
    stay the same, so that a server reads a multi-GB model once however many of its parts ask
    (the calibration lookup, the decision log). Raises ``OSError`` as reading does."""
    st = Path(path).stat()
    key = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns)
    if key not in _SHA256:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while b := f.read(chunk):
                h.update(b)
        _SHA256[key] = h.hexdigest()
    return _SHA256[key]


@attrs.frozen
class Calibration:
    """A loaded calibration file: the maps by type, the model's sha256 it was fitted for, the
    ``x_debias`` methods its scores were read under, and its ``id`` (``cal-`` and 12 hex digits of
    the sha256 of its maps, model and methods), which answers carry in ``x_calibration``."""

    maps: dict[str, TypeMap]
    model_sha256: str
    debias: tuple[str, ...]
    id: str
    document: dict[str, Any]

    def applies(self, methods: Sequence[str]) -> bool:
        """Whether answers read under ``methods`` are the ones this file was fitted on."""
        return tuple(methods) == self.debias

    def apply(self, qtype: str, p: Sequence[float], methods: Sequence[str]) -> tuple[list[float], str]:
        """``(probabilities, x_calibration)``: mapped when the file covers this type and ``methods``,
        else unchanged and ``"identity"``."""
        m = self.maps.get(qtype)
        if m is None or not self.applies(methods) or len(p) < 2:
            return list(p), IDENTITY
        return m.apply(p), f"{self.id}:{m.kind}"


def file_id(maps: dict[str, Any], sha: str, methods: Sequence[str]) -> str:
    """A calibration file's ``id``: ``cal-`` and 12 hex digits of the sha256 of its maps (as
    :meth:`TypeMap.to_json` writes them), model sha256 and ``x_debias`` methods."""
    body = orjson.dumps({"maps": maps, "model_sha256": sha, "x_debias": list(methods)}, option=orjson.OPT_SORT_KEYS)
    return "cal-" + hashlib.sha256(body).hexdigest()[:12]


#: The largest calibration file read, in bytes (``calibrate`` writes about 3 KiB).
MAX_FILE_BYTES = 1 << 20

#: Each map kind's parameters; each must lie in :data:`BETA_RANGE`, where ``calibrate`` fits them.
PARAMS = {"temperature": ("beta",), "two_slope": ("a_yes", "a_no")}

_HEX = frozenset("0123456789abcdef")


def load(path: str | Path) -> Calibration:
    """Read a calibration file. Raises ``ValueError`` naming the file and the field for anything
    :func:`load_document` refuses, a file over :data:`MAX_FILE_BYTES` or not JSON; ``OSError``
    as reading does."""
    return load_document(read_document(path, MAX_FILE_BYTES, "calibration"), str(path))


def _is_hex(text: Any, n: int) -> bool:
    return isinstance(text, str) and len(text) == n and set(text) <= _HEX


def load_document(doc: Any, path: str = "calibration") -> Calibration:
    """A calibration from its decoded JSON (:func:`document`); errors as :func:`load`, naming ``path``.

    Checked: ``format`` and ``version``; ``maps`` an object keyed by question type, each map a
    known ``kind`` with its :data:`PARAMS` numbers in :data:`BETA_RANGE` (a slope of 1e308 would
    make every answer a certainty); ``model.sha256`` 64 hex digits; ``x_debias`` as a request's
    (:func:`gateway.decision.debias.parse`: a list of methods or the flag's comma-separated
    string, kept in its canonical order); ``id`` ``cal-`` and 12 hex digits. The rest
    (``data``, ``folds``, ``held_out``) is how it was fitted and is not read.
    """
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{path}: not a {FORMAT} file")
    if doc.get("version") != VERSION:
        raise ValueError(f"{path}: calibration version {doc.get('version')!r}, this server reads {VERSION}")
    raw_maps = doc.get("maps", {})
    if not isinstance(raw_maps, dict):
        raise ValueError(f"{path}: maps: expected an object keyed by question type (noul, choice, score)")
    lo, hi = BETA_RANGE
    maps = {}
    for qtype, m in raw_maps.items():
        kind = m.get("kind") if isinstance(m, dict) else None
        names = PARAMS.get(kind) if isinstance(kind, str) else None
        if names is None or not isinstance(kind, str) or qtype not in ("noul", "choice", "score"):
            raise ValueError(f"{path}: maps.{qtype}: unknown map {kind!r}")
        for n in names:
            v = m.get(n)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
                raise ValueError(
                    f"{path}: maps.{qtype}.{n}: expected a number from {lo:g} to {hi:g} "
                    f"(where calibrate fits it), got {v!r}"
                )
        maps[qtype] = TypeMap(kind, {n: float(m[n]) for n in names})
    model = doc.get("model")
    sha = model.get("sha256") if isinstance(model, dict) else None
    if not isinstance(sha, str) or not _is_hex(sha, 64):
        raise ValueError(f"{path}: model.sha256: expected the model file's sha256, 64 lowercase hex digits")
    if "x_debias" not in doc:
        raise ValueError(f"{path}: x_debias: missing (the methods its scores were read under; [] for none)")
    try:
        methods = debias.parse(doc["x_debias"])
    except ValueError as exc:
        raise ValueError(f"{path}: x_debias: {exc}") from None
    ident = doc.get("id")
    if not (isinstance(ident, str) and ident.startswith("cal-") and _is_hex(ident[4:], 12)):
        raise ValueError(f"{path}: id: expected 'cal-' and 12 lowercase hex digits, as calibrate writes it")
    return Calibration(maps, sha, methods, ident, doc)


#: The calibrations shipped with the package (issue 48, item 5): ``<model sha256>.json``, as ``calibrate``
#: writes them; ``serve`` loads one when the cache holds none for the model (the default model's,
#: fitted on the generated evaluation set of seed 48: ``bench/results/NOTEBOOK.md``, "A calibration shipped").
SHIPPED = Path(__file__).resolve().parent / "calibrations"


def shipped_path(model_sha256: str) -> Path:
    """Where the package keeps its own calibration of a model: ``gateway/decision/calibrations/<sha256>.json``."""
    return SHIPPED / f"{model_sha256}.json"


def default_path(model_sha256: str, cache: str | Path | None = None) -> Path:
    """Where ``calibrate`` writes and ``serve`` looks for a model's calibration:
    ``$SERVEPROTO_CACHE/calibration/<sha256>.json``."""
    from gateway.paths import cache_dir

    return Path(cache or cache_dir()) / "calibration" / f"{model_sha256}.json"
