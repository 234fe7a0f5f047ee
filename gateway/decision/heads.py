"""Trained heads: a question asked again and again answered by a linear map of the model's hidden state.

A *head* belongs to one question signature (:func:`signature`: the question's type,
instructions and options as sent, in reply order). It maps the hidden state of one
layer at the end of the question's prompt (SCORE's ``hidden``, spec 9.1), read under
the head's own ``x_debias`` (default none: the logprob reading's one prompt, whatever
the request's ``x_debias``), to a probability per option::

    z = (h - mean) / scale          standardized, per coordinate   (d,)
    p = softmax((W z + b) / T)      W (k, d), b (k,), T > 0        (k,)

fitted by ``serveproto heads fit`` (:mod:`gateway.lab.head_fit`: ridge
multinomial logistic regression, its strength cross-validated by request, then
the temperature ``T`` fitted on held-out folds). Serving needs only the dot
products below (plain Python: no numpy on the server's import path).

A heads file is JSON, ``$SERVEPROTO_CACHE/heads/<model sha256>.json``::

    {"format": "serveproto-heads-1", "model": {"name": str, "sha256": str},
     "heads": [{"name": str, "signature": str, "type": str, "instructions": str,
                "options": [str, ...], "x_debias": [str, ...], "layer": int,
                "mean": [d floats], "scale": [d floats], "W": [[d floats] x k],
                "b": [k floats], "T": float, "fit": {...}}, ...]}
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import orjson

from gateway.decision.jsonfile import read_document

__all__ = [
    "FORMAT",
    "Head",
    "HeadSet",
    "signature",
    "options_of",
    "default_path",
    "load",
    "load_document",
    "printable",
]

FORMAT = "serveproto-heads-1"
#: A heads file larger than this is refused (a head of 576 dimensions and 12 options is ~0.2 MB of JSON).
MAX_FILE_BYTES = 256 << 20
#: The temperatures a head may have: ``heads fit`` searches exp(-3) to exp(3) (0.05 to 20); far outside,
#: a head is not fitted but broken (T = 1e-300 made every answer a certainty).
T_RANGE = (0.04, 25.0)
#: The largest magnitude of a head's ``mean``, ``W`` and ``b`` values, and the range of ``scale`` (from
#: ``heads fit``'s floor): within them the logits of any finite float32 hidden state are finite (at most
#: about 1e57), so a matching question never overflows into a 500.
VALUE_MAX = 1e6
SCALE_RANGE = (1e-6, 1e6)


def printable(text: str) -> str:
    """``text`` for a log line: control and other unprintable characters (a newline, an ANSI escape)
    written as Python escapes (``\\n``, ``\\x1b``), so that a name read from a file cannot forge or
    colour a line of the server's log."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def options_of(question: Any) -> list[str]:
    """The options of a Jev question in reply order: a noul's ``["no", "yes"]``, a choice's labels
    with their descriptions (``label: description``), a score's levels (``i: text``)."""
    if question.type == "noul":
        return ["no", "yes"]
    crit = question.criteria
    if isinstance(crit, dict):
        return [k if not v else f"{k}: {v}" for k, v in crit.items()]
    return [f"{i}: {v}" for i, v in enumerate(crit)]


def signature(question: Any) -> str:
    """The head key of a question: sha256 (16 hex digits) of its type, instructions and options
    (:func:`options_of`)."""
    body = orjson.dumps([question.type, question.instructions or "", options_of(question)])
    return hashlib.sha256(body).hexdigest()[:16]


def _softmax(z: Sequence[float]) -> list[float]:
    m = max(z)
    e = [math.exp(v - m) for v in z]
    s = sum(e)
    return [v / s for v in e]


@attrs.frozen
class Head:
    """One fitted head (module doc): ``predict(h)`` of a ``(d,)`` hidden state is ``(k,)``."""

    name: str
    signature: str
    layer: int
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    W: tuple[tuple[float, ...], ...]
    b: tuple[float, ...]
    T: float = 1.0
    methods: tuple[str, ...] = ()  # the x_debias its prompt is read under

    def predict(self, h: Sequence[float]) -> list[float]:
        """Probabilities in reply order from the hidden state ``h`` (``(d,)``; ValueError for another size)."""
        if len(h) != len(self.mean):
            raise ValueError(f"head {self.name}: a hidden state of {len(h)} values, the head reads {len(self.mean)}")
        z = [(x - m) / s for x, m, s in zip(h, self.mean, self.scale)]
        logits = [(sum(w * v for w, v in zip(row, z)) + bias) / self.T for row, bias in zip(self.W, self.b)]
        return _softmax(logits)


@attrs.frozen
class HeadSet:
    """The heads of one model by signature; ``match(question)``: its head or None."""

    model_sha256: str
    heads: dict[str, Head]

    @property
    def names(self) -> list[str]:
        """Each head's name, in the file's order."""
        return [h.name for h in self.heads.values()]

    def match(self, question: Any) -> Head | None:
        """The head of ``question`` (its :func:`signature`), or None."""
        h = self.heads.get(signature(question))
        if h is not None and len(h.b) != question.n_options:
            return None
        return h


def default_path(model_sha256: str, cache: str | Path | None = None) -> Path:
    """Where ``heads fit`` writes and ``serve`` looks: ``$SERVEPROTO_CACHE/heads/<sha256>.json``."""
    from gateway.paths import cache_dir

    return Path(cache or cache_dir()) / "heads" / f"{model_sha256}.json"


def _floats(doc: Any, where: str, lo: float = -VALUE_MAX, hi: float = VALUE_MAX) -> tuple[float, ...]:
    if not isinstance(doc, list) or not doc or not all(isinstance(v, (int, float)) for v in doc):
        raise ValueError(f"{where}: expected a non-empty list of numbers")
    out = tuple(float(v) for v in doc)
    if not all(math.isfinite(v) for v in out):
        raise ValueError(f"{where}: expected finite numbers")
    for i, v in enumerate(out):
        if not lo <= v <= hi:
            raise ValueError(f"{where}[{i}]: expected a number from {lo:g} to {hi:g}, got {v!r}")
    return out


def load_document(doc: Any, where: str, hidden: tuple[int, int] | None = None) -> HeadSet:
    """A :class:`HeadSet` from a parsed heads file; ValueError naming the field.

    ``hidden``: the serving engine's ``(x_hidden, x_hidden_dim)`` (CAPS: the layers SCORE's ``hidden``
    reads and the values of one hidden state), when known: each head must read a layer the model has
    and a hidden state of its size, else it would answer every matching question with an error.
    """
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{where}: format: expected {FORMAT!r}")
    model = doc.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("sha256"), str):
        raise ValueError(f"{where}: model.sha256: expected a string")
    heads: dict[str, Head] = {}
    items = doc.get("heads")
    if not isinstance(items, list):
        raise ValueError(f"{where}: heads: expected a list")
    for i, h in enumerate(items):
        at = f"{where}: heads[{i}]"
        if not isinstance(h, dict):
            raise ValueError(f"{at}: expected an object")
        for key in ("name", "signature"):
            if not isinstance(h.get(key), str):
                raise ValueError(f"{at}.{key}: expected a string")
        layer = h.get("layer")
        if not isinstance(layer, int) or isinstance(layer, bool) or layer < 0:
            raise ValueError(f"{at}.layer: expected a layer number")
        if hidden is not None and layer >= hidden[0]:
            raise ValueError(
                f"{at}.layer: {layer}, the served model has layers 0 to {hidden[0] - 1} (CAPS x_hidden={hidden[0]})"
            )
        mean, scale = _floats(h.get("mean"), f"{at}.mean"), _floats(h.get("scale"), f"{at}.scale", *SCALE_RANGE)
        rows = h.get("W")
        if not isinstance(rows, list) or len(rows) < 2:
            raise ValueError(f"{at}.W: expected one row per option (2 or more)")
        W = tuple(_floats(r, f"{at}.W[{j}]") for j, r in enumerate(rows))
        b = _floats(h.get("b"), f"{at}.b")
        T = h.get("T", 1.0)
        if not isinstance(T, (int, float)) or not T > 0:
            raise ValueError(f"{at}.T: expected a positive number")
        if not T_RANGE[0] <= T <= T_RANGE[1]:
            raise ValueError(
                f"{at}.T: expected a number from {T_RANGE[0]:g} to {T_RANGE[1]:g} (heads fit fits it from 0.05 to 20), "
                f"got {T!r}"
            )
        methods = h.get("x_debias", [])
        if not isinstance(methods, list) or not all(isinstance(m, str) for m in methods):
            raise ValueError(f"{at}.x_debias: expected a list of method names")
        d = len(mean)
        if len(scale) != d or any(len(r) != d for r in W) or len(b) != len(W) or min(scale) <= 0:
            raise ValueError(f"{at}: mean, scale and each W row have one value per dimension, b one per option")
        if hidden is not None and d != hidden[1]:
            raise ValueError(
                f"{at}.mean: {d} values, the served model's hidden state has {hidden[1]} (CAPS x_hidden_dim)"
            )
        heads[h["signature"]] = Head(h["name"], h["signature"], layer, mean, scale, W, b, float(T), tuple(methods))
    return HeadSet(model["sha256"], heads)


def load(path: str | Path, hidden: tuple[int, int] | None = None) -> HeadSet:
    """Read a heads file (module doc), checked against ``hidden`` (:func:`load_document`); ValueError
    naming the file and field."""
    return load_document(read_document(path, MAX_FILE_BYTES, "heads"), str(path), hidden)
