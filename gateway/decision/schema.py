"""The question schema: a ``/v1/systemone`` request validated into what the decision room answers.

:func:`parse_request` turns a decoded JSON body into a :class:`SystemOneRequest`
or raises :class:`JevValidationError` listing every problem at once, as
``{"loc": ["body", ...path], "msg", "type"}`` entries (FastAPI/pydantic's
shape, which the official SDK reads). The wire's side of the contract (the 422
body, the answers and the reply) is the server's: :mod:`gateway.server.jev.protocol`.
See ``../shared/notes/jev-contract.md`` and the seed's "The HTTP endpoint".
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from typing import Any

import attrs

from gateway.decision import debias, pictures, readers
from gateway.decision.arithmetic import check_normalize
from gateway.decision.prompts import as_text

MAX_QUESTIONS = 64
MAX_OPTIONS = 255
#: Tokens an option (a choice's label) may have: the engines score at most this many per option (spec 9.1).
MAX_OPTION_TOKENS = 200
QUESTION_TYPES = ("noul", "choice", "score")

#: The fields a ``/v1/systemone`` body may carry: Jev's (``assets`` is Jev's too, refused by name: this server
#: reads no images), then this server's options and ``x_`` extensions. Any other is an *unknown field*,
#: reported in ``x_warnings`` (or, under ``serve --strict``, refused with a 422 naming it).
TOP_FIELDS = (
    "model",
    "state",
    "questions",
    "assets",
    "normalize",
    "pin_state",
    "prefix",
    "cache_slot",
    "x_debias",
    "x_head",
    "x_reader",
)
#: The fields of a question object (Jev's ``NoulQuestion``, ``ChoiceQuestion``, ``ScoreQuestion``).
QUESTION_FIELDS = ("type", "instructions", "criteria", "x_reader")
#: The fields of a noul's ``criteria`` object (Jev's ``NoulCriteria``).
NOUL_SIDES = ("true", "false")
#: The message of a field that names something this server cannot read (pictures): the 422's ``msg`` starts so.
NOT_IMPLEMENTED = "not implemented: "


class JevValidationError(Exception):
    """A request that does not validate. ``errors``: the 422 ``detail`` list
    (:func:`gateway.server.jev.protocol.error_body` is its 422 body)."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors))
        self.errors = errors


@attrs.frozen
class Question:
    """One validated question: ``id`` byte-for-byte as sent, ``type``, raw ``instructions`` and ``criteria``.

    ``criteria``: noul ``{"true"?, "false"?}`` (keys present only when sent) or
    None; choice ``{label: description}`` (request order); score a list of levels.
    """

    id: str
    type: str
    instructions: Any
    criteria: Any
    has_instructions: bool

    @property
    def n_options(self) -> int:
        return 2 if self.type == "noul" else len(self.criteria)


@attrs.frozen
class SystemOneRequest:
    """A validated ``/v1/systemone`` request.

    ``state``: str, dict or list as sent; ``questions``: in request order;
    ``model``: the name sent or None; ``normalize``: ``"sum"``/``"mean"``;
    ``pin_state``: bool or None (server decides); ``prefix``: str or None;
    ``cache_slot``: int or None; ``debias``: the ``x_debias`` methods
    (:func:`gateway.decision.debias.parse`), or None when the request left it to the
    server's default (absent or null); ``head``: ``x_head``, ``"none"`` to answer
    without the served heads (:mod:`gateway.decision.heads`), else None; ``reader``: ``x_reader`` (who
    reads every question on a served pair, :mod:`gateway.decision.readers`), None for the model's
    default; ``readers``: question id -> its own ``x_reader``, over ``reader``; ``unknown``:
    the path of each field the body sent that this server does not read (:data:`TOP_FIELDS`,
    :data:`QUESTION_FIELDS`, :data:`NOUL_SIDES`): the body's own first, then each question's (in
    request order, a question's own fields before its ``criteria``'s), each object's in its key order.
    ``pictures``: the ``assets`` read (placeholder -> the picture's bytes, :mod:`gateway.decision.pictures`),
    only where the engine reads pictures.
    """

    state: Any
    questions: tuple[Question, ...]
    model: str | None = None
    normalize: str = "sum"
    pin_state: bool | None = None
    prefix: str | None = None
    cache_slot: int | None = None
    debias: tuple[str, ...] | None = None
    head: str | None = None
    unknown: tuple[tuple[str, ...], ...] = ()
    reader: str | None = None
    readers: dict[str, str] = attrs.field(factory=dict)
    pictures: dict[str, bytes] = attrs.field(factory=dict)

    def reader_of(self, qid: str, default: str) -> str:
        """Who reads question ``qid``: its own ``x_reader``, else the request's, else ``default``."""
        return self.readers.get(qid) or self.reader or default

    @property
    def warnings(self) -> list[str]:
        """The ``x_warnings`` of the unknown fields: ``"questions.q1.critera: unknown field"``, one per field
        (its path, the parts joined by dots), in :attr:`unknown`'s order."""
        return [f"{'.'.join(path)}: unknown field" for path in self.unknown]


def visible(text: str) -> str:
    """``text`` as a reader sees it: its format characters (Unicode category Cf: zero-width spaces and
    joiners, a BOM, soft hyphens, direction marks) removed, then NFC (``café`` composed or not is one
    string). Two labels or question ids with the same :func:`visible` form cannot be told apart."""
    return unicodedata.normalize("NFC", "".join(c for c in text if unicodedata.category(c) != "Cf"))


def label_key(label: str) -> str:
    """The form two labels the model cannot keep apart share: :func:`visible`, surrounding whitespace
    stripped, case folded (and NFC again, which case folding can undo)."""
    return unicodedata.normalize("NFC", visible(label).strip().casefold())


#: The differences :func:`visible` removes, as a 422 names them.
_HIDDEN = (
    "invisible characters (Unicode format characters: zero-width spaces and joiners, a BOM) "
    "or Unicode normalization (NFC)"
)


def _how_alike(a: str, b: str) -> str:
    """What ``a`` and ``b`` (of one :func:`label_key` or :func:`visible` form) differ by, for their 422:
    ``"only by case or surrounding whitespace"`` (the first rule, kept word for word), invisible
    characters and normalization when those are all, or every kind when both play a part."""
    if visible(a) == visible(b):
        return f"only by {_HIDDEN}"
    if visible(a) == a and visible(b) == b:
        return "only by case or surrounding whitespace"
    return f"only by case, surrounding whitespace, {_HIDDEN}"


def _err(loc: list[Any], msg: str, type_: str) -> dict[str, Any]:
    return {"loc": ["body", *loc], "msg": msg, "type": type_}


def _options_count(loc: list[Any], what: str, unit: str, n: int) -> dict[str, Any]:
    """The error of a question with ``n`` options, outside 1 to :data:`MAX_OPTIONS`."""
    return _err(loc, f"{what} needs 1 to {MAX_OPTIONS} {unit}, got {n}", "too_short" if not n else "too_long")


def x_debias(body: dict[str, Any], errors: list[dict[str, Any]]) -> tuple[str, ...] | None:
    """A body's ``x_debias`` (:func:`gateway.decision.debias.parse`), None when absent or null. A value
    it refuses appends the error naming the field to ``errors`` (and gives None); ``/v1/rerank``'s
    body reads it the same way (:func:`gateway.decision.rerank.parse`)."""
    if body.get("x_debias") is None:
        return None
    try:
        return debias.parse(body["x_debias"])
    except ValueError as exc:
        errors.append(_err(["x_debias"], str(exc), "literal_error"))
        return None


def _is_content(v: Any) -> bool:
    return isinstance(v, (str, dict, list))


def _check_content(errors: list[dict[str, Any]], loc: list[Any], v: Any, *, nullable: bool) -> None:
    if v is None and nullable:
        return
    if not _is_content(v):
        what = "a string, an object, an array or null" if nullable else "a string, an object or an array"
        errors.append(_err(loc, f"Input should be {what}", "content_type"))


def _unknown(unknown: list[tuple[str, ...]], path: list[str], obj: dict[str, Any], known: tuple[str, ...]) -> None:
    """Append the path of each key of ``obj`` not in ``known`` to ``unknown``."""
    unknown.extend((*path, key) for key in obj if key not in known)


def _question(errors: list[dict[str, Any]], unknown: list[tuple[str, ...]], qid: str, raw: Any) -> Question | None:
    loc = ["questions", qid]
    if not isinstance(raw, dict):
        errors.append(_err(loc, "Input should be an object", "dict_type"))
        return None
    _unknown(unknown, loc, raw, QUESTION_FIELDS)
    qtype = raw.get("type")
    if "type" not in raw:
        errors.append(_err([*loc, "type"], "Field required", "missing"))
        return None
    if qtype == "box":  # Jev's, refused by name: never answered as if it were another type
        errors.append(
            _err(
                [*loc, "type"],
                f"{NOT_IMPLEMENTED}a box question locates something in an image, and this server reads no "
                "images (it answers 'noul', 'choice' and 'score')",
                "not_implemented",
            )
        )
        return None
    if qtype not in QUESTION_TYPES:
        errors.append(_err([*loc, "type"], "Input should be 'noul', 'choice' or 'score'", "literal_error"))
        return None
    n_before = len(errors)
    instructions = raw.get("instructions")
    _check_content(errors, [*loc, "instructions"], instructions, nullable=True)
    criteria = raw.get("criteria")
    cloc = [*loc, "criteria"]
    if qtype == "noul":
        if criteria is not None:
            if not isinstance(criteria, dict):
                errors.append(_err(cloc, "Input should be an object with optional 'true' and 'false'", "dict_type"))
            else:
                _unknown(unknown, [*cloc], criteria, NOUL_SIDES)
                for side in ("true", "false"):
                    if side in criteria:
                        _check_content(errors, [*cloc, side], criteria[side], nullable=True)
                criteria = {k: criteria[k] for k in ("true", "false") if k in criteria}
    elif qtype == "choice":
        if "criteria" not in raw:
            errors.append(_err(cloc, "Field required", "missing"))
        elif not isinstance(criteria, dict):
            errors.append(_err(cloc, "Input should be an object of labels", "dict_type"))
        elif not 1 <= len(criteria) <= MAX_OPTIONS:
            errors.append(_options_count(cloc, "A choice", "labels", len(criteria)))
        else:
            seen: dict[str, str] = {}
            for label, desc in criteria.items():
                if label == "":
                    errors.append(_err([*cloc, label], "A label must not be empty", "string_too_short"))
                elif not label.strip():
                    errors.append(
                        _err(
                            [*cloc, label],
                            "A label must not be only whitespace: it is the text the model is scored on",
                            "value_error",
                        )
                    )
                elif not visible(label).strip():
                    errors.append(
                        _err(
                            [*cloc, label],
                            "A label must not be only invisible characters (Unicode format characters such as "
                            "zero-width spaces) and whitespace: it is the text the model is scored on",
                            "value_error",
                        )
                    )
                else:
                    # the model cannot keep apart labels that differ only so: the probability splits between them
                    twin = seen.setdefault(label_key(label), label)
                    if twin != label:
                        errors.append(
                            _err(
                                [*cloc, label],
                                f"The label {label!r} differs from {twin!r} {_how_alike(label, twin)}: "
                                "the model cannot tell them apart; rename one",
                                "value_error",
                            )
                        )
                _check_content(errors, [*cloc, label], desc, nullable=True)
    else:  # score
        if "criteria" not in raw:
            errors.append(_err(cloc, "Field required", "missing"))
        elif not isinstance(criteria, list):
            errors.append(_err(cloc, "Input should be a list of levels, level 0 first", "list_type"))
        elif not 1 <= len(criteria) <= MAX_OPTIONS:
            errors.append(_options_count(cloc, "A score", "levels", len(criteria)))
        else:
            for i, level in enumerate(criteria):
                _check_content(errors, [*cloc, i], level, nullable=False)
    if len(errors) > n_before:
        return None
    return Question(qid, qtype, instructions, criteria, "instructions" in raw and instructions is not None)


def unknown_field_error(path: tuple[str, ...]) -> dict[str, Any]:
    """The 422 ``detail`` entry of an unknown field under ``serve --strict`` (pydantic's ``extra="forbid"``
    words and type, which FastAPI servers such as Jev's send)."""
    return _err(list(path), "Extra inputs are not permitted", "extra_forbidden")


def parse_request(
    body: Any, *, strict: bool = False, vision: bool = False, parts: Mapping[str, bytes] | None = None
) -> SystemOneRequest:
    """Validate a decoded ``/v1/systemone`` body. Raises :class:`JevValidationError` with every error.

    A field this server does not read, at any level (the body, a question, a noul's ``criteria``), is
    kept in ``SystemOneRequest.unknown`` (its ``x_warnings``), so a Jev client's extra field still gets
    its answer while a typo (``"critera"``) is reported; ``strict`` (``serve --strict``) refuses each
    one instead (:func:`unknown_field_error`, after the other errors). ``assets`` (Jev's image assets)
    is refused by name (``not_implemented``) unless ``vision`` (the engine has a projector: the pictures
    are read, :func:`gateway.decision.pictures.parse_assets`, ``parts`` a multipart body's parts by name,
    and placed only in the state, :func:`gateway.decision.pictures.misplaced`); a ``box`` question is
    refused by name either way.
    ``model`` may be any string or absent. Our extensions read here are ``x_debias``
    (:mod:`gateway.decision.debias`), ``x_head`` and ``x_reader`` (:func:`gateway.decision.readers.parse`).
    """
    if not isinstance(body, dict):
        raise JevValidationError([_err([], "Input should be a JSON object", "model_attributes_type")])
    errors: list[dict[str, Any]] = []
    unknown: list[tuple[str, ...]] = []
    _unknown(unknown, [], body, TOP_FIELDS)
    if "state" not in body:
        errors.append(_err(["state"], "Field required", "missing"))
    else:
        _check_content(errors, ["state"], body["state"], nullable=False)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        errors.append(_err(["model"], "Input should be a valid string", "string_type"))
    questions: list[Question] = []
    raw_q = body.get("questions")
    if "questions" not in body:
        errors.append(_err(["questions"], "Field required", "missing"))
    elif not isinstance(raw_q, dict):
        errors.append(_err(["questions"], "Input should be an object of questions keyed by id", "dict_type"))
    elif not 1 <= len(raw_q) <= MAX_QUESTIONS:
        errors.append(
            _err(
                ["questions"],
                f"Between 1 and {MAX_QUESTIONS} questions are needed, got {len(raw_q)}",
                "too_short" if not raw_q else "too_long",
            )
        )
    else:
        ids: dict[str, str] = {}
        for qid, raw in raw_q.items():
            if qid == "":
                errors.append(_err(["questions", qid], "A question id must not be empty", "string_too_short"))
                continue
            if visible(qid) == "":
                errors.append(
                    _err(
                        ["questions", qid],
                        "A question id must not be only invisible characters (Unicode format characters "
                        "such as zero-width spaces): it keys its answer in the reply",
                        "string_too_short",
                    )
                )
                continue
            # ids keep case and spaces (they are keys, not text the model reads), not what no reader can see
            twin = ids.setdefault(visible(qid), qid)
            if twin != qid:
                errors.append(
                    _err(
                        ["questions", qid],
                        f"The question id {qid!r} differs from {twin!r} {_how_alike(qid, twin)}: "
                        "their answers could not be told apart; rename one",
                        "value_error",
                    )
                )
                continue
            q = _question(errors, unknown, qid, raw)
            if q is not None:
                questions.append(q)
    normalize = body.get("normalize", "sum")
    if normalize is None:
        normalize = "sum"
    try:
        check_normalize(normalize)
    except ValueError:
        errors.append(_err(["normalize"], "Input should be 'sum' or 'mean'", "literal_error"))
    pin_state = body.get("pin_state")
    if pin_state is not None and not isinstance(pin_state, bool):
        errors.append(_err(["pin_state"], "Input should be a valid boolean", "bool_type"))
    prefix = body.get("prefix")
    if prefix is not None:
        if not _is_content(prefix):
            errors.append(_err(["prefix"], "Input should be a string, an object or an array", "content_type"))
        elif prefix == "":
            prefix = None
    cache_slot = body.get("cache_slot")
    if cache_slot is not None and (isinstance(cache_slot, bool) or not isinstance(cache_slot, int) or cache_slot < 0):
        errors.append(_err(["cache_slot"], "Input should be a non-negative integer", "int_type"))
    debias_methods = x_debias(body, errors)
    head = body.get("x_head")
    if head is not None and head != "none":
        errors.append(_err(["x_head"], "Input should be 'none' (answer without the served heads)", "literal_error"))
    reader, per_question, reader_errors = readers.parse(body)
    errors.extend(reader_errors)
    shown: dict[str, bytes] = {}
    if vision:  # the engine reads pictures: the assets are read and must sit in the state
        if body.get("assets") is not None:
            shown = pictures.parse_assets(body["assets"], parts or {}, errors)
        errors.extend(pictures.misplaced(body.get("state"), questions, shown))
    elif body.get("assets") is not None:  # Jev's image assets: refused by name, never answered on the text alone
        errors.append(
            _err(
                ["assets"],
                f"{NOT_IMPLEMENTED}image assets need a vision model (serve --mmproj), and this server reads no images: "
                "send the request without assets (describe the picture in state)",
                "not_implemented",
            )
        )
    if strict:
        errors.extend(unknown_field_error(path) for path in unknown)
    if errors:
        raise JevValidationError(errors)
    return SystemOneRequest(
        state=body["state"],
        questions=tuple(questions),
        model=model,
        normalize=normalize,
        pin_state=pin_state,
        prefix=None if prefix is None else as_text(prefix),
        cache_slot=cache_slot,
        debias=debias_methods,
        head=head,
        unknown=tuple(unknown),
        reader=reader,
        readers=per_question,
        pictures=shown,
    )
