"""The events: one immutable attrs class per frame kind of the serve protocol.

Each event is validated when it is built: a bad field raises
``LocalProtocolError`` (code ``BAD_FRAME``) naming the class and the field.
Units: token counts and positions are tokens, payload sizes bytes, logprobs
natural-log probabilities (log-softmax over the whole vocabulary), ``rss_gb``
gigabytes, ``tok_s`` tokens per second. Field meanings follow
``spec/serve-protocol.md``; the section is cited on each class.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs

from . import _grammar as g
from ._errors import LocalProtocolError

__all__ = [
    "Event",
    "Ready",
    "Caps",
    "Stat",
    "LoadFail",
    "Telemetry",
    "Submit",
    "Image",
    "Stop",
    "Cancel",
    "Decide",
    "Score",
    "Ping",
    "Accept",
    "Echo",
    "Data",
    "Decision",
    "Done",
    "Error",
    "Scored",
    "Hidden",
    "Pong",
    "ConnectionClosed",
]

_U64 = g.UINT_LIMIT
_isfinite = math.isfinite
_set = object.__setattr__


def _bad(obj: object, field: str, msg: str, request_id: int = 0) -> LocalProtocolError:
    return LocalProtocolError(f"{type(obj).__name__}.{field}: {msg}", "BAD_FRAME", request_id)


def _uint(obj: object, field: str, v: Any, lo: int = 0, hi: int = _U64 - 1, rid: int = 0) -> None:
    if type(v) is not int or not lo <= v <= hi:
        raise _bad(obj, field, f"must be an int in [{lo}, {hi}], got {v!r}", rid)


def _id(obj: object, v: Any) -> None:
    if type(v) is not int or not 0 < v < _U64:
        raise _bad(obj, "id", f"must be an int in [1, 2**64-1], got {v!r}")


def _float(obj: object, field: str, v: Any, rid: int) -> float:
    """Return ``v`` as a float (ints are accepted); refuse anything else."""
    if type(v) is float:
        return v
    if type(v) is int:
        return float(v)
    raise _bad(obj, field, f"must be a float, got {v!r}", rid)


def _bytes(obj: object, field: str, v: Any, rid: int) -> bytes:
    if type(v) is bytes:
        return v
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    raise _bad(obj, field, f"must be bytes, got {type(v).__name__}", rid)


def _bool(obj: object, field: str, v: Any, rid: int) -> None:
    if type(v) is not bool:
        raise _bad(obj, field, f"must be a bool, got {v!r}", rid)


def _text(obj: object, field: str, v: Any, rid: int, word: bool = False) -> None:
    if type(v) is not str:
        raise _bad(obj, field, f"must be a str, got {type(v).__name__}", rid)
    if (g.WORD_RE if word else g.TEXT_RE).fullmatch(v) is None:
        what = "non-empty, without spaces or newlines" if word else "without newlines"
        raise _bad(obj, field, f"must be {what}, got {v!r}", rid)


def _top(obj: object, v: Any, rid: int) -> tuple[tuple[int, float], ...]:
    """Validate ``top``: (token_id, finite logprob) pairs; return it as tuples."""
    out = []
    try:
        for tid, lp in v:
            if type(tid) is not int or not 0 <= tid < _U64:
                raise _bad(obj, "top", f"token id must be a uint, got {tid!r}", rid)
            if type(lp) is not float:
                lp = _float(obj, "top", lp, rid)
            if not _isfinite(lp):
                raise _bad(obj, "top", f"logprob must be finite, got {lp!r}", rid)
            out.append((tid, lp))
    except (TypeError, ValueError):
        raise _bad(obj, "top", f"must be (token_id, logprob) pairs, got {v!r}", rid) from None
    return tuple(out)


def _pairs(obj: object, field: str, v: Any, rid: int) -> dict[str, str]:
    """Validate a ``key=value`` mapping (CAPS, PONG); return a plain dict copy."""
    if not isinstance(v, Mapping):
        raise _bad(obj, field, f"must be a mapping of str to str, got {type(v).__name__}", rid)
    out = {}
    for k, val in v.items():
        if type(k) is not str or not k.isascii() or g.KEY_RE.fullmatch(k.encode()) is None:
            raise _bad(obj, field, f"key must match [a-z_][a-z0-9_]*, got {k!r}", rid)
        _text(obj, f"{field}[{k!r}]", val, rid, word=True)
        out[k] = val
    return out


@attrs.frozen
class Event:
    """Base class of every serve protocol event (frozen, slotted, compared by value)."""


# --- handshake, engine to gateway (section 3) -----------------------------------------


@attrs.frozen
class Ready(Event):
    """The ``\\x01\\x01READY\\x01\\x01`` line: the engine loaded its model (section 3)."""


@attrs.frozen
class Caps(Event):
    """``CAPS key=value ...``: what the engine serves (section 3, "CAPS keys").

    ``values`` maps each key to its text value, in line order; unknown keys are
    kept. Known keys are checked: ``chat decide vision x_score x_score_base x_counters
    x_health`` are ``"0"``/``"1"``, ``slots n_ctx n_vocab pin_slots
    max_logprobs x_hidden x_hidden_dim`` are uints. The typed properties apply the spec's defaults
    for absent keys.

    Raises LocalProtocolError naming the key for a bad key or value.
    """

    values: dict[str, str] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        vals = _pairs(self, "values", self.values, 0)
        for k, v in vals.items():
            if k in g.CAPS_BOOL_KEYS and v not in ("0", "1"):
                raise _bad(self, f"values[{k!r}]", f"must be '0' or '1', got {v!r}")
            if k in g.CAPS_UINT_KEYS and (not v.isascii() or g.UINT_RE.fullmatch(v.encode()) is None):
                raise _bad(self, f"values[{k!r}]", f"must be a uint, got {v!r}")
        _set(self, "values", vals)

    def _flag(self, key: str) -> bool:
        v = self.values.get(key)
        return g.CAPS_BOOL_KEYS[key] if v is None else v == "1"

    def _int(self, key: str, default: int) -> int:
        v = self.values.get(key)
        return default if v is None else int(v)

    def _opt_int(self, key: str) -> int | None:
        v = self.values.get(key)
        return None if v is None else int(v)

    @property
    def chat(self) -> bool:
        """True unless ``chat=0`` (a decision-only engine answers SUBMIT with NOT_SUPPORTED)."""
        return self._flag("chat")

    @property
    def decide(self) -> bool:
        """True when the engine takes DECIDE (``decide=1``); default False."""
        return self._flag("decide")

    @property
    def decide_record(self) -> str | None:
        """The decision record form the engine wants (``"raw"``), or None for the default form."""
        return self.values.get("decide_record")

    @property
    def decide_json(self) -> str | None:
        """``x_decide_json``: ``"sent"`` when the raw record's JSON values keep the caller's key order, else None."""
        return self.values.get("x_decide_json")

    @property
    def vision(self) -> bool:
        """True when an image tower is loaded (IMAGE frames); default False."""
        return self._flag("vision")

    @property
    def slots(self) -> int:
        """Number of KV slots, numbered 0 .. slots-1; default 1."""
        return self._int("slots", 1)

    @property
    def n_ctx(self) -> int | None:
        """Context size per slot, in tokens, or None when not advertised."""
        return self._opt_int("n_ctx")

    @property
    def n_vocab(self) -> int | None:
        """Vocabulary size, in tokens, or None when not advertised."""
        return self._opt_int("n_vocab")

    @property
    def model(self) -> str | None:
        """The model name, or None when not advertised."""
        return self.values.get("model")

    @property
    def pin_slots(self) -> int | None:
        """How many snapshots the engine keeps, or None when not advertised (engines default to 4)."""
        return self._opt_int("pin_slots")

    @property
    def max_logprobs(self) -> int:
        """The largest ``logprobs=`` the engine accepts; default 32."""
        return self._int("max_logprobs", g.MAX_LOGPROBS)

    @property
    def x_score(self) -> bool:
        """Extension 9.1: the engine takes SCORE and answers SCORED."""
        return self._flag("x_score")

    @property
    def x_score_base(self) -> bool:
        """Extension 9.1: a SCORE group may carry ``base``, continuing a leading part of the prefix."""
        return self._flag("x_score_base")

    @property
    def x_hidden(self) -> int:
        """Extension 9.1: SCORE's ``hidden`` reads layers 0 to this minus 1 (HIDDEN frames); 0: absent."""
        return self._int("x_hidden", 0)

    @property
    def x_hidden_dim(self) -> int:
        """Extension 9.1: the values of one HIDDEN frame (the model's hidden size); 0: absent."""
        return self._int("x_hidden_dim", 0)

    @property
    def x_counters(self) -> bool:
        """Extension 9.2: the engine takes ``counters=1`` and reports counters on DONE."""
        return self._flag("x_counters")

    @property
    def x_health(self) -> bool:
        """Extension 9.3: the engine answers PING with PONG."""
        return self._flag("x_health")


@attrs.frozen
class Stat(Event):
    """``STAT <float> <float> <float> <rss_gb>``: ends the handshake (section 3).

    ``fields``: exactly four floats, as colibri writes ``STAT 0 0.00 0.0 <rss_gb>``;
    the last is the engine's resident memory in GB (``rss_gb``).
    """

    fields: tuple[float, ...]

    def __attrs_post_init__(self) -> None:
        try:
            vals = tuple(_float(self, "fields", v, 0) for v in self.fields)
        except TypeError:
            raise _bad(self, "fields", f"must be a sequence of floats, got {self.fields!r}") from None
        if len(vals) != g.STAT_FIELDS:
            raise _bad(self, "fields", f"must hold {g.STAT_FIELDS} floats, got {len(vals)}")
        _set(self, "fields", vals)

    @property
    def rss_gb(self) -> float:
        """The engine's resident memory, in GB."""
        return self.fields[3]


@attrs.frozen
class LoadFail(Event):
    """``LOAD_FAIL kind=<kind> <detail>``: the engine could not load its model (section 3).

    ``kind``: ``nomem`` | ``io`` | ``format`` | ``unsupported``; ``detail``:
    free text (no newline, may be empty). The engine exits after it.
    """

    kind: str
    detail: str = ""

    def __attrs_post_init__(self) -> None:
        if self.kind not in g.LOAD_FAIL_KINDS:
            raise _bad(self, "kind", f"must be one of {sorted(g.LOAD_FAIL_KINDS)}, got {self.kind!r}")
        _text(self, "detail", self.detail, 0)


@attrs.frozen
class Telemetry(Event):
    """A line of a kind the gateway does not know (``HWINFO``, ``TIERS``, ``PERF``, ...).

    Section 2's forward-compatibility rule: a gateway ignores such lines; they
    are still handed out as events so they can be logged. ``kind``: the line's
    kind; ``line``: the whole line without its ``\\n``, kind included. A
    telemetry line carries no payload.
    """

    kind: str
    line: bytes

    def __attrs_post_init__(self) -> None:
        line = _bytes(self, "line", self.line, 0)
        _set(self, "line", line)
        if type(self.kind) is not str or not self.kind.isascii() or g.KIND_RE.fullmatch(self.kind.encode()) is None:
            raise _bad(self, "kind", f"must match [A-Z][A-Z0-9_]*, got {self.kind!r}")
        k = self.kind.encode()
        if k in g.REPLY_KINDS or k in g.REQUEST_KINDS:
            raise _bad(self, "kind", f"{self.kind} is a protocol kind, not telemetry")
        if not (line == k or line.startswith(k + b" ")) or b"\n" in line:
            raise _bad(self, "line", f"must be one line starting with {self.kind!r}, got {line!r}")


# --- requests, gateway to engine (section 4, 9) ---------------------------------------


@attrs.frozen
class Submit(Event):
    """``SUBMIT``: tokenize ``prompt`` in ``slot`` and generate (section 4).

    Fields: ``id`` (1..2**64-1, unique among requests in flight); ``slot``
    (KV slot); ``prompt`` (bytes; with ``ids=True``, token ids as ASCII
    decimal separated by single spaces); ``max_tokens`` (tokens to generate
    at most; ``0`` only with ``logprobs > 0``: read the prompt out and stop);
    ``temperature`` (finite float >= 0, ``0`` is greedy); ``top_p`` (float in
    (0, 1]); ``grammar`` (a constraint grammar, sent as the second payload, or
    None); ``logprobs`` (0..32: one ECHO per fresh prompt position and a tail
    of that many alternatives on each DATA); ``pin`` (take a snapshot at the
    end of the prompt, section 6); ``ids`` (the prompt is token ids);
    ``counters`` (extension 9.2: counters on DONE).

    Raises LocalProtocolError naming the field.
    """

    id: int
    slot: int
    prompt: bytes
    max_tokens: int
    temperature: float
    top_p: float
    grammar: bytes | None = None
    logprobs: int = 0
    pin: bool = False
    ids: bool = False
    counters: bool = False

    def __attrs_post_init__(self) -> None:
        _id(self, self.id)
        rid = self.id
        _uint(self, "slot", self.slot, rid=rid)
        _set(self, "prompt", _bytes(self, "prompt", self.prompt, rid))
        _uint(self, "max_tokens", self.max_tokens, rid=rid)
        t = _float(self, "temperature", self.temperature, rid)
        if not (_isfinite(t) and t >= 0.0):
            raise _bad(self, "temperature", f"must be a finite float >= 0, got {t!r}", rid)
        _set(self, "temperature", t)
        p = _float(self, "top_p", self.top_p, rid)
        if not 0.0 < p <= 1.0:
            raise _bad(self, "top_p", f"must be in (0, 1], got {p!r}", rid)
        _set(self, "top_p", p)
        if self.grammar is not None:
            _set(self, "grammar", _bytes(self, "grammar", self.grammar, rid))
        _uint(self, "logprobs", self.logprobs, 0, g.MAX_LOGPROBS, rid)
        _bool(self, "pin", self.pin, rid)
        _bool(self, "ids", self.ids, rid)
        _bool(self, "counters", self.counters, rid)
        if self.max_tokens == 0 and self.logprobs == 0:
            raise _bad(self, "max_tokens", "0 is legal only with logprobs > 0", rid)
        if self.ids and g.IDS_PAYLOAD_RE.fullmatch(self.prompt) is None:
            raise _bad(self, "prompt", "with ids=True must be token ids separated by single spaces", rid)


@attrs.frozen
class Image(Event):
    """``IMAGE``: a picture for the SUBMIT or SCORE with the same ``id``, which must come next, after
    the request's other IMAGEs (section 4).

    ``data``: the picture: an encoded file (PNG, JPEG, ...) when ``grid_h`` and
    ``grid_w`` are 0, else ``grid_h`` rows of ``grid_w`` RGB pixels, 8 bits a
    channel (uints).
    """

    id: int
    data: bytes
    grid_h: int
    grid_w: int

    def __attrs_post_init__(self) -> None:
        _id(self, self.id)
        _set(self, "data", _bytes(self, "data", self.data, self.id))
        _uint(self, "grid_h", self.grid_h, rid=self.id)
        _uint(self, "grid_w", self.grid_w, rid=self.id)


@attrs.frozen
class Stop(Event):
    """``STOP <id>``: end a generating request through its normal DONE (section 4)."""

    id: int

    def __attrs_post_init__(self) -> None:
        _id(self, self.id)


@attrs.frozen
class Cancel(Event):
    """``CANCEL <id>``: abort a request; it ends with ``ERROR <id> CANCELLED`` (section 4)."""

    id: int

    def __attrs_post_init__(self) -> None:
        _id(self, self.id)


@attrs.frozen
class Decide(Event):
    """``DECIDE <id> <slot> <bytes>``: one decision record, UTF-8 JSON (section 4,
    ``spec/decision-record.md``); only to an engine with ``decide=1``.
    ``record`` is bytes and is not parsed here."""

    id: int
    slot: int
    record: bytes

    def __attrs_post_init__(self) -> None:
        _id(self, self.id)
        _uint(self, "slot", self.slot, rid=self.id)
        _set(self, "record", _bytes(self, "record", self.record, self.id))


@attrs.frozen
class Score(Event):
    """``SCORE <id> <slot> <bytes>``: batched scoring of continuations (extension 9.1).

    ``payload``: UTF-8 JSON ``{"prefix": str, "groups": [{"stem": str,
    "options": [str, ...]}, ...], "pin": bool}``, kept as bytes. Build it with
    ``Score.build``. The engine answers one SCORED per option, in order, then DONE.
    """

    id: int
    slot: int
    payload: bytes

    def __attrs_post_init__(self) -> None:
        _id(self, self.id)
        _uint(self, "slot", self.slot, rid=self.id)
        _set(self, "payload", _bytes(self, "payload", self.payload, self.id))

    @classmethod
    def build(cls, id: int, slot: int, prefix: str, groups: list[tuple[str, list[str]]], pin: bool = False) -> Score:
        """Return a Score whose payload holds ``prefix`` and ``groups``
        (``[(stem, [option, ...]), ...]``) as the spec's JSON.

        Raises LocalProtocolError when a group has no option or a text is not a str.
        """
        import json

        body: dict[str, Any] = {
            "prefix": prefix,
            "groups": [{"stem": stem, "options": list(opts)} for stem, opts in groups],
        }
        if pin:
            body["pin"] = True
        ev = cls(id, slot, json.dumps(body, ensure_ascii=False).encode())
        if score_shape(ev.payload) is None:
            raise LocalProtocolError(
                "Score.payload: every group needs a str stem and at least one str option, and the prefix a str",
                "BAD_FRAME",
                id,
            )
        return ev


def score_shape(payload: bytes) -> tuple[int, ...] | None:
    """Return the number of options of each group of a SCORE payload, or None
    when the payload is not the JSON shape of section 9.1."""
    import json

    try:
        body = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(body, dict) or not isinstance(body.get("prefix"), str):
        return None
    groups = body.get("groups")
    if not isinstance(groups, list) or not groups or not isinstance(body.get("pin", False), bool):
        return None
    shape = []
    for grp in groups:
        if not isinstance(grp, dict) or not isinstance(grp.get("stem"), str):
            return None
        opts = grp.get("options")
        if not isinstance(opts, list) or not opts or not all(isinstance(o, str) for o in opts):
            return None
        shape.append(len(opts))
    return tuple(shape)


@attrs.frozen
class Ping(Event):
    """``PING <id>``: ask for a PONG (extension 9.3); ``id`` must not be in flight."""

    id: int

    def __attrs_post_init__(self) -> None:
        _id(self, self.id)


# --- replies, engine to gateway (section 5, 9) -----------------------------------------


@attrs.frozen
class Accept(Event):
    """``ACCEPT <id> <prompt_tokens>``: the request was taken (section 5).

    ``prompt_tokens``: the prompt's length in tokens (DECIDE: tokens read;
    SCORE: the longest ``context_tokens + n``).
    """

    id: int
    prompt_tokens: int

    def __attrs_post_init__(self) -> None:
        _id(self, self.id)
        _uint(self, "prompt_tokens", self.prompt_tokens, rid=self.id)


@attrs.frozen
class Echo(Event):
    """``ECHO``: the read-out of one prompt position (section 5).

    ``position``: the token's 0-based index in the prompt; ``logprob``: the
    log-softmax over the vocabulary of the token at that position given the
    positions before it (``nan`` only at position 0 with no alternatives: a
    cold prompt's first token has nothing to condition on); ``top``: the ``k``
    most likely tokens there, most likely first, as ``(token_id, logprob)``;
    ``text``: the token's bytes (maybe a partial UTF-8 sequence).
    Every logprob is finite except that ``nan``.
    """

    id: int
    position: int
    logprob: float
    top: tuple[tuple[int, float], ...]
    text: bytes

    def __attrs_post_init__(self) -> None:
        _id(self, self.id)
        rid = self.id
        _uint(self, "position", self.position, rid=rid)
        lp = self.logprob
        if type(lp) is not float:
            lp = _float(self, "logprob", lp, rid)
            _set(self, "logprob", lp)
        top = self.top
        if type(top) is not tuple or top:
            _set(self, "top", _top(self, top, rid))
        if not _isfinite(lp) and not (lp != lp and self.position == 0 and not self.top):
            raise _bad(self, "logprob", f"must be finite (nan only at position 0 with k=0), got {lp!r}", rid)
        if type(self.text) is not bytes:
            _set(self, "text", _bytes(self, "text", self.text, rid))


@attrs.frozen
class Data(Event):
    """``DATA``: one generated token's text (section 5).

    ``text``: its bytes; ``logprob``: its logprob when the request asked for
    ``logprobs > 0`` (else None); ``top``: then the ``k`` alternatives as
    ``(token_id, logprob)``, most likely first. ``top`` is empty when
    ``logprob`` is None. Logprobs are finite.
    """

    id: int
    text: bytes
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()

    def __attrs_post_init__(self) -> None:
        _id(self, self.id)
        rid = self.id
        if type(self.text) is not bytes:
            _set(self, "text", _bytes(self, "text", self.text, rid))
        lp = self.logprob
        if lp is None:
            if self.top:
                raise _bad(self, "top", "must be empty when logprob is None", rid)
            return
        if type(lp) is not float:
            lp = _float(self, "logprob", lp, rid)
            _set(self, "logprob", lp)
        if not _isfinite(lp):
            raise _bad(self, "logprob", f"must be finite, got {lp!r}", rid)
        top = self.top
        if type(top) is not tuple or top:
            _set(self, "top", _top(self, top, rid))


@attrs.frozen
class Decision(Event):
    """``DECISION <id> <n>``: the answer to a DECIDE, UTF-8 JSON as bytes (section 5)."""

    id: int
    record: bytes

    def __attrs_post_init__(self) -> None:
        _id(self, self.id)
        _set(self, "record", _bytes(self, "record", self.record, self.id))


@attrs.frozen
class Done(Event):
    """``DONE <id> STAT ...``: the request ended well (section 5, counters 9.2).

    ``emitted``: DATA frames sent; ``tok_s``: generation speed, tokens/s;
    ``hit_pct``: colibri's expert-cache hit rate, percent; ``rss_gb``:
    resident memory, GB; ``prompt_tokens``: as in ACCEPT; ``length_limited``:
    generation stopped at ``max_tokens`` or the context end. Counters
    (extension 9.2, all three or none): ``computed`` prompt positions run
    through the model, ``reused`` positions taken from the KV cache or a
    snapshot, ``snapshot`` ``"none"`` | ``"hit"`` | ``"stale"``; ``disk``
    (optional, only with the three, ``x_persist=1``): how many of ``reused``
    were read from files an earlier engine process wrote.
    """

    id: int
    emitted: int
    tok_s: float
    hit_pct: float
    rss_gb: float
    prompt_tokens: int
    length_limited: bool
    computed: int | None = None
    reused: int | None = None
    snapshot: str | None = None
    disk: int | None = None

    def __attrs_post_init__(self) -> None:
        _id(self, self.id)
        rid = self.id
        _uint(self, "emitted", self.emitted, rid=rid)
        for name in ("tok_s", "hit_pct", "rss_gb"):
            _set(self, name, _float(self, name, getattr(self, name), rid))
        _uint(self, "prompt_tokens", self.prompt_tokens, rid=rid)
        _bool(self, "length_limited", self.length_limited, rid)
        have = (self.computed is not None, self.reused is not None, self.snapshot is not None)
        if any(have) and not all(have):
            raise _bad(self, "computed", "computed, reused and snapshot come all three or none", rid)
        if have[0]:
            _uint(self, "computed", self.computed, rid=rid)
            _uint(self, "reused", self.reused, rid=rid)
            if self.snapshot not in g.SNAPSHOT_VALUES:
                raise _bad(self, "snapshot", f"must be one of none, hit, stale; got {self.snapshot!r}", rid)
        if self.disk is not None:
            if not have[0]:
                raise _bad(self, "disk", "disk comes only with computed, reused and snapshot", rid)
            _uint(self, "disk", self.disk, rid=rid)
            if self.disk > self.reused:  # type: ignore[operator]
                raise _bad(self, "disk", f"disk={self.disk} is more than reused={self.reused}", rid)

    @property
    def has_counters(self) -> bool:
        """True when the counters of extension 9.2 are present."""
        return self.computed is not None


@attrs.frozen
class Error(Event):
    """``ERROR <id> <CODE>[ <reason>]``: the request ended with an error (sections 5, 7).

    ``id``: the request, or ``0`` when the error cannot be tied to one;
    ``code``: one of section 7's codes (``BAD_FRAME``, ``SLOT_BUSY``, ...; any
    word is read, for compatibility); ``reason``: free text, no newline.
    """

    id: int
    code: str
    reason: str = ""

    def __attrs_post_init__(self) -> None:
        _uint(self, "id", self.id)
        _text(self, "code", self.code, self.id, word=True)
        _text(self, "reason", self.reason, self.id)


@attrs.frozen
class Scored(Event):
    """``SCORED``: the logprobs of one option of a SCORE (extension 9.1).

    ``group``, ``option``: 0-based indices in the request; ``context_tokens``:
    tokens before the option's first scored token; ``logprobs``: one finite
    logprob per scored token, 1 to 200 of them.
    """

    id: int
    group: int
    option: int
    context_tokens: int
    logprobs: tuple[float, ...]

    def __attrs_post_init__(self) -> None:
        _id(self, self.id)
        rid = self.id
        _uint(self, "group", self.group, rid=rid)
        _uint(self, "option", self.option, rid=rid)
        _uint(self, "context_tokens", self.context_tokens, rid=rid)
        try:
            lps = tuple(_float(self, "logprobs", v, rid) for v in self.logprobs)
        except TypeError:
            raise _bad(self, "logprobs", f"must be a sequence of floats, got {self.logprobs!r}", rid) from None
        if not 1 <= len(lps) <= g.MAX_SCORED_TOKENS:
            raise _bad(self, "logprobs", f"must hold 1 to {g.MAX_SCORED_TOKENS} values, got {len(lps)}", rid)
        if not all(map(_isfinite, lps)):
            raise _bad(self, "logprobs", f"must be finite, got {lps!r}", rid)
        _set(self, "logprobs", lps)


@attrs.frozen
class Hidden(Event):
    """``HIDDEN``: one layer's output at the end of a SCORE group's context (extension 9.1, ``hidden``).

    ``group``: 0-based group index; ``layer``: the layer asked for (0-based block index);
    ``values``: the hidden state, 1 to 65536 finite float32 values (the model's hidden size),
    sent as little-endian binary32 (exact bits).
    """

    id: int
    group: int
    layer: int
    values: tuple[float, ...]

    def __attrs_post_init__(self) -> None:
        _id(self, self.id)
        rid = self.id
        _uint(self, "group", self.group, rid=rid)
        _uint(self, "layer", self.layer, rid=rid)
        try:
            vals = tuple(_float(self, "values", v, rid) for v in self.values)
        except TypeError:
            raise _bad(self, "values", f"must be a sequence of floats, got {self.values!r}", rid) from None
        if not 1 <= len(vals) <= g.MAX_HIDDEN_VALUES:
            raise _bad(self, "values", f"must hold 1 to {g.MAX_HIDDEN_VALUES} values, got {len(vals)}", rid)
        if not all(map(_isfinite, vals)):
            raise _bad(self, "values", "must be finite", rid)
        _set(self, "values", vals)


@attrs.frozen
class Pong(Event):
    """``PONG <id> key=value ...``: the answer to a PING (extension 9.3).

    ``values``: at least ``active`` (requests in flight, a uint); other keys are kept.
    """

    id: int
    values: dict[str, str] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        _id(self, self.id)
        vals = _pairs(self, "values", self.values, self.id)
        act = vals.get("active")
        if act is None or not act.isascii() or g.UINT_RE.fullmatch(act.encode()) is None:
            raise _bad(self, "values", f"must hold active=<uint>, got {vals!r}", self.id)
        _set(self, "values", vals)

    @property
    def active(self) -> int:
        """Requests in flight in the engine when it answered."""
        return int(self.values["active"])


@attrs.frozen
class ConnectionClosed(Event):
    """The peer closed its end (EOF), returned by ``next_event()`` once the
    buffered frames are used up (section 2). ``unfinished``: the ids of the
    requests still in flight at that moment (on the gateway side they have
    failed; on the engine side they are still to be finished)."""

    unfinished: tuple[int, ...] = ()


E = TypeVar("E", bound=Event)


def trusted_constructor(cls: type[E]) -> Callable[..., E]:
    """Return ``make(*fields)`` building a ``cls`` without validation.

    Only for the readers, which have checked every field against the grammar
    and the event's rules already; it saves the validation a second time on
    the hot path (an ECHO-heavy read-out). Field order is the class's.
    """
    new = object.__new__
    names = [a.name for a in attrs.fields(cls)]
    setters = {f"_s{i}": cls.__dict__[n].__set__ for i, n in enumerate(names)}
    args = ", ".join(f"a{i}" for i in range(len(names)))
    body = "".join(f"    _s{i}(o, a{i})\n" for i in range(len(names)))
    ns: dict[str, Any] = {"new": new, "cls": cls, **setters}
    exec(f"def make({args}):\n    o = new(cls)\n{body}    return o\n", ns)
    make: Callable[..., E] = ns["make"]
    make.__doc__ = f"Build a {cls.__name__} from already-validated fields {names}."
    return make
