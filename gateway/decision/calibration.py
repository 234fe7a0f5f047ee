"""Calibration by a fit: per question type, a monotone map of the probabilities that keeps the answer.

``serveproto calibrate`` (:mod:`gateway.cli.calibrate`) fits one map per
question type on labelled answers and writes a versioned file keyed by the
model file's sha256; ``serveproto serve`` applies it to the answers read
under the same ``x_debias`` (:meth:`Calibration.apply`), and every answer
says which map it got (``x_calibration``; ``"identity"`` when none).

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

Each slope is fitted by minimising the negative log-likelihood, which is
convex in the inverse temperature (and in each slope), by golden-section
search on a bracket (:func:`fit_inverse_temperature`). A noul gets
``two_slope`` only when it beats ``temperature`` on held-out data
(:func:`fit`).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import orjson

from gateway.decision import debias, evaluation
from gateway.decision.jsonfile import read_document

FORMAT = "serveproto-calibration"
VERSION = 1
IDENTITY = "identity"

#: The bracket of inverse temperatures (and slopes) searched: T from 0.02 to 50.
BETA_RANGE = (0.02, 50.0)

_EPS = 1e-12


def _clip(p: float) -> float:
    return min(max(p, _EPS), 1 - _EPS)


def temperature(p: Sequence[float], beta: float) -> list[float]:
    """``softmax(beta * ln p)``: temperature ``1 / beta``. Shape ``(n,)``; ``beta > 0``."""
    logs = [beta * math.log(max(x, _EPS)) for x in p]
    m = max(logs)
    e = [math.exp(x - m) for x in logs]
    z = math.fsum(e)
    return [x / z for x in e]


def two_slope(p: Sequence[float], a_yes: float, a_no: float) -> list[float]:
    """A noul's ``[p_no, p_yes]`` with its log-odds scaled by ``a_yes`` (yes answers) or ``a_no`` (no answers)."""
    z = math.log(_clip(p[1])) - math.log(_clip(p[0]))
    z2 = (a_yes if z >= 0 else a_no) * z
    yes = 1 / (1 + math.exp(-z2)) if z2 >= 0 else math.exp(z2) / (1 + math.exp(z2))
    return [1 - yes, yes]


def _golden(f, lo: float, hi: float, iters: int = 80) -> float:
    """The minimum of a convex ``f`` on ``[lo, hi]`` (golden-section search on ``ln beta``)."""
    a, b = math.log(lo), math.log(hi)
    g = (math.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(math.exp(c)), f(math.exp(d))
    for _ in range(iters):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(math.exp(c))
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(math.exp(d))
    return math.exp((a + b) / 2)


def fit_inverse_temperature(probs: Sequence[Sequence[float]], gold: Sequence[int]) -> float:
    """The ``beta`` in :data:`BETA_RANGE` minimising the mean NLL of :func:`temperature` (1.0 for no data)."""
    if not probs:
        return 1.0
    logs = [[math.log(max(x, _EPS)) for x in p] for p in probs]

    def nll(beta: float) -> float:
        total = 0.0
        for lp, g in zip(logs, gold):
            s = [beta * x for x in lp]
            m = max(s)
            total += m + math.log(math.fsum(math.exp(x - m) for x in s)) - s[g]
        return total / len(logs)

    return _golden(nll, *BETA_RANGE)


def fit_two_slope(probs: Sequence[Sequence[float]], gold: Sequence[int]) -> tuple[float, float]:
    """``(a_yes, a_no)`` for :func:`two_slope`: each side's slope fitted on the answers of that side."""
    sides: dict[bool, tuple[list, list]] = {True: ([], []), False: ([], [])}
    for p, g in zip(probs, gold):
        z = math.log(_clip(p[1])) - math.log(_clip(p[0]))
        sides[z >= 0][0].append(p)
        sides[z >= 0][1].append(g)
    return fit_inverse_temperature(*sides[True]), fit_inverse_temperature(*sides[False])


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


def _folds(groups: Sequence[str], k: int, seed: int) -> list[int]:
    """Fold of each answer: requests (``groups``) shuffled with ``seed`` and dealt into ``k`` folds."""
    names = sorted(set(groups))
    random.Random(seed).shuffle(names)
    fold_of = {g: i % k for i, g in enumerate(names)}
    return [fold_of[g] for g in groups]


def fit_type(qtype: str, probs: Sequence[Sequence[float]], gold: Sequence[int], kind: str) -> TypeMap:
    """Fit one map of ``kind`` on answers of one type (module doc)."""
    if kind == "two_slope":
        a_yes, a_no = fit_two_slope(probs, gold)
        return TypeMap("two_slope", {"a_yes": a_yes, "a_no": a_no})
    return TypeMap("temperature", {"beta": fit_inverse_temperature(probs, gold)})


def cross_validate(
    qtype: str,
    probs: Sequence[Sequence[float]],
    gold: Sequence[int],
    groups: Sequence[str],
    kind: str,
    k: int = 5,
    seed: int = 0,
) -> list[list[float]]:
    """Out-of-fold calibrated probabilities: each answer mapped by a fit on the folds without its request."""
    folds = _folds(groups, k, seed)
    out: list[list[float]] = [list(p) for p in probs]
    for f in range(k):
        train = [i for i, x in enumerate(folds) if x != f]
        test = [i for i, x in enumerate(folds) if x == f]
        if not test:
            continue
        m = fit_type(qtype, [probs[i] for i in train], [gold[i] for i in train], kind)
        for i in test:
            out[i] = m.apply(probs[i])
    return out


def report(probs: Sequence[Sequence[float]], gold: Sequence[int]) -> dict[str, float]:
    """ECE (10 equal-mass bins), Brier, NLL and accuracy of answers (:mod:`gateway.decision.evaluation`)."""
    conf, correct = evaluation.confidences(probs, gold)
    return {
        "ece": evaluation.ece(conf, correct),
        "brier": evaluation.brier(probs, gold),
        "nll": evaluation.nll(probs, gold),
        "accuracy": evaluation.accuracy(probs, gold),
        "n": len(probs),
    }


@attrs.frozen
class Fit:
    """The outcome of :func:`fit`: the maps by type, and held-out figures per type and overall.

    ``held_out[type or "all"] = {"before": report, "after": report}`` on
    out-of-fold answers; ``pooled``: (probabilities before, after, gold) of
    every answer, for the reliability diagram.
    """

    maps: dict[str, TypeMap]
    held_out: dict[str, dict[str, dict[str, float]]]
    pooled: tuple[list, list, list]
    folds: int


def fit(answers: Sequence[tuple[str, Sequence[float], int, str]], k: int = 5, seed: int = 0) -> Fit:
    """Fit every type's map on ``answers`` and measure it by ``k``-fold cross-validation.

    ``answers[j] = (question type, probabilities in reply order, gold index,
    request id)``; folds are by request, so a request's questions are never
    split between fitting and measuring. A noul takes ``two_slope`` only
    when its held-out NLL beats ``temperature``'s. Raises ``ValueError`` for
    fewer than ``k`` requests.
    """
    if len({a[3] for a in answers}) < k:
        raise ValueError(f"cross-validation over {k} folds needs at least {k} labelled requests")
    maps: dict[str, TypeMap] = {}
    held: dict[str, dict[str, dict[str, float]]] = {}
    before_all, after_all, gold_all = [], [], []
    for qtype in ("noul", "choice", "score"):
        rows = [a for a in answers if a[0] == qtype]
        if not rows:
            continue
        probs = [list(a[1]) for a in rows]
        gold = [a[2] for a in rows]
        groups = [a[3] for a in rows]
        kind = "temperature"
        oof = cross_validate(qtype, probs, gold, groups, kind, k, seed)
        if qtype == "noul":
            alt = cross_validate(qtype, probs, gold, groups, "two_slope", k, seed)
            if evaluation.nll(alt, gold) < evaluation.nll(oof, gold):
                kind, oof = "two_slope", alt
        maps[qtype] = fit_type(qtype, probs, gold, kind)
        held[qtype] = {"before": report(probs, gold), "after": report(oof, gold)}
        before_all += probs
        after_all += oof
        gold_all += gold
    held["all"] = {"before": report(before_all, gold_all), "after": report(after_all, gold_all)}
    return Fit(maps, held, (before_all, after_all, gold_all), k)


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


def _id(maps: dict[str, Any], sha: str, methods: Sequence[str]) -> str:
    body = orjson.dumps({"maps": maps, "model_sha256": sha, "x_debias": list(methods)}, option=orjson.OPT_SORT_KEYS)
    return "cal-" + hashlib.sha256(body).hexdigest()[:12]


def document(result: Fit, model_name: str, model_sha256: str, methods: Sequence[str], source: str) -> dict[str, Any]:
    """The calibration file's JSON (``format``, ``version``, ``id``, ``model``, ``x_debias``, ``maps``,
    and how it was fitted: ``data``, ``held_out`` figures, ``folds``)."""
    maps = {t: m.to_json() for t, m in result.maps.items()}
    return {
        "format": FORMAT,
        "version": VERSION,
        "id": _id(maps, model_sha256, methods),
        "model": {"name": model_name, "sha256": model_sha256},
        "x_debias": list(methods),
        "maps": maps,
        "data": source,
        "folds": result.folds,
        "held_out": result.held_out,
    }


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
        if names is None or qtype not in ("noul", "choice", "score"):
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
    if not _is_hex(sha, 64):
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


def default_path(model_sha256: str, cache: str | Path | None = None) -> Path:
    """Where ``calibrate`` writes and ``serve`` looks for a model's calibration:
    ``$SERVEPROTO_CACHE/calibration/<sha256>.json``."""
    from gateway.paths import cache_dir

    return Path(cache or cache_dir()) / "calibration" / f"{model_sha256}.json"


def reliability_text(probs: Sequence[Sequence[float]], gold: Sequence[int], n_bins: int = 10, width: int = 40) -> str:
    """A reliability diagram in text: per equal-mass bin (:func:`gateway.decision.evaluation.bins`), mean
    confidence, accuracy and a bar."""
    import numpy as np

    conf, correct = evaluation.confidences(probs, gold)
    b = evaluation.bins(conf, np.ones(len(conf)), n_bins)
    lines = ["confidence  accuracy  n     (| = confidence, # = accuracy)"]
    for k in range(n_bins):
        chunk = b == k
        if not chunk.any():
            continue
        c, a = float(conf[chunk].mean()), float(correct[chunk].mean())
        bar = [" "] * (width + 1)
        for x in range(int(round(a * width)) + 1):  # noqa: RUF046  (kept as written)
            bar[x] = "#"
        bar[int(round(c * width))] = "|"  # noqa: RUF046  (kept as written)
        lines.append(f"{c:10.3f}  {a:8.3f}  {int(chunk.sum()):<4}  {''.join(bar)}")
    return "\n".join(lines)


def reliability_png(before: tuple, after: tuple, path: str | Path, title: str, n_bins: int = 10) -> None:
    """A reliability diagram (matplotlib): accuracy against confidence per equal-mass bin, before and
    after, with the diagonal. ``before``/``after``: (probabilities, gold). Raises ``ImportError``
    without matplotlib (``pip install 'serveproto[calibrate]'``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(5, 5), dpi=100)
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="calibrated")
    for (probs, gold), label, marker in ((before, "before", "o"), (after, "after", "s")):
        conf, correct = evaluation.confidences(probs, gold)
        b = evaluation.bins(conf, np.ones(len(conf)), n_bins)
        xs, ys = [], []
        for k in range(n_bins):
            if (b == k).any():
                xs.append(float(conf[b == k].mean()))
                ys.append(float(correct[b == k].mean()))
        e = evaluation.ece(conf, correct, n_bins=n_bins)
        ax.plot(xs, ys, marker=marker, label=f"{label} (ECE {e:.3f})")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("confidence (top answer's probability)")
    ax.set_ylabel("accuracy")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
